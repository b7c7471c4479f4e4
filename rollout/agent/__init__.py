"""Agent mode (`env.code.mode: agent`): multi-turn episodes of tool calls against a sandbox session.

`parser` reads Qwen/Hermes `<tool_call>` JSON, `tools` runs shell / file_editor / submit against a session,
`chat` turns the tokenizer's chat template into prompt and observation token ids, `episode` is the loop.
"""
