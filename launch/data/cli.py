"""`grpo-fleet data ...`: build the embedded SWE task set, list what a built one holds, merge two builds, restate its
problem statements, or validate any SWE dataset's rows (gold FULL, empty NO) through the sandbox.

`launch/cli.py` calls `data_main(argv)`; heavy imports (LibCST, the executor) happen only inside the subcommands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from envs.swe.paths import default_sdist_cache, default_task_dir
from fleet.entry import add_config_args, parse_config_args

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo-fleet data", description="SWE task data: build and inspect task sets.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the embedded task set (sdists -> bugs -> sandbox-validated tasks)")
    b.add_argument("--out", type=Path, default=default_task_dir(), help="task-set folder (default: %(default)s)")
    b.add_argument("--repos", default="", help="comma-separated recipe repositories (default: all)")
    b.add_argument("--max-per-repo", type=int, default=32, help="tasks per repository at most (default: %(default)s)")
    b.add_argument("--seed", type=int, default=0, help="candidate order seed (default: %(default)s)")
    b.add_argument("--max-seconds", type=float, default=None,
                   help="stop validating after this many seconds and write the tasks accepted by then")
    b.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="sandbox runs in parallel (default: cores, %(default)s)")
    b.add_argument("--cache-dir", type=Path, default=default_sdist_cache(),
                   help="downloaded sdists (default: %(default)s)")
    b.add_argument("--recipe", type=Path, default=None, help="recipe YAML (default: launch/data/recipe.yaml)")
    b.add_argument("--kinds", default="", help="comma-separated bug kinds (default: all)")
    b.add_argument("--verbose", action="store_true", help="log every sandbox run")
    b.add_argument("--python", default=None,
                   help="the interpreter (and its pytest) the tasks' tests run on, as sandbox.python: the set's test "
                        "ids are that pytest's names, so train on the same (default: this Python)")
    b.add_argument("--images", action="store_true",
                   help="build an instance image per task (SWE-bench style), push it to --registry and record it in "
                        "the rows, so the fleet runs the set on the image path (the set is built first if missing)")
    b.add_argument("--registry", default="", help="--images: registry to push to, HOST[:PORT] (e.g. 127.0.0.1:5000)")
    b.add_argument("--namespace", default="grpo-fleet", help="--images: image namespace (default: %(default)s)")
    b.add_argument("--insecure-registry", action="store_true", help="--images: plain HTTP / unverified TLS")
    r = sub.add_parser("restate", help="rewrite a built task set's problem statements under a recipe's "
                                       "statement_frames (one sandbox run per task; nothing else in a row changes)")
    r.add_argument("--data", type=Path, default=default_task_dir(), help="task-set folder (default: %(default)s)")
    r.add_argument("--recipe", type=Path, required=True, help="recipe YAML whose statement_frames to apply")
    r.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="sandbox runs in parallel (default: cores, %(default)s)")
    m = sub.add_parser("merge", help="one task set from two builds of the same recipe: OTHER's repositories "
                                     "replace BASE's, the rest of BASE is kept (grow a set one repository at a time)")
    m.add_argument("base", type=Path, help="task-set folder whose other repositories are kept")
    m.add_argument("other", type=Path, help="task-set folder (e.g. `data build --repos ...`) whose repositories win")
    m.add_argument("--out", type=Path, required=True, help="the merged set's folder (must not exist)")
    ls = sub.add_parser("list", help="counts per repository and bug kind of a built task set")
    ls.add_argument("--data", type=Path, default=default_task_dir(), help="task-set folder (default: %(default)s)")
    v = sub.add_parser("validate", help="grade N rows' gold and empty patches in the sandbox; exit 1 unless every "
                                        "gold resolves FULL and every empty patch NO",
                       description="The dataset is the one training would read: data.train.* from --config and "
                                   "overrides (e.g. data.train.dataset_name=swebench data.train.data_path=F.jsonl).")
    v.add_argument("--gold", type=int, required=True, metavar="N",
                   help="rows to grade, spread round-robin over the repos (0: every row)")
    v.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="sandbox runs at once (default: cores, %(default)s)")
    v.add_argument("--remote", action="store_true",
                   help="grade on the sandbox service at env.code.sandbox_urls (default: an in-process executor "
                        "with the config's sandbox section)")
    v.add_argument("--out", type=Path, default=None, help="also write the report as JSON to this file")
    v.add_argument("--verbose", action="store_true", help="log every sandbox run")
    add_config_args(v)
    return p


def _build_images(args: argparse.Namespace) -> int:
    from launch.data.image_build import build_task_images

    if not args.registry:
        print("error: --images needs --registry HOST[:PORT] (where executors will pull the images from)",
              file=sys.stderr)
        return 2
    if not (args.out / "train.jsonl").is_file():
        code = _build_tasks(args)
        if code:
            return code
    try:
        report = build_task_images(args.out, args.registry, namespace=args.namespace,
                                   tls_verify=not args.insecure_registry)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"built and pushed {report.images} images to {report.registry} in {report.seconds:.0f} s; run the set with "
          f"sandbox.image_registry={report.registry}" + (" sandbox.image_tls_verify=false"
                                                         if args.insecure_registry else ""))
    return 0


def _build(args: argparse.Namespace) -> int:
    return _build_images(args) if args.images else _build_tasks(args)


def _build_tasks(args: argparse.Namespace) -> int:
    from envs.swe.taskset import format_summary, summarize
    from fleet.config.infra import SandboxConfig
    from launch.data.builder import BuildOptions, build_taskset
    from launch.data.mutations import BUG_KINDS

    kinds = tuple(k for k in args.kinds.split(",") if k) or BUG_KINDS
    unknown = [k for k in kinds if k not in BUG_KINDS]
    if unknown:
        print(f"error: --kinds: unknown bug kind(s) {unknown}; known: {', '.join(BUG_KINDS)}", file=sys.stderr)
        return 2
    if args.max_per_repo < 1 or args.workers < 1:
        print("error: --max-per-repo and --workers must be >= 1", file=sys.stderr)
        return 2
    if args.max_seconds is not None and args.max_seconds <= 0:
        print(f"error: --max-seconds must be > 0, got {args.max_seconds}", file=sys.stderr)
        return 2
    if not args.verbose:  # hundreds of runs: one line each is noise next to the per-repository progress
        logging.getLogger("services.sandbox.executor").setLevel(logging.WARNING)
    opts = BuildOptions(out=args.out, repos=[r for r in args.repos.split(",") if r] or None,
                        max_per_repo=args.max_per_repo, seed=args.seed, workers=args.workers,
                        cache_dir=args.cache_dir, recipe_path=args.recipe, kinds=kinds, max_seconds=args.max_seconds,
                        sandbox=SandboxConfig(python=args.python) if args.python else None)
    try:
        report = asyncio.run(build_taskset(opts))
    except (KeyError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_summary(summarize(args.out)))
    runs = sum(r.sandbox_runs for r in report.repos.values())
    print(f"\nbuilt {len(report.tasks)} tasks in {report.seconds:.0f} s ({runs} sandbox runs) -> {args.out}")
    return 0


def _restate(args: argparse.Namespace) -> int:
    from launch.data.recipe import load_recipe
    from launch.data.restate import restate_taskset

    if args.workers < 1:
        print("error: --workers must be >= 1", file=sys.stderr)
        return 2
    logging.getLogger("services.sandbox.executor").setLevel(logging.WARNING)
    try:
        recipe = load_recipe(args.recipe)
        report = asyncio.run(restate_taskset(args.data, recipe, args.workers))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    kept = ", ".join(f"{n} {why}" for why, n in sorted(report.kept.items())) or "none"
    print(f"restated {report.rows} rows of {args.data} ({args.recipe}: statement_frames={recipe.statement_frames}) "
          f"in {report.seconds:.0f} s: {report.changed} statements changed; kept as they were: {kept}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from launch.data.merge import format_merge, merge_tasksets

    try:
        report = merge_tasksets(args.base, args.other, args.out)
    except (FileExistsError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_merge(report))
    return 0


def _list(args: argparse.Namespace) -> int:
    from envs.swe.taskset import format_summary, summarize

    if not (args.data / "train.jsonl").is_file():
        print(f"error: no task set in {args.data} (build one: grpo-fleet data build --out {args.data})",
              file=sys.stderr)
        return 1
    print(format_summary(summarize(args.data)))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from envs.registry import load_dataset
    from envs.swe.loaders import DatasetFormatError
    from envs.swe.paths import repos_dir
    from envs.swe.taskset import read_manifest
    from fleet.config import ConfigError, load_config
    from fleet.contracts.sandbox import describe_runner, runner_mismatch
    from launch.data.gold import format_report, pick_rows, report_json, validate_tasks

    if args.gold < 0 or args.workers < 1:
        print("error: --gold must be >= 0 and --workers >= 1", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"grpo-fleet: config error: {exc}", file=sys.stderr)
        return 2
    try:
        dataset = load_dataset(cfg.data.train, env_cfg=cfg.env, seed=cfg.grpo.seed)
    except (DatasetFormatError, FileNotFoundError, KeyError, ValueError) as exc:
        print(f"error: dataset {cfg.data.train.dataset_name}: {exc}", file=sys.stderr)
        return 2
    if dataset.env_name != "swe":
        print(f"error: data validate grades SWE tasks; {dataset.name} is a {dataset.env_name!r} dataset",
              file=sys.stderr)
        return 2
    if dataset.root is not None and cfg.sandbox.repos_root is None:  # an embedded set's embedded:// repos
        cfg = cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(
            update={"repos_root": str(repos_dir(dataset.root))})})
    if not args.verbose:  # one line per run is noise next to the table
        logging.getLogger("services.sandbox.executor").setLevel(logging.WARNING)
    tasks = pick_rows(list(dataset), args.gold)
    where = ", ".join(cfg.env.code.sandbox_urls) if args.remote else "an in-process executor"
    print(f"grading {len(tasks)} of {len(dataset)} rows of {dataset.name} (gold and empty patch) on {where}",
          file=sys.stderr)
    result = asyncio.run(validate_tasks(tasks, cfg, remote=args.remote, concurrency=args.workers))
    rows = result.rows
    made_with = read_manifest(dataset.root).get("test_runner", {}) if dataset.root is not None else {}
    mismatch = runner_mismatch(made_with, result.test_runner)
    print(format_report(rows))
    print(f"\ntests ran with {describe_runner(result.test_runner)}"
          + (f"; the task set's ids were made with {describe_runner(made_with)}" if made_with else ""))
    if mismatch:
        print(f"warning: {mismatch}")
    if args.out is not None:
        runner = {"executor": result.test_runner, "task_set": made_with, "mismatch": mismatch}
        args.out.write_text(json.dumps(report_json(rows, dataset.name, runner), indent=2) + "\n")
    return 0 if all(r.ok for r in rows) else 1


def data_main(argv: list[str]) -> int:
    args = parse_config_args(_parser(), argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    commands = {"build": _build, "list": _list, "merge": _merge, "restate": _restate, "validate": _validate}
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(data_main(sys.argv[1:]))
