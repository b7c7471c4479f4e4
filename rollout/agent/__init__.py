"""Agent mode (`env.code.mode: agent`): multi-turn episodes of tool calls against a sandbox session.

`episode` is the loop; `runner` (sandbox code sessions), `local` (in-process tools) and `computer` (computer-use
sessions) run it for their environments. The tool protocol they share with the environments (the `<tool_call>`
parser, the chat format, the session tools) lives a floor below, in `envs/agent`.
"""
