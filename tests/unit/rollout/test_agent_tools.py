"""Tool-call parsing (Qwen/Hermes `<tool_call>` JSON) and the file editor / shell tools on a local backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import LocalBackend, call

from envs.agent.parser import ToolCall, ToolCallError, parse_tool_calls
from envs.agent.tools import TOOL_NAMES, TOOL_SPECS, ToolBox


def test_calls_are_parsed_in_order_with_text_around_them() -> None:
    text = ("Let me look.\n" + call("shell", command="ls") + "\nand\n"
            + '<tool_call>{"name": "file_editor", "arguments": "{\\"command\\": \\"view\\", \\"path\\": \\"a\\"}"}'
            "</tool_call>")
    assert parse_tool_calls(text) == [ToolCall("shell", {"command": "ls"}),
                                      ToolCall("file_editor", {"command": "view", "path": "a"})]
    assert parse_tool_calls("no call here") == []


@pytest.mark.parametrize(("text", "why"), [
    ("<tool_call>{\"name\": \"shell\"", "not closed"),
    ("<tool_call>{name: shell}</tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', '"name" string'),
    ('<tool_call>["shell"]</tool_call>', '"name" string'),
    ('<tool_call>{"name": "shell", "arguments": [1]}</tool_call>', "must be a JSON object"),
])
def test_malformed_calls_are_errors_that_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ToolCallError, match=why):
        parse_tool_calls(text)


def test_tool_specs_name_every_tool() -> None:
    assert TOOL_NAMES == {"shell", "file_editor", "submit"}
    assert all(spec["function"]["parameters"]["type"] == "object" for spec in TOOL_SPECS)


async def test_file_editor_edits_exactly_and_refuses_ambiguity(tmp_path: Path) -> None:
    box = ToolBox(LocalBackend(tmp_path))
    (tmp_path / "m.py").write_text("a = 1\nb = 1\n")
    view = await box.run(ToolCall("file_editor", {"command": "view", "path": "m.py"}))
    assert "     1\ta = 1" in view.text and not view.error
    ambiguous = await box.run(ToolCall("file_editor", {"command": "str_replace", "path": "m.py", "old_str": "= 1",
                                                       "new_str": "= 2"}))
    assert ambiguous.error and "occurs 2 times" in ambiguous.text
    ok = await box.run(ToolCall("file_editor", {"command": "str_replace", "path": "m.py", "old_str": "b = 1",
                                                "new_str": "b = 2"}))
    assert not ok.error and "line 2" in ok.text
    await box.run(ToolCall("file_editor", {"command": "insert", "path": "m.py", "insert_line": 0,
                                           "new_str": "import os"}))
    assert (tmp_path / "m.py").read_text() == "import os\na = 1\nb = 2\n"
    exists = await box.run(ToolCall("file_editor", {"command": "create", "path": "m.py", "file_text": ""}))
    assert exists.error and "already exists" in exists.text
    bad_line = await box.run(ToolCall("file_editor", {"command": "insert", "path": "m.py", "insert_line": 99,
                                                      "new_str": "x"}))
    assert bad_line.error and "insert_line" in bad_line.text


async def test_bad_arguments_and_unknown_commands_are_error_observations(tmp_path: Path) -> None:
    box = ToolBox(LocalBackend(tmp_path))
    for c, why in [(ToolCall("shell", {}), "'command' must be a str"),
                   (ToolCall("shell", {"command": 3}), "must be a str"),
                   (ToolCall("file_editor", {"command": "delete", "path": "x"}), "unknown command 'delete'"),
                   (ToolCall("file_editor", {"command": "view", "path": "missing"}), "does not exist"),
                   (ToolCall("rm_rf", {}), "unknown tool 'rm_rf'")]:
        obs = await box.run(c)
        assert obs.error and why in obs.text, (c, obs.text)


async def test_shell_reports_output_and_exit_code(tmp_path: Path) -> None:
    obs = await ToolBox(LocalBackend(tmp_path)).run(ToolCall("shell", {"command": "echo out; echo err >&2; exit 3"}))
    assert obs.text == "out\nerr\n[exit code 3]" and not obs.error


async def test_viewing_a_folder_lists_it(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("")
    obs = await ToolBox(LocalBackend(tmp_path)).run(ToolCall("file_editor", {"command": "view", "path": "pkg"}))
    assert "pkg/mod.py" in obs.text


def test_agent_limits_come_from_the_config_and_never_exceed_the_sequence_length() -> None:
    from fleet.config import MasterConfig
    from rollout.agent.runner import limits_from_config

    cfg = MasterConfig()
    cfg.env.code.agent.max_turns = 5
    limits = limits_from_config(cfg.env.code.agent, cfg.policy)
    assert limits.max_turns == 5 and limits.max_total_tokens == cfg.policy.max_total_sequence_length
    assert limits.max_new_tokens_per_turn == cfg.policy.generation.max_new_tokens
    cfg.env.code.agent.max_total_tokens = cfg.policy.max_total_sequence_length + 1
    with pytest.raises(ValueError, match="env.code.agent.max_total_tokens=.* exceeds policy.max_total_sequence"):
        limits_from_config(cfg.env.code.agent, cfg.policy)
