"""Generate the Python gRPC code from `protos/` (the single source of truth) into the `grpofleet` package.

`python -m fleet.protogen` regenerates; `python -m fleet.protogen --check` exits 1 when the generated code is missing
or older than the .proto files (a stamp file records the hash of the sources it was built from).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT
STAMP = ROOT / "grpofleet" / "SOURCES_SHA256"


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def sources_digest() -> str:
    h = hashlib.sha256()
    for path in proto_files():
        h.update(str(path.relative_to(PROTO_ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def is_stale() -> bool:
    return not STAMP.exists() or STAMP.read_text().strip() != sources_digest()


def generate() -> None:
    from grpc_tools import protoc  # build-time dependency only

    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={OUT_ROOT}",
        f"--pyi_out={OUT_ROOT}",
        f"--grpc_python_out={OUT_ROOT}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {files}")
    for pkg in {p.parent for p in (OUT_ROOT / f for f in files)} | {OUT_ROOT / "grpofleet"}:
        (pkg / "__init__.py").touch()
    STAMP.write_text(sources_digest() + "\n")


def main() -> int:
    if "--check" in sys.argv[1:]:
        if is_stale():
            print("generated gRPC code is stale or missing: run `python -m fleet.protogen`", file=sys.stderr)
            return 1
        return 0
    generate()
    print(f"generated gRPC code for {len(proto_files())} proto files into {OUT_ROOT / 'grpofleet'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
