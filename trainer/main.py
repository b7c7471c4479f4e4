"""The trainer's entry point.

    torchrun --nproc-per-node=N trainer/main.py --config FILE [key=value ...]
    python trainer/main.py --config FILE [key=value ...]          # one process

The config is loaded and validated (and checked against the world size) before torch is imported: a config that
cannot run fails in well under a second, before any model loads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script, sys.path[0] is trainer/ itself: its modules (data, metrics, ...) would shadow top-level names.
    sys.path[0] = str(Path(__file__).resolve().parents[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trainer/main.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", "-c", default=None, help="YAML config file (defaults when omitted)")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: key=value, +key=value, ~key")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from fleet.config import ConfigError, load_config
    from fleet.logs import setup_logging
    from trainer.dist import check_world, read_env

    env = read_env()
    try:
        cfg = load_config(args.config, args.overrides)
        check_world(cfg.policy, cfg.cluster, env.world_size)
    except ConfigError as exc:
        print(f"trainer: config error: {exc}", file=sys.stderr)
        return 2
    setup_logging(cfg.logger.level, prefix=f"[trainer {env.rank}] ")
    from trainer.app import run  # torch, transformers: only now

    return run(cfg)


if __name__ == "__main__":
    raise SystemExit(main())
