"""The HTTP spec parser's image fields: accepted beside today's, bad ones named, unset ones never sent."""

from __future__ import annotations

import pytest

from fleet.contracts.sandbox import SpecError, TaskSpec, spec_from_json
from services.sandbox.images.pull import normalize

BASE = {"repo_url": "r", "base_commit": "abc", "patch": "", "fail_to_pass": ["t.py::x"]}


def test_image_fields_are_accepted_beside_the_seed_fields() -> None:
    spec = spec_from_json({**BASE, "image": "swebench/sweb.eval.x86_64.a_1776_b:latest", "eval_script": "echo",
                           "log_parser": "parse_log_pytest", "eval_type": "fail_only"})
    assert (spec.image, spec.eval_script, spec.log_parser, spec.eval_type) == (
        "swebench/sweb.eval.x86_64.a_1776_b:latest", "echo", "parse_log_pytest", "fail_only")


@pytest.mark.parametrize("extra,field", [
    ({"image": 3}, "image"), ({"image": "a b"}, "image"), ({"image": "x", "eval_type": "both"}, "eval_type"),
    ({"eval_script": "echo"}, "eval_script"), ({"image": "x", "log_parser": ["p"]}, "log_parser"),
])
def test_bad_image_fields_are_named(extra: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_from_json({**BASE, **extra})
    assert err.value.field == field


def test_unset_image_fields_are_not_sent_to_seed_executors() -> None:
    body = TaskSpec(repo_url="r", base_commit="c", patch="", test_command="true").to_json()
    assert not {"image", "eval_script", "log_parser", "eval_type", "setup_patch"} & set(body)
    assert spec_from_json(body).image is None


@pytest.mark.parametrize("name,want", [
    ("swebench/sweb.eval.x86_64.a:latest", "docker.io/swebench/sweb.eval.x86_64.a:latest"),
    ("swe/calc", "docker.io/swe/calc:latest"),
    ("127.0.0.1:5000/swe/calc:v1", "127.0.0.1:5000/swe/calc:v1"),
    ("ghcr.io/o/r@sha256:ab", "ghcr.io/o/r@sha256:ab"),
])
def test_image_names_get_the_registry_unless_they_name_one(name: str, want: str) -> None:
    assert normalize(name, "docker.io") == want
