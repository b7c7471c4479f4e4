"""Regenerate the vendored harness specs in envs/swe/harnesses/data/ from the harnesses' own code.

  swebench_4_1.json    from swebench 4.x (PyPI)
  swe_gym_fork.json    from the SWE-Gym fork of SWE-bench (github.com/SWE-Gym/SWE-Bench-Fork, not on PyPI), with
                       `--swe-gym <checkout of the fork>`

swebench 5 dropped MAP_REPO_VERSION_TO_SPECS (its rows carry their eval script), so the per-repo, per-version specs
that grade princeton-nlp rows are vendored as data. Run with swebench 4.1 importable, e.g.:

    pip install --no-deps --target /tmp/swebench-4.1 swebench==4.1.0
    PYTHONPATH=/tmp/swebench-4.1 python scripts/regen_swebench_specs.py
    PYTHONPATH=/path/to/SWE-Bench-Fork python scripts/regen_swebench_specs.py --swe-gym /path/to/SWE-Bench-Fork
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Only what the eval script and the grading read; environment-image keys (packages, pip_packages, docker_specs,
# ...) are the image builder's business and stay out.
EVAL_KEYS = ("test_cmd", "eval_commands", "install", "build")
DATA = Path(__file__).resolve().parents[1] / "envs" / "swe" / "harnesses" / "data"
OUT = DATA / "swebench_4_1.json"


def swe_gym(fork: Path) -> None:
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS, NON_TEST_EXTS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    commit = subprocess.run(["git", "-C", str(fork), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip() or "unknown"
    data = {
        "source": f"github.com/SWE-Gym/SWE-Bench-Fork@{commit}: swebench/harness/constants.py "
                  "MAP_REPO_VERSION_TO_SPECS, NON_TEST_EXTS; log_parsers.py MAP_REPO_TO_PARSER (repo keys lower-case, "
                  "as the fork looks them up)",
        "fork_commit": commit,
        "non_test_exts": list(NON_TEST_EXTS),
        "parser": {repo.lower(): fn.__name__ for repo, fn in sorted(MAP_REPO_TO_PARSER.items())},
        "specs": {repo.lower(): {version: {k: spec[k] for k in EVAL_KEYS if k in spec}
                                 for version, spec in versions.items()}
                  for repo, versions in sorted(MAP_REPO_VERSION_TO_SPECS.items())},
    }
    out = DATA / "swe_gym_fork.json"
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} ({sum(len(v) for v in data['specs'].values())} repo versions, {len(data['specs'])} repos)")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--swe-gym":
        swe_gym(Path(sys.argv[2]))
        return
    import swebench
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS, NON_TEST_EXTS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    if not swebench.__version__.startswith("4."):
        sys.exit(f"needs swebench 4.x importable, found {swebench.__version__} at {swebench.__file__}")
    data = {
        "source": f"swebench {swebench.__version__}: harness/constants MAP_REPO_VERSION_TO_SPECS, MAP_REPO_TO_EXT, "
                  "NON_TEST_EXTS; harness/log_parsers MAP_REPO_TO_PARSER (function names, keys of swebench 5's "
                  "PARSER_REGISTRY)",
        "swebench_version": swebench.__version__,
        "non_test_exts": list(NON_TEST_EXTS),
        "ext": dict(sorted(MAP_REPO_TO_EXT.items())),
        "parser": {repo: fn.__name__ for repo, fn in sorted(MAP_REPO_TO_PARSER.items())},
        "specs": {repo: {version: {k: spec[k] for k in EVAL_KEYS if k in spec} for version, spec in versions.items()}
                  for repo, versions in sorted(MAP_REPO_VERSION_TO_SPECS.items())},
    }
    OUT.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({sum(len(v) for v in data['specs'].values())} repo versions, {len(data['specs'])} repos)")


if __name__ == "__main__":
    main()
