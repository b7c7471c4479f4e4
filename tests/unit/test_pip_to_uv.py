"""scripts/pip_to_uv.py: the host's pip index settings reach uv as pip would apply them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pip_to_uv.py"
_SPEC = importlib.util.spec_from_file_location("pip_to_uv", SCRIPT)
assert _SPEC and _SPEC.loader
pip_to_uv = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pip_to_uv)

LISTING = """\
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/ignored/because/env/wins'
global.index-url='https://global.invalid/simple'
install.index-url='https://install.invalid/simple'
global.cert='/etc/ssl/certs/ca-certificates.crt'
"""


def test_env_beats_install_beats_global_and_unknown_keys_are_dropped() -> None:
    assert pip_to_uv.pip_settings(LISTING) == {
        "find-links": "/opt/wheels",
        "constraint": "/etc/xdg/pip/constraints.txt",
        "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "index-url": "https://install.invalid/simple",
    }


def test_several_indexes_become_one_flag_each_and_every_index_is_searched() -> None:
    args = pip_to_uv.uv_args(pip_to_uv.pip_settings(LISTING))
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    pairs = list(zip(args[2::2], args[3::2], strict=True))
    assert ("--extra-index-url", "file:///opt/pypi/simple") in pairs
    assert ("--extra-index-url", "file:///opt/pypi-more/simple") in pairs
    assert ("--default-index", "https://install.invalid/simple") in pairs
    assert ("--find-links", "/opt/wheels") in pairs and ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs


def test_no_pip_configuration_gives_only_the_strategy() -> None:
    assert pip_to_uv.uv_args(pip_to_uv.pip_settings("")) == ["--index-strategy", "unsafe-best-match"]
