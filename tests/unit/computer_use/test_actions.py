"""Action parsing: every tool call the model may send, its JSON round trip, and errors written for the model."""

from __future__ import annotations

import pytest

from envs.computer_use.actions import (
    COMPUTER_TOOLS,
    KEYS,
    ActionError,
    Click,
    Done,
    Key,
    Scroll,
    Type,
    action_from_json,
    parse_action,
)


@pytest.mark.parametrize("action", [Click(3, 220), Type("hello world"), Key("Enter"), Key("a"), Scroll(0, -120),
                                    Done()])
def test_every_action_round_trips_through_json(action: object) -> None:
    assert isinstance(action, Click | Type | Key | Scroll | Done)
    data = action.to_json()
    assert set(data) == {"name", "arguments"}
    assert action_from_json(data) == action
    assert parse_action(data["name"], data["arguments"]) == action


@pytest.mark.parametrize(("name", "arguments", "message"), [
    ("clik", {"x": 1, "y": 2}, "unknown action 'clik'; the actions are click(x, y), type(text)"),
    ("click", {"x": 1}, "click: missing argument 'y' (call click(x, y)"),
    ("click", {"x": 1, "y": 2, "button": "left"}, "click: unexpected argument 'button'"),
    ("click", {"x": "left", "y": 2}, "click: x must be an integer, got 'left'"),
    ("click", {"x": True, "y": 2}, "click: x must be an integer, got True"),
    ("click", [1, 2], "click: arguments must be a JSON object"),
    ("type", {"text": 5}, "type: text must be a string, got 5"),
    ("type", {"text": ""}, "type: text must be 1 to 200 characters"),
    ("key", {"key": "F5"}, "key: 'F5' is not a key; use one of Enter, Tab"),
    ("scroll", {"dx": 0, "dy": 99999}, "scroll: dx and dy must be within"),
])
def test_invalid_calls_raise_a_message_naming_what_to_fix(name: str, arguments: object, message: str) -> None:
    with pytest.raises(ActionError) as err:
        parse_action(name, arguments)
    assert message in str(err.value)


def test_click_off_the_screen_names_the_screen_size() -> None:
    assert parse_action("click", {"x": 223, "y": 0}, viewport=(224, 224)) == Click(223, 0)
    with pytest.raises(ActionError, match=r"\(224, 5\) is outside the 224x224 screen; x must be in 0..223"):
        parse_action("click", {"x": 224, "y": 5}, viewport=(224, 224))


def test_quoted_and_float_integers_are_accepted_but_fractions_are_not() -> None:
    assert parse_action("click", {"x": "12", "y": 7.0}) == Click(12, 7)
    with pytest.raises(ActionError, match="y must be an integer, got 7.5"):
        parse_action("click", {"x": 1, "y": 7.5})


def test_done_takes_no_arguments_and_missing_arguments_mean_none() -> None:
    assert parse_action("done", None) == Done()
    with pytest.raises(ActionError, match="done: unexpected argument 'now'"):
        parse_action("done", {"now": True})


def test_action_from_json_rejects_a_shape_that_is_not_a_tool_call() -> None:
    with pytest.raises(ActionError, match='action: must be an object {"name": ..., "arguments": {...}}'):
        action_from_json(["click", 1, 2])


def test_tool_schemas_describe_every_action_with_its_required_arguments() -> None:
    by_name = {t["function"]["name"]: t["function"] for t in COMPUTER_TOOLS}
    assert set(by_name) == {"click", "type", "key", "scroll", "done"}
    assert by_name["click"]["parameters"]["required"] == ["x", "y"]
    assert by_name["done"]["parameters"]["required"] == []
    assert all(k in by_name["key"]["parameters"]["properties"]["key"]["description"] for k in KEYS)
