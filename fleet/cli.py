"""`grpo-fleet`: the one command line of the project.

    grpo-fleet config show|check [--config FILE] [overrides...]
    grpo-fleet serve replay-buffer|sandbox|rollout [--config FILE] [overrides...]
    grpo-fleet up [--config FILE] [overrides...]
    grpo-fleet prepare [--config FILE] [overrides...]
    grpo-fleet data build|list [...]
    grpo-fleet status [--config FILE] [overrides...]

The config is parsed and validated before anything heavy (torch, vLLM) is imported, so mistakes fail fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from fleet.config import ConfigError, MasterConfig, load_config
from fleet.config.loader import dump_config

SERVICES = ("replay-buffer", "sandbox", "rollout")


def setup_logging(level: str = "INFO", prefix: str = "") -> None:
    fmt = f"%(asctime)s {prefix}%(levelname).1s %(name)s: %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, datefmt="%H:%M:%S", force=True)


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", default=None, help="YAML config file (defaults when omitted)")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: key=value, +key=value, ~key")


def _load(args: argparse.Namespace) -> MasterConfig:
    return load_config(args.config, args.overrides)


def _cmd_config(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.action == "show":
        sys.stdout.write(dump_config(cfg))
    else:
        print(f"config OK: {args.config or '(defaults)'}")
    return 0


def _service_main(name: str) -> Callable[[MasterConfig], int]:
    # Imported lazily: each service pulls in only what it needs (the rollout worker imports torch and vLLM).
    if name == "replay-buffer":
        from services.replay_buffer.server import main as rb_main

        return rb_main
    if name == "sandbox":
        from services.sandbox.server import main as sb_main

        return sb_main
    from rollout.server import main as rollout_main

    return rollout_main


def _cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    setup_logging(cfg.logger.level)
    return _service_main(args.service)(cfg)


def _cmd_up(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from fleet.launcher.up import up

    return up(cfg, config_path=args.config, overrides=args.overrides)


def _cmd_prepare(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from fleet.launcher.up import prepare

    prepare(cfg)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from fleet.status import show_status

    return show_status(cfg, watch=args.watch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-fleet", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("config", help="show or check a config")
    p.add_argument("action", choices=["show", "check"])
    _config_args(p)
    p.set_defaults(fn=_cmd_config)
    p = sub.add_parser("serve", help="run one service")
    p.add_argument("service", choices=SERVICES)
    _config_args(p)
    p.set_defaults(fn=_cmd_serve)
    p = sub.add_parser("up", help="run the whole fleet as local processes")
    _config_args(p)
    p.set_defaults(fn=_cmd_up)
    p = sub.add_parser("prepare", help="make what the config needs before a run (tiny model, task set), then exit")
    _config_args(p)
    p.set_defaults(fn=_cmd_prepare)
    p = sub.add_parser("status", help="show a running fleet's state")
    p.add_argument("--watch", action="store_true", help="refresh every 2 s")
    _config_args(p)
    p.set_defaults(fn=_cmd_status)
    sub.add_parser("data", help="build or list task sets (grpo-fleet data --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "data":
        from envs.cli import data_main

        return data_main(argv[1:])
    parser = build_parser()
    # Overrides may come before or after --config; argparse leaves the later ones over.
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") and not a.startswith("~")]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return int(args.fn(args))
    except ConfigError as exc:
        print(f"grpo-fleet: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
