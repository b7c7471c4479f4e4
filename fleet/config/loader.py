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


def _model_at(path: list[str]) -> type[BaseModel] | None:
    """The pydantic section model at a dotted path, or None when the path leads into a non-section value."""
    model: type[BaseModel] = MasterConfig
    for part in path:
        field = model.model_fields.get(part)
        if field is None:
            return None
        sub = _section_type(field.annotation)
        if sub is None:
            return None
        model = sub
    return model


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _unknown_key_error(dotted: str) -> ConfigError:
    parts = dotted.split(".")
    model = _model_at(parts[:-1])
    valid = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(parts[-1], valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{'.'.join([*parts[:-1], close[0]])}'?" if close else ""
    if not hint and valid:
        hint = f"; valid keys here: {', '.join(sorted(valid))}"
    return ConfigError(f"unknown config key '{dotted}'{hint}")


def _check_known(tree: dict[str, Any], prefix: list[str]) -> None:
    model = _model_at(prefix)
    if model is None:
        return
    for key, value in tree.items():
        if key not in model.model_fields:
            raise _unknown_key_error(".".join([*prefix, str(key)]))
        if isinstance(value, dict) and _model_at([*prefix, key]) is not None:
            _check_known(value, [*prefix, key])


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
    exists = _model_at(parts[:-1]) is not None and parts[-1] in (_model_at(parts[:-1]) or MasterConfig).model_fields
    if not exists and not adding:
        raise _unknown_key_error(dotted)
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: '{part}' holds a value, not a section")
        node = child
    node[parts[-1]] = _parse_value(text, dotted)


def _validation_error(exc: ValidationError) -> ConfigError:
    lines = []
    for err in exc.errors():
        dotted = ".".join(str(p) for p in err["loc"])
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
