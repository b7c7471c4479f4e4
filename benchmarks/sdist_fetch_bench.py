"""What fetching a pinned sdist by its hash from the index (`launch.data.sdist.download_from_index`) saves against
`pip download`, on a recipe's real pins, in one sitting:

    .venv/bin/python benchmarks/sdist_fetch_bench.py --recipe benchmarks/speedrun/tasks.yaml

Each sdist (the recipe's repositories and vendored packages) is fetched into an empty cache both ways, the order
alternating from one sdist to the next so that load and the network hit both alike; both must give the pinned bytes.
`pip download` (`launch.data.sdist.pip_download`) is the fallback `fetch_sdist` used alone before: it prepares each
sdist's metadata in a build environment of its own. Writes `benchmarks/results/sdist_fetch.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.data.recipe import load_recipe  # noqa: E402
from launch.data.sdist import download_from_index, index_url, pip_download, sha256_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def by_index(package: str, version: str, sha: str, dest: Path) -> Path:
    got = download_from_index(package, version, sha, dest)
    if got is None:
        raise SystemExit(f"{index_url()} did not serve {package}=={version} by its hash")
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", type=Path, default=ROOT / "benchmarks" / "speedrun" / "tasks.yaml")
    p.add_argument("--limit", type=int, default=None, help="the recipe's first N sdists only")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sdist_fetch.json")
    args = p.parse_args()
    pins = [pin for r in load_recipe(args.recipe).repos
            for pin in [(r.package, r.version, r.sha256), *((v.package, v.version, v.sha256) for v in r.vendor)]]
    rows: list[dict[str, object]] = []
    times: dict[str, list[float]] = {"pip": [], "index": []}
    for i, (package, version, sha) in enumerate(pins[:args.limit]):
        row: dict[str, object] = {"sdist": f"{package}=={version}"}
        for way in (("pip", "index") if i % 2 == 0 else ("index", "pip")):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                got = (pip_download(package, f"{package}=={version}", Path(tmp)) if way == "pip"
                       else by_index(package, version, sha, Path(tmp)))
                times[way].append(time.perf_counter() - t0)
                if sha256_file(got) != sha:
                    raise SystemExit(f"{way}: {got.name} is not the pinned {package}=={version}")
                row[f"{way}_s"], row["bytes"] = round(times[way][-1], 2), got.stat().st_size
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "recipe": str(args.recipe.relative_to(ROOT) if args.recipe.is_relative_to(ROOT) else args.recipe),
        "index": index_url(), "sdists": len(rows),
        "seconds": {way: round(sum(t), 1) for way, t in times.items()},
        "median_s": {way: round(statistics.median(t), 2) for way, t in times.items()},
        "speedup": round(sum(times["pip"]) / sum(times["index"]), 1),
        "host": {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2),
                 "python": platform.python_version()},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
