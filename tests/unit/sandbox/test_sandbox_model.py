"""The wire format of a task: every bad field is named, and a Verdict survives the JSON round trip."""

from __future__ import annotations

import json

import pytest

from fleet.contracts.sandbox import SpecError, TaskSpec, Verdict, check_spec, spec_from_json

GOOD = {"repo_url": "embedded://calc", "base_commit": "abc123", "patch": "", "fail_to_pass": ["t.py::test_a"]}


def test_minimal_request_becomes_a_spec_with_defaults() -> None:
    spec = spec_from_json(GOOD)
    assert spec == TaskSpec(repo_url="embedded://calc", base_commit="abc123", patch="", fail_to_pass=["t.py::test_a"])
    assert spec.timeout == 1800.0 and spec.integrity_check  # the SWE-bench harness's default


def test_swebench_style_json_text_lists_are_accepted() -> None:
    spec = spec_from_json({**GOOD, "fail_to_pass": json.dumps(["a.py::t[x y]"]), "pass_to_pass": "[]"})
    assert spec.fail_to_pass == ["a.py::t[x y]"] and spec.pass_to_pass == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({k: v for k, v in GOOD.items() if k != "repo_url"}, "repo_url"),
        ({**GOOD, "repo_url": "  "}, "repo_url"),
        ({**GOOD, "base_commit": "--upload-pack=x"}, "base_commit"),
        ({**GOOD, "base_commit": "a b"}, "base_commit"),
        ({k: v for k, v in GOOD.items() if k != "patch"}, "patch"),
        ({**GOOD, "patch": 3}, "patch"),
        ({**GOOD, "fail_to_pass": "not json"}, "fail_to_pass"),
        ({**GOOD, "pass_to_pass": [1]}, "pass_to_pass"),
        ({**GOOD, "fail_to_pass": ["--junitxml=/etc/x::t"]}, "fail_to_pass"),
        ({**GOOD, "fail_to_pass": ["../up.py::t"]}, "fail_to_pass"),
        ({**GOOD, "timeout": 0}, "timeout"),
        ({**GOOD, "timeout": 10**6}, "timeout"),
        ({**GOOD, "timeout": True}, "timeout"),
        ({**GOOD, "timeout": "5"}, "timeout"),
        ({**GOOD, "integrity_check": "yes"}, "integrity_check"),
        ({**GOOD, "fail_to_pass_first": 1}, "fail_to_pass_first"),
        ({**GOOD, "fail_to_pas": []}, "fail_to_pas"),
        ({**GOOD, "fail_to_pass": []}, "test_command"),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_json(body, max_timeout=3600)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_body_must_be_an_object() -> None:
    with pytest.raises(SpecError, match="body: must be a JSON object"):
        spec_from_json(["x"])


def test_in_process_specs_obey_the_same_rules() -> None:
    with pytest.raises(SpecError, match="either test_command or fail_to_pass"):
        check_spec(TaskSpec(repo_url="r", base_commit="c", patch=""))


def test_verdict_round_trips_and_ignores_unknown_keys() -> None:
    verdict = Verdict(status="completed", patch_applied=True, test_status={"a.py::t[x y]": "PASSED"},
                      resolution="FULL", report={"FAIL_TO_PASS": {"success": ["a.py::t[x y]"], "failure": []}})
    data = json.loads(json.dumps(verdict.to_json()))
    assert Verdict.from_json({**data, "added_by_a_newer_executor": 1}) == verdict


def test_fail_to_pass_first_travels_only_when_set() -> None:
    """A seed executor rejects keys it does not know: the flag is left out of the JSON unless it is on."""
    assert "fail_to_pass_first" not in TaskSpec(**GOOD).to_json()  # type: ignore[arg-type]
    on = TaskSpec(**GOOD, fail_to_pass_first=True)  # type: ignore[arg-type]
    assert on.to_json()["fail_to_pass_first"] is True
    assert spec_from_json(on.to_json()) == on
