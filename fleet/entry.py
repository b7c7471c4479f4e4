"""What every entry point does first: parse `[--config FILE] [overrides...]`, load and validate the config before
anything heavy (torch, vLLM) is imported, set up logging, then run. The command line (`launch/cli.py`) and each
service's `main(argv)` (`services/replay_buffer/server.py`, `services/sandbox/server.py`, `rollout/server.py`) use
it; `trainer/main.py` does the same with its world-size check."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from fleet.config import ConfigError, MasterConfig, load_config
from fleet.lifeline import hold_descendants
from fleet.logs import setup_logging


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", default=None, help="YAML config file (defaults when omitted)")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: key=value, +key=value, ~key")


def parse_config_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Overrides may come before or after `--config`: argparse leaves the later ones over, added back here."""
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") and not a.startswith("~")]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def service_main(prog: str, argv: list[str] | None, serve: Callable[[MasterConfig], int]) -> int:
    """`main(argv)` of one service: config and logging, then `serve(cfg)`. A bad config exits 2 naming the key."""
    parser = argparse.ArgumentParser(prog=prog, description=f"{prog}: one service of the fleet")
    add_config_args(parser)
    args = parse_config_args(parser, list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = load_config(args.config, args.overrides)
        setup_logging(cfg.logger.level)
        # Before anything starts a process (vLLM's engine, sandbox runners): what the service starts dies with it,
        # even when it is SIGKILLed.
        hold_descendants()
        return serve(cfg)
    except ConfigError as exc:
        print(f"grpo-fleet: config error: {exc}", file=sys.stderr)
        return 2
