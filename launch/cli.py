"""`grpo-fleet`: the one command line of the project.

    grpo-fleet config show|check [--config FILE] [overrides...]
    grpo-fleet serve replay-buffer|sandbox|rollout|trainer [--config FILE] [overrides...]
    grpo-fleet up [--config FILE] [overrides...]
    grpo-fleet prepare [--config FILE] [overrides...]
    grpo-fleet data build|list|validate [...]
    grpo-fleet status [--config FILE] [overrides...]

The config is parsed and validated before anything heavy (torch, vLLM) is imported, so mistakes fail fast.
`serve NAME` hands the rest of the line to that service's own `main(argv)` (`trainer`: one process; torchrun
trainer/main.py for several). This package is the top floor: it may import every fleet, and nothing imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from fleet.config import ConfigError, MasterConfig, load_config
from fleet.config.loader import dump_config
from fleet.entry import add_config_args, parse_config_args

SERVICES = ("replay-buffer", "sandbox", "rollout", "trainer")


def _load(args: argparse.Namespace) -> MasterConfig:
    return load_config(args.config, args.overrides)


def _cmd_config(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.action == "show":
        sys.stdout.write(dump_config(cfg))
    else:
        print(f"config OK: {args.config or '(defaults)'}")
    return 0


def service_main(name: str) -> Callable[[list[str] | None], int]:
    """The `main(argv)` of service `name`. Imported lazily: each service pulls in only what it needs (the rollout
    worker imports torch and vLLM, after its config is valid)."""
    if name == "replay-buffer":
        from services.replay_buffer.server import main as rb_main

        return rb_main
    if name == "sandbox":
        from services.sandbox.server import main as sb_main

        return sb_main
    if name == "trainer":
        from trainer.main import main as trainer_main

        return trainer_main
    from rollout.server import main as rollout_main

    return rollout_main


def _cmd_up(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from launch.up import up

    return up(cfg, config_path=args.config, overrides=args.overrides)


def _cmd_prepare(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from launch.up import prepare

    prepare(cfg)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from launch.status import show_status

    return show_status(cfg, watch=args.watch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-fleet", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("config", help="show or check a config")
    p.add_argument("action", choices=["show", "check"])
    add_config_args(p)
    p.set_defaults(fn=_cmd_config)
    p = sub.add_parser("serve", help="run one service (its own main(argv) parses the rest of the line)")
    p.add_argument("service", choices=SERVICES)
    add_config_args(p)
    p = sub.add_parser("up", help="run the whole fleet as local processes")
    add_config_args(p)
    p.set_defaults(fn=_cmd_up)
    p = sub.add_parser("prepare", help="make what the config needs before a run (tiny model, task set), then exit")
    add_config_args(p)
    p.set_defaults(fn=_cmd_prepare)
    p = sub.add_parser("status", help="show a running fleet's state")
    p.add_argument("--watch", action="store_true", help="refresh every 2 s")
    add_config_args(p)
    p.set_defaults(fn=_cmd_status)
    sub.add_parser("data", help="build, list or validate task sets (grpo-fleet data --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "data":
        from launch.data.cli import data_main

        return data_main(argv[1:])
    try:
        if len(argv) > 1 and argv[0] == "serve" and argv[1] in SERVICES:
            return int(service_main(argv[1])(argv[2:]))
        args = parse_config_args(build_parser(), argv)
        return int(args.fn(args))
    except ConfigError as exc:
        print(f"grpo-fleet: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
