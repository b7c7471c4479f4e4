"""Download the problem-statement images of SWE-bench Multimodal rows into an assets folder, on a machine with internet.

    python scripts/fetch_image_assets.py data/swe-bench-multimodal/data/*.parquet --out data/swe-bench-multimodal/assets

(`--out`: `assets/` in the folder `data.*.data_path` names, or in the file's folder, or `data.*.assets_dir`.)

Each image is saved as `<sha256 of its URL>.<ext>`, the name the loader looks for (`envs/swe/assets.py`); images already
there are skipped, so a rerun fetches only what failed. Copy the folder beside the data on the training machines (or
point `data.*.assets_dir` at it). Only `image_assets["problem_statement"]` is fetched: the patch-side images are the
grader's, not the policy's. Exit status 1 when any image could not be fetched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envs.swe.assets import fetch_assets
from envs.swe.loaders import read_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("files", nargs="+", type=Path, help="task files (.parquet, .jsonl, .json)")
    parser.add_argument("--out", type=Path, required=True,
                        help="assets folder: `assets/` in data.*.data_path's folder, or data.*.assets_dir")
    args = parser.parse_args(argv)
    out = args.out
    rows = [row for file in args.files for _, row in read_rows(file)]
    fetched, present, failed = fetch_assets(rows, out)
    print(f"{out}: {fetched} fetched, {present} already there, {len(failed)} failed")
    for line in failed:
        print(f"  failed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
