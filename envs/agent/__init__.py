"""The agent tool protocol shared by the agent-mode environments and the rollout worker: how tools are described to
the model (chat.py), how its tool calls are parsed (parser.py), and the sandbox-session tools (tools.py). Below both
the environments and the rollout fleet, so neither imports the other for it."""
