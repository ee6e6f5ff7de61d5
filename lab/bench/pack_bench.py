"""A CUDA llama-bench built on a lent GPU machine, packed to travel to a later one (bench/measure_device.sh).

A fresh machine spends 3.5-5 minutes of a 585 s call building llama.cpp's CUDA programs (293 s on lease 22), each
session on each machine. `PACK_BENCH=1` packs the llama-bench just built, with the vocab-only GGUFs the real-shape
files take their tokenizers from, into the call's $OUT in parts (what comes back from a call: files of at most 16 MiB),
and a manifest of their hashes; copied into an ignored folder of the checkout and carried, `CUDA_BENCH=<folder>` unpacks
and checks them instead of building. Nothing is packed where it would not travel back (MAX_PACK_BYTES): the call
prints the size and goes on.

    python3 -m lab.bench.pack_bench pack --bench BIN/llama-bench --out DIR
    python3 -m lab.bench.pack_bench unpack --from DIR --to DIR

Its own code is the standard library's: it runs on the GPU machine, where only .soak's wheels are installed (the
shapes' vocab names, for pack, come from lab/contract/real_shape.py, which needs gguf).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lab.llama_build import DEFAULT_BUILD, BuildError, _key, unpack_archive

NAME = "llama-bench-cuda"
MANIFEST = f"{NAME}.json"
# A file back from a call is at most 16 MiB (the device tool's limits).
PART_BYTES = 15 * 2**20
# What a call carries is at most 64 MiB: the tracked tree (8 MiB at 5700c29) and .soak's wheels (3.7 MiB) beside it.
MAX_PACK_BYTES = 50 * 2**20


class PackError(Exception):
    """One line: why nothing was packed, or why a carried pack is not used."""


def _build_folder(bench: Path) -> str:
    """The llama.cpp build the cache folder is named for (llama-b<N>-<sha>-cuda/bin/llama-bench)."""
    folder = bench.resolve().parent.parent.name
    if not folder.startswith("llama-b"):
        raise PackError(f"{bench}: not in a lab/llama_build cache folder (llama-b<build>-<sha>-cuda/bin)")
    return folder


def _xz(data: bytes) -> bytes:
    """xz with every core where the xz program is there (a 16-core machine packs in seconds), else Python's lzma."""
    if shutil.which("xz"):
        done = subprocess.run(["xz", "-T0", "-6", "-c"], input=data, capture_output=True, check=True)
        return done.stdout
    return lzma.compress(data, preset=6)


def pack(bench: Path, vocab: list[Path], out: Path, *, max_bytes: int = MAX_PACK_BYTES,
         part_bytes: int = PART_BYTES) -> dict:
    """Write NAME.tar.xz.<NN> parts and MANIFEST into out; returns the manifest. Raises PackError, writing nothing,
    where the pack would be larger than max_bytes."""
    build = _build_folder(bench)
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "llama-bench"
        shutil.copy2(bench, binary)
        if shutil.which("strip"):  # symbols only: the kernels and code are the build's
            subprocess.run(["strip", str(binary)], check=True)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(binary, arcname="llama-bench")
            for path in vocab:
                tar.add(path, arcname=f"models/{path.name}")
        packed = _xz(buffer.getvalue())
    if len(packed) > max_bytes:
        raise PackError(f"{NAME}: {len(packed) / 2**20:.1f} MiB packed, over the {max_bytes / 2**20:.0f} MiB a call "
                        f"can carry beside the checkout: not packed, build on each machine")
    chunks = [packed[start:start + part_bytes] for start in range(0, len(packed), part_bytes)]
    parts = [{"name": f"{NAME}.tar.xz.{index:02d}", "sha256": hashlib.sha256(chunk).hexdigest(), "bytes": len(chunk)}
             for index, chunk in enumerate(chunks)]
    manifest = {"build": build, "sha256": hashlib.sha256(packed).hexdigest(), "bytes": len(packed), "parts": parts,
                "members": ["llama-bench"] + [f"models/{p.name}" for p in vocab]}
    out.mkdir(parents=True, exist_ok=True)
    for part, chunk in zip(parts, chunks):
        (out / part["name"]).write_bytes(chunk)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def unpack(src: Path, dest: Path, build: str) -> Path:
    """The carried pack in src, checked part by part and whole against its manifest and against the build this
    checkout pins, unpacked into dest (llama-bench and models/); returns dest/llama-bench."""
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise PackError(f"{src / MANIFEST}: {err}") from None
    if manifest.get("build") != build:
        raise PackError(f"{src / MANIFEST}: packed from {manifest.get('build')}, this checkout builds {build}")
    data = b""
    for part in manifest["parts"]:
        path = src / part["name"]
        if not path.is_file():
            raise PackError(f"{path}: missing (the manifest names {len(manifest['parts'])} parts)")
        chunk = path.read_bytes()
        if hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise PackError(f"{path}: its sha256 is not the manifest's")
        data += chunk
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise PackError(f"{src}: the joined parts' sha256 is not the manifest's")
    members = set(manifest["members"])
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / f"{NAME}.tar.xz"
        archive.write_bytes(data)
        with tarfile.open(archive) as tar:
            names = {m.name for m in tar.getmembers()}
        if names != members:
            raise PackError(f"{src}: the pack holds {sorted(names)}, not the manifest's files")
        try:  # the sdist's unpacker: plain files inside dest only, on a Python with tarfile's filters or without
            unpack_archive(archive, dest)
        except BuildError as err:
            raise PackError(str(err)) from None
    binary = dest / "llama-bench"
    binary.chmod(0o755)
    return binary


def _pinned_build() -> str:
    """llama-b<build>-<sha12>-cuda, the cache folder lab/llama_build names for the pinned sdist."""
    return f"{_key(DEFAULT_BUILD)}-cuda"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--bench", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    u = sub.add_parser("unpack")
    u.add_argument("--from", dest="src", type=Path, required=True)
    u.add_argument("--to", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.verb == "pack":
            from lab.contract.gguf_layout import vocab_dir
            from lab.contract.real_shape import PRESETS
            vocab = [vocab_dir() / f"ggml-vocab-{v}.gguf" for v in sorted({p.vocab for p in PRESETS.values()})]
            manifest = pack(args.bench, vocab, args.out)
            print(f"{NAME}: {manifest['bytes'] / 2**20:.1f} MiB packed in {len(manifest['parts'])} part(s) "
                  f"({manifest['build']}): copy them with {MANIFEST} into an ignored folder, carry it, CUDA_BENCH=it")
        else:
            binary = unpack(args.src, args.to, _pinned_build())
            print(f"{NAME}: {binary} from {args.src}, every part's sha256 the manifest's")
    except PackError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
