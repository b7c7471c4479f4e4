"""Log parsers beyond swebench's PARSER_REGISTRY, for the harnesses whose runtimes parse logs their own way.

`install()` adds them to swebench's registry dict, which `grading.get_logs_eval` looks parsers up in, so every image
task is graded by the one swebench grading path whatever its format. Each parser has swebench's signature,
`(log: str, test_spec) -> {test: status}` with statuses from `swebench.harness.constants.TestStatus`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.sandbox.images.parsers import r2e, swegym, swesmith

Parser = Callable[[str, Any], dict[str, str]]
EXTRA_PARSERS: dict[str, Parser] = {**r2e.PARSERS, **swegym.PARSERS, **swesmith.PARSERS}


def install() -> None:
    from swebench.harness.log_parsers import PARSER_REGISTRY

    clash = sorted(set(EXTRA_PARSERS) & {k for k, v in PARSER_REGISTRY.items() if v is not EXTRA_PARSERS.get(k)})
    if clash:
        raise RuntimeError(f"extra log parsers shadow swebench's: {', '.join(clash)}")
    PARSER_REGISTRY.update(EXTRA_PARSERS)


def known(name: str) -> bool:
    from swebench.harness.log_parsers import PARSER_REGISTRY

    return name in PARSER_REGISTRY or name in EXTRA_PARSERS
