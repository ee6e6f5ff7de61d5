"""Measure llama.cpp's decode speed on real model shapes: `make bench`'s source of truth for the
decode prediction (planning: engines/llamacpp_speed.py).

Each shape is a GGUF with the model's real hyperparameters and tensor table whose weights are an
all-zero sparse region (lab/contract/real_shape.py): no download, no disk, and a matrix product
costs the same on zeros as on trained weights. llama-bench generates tokens at context depths 0,
half and full; the JSON written has one row per (shape, quant, depth) with llama-bench's own rate.

    python -m lab.bench.measure_decode --out results.json [--llama-bench PATH] [--ngl 99] [--threads N]
        [--shapes qwen3-8b:Q4_K_M,llama-3.1-8b:F16 ...] [--ctx 16384] [--tokens 64]

    python -m lab.bench.measure_decode --jobs jobs.json --out results.json [--llama-bench PATH]

--jobs runs a grid per shape: each job is {"shape", "quant", "routing", "args": [llama-bench arguments,
lists allowed: "-t", "4,8,16", "-ncmoe", "0,24", "-p", "512,4096", ...]}, one row per llama-bench test
with its prompt, generated tokens, depth, threads, layers and experts in RAM; "routing": "token" writes
the MoE shape with token-dependent routing (real_shape.py), which MoE prefill and expert offload need.

Run here (CPU build) or on a GPU machine (LLAMA_CPP_BACKEND=cuda lab/llama_build.py builds
llama-bench with CUDA from the same sdist, offline with LLAMA_CPP_ARCHIVE).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]

from lab.contract.real_shape import PRESETS, expected_weights_bytes, write_real_shape

DEFAULT_SHAPES = "qwen3-8b:Q4_K_M,llama-3.1-8b:Q4_K_M,llama-3.1-8b:Q8_0,llama-3.1-8b:F16,qwen3-30b-a3b:Q4_K_M"


def bench(binary: str, model: Path, depths: list[int], tokens: int, ngl: int, threads: int, extra: list[str]) -> list[dict]:
    cmd = [binary, "-m", str(model), "-p", "0", "-n", str(tokens), "-d", ",".join(map(str, depths)), "-r", "2",
           "-ngl", str(ngl), "-t", str(threads), "-o", "json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def job_threads(args: list[str]) -> list[int]:
    """The thread counts a job's llama-bench arguments name (-t 4,8,16), none where they name none."""
    value = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-t", "--threads")), "")
    return [int(t) for t in value.split(",") if t.strip().isdigit()]


def bandwidth_lines(text: str) -> dict[int, float]:
    """GB/s by thread count from bench/host_bandwidth.c's output ("threads N read_gbs X" a line)."""
    return {int(t): float(g) for t, g in re.findall(r"threads (\d+) read_gbs ([\d.]+)", text)}


def compute_lines(text: str) -> dict[int, float]:
    """Gop/s by thread count from the same output ("threads N read_gbs X compute_gops Y"; none where it has no
    compute reading, as host_bandwidth.c printed before it had one)."""
    return {int(t): float(g) for t, g in re.findall(r"threads (\d+) read_gbs [\d.]+ compute_gops ([\d.]+)", text)}


def read_now(host_bandwidth: Optional[str], threads: list[int]) -> tuple[dict[int, float], dict[int, float]]:
    """The host's read bandwidth and compute now at these thread counts (bench/host_bandwidth.c over 4 GiB, as make
    host-profile reads them; a few seconds): a shared host's drifts (58-78 GB/s with 16 threads within 25 minutes on
    one lease), so a job beside layers or experts in RAM is planned with the host as read around it, not only as read
    at profiling. None read (the tool failed or ran past a minute): ({}, {}), and the row keeps the profile's."""
    if not host_bandwidth or not threads:
        return {}, {}
    try:
        out = subprocess.run([host_bandwidth, "4", *map(str, threads)], capture_output=True, text=True, timeout=60)
    except (subprocess.TimeoutExpired, OSError) as e:
        print(f"host bandwidth not read: {e}", flush=True)
        return {}, {}
    if out.returncode != 0:
        print(f"host bandwidth not read: {out.stderr.strip()[-200:]}", flush=True)
        return {}, {}
    return bandwidth_lines(out.stdout), compute_lines(out.stdout)


# What a job may hold, and the llama-bench arguments the grids use (each takes one value, a comma list allowed).
JOB_KEYS = {"shape", "quant", "routing", "repetitions", "args"}
JOB_FLAGS = {"-ngl", "-ncmoe", "-t", "-fa", "-ctk", "-ctv", "-p", "-n", "-d", "-ub", "-b"}
# config.facts.KvCacheType's, written out: this module runs on the device machine before the planner's pydantic is
# needed there (tests/test_speed_model.py holds the two equal).
CACHE_TYPES = {"f16", "bf16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}


def job_problems(jobs) -> list[str]:
    """Why a jobs file would fail on the device machine, one line each, before any of its device time is spent: not a
    list of jobs, a key or llama-bench argument the grids do not use, a shape real_shape.py does not write, a flag
    without its value, a value that is not a comma list of integers (or of cache types for -ctk/-ctv)."""
    if not isinstance(jobs, list) or not jobs:
        return ["a non-empty JSON list of jobs"]
    problems = []
    for number, job in enumerate(jobs):
        where = f"job {number}"
        if not isinstance(job, dict):
            problems.append(f"{where}: an object with shape, quant and args")
            continue
        if set(job) - JOB_KEYS or not {"shape", "quant", "args"} <= set(job):
            problems.append(f"{where}: keys {sorted(job)}; shape, quant and args, with routing and repetitions optional")
            continue
        if job["shape"] not in PRESETS:
            problems.append(f"{where}: shape {job['shape']!r} is not one real_shape.py writes ({', '.join(PRESETS)})")
        if job.get("routing", "zero") not in ("zero", "token"):
            problems.append(f"{where}: routing {job['routing']!r}; zero or token")
        if not isinstance(job.get("repetitions", 2), int) or job.get("repetitions", 2) < 1:
            problems.append(f"{where}: repetitions {job['repetitions']!r}; a whole number of 1 or more")
        args = job["args"]
        if not isinstance(args, list) or len(args) % 2 or not all(isinstance(a, str) for a in args):
            problems.append(f"{where}: args {args!r}; flag and value pairs, as strings")
            continue
        for flag, value in zip(args[::2], args[1::2]):
            items = value.split(",")
            if flag not in JOB_FLAGS:
                problems.append(f"{where}: {flag} is not an argument the grids use ({', '.join(sorted(JOB_FLAGS))})")
            elif flag in ("-ctk", "-ctv"):
                if not set(items) <= CACHE_TYPES:
                    problems.append(f"{where}: {flag} {value}; one of {', '.join(sorted(CACHE_TYPES))}")
            elif not all(re.fullmatch(r"\d+", item) for item in items):
                problems.append(f"{where}: {flag} {value}; whole numbers, comma-separated")
    return problems


def run_jobs(binary: str, jobs: list[dict], device: str, deadline: float, out_path: Path,
             host_bandwidth: Optional[str] = None, passes: int = 1) -> list[dict]:
    """Each job's llama-bench grid, one row per test (written as it goes: a call cut short keeps rows); with
    host_bandwidth, each row also carries the host's read bandwidth and compute at its threads, read before and after
    its job (read_gbs_around, compute_gops_around).
    passes > 1 runs the whole list that many times, interleaved (every job once, then again), each row naming its
    pass: make bench takes each point's median over them (profile_rules.fold_passes), as make host-profile does, since
    a shared host moves by more than the plan's tolerance within minutes (lease 14: twelve jobs run twice, up to 28 % apart)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="shapes-") as tmp:
        for number, index, job in ((n, i, job) for n in range(passes) for i, job in enumerate(jobs)):
            if passes > 1 and index == 0:
                print(f"pass {number + 1} of {passes}", flush=True)
            tag = {"pass": number} if passes > 1 else {}  # every row of this run of the job names its pass
            routing = job.get("routing", "zero")
            if time.monotonic() > deadline:
                rows.append({"job": job, "error": "out of time", **tag})
                continue
            extra = {"routing": routing} if routing != "zero" else {}
            path = write_real_shape(job["shape"], Path(tmp) / f"{job['shape']}-{job['quant']}-{routing}.gguf", job["quant"], **extra)
            cmd = [binary, "-m", str(path), "-r", str(job.get("repetitions", 2)), "-o", "json", *job["args"]]
            threads = job_threads(job["args"])
            before = read_now(host_bandwidth, threads)
            started = time.monotonic()
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10, deadline - time.monotonic()))
                results = json.loads(out.stdout) if out.returncode == 0 else []
                error = None if out.returncode == 0 else out.stderr.strip().splitlines()[-3:]
            except subprocess.TimeoutExpired as e:
                results, error = [], f"timed out: {(e.stdout or b'')[-400:]!r}"
            after = read_now(host_bandwidth, threads)
            for r in results:
                read, compute = ([v for v in (first.get(r.get("n_threads")), then.get(r.get("n_threads"))) if v]
                                 for first, then in zip(before, after))
                rows.append({**({"read_gbs_around": read} if read else {}),
                             **({"compute_gops_around": compute} if compute else {}), **tag,
                    "device": device, "shape": job["shape"], "quant": job["quant"], "routing": routing,
                    "weights_bytes": expected_weights_bytes(job["shape"], job["quant"]), "n_prompt": r.get("n_prompt"),
                    "n_gen": r.get("n_gen"), "depth": r.get("n_depth", 0), "tok_s": r.get("avg_ts"), "stddev": r.get("stddev_ts"),
                    "threads": r.get("n_threads"), "ngl": r.get("n_gpu_layers"), "n_cpu_moe": r.get("n_cpu_moe"),
                    "n_ubatch": r.get("n_ubatch"), "flash_attn": r.get("flash_attn"), "backend": r.get("backends"),
                    "type_k": r.get("type_k"), "type_v": r.get("type_v"),
                    "gpu": r.get("gpu_info"), "cpu": r.get("cpu_info"), "build": r.get("build_number"),
                })
                print(f"{job['shape']:16} {job['quant']:7} {routing:5} {r.get('type_k')}/{r.get('type_v')} pp {r.get('n_prompt'):5} tg {r.get('n_gen'):3} "
                      f"d {r.get('n_depth', 0):5} t {r.get('n_threads'):2} ngl {r.get('n_gpu_layers'):2} "
                      f"cmoe {r.get('n_cpu_moe')} {r.get('avg_ts'):9.2f} tok/s", flush=True)
            if error:
                rows.append({"job": job, "error": error, **tag})
                print(f"{job['shape']} {job['args']}: {error}", flush=True)
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
            path.unlink()
            out_path.write_text(json.dumps(rows, indent=1))
    return rows


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
    parser.add_argument("--jobs", help="a JSON list of grids (see above) instead of --shapes")
    parser.add_argument("--max-seconds", type=float, default=3600)
    parser.add_argument("--host-bandwidth", default=None, help="bench/host_bandwidth.c built: read the host's bandwidth "
                        "around each job (--jobs)")
    parser.add_argument("--passes", type=int, default=1, help="run the jobs this many times, interleaved (--jobs); make "
                        "bench takes each point's median")
    parser.add_argument("--check", action="store_true", help="only check the --jobs file (bench/measure_device.sh, before "
                        "its build): one line per problem, exit 2")
    args = parser.parse_args(argv)
    if args.jobs and args.passes < 1:
        print(f"measure_decode: --passes {args.passes}: at least 1", file=sys.stderr)
        return 2
    if args.check and not args.jobs:
        print("measure_decode: --check checks a --jobs file: name one", file=sys.stderr)
        return 2
    jobs = None
    if args.jobs:
        try:
            jobs = json.loads(Path(args.jobs).read_text())
        except (OSError, ValueError) as e:
            print(f"measure_decode: {args.jobs}: {e}", file=sys.stderr)
            return 2
        problems = job_problems(jobs)
        for problem in problems:
            print(f"measure_decode: {args.jobs}: {problem}", file=sys.stderr)
        if problems:
            return 2
    if args.check:
        return 0
    binary = args.llama_bench
    if binary is None:
        from lab.llama_build import build

        binary = str(build(program="llama-bench"))
    if args.jobs:
        deadline = time.monotonic() + args.max_seconds
        run_jobs(binary, jobs, args.device, deadline, Path(args.out), args.host_bandwidth, args.passes)
        return 0
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
