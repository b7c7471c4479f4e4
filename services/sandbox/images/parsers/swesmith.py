"""Log parsers of the swesmith runtime (registered as `swesmith_*` names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PARSERS: dict[str, Callable[[str, Any], dict[str, str]]] = {}
