"""The chat template's side of an episode, in token ids.

The trajectory is never a re-tokenisation of text: what the engine generated is kept as is, and between turns only
the *observation* tokens are appended -- the template's rendering of the tool results, computed as the difference
between a conversation rendered without them and with them (so whatever the template puts between turns, e.g.
Qwen's `<|im_end|>\\n<|im_start|>user\\n<tool_response>...`, is reproduced exactly). When the model's turn did not
end with the template's end-of-turn token (it hit its token budget), that token is part of the observation.

Tool descriptions go to the template as `tools=`; a template that ignores them (the tiny test model's) gets the
Hermes / Qwen 2.5 tools block in the system message instead, so the model always sees them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envs.agent.tools import Observation

_PROBE_USER, _PROBE_ASSISTANT = "\x01U\x01", "\x01A\x01"
HERMES_TOOLS = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
TRUNCATION_MARKER = "\n[... {dropped} of {total} tokens of output cut here ...]\n"


class ChatFormat:
    """Prompt and observation token ids for one tokenizer (with a chat template)."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("agent mode needs a tokenizer with a chat template (tokenizer.chat_template is empty)")
        self.tok = tokenizer
        base = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        rendered = self._render(base)
        # What the template writes after an assistant message: its end-of-turn text and the separator.
        self._close = rendered[rendered.rindex(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]
        end_text = self._close.strip()
        ids = tokenizer.convert_tokens_to_ids(end_text) if end_text else None
        unk = getattr(tokenizer, "unk_token_id", None)
        self.end_ids = {i for i in (ids, tokenizer.eos_token_id) if isinstance(i, int) and i != unk}
        self._end_text = end_text if isinstance(ids, int) and ids != unk else ""
        self._base = base

    def _render(self, messages: list[dict[str, Any]], **kw: Any) -> str:
        return str(self.tok.apply_chat_template(messages, tokenize=False, **kw))

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))

    def prompt_ids(self, system: str, user: str, tools: list[dict[str, Any]], *,
                   fallback: str | None = None) -> list[int]:
        """The episode's prompt: system + user messages, tool descriptions, and the assistant turn opened.
        `fallback`: the tools block for a template that ignores `tools=` (`{tools}`: one JSON spec a line; default
        the Hermes block), e.g. a shorter one for a tiny model's short prompts."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        with_tools = self._render(messages, tools=tools, add_generation_prompt=True)
        if with_tools == self._render(messages, add_generation_prompt=True):  # the template ignores `tools`
            block = (fallback or HERMES_TOOLS).format(tools="\n".join(json.dumps(t) for t in tools))
            messages[0] = {"role": "system", "content": system + block}
            with_tools = self._render(messages, add_generation_prompt=True)
        return self.encode(with_tools)

    def observation_ids(self, results: Sequence[str | list[dict[str, Any]]], *, turn_closed: bool) -> list[int]:
        """Tokens between one assistant turn and the next: (the end-of-turn token if the model did not write it,)
        the tool messages, and the next assistant turn opened."""
        before = self._render(self._base)
        after = self._render([*self._base, *({"role": "tool", "content": r} for r in results)],
                             add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template renders earlier turns differently once tool results follow; "
                             "agent mode cannot append observations to it token-exactly")
        close = self._close
        if turn_closed and self._end_text and close.startswith(self._end_text):
            close = close[len(self._end_text):]
        return self.encode(close + after[len(before):])

    def observation_tokens(self, results: Sequence[Observation], max_tokens: int, *,
                           turn_closed: bool) -> tuple[list[int], list[tuple[bytes, int, int]]]:
        """`observation_ids` of tool results, each cut to `max_tokens`, and the images among them as (PNG, start,
        length) of their placeholder runs in those ids: none here (a vision format overrides this)."""
        texts = [self.truncate(r.text, max_tokens) for r in results]
        return self.observation_ids(texts, turn_closed=turn_closed), []

    def turn_closed(self, ids: list[int]) -> bool:
        return bool(ids) and ids[-1] in self.end_ids

    def truncate(self, text: str, max_tokens: int) -> str:
        """`text` cut to about `max_tokens` tokens: its head and tail kept, a marker saying what was cut."""
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text
        marker = TRUNCATION_MARKER.format(dropped=len(ids) - max_tokens, total=len(ids))
        keep = max(0, max_tokens - len(self.encode(marker)))
        head, tail = keep // 2, keep - keep // 2
        return self.decode(ids[:head]) + marker + (self.decode(ids[-tail:]) if tail else "")


def tool_prompt(tokenizer: Any, env: str, system: str, user: str, tools: list[dict[str, Any]], *,
                max_prompt_length: int, fallback: str | None = None) -> tuple[list[int], str]:
    """An agent environment's prompt (`ChatFormat.prompt_ids`) as ids and text, refused with the environment's
    name when it is longer than `max_prompt_length` (`data.*.max_prompt_length`)."""
    fmt = ChatFormat(tokenizer)
    ids = fmt.prompt_ids(system, user, tools, fallback=fallback)
    if len(ids) > max_prompt_length:
        raise ValueError(f"{env} prompt of {len(ids)} tokens exceeds max_prompt_length={max_prompt_length}")
    return ids, fmt.decode(ids)
