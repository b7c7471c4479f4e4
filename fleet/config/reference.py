"""Generate docs/configuration.md from the config tree's field docstrings (`python -m fleet.config.reference`).
A test fails when the committed page differs from what this produces."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fleet.config.loader import _section_types, _tag
from fleet.config.schema import MasterConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

HEADER = """# Configuration reference

Generated from the field docstrings of `fleet/config/` by `python -m fleet.config.reference`; do not edit by hand.

A run is configured by one YAML file (optionally inheriting others through `defaults: [base.yaml]`) plus
Hydra-style overrides on the command line: `key.nested=value` sets a key, `+key=value` adds one the file lacks,
`~key` deletes one. Values are YAML (`x=3`, `x=[a,b]`, `x=null`). Unknown keys are errors that name the closest
valid key. `grpo-fleet config show --config FILE [overrides]` prints the resolved tree.
"""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return ""
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return f"`{json.dumps(value)}`"


Section = tuple[str, type[BaseModel], str, str]  # dotted key, model, doc, heading


def _variant_sections(dotted: str, field: FieldInfo, subs: list[type[BaseModel]]) -> list[Section]:
    """One section per variant of a discriminated union (`policy.weight_sync`: one per transport)."""
    if len(subs) == 1 or not isinstance(field.discriminator, str):
        return [(dotted, subs[0], field.description or "", f"`{dotted}`")]
    disc = field.discriminator
    return [(dotted, m, f"{field.description or ''} {m.__doc__ or ''}", f"`{dotted}` ({disc}: `{_tag(m, disc)}`)")
            for m in subs]


def _rows(model: type[BaseModel], prefix: str, sections: list[Section]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        subs = _section_types(field.annotation)
        doc = (field.description or "").replace("\n", " ").replace("|", "\\|")
        if subs and subs[0] is not model:
            sections.extend(_variant_sections(dotted, field, subs))
            if field.default_factory is None:
                rows.append(f"| `{dotted}` | {_default(field)} | {doc} (section, see below) |")
            continue
        rows.append(f"| `{dotted}` | {_default(field)} | {doc} |")
    return rows


def render() -> str:
    out = [HEADER]
    queue: list[Section] = []
    _rows(MasterConfig, "", queue)
    while queue:
        dotted, model, doc, heading = queue.pop(0)
        out.append(f"\n## {heading}\n\n{' '.join(doc.split())}\n")
        out.append("| key | default | meaning |\n|---|---|---|")
        nested: list[Section] = []
        out.extend(_rows(model, f"{dotted}.", nested))
        queue[0:0] = nested
    return "\n".join(out) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run `python -m fleet.config.reference`", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
