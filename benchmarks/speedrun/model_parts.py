"""The speedrun's SFT model carried between sessions in parts small enough for the lent machine's transfers.

A device call brings back at most 64 MiB (8 files of 16 MiB) and carries at most 64 MiB with the tree, and the
machine keeps nothing between sessions. Making the model again costs ~490 s of each session's 1,800 (pre-training,
SFT, their set-up); carried as parts it costs a few calls' transfers, and every later session's GRPO starts from
the one base, so sync and async runs compare against the same model.

    python benchmarks/speedrun/model_parts.py pack --model /tmp/speedrun/models/sft --out /tmp/speedrun/model-parts
    python benchmarks/speedrun/model_parts.py spread --parts .speedrun/model-parts --out .speedrun/model-up
    python benchmarks/speedrun/model_parts.py join --parts .speedrun/model-up/* --out /tmp/speedrun/models/sft

`pack` writes the model as bfloat16 (half the fp32 masters' bytes: the 88M model is 176 MB, 12 parts of 15 MB),
then a tar of the folder cut into parts with a manifest of their SHA-256; `join` checks every part against it
before it writes anything. The bf16 rounding of the weights makes a model that differs from the trained one in the
last bits, so a run from it measures its own base (GRPO's validation at step 0), as every run does."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
PART_BYTES = 15_000_000  # four parts and a report stay under a call's 64 MiB (16 MiB a file)


def pack(model: Path, out: Path, *, part_bytes: int = PART_BYTES) -> dict[str, Any]:
    """`model` (an HF folder) as bf16, tarred and cut into `out/part-NNN` with `out/manifest.json`."""
    import torch
    from safetensors.torch import load_file, save_file

    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model}: no config.json: not a model folder")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "model"
        staged.mkdir()
        for f in sorted(model.iterdir()):
            if f.suffix == ".safetensors":
                tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                           for k, v in load_file(f).items()}
                save_file(tensors, staged / f.name, metadata={"format": "pt"})
            elif f.is_file():
                shutil.copy(f, staged / f.name)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for f in sorted(staged.iterdir()):
                tar.add(f, arcname=f.name)
    blob = buf.getvalue()
    parts = []
    for i, start in enumerate(range(0, len(blob), part_bytes)):
        chunk = blob[start:start + part_bytes]
        name = f"part-{i:03d}"
        (out / name).write_bytes(chunk)
        parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"source": str(model), "dtype": "bfloat16", "bytes": len(blob),
                "sha256": hashlib.sha256(blob).hexdigest(), "parts": parts}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def replace_dir(path: Path, *, holds: str, ours: bool) -> None:
    """Empty `path` for a new output, but only when it is one of ours (`ours`): a mistyped `--out` (`.`, the
    checkout) is refused, not wiped."""
    if path.exists():
        if not ours:
            raise ValueError(f"{path} exists and does not hold {holds}: refusing to replace it")
        shutil.rmtree(path)
    path.mkdir(parents=True)


def find_manifest(dirs: list[Path]) -> dict[str, Any]:
    found = [d / MANIFEST for d in dirs if (d / MANIFEST).is_file()]
    if not found:
        raise FileNotFoundError(f"no {MANIFEST} in {', '.join(map(str, dirs))}: `pack` writes one beside the parts")
    manifest: dict[str, Any] = json.loads(found[0].read_text())
    return manifest


def join(dirs: list[Path], out: Path) -> dict[str, Any]:
    """The model folder from its parts, spread over `dirs` in any way; every part checked before `out` is written."""
    manifest = find_manifest(dirs)
    where = {p.name: p for d in dirs for p in d.glob("part-*")}
    blob = bytearray()
    for part in manifest["parts"]:
        path = where.get(part["name"])
        if path is None:
            raise FileNotFoundError(f"{part['name']} of {manifest['source']} is in none of "
                                    f"{', '.join(map(str, dirs))}")
        chunk = path.read_bytes()
        if len(chunk) != part["bytes"] or hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise ValueError(f"{path}: {len(chunk)} bytes that do not match the manifest's {part['bytes']} "
                             f"(sha256 {part['sha256'][:12]}): the part was cut short or is another model's")
        blob += chunk
    if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
        raise ValueError(f"the joined parts do not hash to the manifest's {manifest['sha256'][:12]}")
    replace_dir(out, holds="a model (config.json)", ours=(out / "config.json").is_file())
    with tarfile.open(fileobj=io.BytesIO(bytes(blob)), mode="r") as tar:
        tar.extractall(out, filter="data")
    return manifest


def spread(parts: Path, out: Path, *, first: int, per: int) -> list[list[str]]:
    """The parts in folders `out/1`, `out/2`, ... one per device call: `first` parts in the call that also carries
    the wheels and the task set, `per` in each next one (each folder with a copy of the manifest)."""
    manifest = find_manifest([parts])
    names = [p["name"] for p in manifest["parts"]]
    groups = [names[:first]] + [names[i:i + per] for i in range(first, len(names), per)]
    replace_dir(out, holds="only numbered folders of parts",
                ours=out.is_dir() and all(d.is_dir() and d.name.isdigit() for d in out.iterdir()))
    for i, group in enumerate((g for g in groups if g), start=1):
        dest = out / str(i)
        dest.mkdir()
        shutil.copy(parts / MANIFEST, dest / MANIFEST)
        for name in group:
            shutil.copy(parts / name, dest / name)
    return [g for g in groups if g]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack", help="a model folder as bf16 parts with a manifest")
    a.add_argument("--model", type=Path, required=True)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--part-bytes", type=int, default=PART_BYTES)
    b = sub.add_parser("join", help="the model folder from its parts (checked against the manifest)")
    b.add_argument("--parts", type=Path, nargs="+", required=True)
    b.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("spread", help="the parts in one folder per device call")
    c.add_argument("--parts", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--first", type=int, default=2, help="parts in the first call (it carries the wheels too)")
    c.add_argument("--per", type=int, default=4, help="parts in each later call")
    args = p.parse_args(argv)
    if args.cmd == "pack":
        m = pack(args.model, args.out, part_bytes=args.part_bytes)
        print(f"{args.model}: {m['bytes']} bytes in {len(m['parts'])} parts at {args.out}")
    elif args.cmd == "join":
        m = join(args.parts, args.out)
        print(f"{args.out}: {m['source']} ({m['bytes']} bytes, {len(m['parts'])} parts checked)")
    else:
        for i, group in enumerate(spread(args.parts, args.out, first=args.first, per=args.per), start=1):
            print(f"{args.out}/{i}: {' '.join(group)}")


if __name__ == "__main__":
    main()
