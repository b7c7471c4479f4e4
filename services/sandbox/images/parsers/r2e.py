"""Log parsers of the r2e runtime (registered as `r2e_*` names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PARSERS: dict[str, Callable[[str, Any], dict[str, str]]] = {}
