"""YAML + Hydra-style overrides -> `MasterConfig`.

Overrides: `key=value` sets an existing key, `+key=value` adds a key that the file lacks, `~key` deletes one.
Values are parsed as YAML scalars/lists (`x=3` is an int, `x=[a,b]` a list, `x=null` None). A YAML file may start
with `defaults: [base.yaml, ...]`: those files are loaded first (relative to it) and this file is merged on top.
Every error names the dotted key at fault and, for a misspelling, the closest valid key.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from fleet.config.schema import MasterConfig


class ConfigError(ValueError):
    """A config that cannot be loaded or validated; the message names the dotted key."""


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: `defaults` include cycle ({' -> '.join(p.name for p in (*seen, path))})")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(raw).__name__}")
    defaults = raw.pop("defaults", []) or []
    if isinstance(defaults, str):
        defaults = [defaults]
    merged: dict[str, Any] = {}
    for name in defaults:
        base = path.parent / (name if str(name).endswith((".yaml", ".yml")) else f"{name}.yaml")
        merged = _merge(merged, _read_yaml(base, (*seen, path)))
    return _merge(merged, raw)


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _model_at(path: list[str], tree: dict[str, Any] | None = None) -> type[BaseModel] | None:
    """The pydantic section model at a dotted path, or None when the path leads into a non-section value. Where a
    section is a union of variants (`policy.weight_sync`), `tree` (the raw config) picks the one its tag names."""
    model: type[BaseModel] = MasterConfig
    node: Any = tree
    for part in path:
        field = model.model_fields.get(part)
        if field is None:
            return None
        node = node.get(part) if isinstance(node, dict) else None
        sub = _variant(field, node)
        if sub is None:
            return None
        model = sub
    return model


def _section_types(annotation: Any) -> list[type[BaseModel]]:
    """The section models a field's annotation names: one, or every variant of a union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [a for a in getattr(annotation, "__args__", ()) or () if isinstance(a, type) and issubclass(a, BaseModel)]


def _section_type(annotation: Any) -> type[BaseModel] | None:
    models = _section_types(annotation)
    return models[0] if models else None


def _tag(model: type[BaseModel], discriminator: str) -> Any:
    return model.model_fields[discriminator].default


def _variant(field: FieldInfo, value: Any) -> type[BaseModel] | None:
    """The section model of `field` for the raw `value`: for a discriminated union, the variant its tag names (the
    default's variant when it names none; None for an unknown tag, which validation then reports)."""
    models = _section_types(field.annotation)
    if len(models) < 2 or not isinstance(field.discriminator, str):
        return models[0] if models else None
    tag = value.get(field.discriminator) if isinstance(value, dict) else None
    if tag is None:
        return type(field.default_factory()) if field.default_factory is not None else None  # type: ignore[call-arg]
    return next((m for m in models if _tag(m, field.discriminator) == tag), None)


def _other_variant_hint(parts: list[str]) -> str:
    """'; it is a key of policy.weight_sync.transport=grpc' when another variant of the section has the key."""
    model: type[BaseModel] = MasterConfig
    for i, part in enumerate(parts[:-1]):
        field = model.model_fields.get(part)
        if field is None or not _section_types(field.annotation):
            return ""
        if i == len(parts) - 2 and isinstance(field.discriminator, str):
            tags = [str(_tag(m, field.discriminator)) for m in _section_types(field.annotation)
                    if parts[-1] in m.model_fields]
            where = ".".join([*parts[:-1], field.discriminator])
            return f"; it is a key of {where}={' or '.join(tags)}" if tags else ""
        model = _section_types(field.annotation)[0]
    return ""


def _unknown_key_error(dotted: str, tree: dict[str, Any] | None = None) -> ConfigError:
    parts = dotted.split(".")
    model = _model_at(parts[:-1], tree)
    valid = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(parts[-1], valid, n=1, cutoff=0.5)
    hint = _other_variant_hint(parts) or (f"; did you mean '{'.'.join([*parts[:-1], close[0]])}'?" if close else "")
    if not hint and valid:
        hint = f"; valid keys here: {', '.join(sorted(valid))}"
    return ConfigError(f"unknown config key '{dotted}'{hint}")


def _check_known(tree: dict[str, Any], prefix: list[str], root: dict[str, Any] | None = None) -> None:
    root = tree if root is None else root
    model = _model_at(prefix, root)
    if model is None:
        return
    for key, value in tree.items():
        if key not in model.model_fields:
            raise _unknown_key_error(".".join([*prefix, str(key)]), root)
        if isinstance(value, dict) and _model_at([*prefix, key], root) is not None:
            _check_known(value, [*prefix, key], root)


def _keys_of_any_variant(path: list[str]) -> set[str]:
    """The keys of the section at `path`, of every variant where a section along it is a union."""
    models: list[type[BaseModel]] = [MasterConfig]
    for part in path:
        models = [sub for m in models if part in m.model_fields
                  for sub in _section_types(m.model_fields[part].annotation)]
    return {key for m in models for key in m.model_fields}


def _parse_value(text: str, dotted: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {dotted}: cannot parse value {text!r}: {exc}") from exc


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Apply one Hydra-style override to a raw config tree (in place)."""
    if override.startswith("~"):
        dotted = override[1:].split("=", 1)[0]
        parts = dotted.split(".")
        node = tree
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None  # type: ignore[assignment]
        if not isinstance(node, dict) or parts[-1] not in node:
            raise ConfigError(f"override ~{dotted}: key '{dotted}' is not set, nothing to delete")
        del node[parts[-1]]
        return
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key=value, +key=value or ~key")
    key, text = override.split("=", 1)
    adding = key.startswith("+")
    dotted = key.lstrip("+")
    if not dotted or any(not p for p in dotted.split(".")):
        raise ConfigError(f"override {override!r}: empty key")
    parts = dotted.split(".")
    # Any variant's key may be set here: the tag may come in a later override; `_check_known` judges the result.
    exists = parts[-1] in _keys_of_any_variant(parts[:-1])
    if not exists and not adding:
        raise _unknown_key_error(dotted, tree)
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: '{part}' holds a value, not a section")
        node = child
    node[parts[-1]] = _parse_value(text, dotted)


def _dotted(loc: tuple[int | str, ...]) -> str:
    """An error location as the config key: a union's tag (`policy.weight_sync.grpc.chunk_mb`) is not a key."""
    parts: list[str] = []
    model: type[BaseModel] | None = MasterConfig
    i = 0
    while i < len(loc):
        part = str(loc[i])
        parts.append(part)
        i += 1
        field = model.model_fields.get(part) if model is not None else None
        models = _section_types(field.annotation) if field is not None else []
        model = models[0] if models else None
        if field is not None and len(models) > 1 and isinstance(field.discriminator, str) and i < len(loc):
            tags = {str(_tag(m, field.discriminator)): m for m in models}
            if str(loc[i]) in tags:
                model = tags[str(loc[i])]
                i += 1
    return ".".join(parts)


def _validation_error(exc: ValidationError) -> ConfigError:
    lines = []
    for err in exc.errors():
        dotted = _dotted(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{dotted}: {msg}" if dotted else msg)
    return ConfigError("invalid config:\n  " + "\n  ".join(lines))


def parse_config(tree: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> MasterConfig:
    """Validate a raw tree (plus overrides) into a `MasterConfig`."""
    tree = copy.deepcopy(tree)
    for override in overrides:
        apply_override(tree, override)
    _check_known(tree, [])
    try:
        return MasterConfig.model_validate(tree)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> MasterConfig:
    """Load a YAML file (with `defaults:` inheritance) and apply overrides. `path=None` starts from defaults."""
    tree = _read_yaml(Path(path)) if path is not None else {}
    return parse_config(tree, overrides)


def dump_config(cfg: MasterConfig) -> str:
    """The resolved config as YAML (what is written to the run directory)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def write_resolved(cfg: MasterConfig, run_dir: str | Path) -> Path:
    """Write the resolved config to RUN_DIR/config.yaml atomically."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".config.yaml.tmp"
    tmp.write_text(dump_config(cfg))
    tmp.replace(out / "config.yaml")
    return out / "config.yaml"
