"""Helpers of the agent-loop unit tests: a scripted policy (texts -> Generations, recording every context it was
given), a local tool backend (real `sh` processes in a temporary folder, standing in for a sandbox session), and a
Qwen 2.5-style chat template that renders `tools=` and tool results the way Qwen's own does."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from envs.agent.chat import ChatFormat
from rollout.engine.base import Generation, SamplingSpec
from sandbox_client.sessions import CommandResult, SessionToolError

QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '\\n\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set rest = messages %}{%- endif %}"
    "{%- for m in rest %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ScriptedPolicy:
    """Answers turn k with `turns[k]` (+ the end-of-turn token), honouring `max_new_tokens` like an engine
    (cut: finish "length", no end token). Versions: `versions[k]` for every token of turn k (default 0)."""

    def __init__(self, fmt: ChatFormat, turns: Sequence[str], versions: Sequence[int] = (),
                 delay_s: float = 0.0) -> None:
        self.fmt, self.turns, self.versions, self.delay_s = fmt, list(turns), list(versions), delay_s
        self.contexts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.end_id = min(fmt.end_ids)

    async def __call__(self, request_id: str, prompt: Sequence[int], sampling: SamplingSpec) -> Generation:
        k = len(self.contexts)
        self.contexts.append(list(prompt))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        ids = self.fmt.encode(self.turns[min(k, len(self.turns) - 1)]) + [self.end_id]
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        self.outputs.append(ids)
        version = self.versions[k] if k < len(self.versions) else 0
        return Generation(request_id, ids, [-0.5 - 0.01 * i for i in range(len(ids))], [version] * len(ids),
                          finish, len(prompt))  # type: ignore[arg-type]


class LocalBackend:
    """Files and `sh -c` in a local folder: the ToolBackend contract without a sandbox."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.commands: list[str] = []

    def _path(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if self.root.resolve() not in (path, *path.parents):
            raise SessionToolError(f"path: {rel!r} must stay inside the repository")
        return path

    async def exec(self, command: str, *, limit_s: float | None = None) -> CommandResult:
        self.commands.append(command)
        proc = await asyncio.create_subprocess_shell(command, cwd=self.root, stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return CommandResult(proc.returncode, out.decode(), err.decode(), False, False, False, 0.0)

    async def read_file(self, path: str) -> tuple[str, bool]:
        target = self._path(path)
        if target.is_dir():
            raise SessionToolError(f"path: {path!r} is not a regular file")
        if not target.exists():
            raise SessionToolError(f"path: {path!r} does not exist in the session")
        return target.read_text(), False

    async def write_file(self, path: str, content: str) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)


def call(name: str, **arguments: object) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
