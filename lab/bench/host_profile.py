"""Measure a node's CPU for the decode prediction (`make host-profile`): what it reads with N threads and what
llama.cpp's decode costs it beyond reading the weights, printed as the two stack-file lines of its pool.

    python -m lab.bench.host_profile [--threads 4,16] [--depth 4096] [--passes 3] [--experts] [--llama-bench PATH]
        [--out record.json]

1. bench/host_bandwidth.c reads 4 GiB with each thread count: memory_bandwidth_by_threads. It also reads the
   node's compute with each count, before the passes and after them (host_compute_gops; not a stack-file figure:
   make bench restates the CPU's own work of a job measured later at the compute read around it).
2. llama-bench (-ngl 0: on a GPU build too, the CPU decodes) generates 16 tokens of a real-shape Qwen3-1.7B
   Q4_K_M (lab/contract/real_shape.py: the model's hyperparameters and tensor table, zero weights; no
   download) at an empty context, at --depth and at twice it, with each thread count.
3. engines/llamacpp_speed.solve_host_cost turns the first two rates into the node's figures at that count: the
   time the weights do not explain, per block; the rest at depth, the KV cache's rate per thread; and the third
   into how much slower each position is at twice the depth (kv_deep_slowdown; 1.2-1.67 measured):
   cpu_decode_by_threads.
4. With the largest thread count, each quantized KV cache type (--kv-types, flash attention on as in step 2) at an
   empty context and at twice the depth: its time per position there against the time per position the plan gives
   an f16 cache there (step 3's figures, its slow-down included), cpu_quantized_kv (on a CPU a quantized cache is
   slower, not faster: q8_0 1.82 and q4_0 2.3 times on a 2-core EPYC, 1.86 and 1.96 on an H100 machine's 16-thread
   Xeon). Printed for the stack file at the default depth only (the plan's figure is stated at 8192). Stated at the deeper
   depth because whether a quantized cache slows past 4096 positions as f16 does differs from host to host (the
   CI machine's q4_0 did not), and the plan prints the decode of a half and a full context. A cache type does not
   change an empty context's decode: where a quantized run's empty rate lies more than 15 % from f16's, the node's
   speed moved between the runs (an H200 host's q8_0 ran 30 % slow empty on lease 11), and that cache gets no ratio.
Nor does a rate whose three repetitions spread more than 15 % (stddev over mean) stand: for f16 the tool prints no
figures and exits 1 (as for a slow-down at twice the depth outside 1-10): run it again. Lease 13's H200 host gave one
f16 empty rate of 31.7 +- 10.3 tok/s, then slow-downs of 0.99, 1.42 and 0.96 in three more runs within minutes.
So steps 2 and 4 run --passes times (3), interleaved, and each point's rate is its median over the passes
(profile_rules.median_rows, which make bench reads a record with too): a minute the host moves spoils one pass of a
point, not the figure. The spread the passes showed is printed.

5. With --experts, on a node with its card (a GPU build): a real-shape Qwen3-30B-A3B Q4_K_M routing each token to its
   own experts, every layer on the card, the experts of 24 and of all 48 blocks in system RAM, 128 tokens at an empty
   context with the largest thread count: what each block moved to RAM adds to a token (experts_in_ram_us_by_threads,
   the two rates paired within each pass, the median over passes taken: profile_rules.experts_figure),
   from which the plan solves the share of the read bandwidth this node's CPU reads routed experts at (fixed at one
   H200 host's 0.78 until now; eight hosts measured since lay at 0.65-1.15). Refused like the rest where its rates
   spread, or where a block moved added no more than moving the hidden state alone does; where llama-bench fails
   (a card that cannot hold 24 blocks' experts, about 11 GB with the rest), the CPU's figures still stand. The read
   bandwidth is read before and after the step (experts_read_gbs_around), and the figure printed is restated at the
   bandwidth printed beside it (profile_rules.experts_figure). On lease 15's H100 host a three-pass profile at 16
   threads with the step took about 140 s (the step's own share not timed).

Run it on the node that serves (or one of its kind), with nothing else running: a second H200 host read 30 %
faster and attended twice as fast as the first (docs/capacity-planning.md, "Decode speed"). A pass takes about
40 s at 16 threads alone with llama.cpp's CUDA build (its prompts go to the card; each further thread count adds its
own runs), five minutes with a CPU build, 34 on 2 cores (the depths' prompts are processed on the CPU, once per cache
type, and a quantized cache's 8192 positions cost most), after llama.cpp's build; --passes 1 on a small node whose
quiet you trust.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from engines.llamacpp_host import EXPERTS_PROFILE_BLOCKS, EXPERTS_PROFILE_SHAPE, KV_PROFILE_DEPTH, kv_deep_slowdown
from engines.llamacpp_speed import quantized_kv_ratio
from lab.bench.decode_error import planned_deep_rate, solved_cost, stated_slowdown
from lab.bench.profile_rules import (cache_type, experts_figure, median_rows, pass_figures, profile_refusal,
                                     quantized_refusal)
from lab.bench.measure_decode import bandwidth_lines, compute_lines
from lab.contract.real_shape import PRESETS, write_real_shape

SHAPE, QUANT = "qwen3-1.7b", "Q4_K_M"  # small: its blocks and KV cache weigh against its weights


def default_threads() -> list[int]:
    """Powers of two below the node's cores, and its cores (what `make host-bandwidth` measures)."""
    cores = os.cpu_count() or 2
    return sorted({*(c for c in (1, 2, 4, 8, 16, 32, 64, 128) if c < cores), cores})


def read_host(threads: list[int], workdir: Path) -> tuple[dict[int, float], dict[int, float]]:
    """The node's read bandwidth (GB/s) and compute (Gop/s) by thread count, as bench/host_bandwidth.c reads them."""
    binary = workdir / "host_bandwidth"
    if not binary.exists():
        subprocess.run(["cc", "-O2", "-march=native", "-fopenmp", str(ROOT / "bench" / "host_bandwidth.c"), "-o",
                        str(binary)], check=True)
    out = subprocess.run([str(binary), "4", *map(str, threads)], check=True, capture_output=True, text=True).stdout
    return bandwidth_lines(out), compute_lines(out)


def decode_rates(binary: str, threads: list[int], depths: list[int], workdir: Path, kv_type: str = "f16") -> list[dict]:
    model = workdir / f"{SHAPE}-{QUANT}.gguf"
    if not model.exists():
        write_real_shape(SHAPE, model, QUANT)
    # Flash attention on: a quantized V cache needs it, and llama.cpp's auto turns it on for a CPU anyway.
    cmd = [binary, "-m", str(model), "-ngl", "0", "-p", "0", "-n", "16", "-d", ",".join(map(str, [0, *depths])),
           "-t", ",".join(map(str, threads)),
           "-fa", "1", "-ctk", kv_type, "-ctv", kv_type, "-r", "3", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"host_profile: llama-bench failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return [{"threads": r["n_threads"], "depth": r.get("n_depth", 0), "tok_s": r["avg_ts"], "stddev": r.get("stddev_ts"),
             "kv_type": kv_type, "cpu": r.get("cpu_info"), "build": r.get("build_number"), "backend": r.get("backends")}
            for r in json.loads(out.stdout)]


# The names llama.cpp gives the GPU devices of the backends the plan knows (CUDA0, ROCm0, Vulkan0, SYCL0, MTL0);
# an accelerator such as BLAS is listed too, and is not a card.
GPU_DEVICE = re.compile(r"^(CUDA|ROCm|Vulkan|SYCL|MTL)\d+:")


def gpu_devices(binary: str) -> list[str]:
    """The GPUs llama-bench lists (`--list-devices`: "Available devices:", then one line a device, or "(none)"): none
    for a CPU build, or for a llama-bench that does not answer the flag so."""
    out = subprocess.run([binary, "--list-devices"], capture_output=True, text=True, timeout=60)
    lines = [line.strip() for line in out.stdout.splitlines()]
    if out.returncode != 0 or not lines or lines[0] != "Available devices:":
        return []
    return [line for line in lines[1:] if GPU_DEVICE.match(line)]


# Tokens a run of the experts step generates: 128, where leases 15 and 16 ran 32 (0.3-1 s a repetition at 35-100 tok/s;
# their passes' figures lay 353-602 us apart on lease 15). Chosen before the lease that first ran it.
EXPERTS_TOKENS = 128


def experts_rates(binary: str, threads: int, workdir: Path) -> list[dict]:
    """Step 5 (--experts): a real-shape Qwen3-30B-A3B Q4_K_M whose router sends each token to its own experts (as a
    trained one does; zero weights route every token alike), every layer on the card, the experts of
    EXPERTS_PROFILE_BLOCKS's blocks in system RAM, EXPERTS_TOKENS tokens at an empty context."""
    shape, quant = EXPERTS_PROFILE_SHAPE
    model = workdir / f"{shape}-{quant}-token.gguf"
    if not model.exists():
        write_real_shape(shape, model, quant, routing="token")
    cmd = [binary, "-m", str(model), "-ngl", "99", "-ncmoe", ",".join(map(str, EXPERTS_PROFILE_BLOCKS)), "-p", "0",
           "-n", str(EXPERTS_TOKENS), "-d", "0", "-t", str(threads), "-fa", "1", "-r", "3", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        # The caller keeps the CPU's figures (a card too small for the experts fails here, not the node's CPU).
        raise RuntimeError(f"llama-bench failed ({out.returncode}) with experts in RAM: "
                           f"{out.stderr.strip().splitlines()[-1:]}")
    return [{"shape": shape, "quant": quant, "routing": "token", "threads": r["n_threads"], "depth": r.get("n_depth", 0),
             "ngl": 99, "n_cpu_moe": r["n_cpu_moe"], "n_gen": r.get("n_gen"), "tok_s": r["avg_ts"], "stddev": r.get("stddev_ts"), "kv_type": "f16",
             "cpu": r.get("cpu_info"), "gpu": r.get("gpu_info"), "build": r.get("build_number"), "backend": r.get("backends")}
            for r in json.loads(out.stdout)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (default: powers of two and all cores)")
    parser.add_argument("--depth", type=int, default=KV_PROFILE_DEPTH,
                        help="context depth for the KV cache's rate (and twice it for its slow-down, printed for the "
                             "stack file at the default only)")
    parser.add_argument("--llama-bench", default=None, help="default: the build tool's (LLAMA_CPP_BACKEND picks CPU or CUDA)")
    parser.add_argument("--kv-types", default="q8_0,q4_0", help="quantized KV cache types to measure (empty: none)")
    parser.add_argument("--passes", type=int, default=3,
                        help="measure everything this many times, interleaved, and take each point's median (default 3)")
    parser.add_argument("--experts", action="store_true",
                        help="on a node with its GPU (a GPU build of llama.cpp): also what a block of experts moved to "
                             "RAM adds (experts_in_ram_us_by_threads; 18 GB of system RAM, 11 GB of the card)")
    parser.add_argument("--out", default=None, help="also write the measurements and figures as JSON")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else default_threads()
    kv_types = [t for t in args.kv_types.split(",") if t]
    if any(t <= 0 for t in threads) or args.depth <= 0 or args.passes <= 0 or not set(kv_types) <= {"q8_0", "q4_0"}:
        print("host_profile: --threads are positive counts, --depth a positive token count, --passes a positive count "
              "and --kv-types some of q8_0,q4_0", file=sys.stderr)
        return 2
    binary = args.llama_bench
    if binary is None:
        from lab.llama_build import build

        binary = str(build(program="llama-bench"))
    if args.experts and not gpu_devices(binary):
        print(f"host_profile: --experts measures experts moved from the card to RAM, and {binary} lists no GPU: run it "
              "with llama.cpp built for the node's card (LLAMA_CPP_BACKEND=cuda), or without --experts", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="host-profile-") as tmp:
        bandwidth, compute = read_host(threads, Path(tmp))
        compute_around = {t: [gops] for t, gops in compute.items()}
        most = max(threads)  # the quantized caches' and the experts' runs take the largest thread count
        measured, moved, experts_failed, experts_read = [], [], None, {most: []}
        for n in range(args.passes):
            # Interleaved: a host that moves for a minute moves one pass of each point, which the median leaves out.
            measured += [{**r, "pass": n} for r in decode_rates(binary, threads, [args.depth, 2 * args.depth], Path(tmp))]
            for kind in kv_types:
                measured += [{**r, "pass": n} for r in decode_rates(binary, [most], [2 * args.depth], Path(tmp), kind)]
            if args.experts and not experts_failed:
                # The read bandwidth before and after the step: it runs minutes after the first reading, and the
                # figure is restated at that reading's bandwidth, the one printed beside it (experts_figure).
                before = read_host([most], Path(tmp))[0][most]
                try:
                    moved += [{**r, "pass": n} for r in experts_rates(binary, most, Path(tmp))]
                except RuntimeError as failure:
                    # A card that cannot hold the 24 blocks' experts, say: the CPU's figures still stand.
                    experts_failed, moved = str(failure), []
                experts_read[most] += [before, read_host([most], Path(tmp))[0][most]]
        # The compute read again after the passes: make bench restates the CPU's own work of a job measured later at
        # the compute read around that job against these (lab/bench/decode_error.py, host_compute_gops).
        for t, gops in read_host(threads, Path(tmp))[1].items():
            compute_around.setdefault(t, []).append(gops)
    rows = median_rows(measured)
    refusal = profile_refusal(rows, args.depth)
    if refusal:
        # No figures: the record keeps the rates (and why), for the lab.
        if args.out:
            Path(args.out).write_text(json.dumps({"host_read_gbs": bandwidth, "host_compute_gops": compute_around,
                                                  "depth": args.depth, "shape": SHAPE,
                                                  "quant": QUANT, "rows": measured + moved, "refused": refusal,
                                                  **({"experts_read_gbs_around": experts_read} if args.experts else {})},
                                                 indent=1))
        print(f"host_profile: {refusal}; no figures: run it again on a quiet node", file=sys.stderr)
        return 1
    experts, experts_why, folded = experts_figure(moved, experts_read, bandwidth) if moved else ({}, experts_failed, {})
    if args.passes > 1:
        apart = max(r["passes_apart"] for r in [*rows, *folded.values()])
        print(f"{args.passes} passes: each figure below is from the median rate of each point; the passes of one point "
              f"differed by up to {apart:.0%}")
    rates = {(r["threads"], r["depth"]): r["tok_s"] for r in rows if cache_type(r) == "f16"}
    figures, slowdowns = {}, {}
    for t in threads:
        cost = solved_cost(SHAPE, QUANT, t, args.depth, rates[(t, 0)], rates[(t, args.depth)], bandwidth)
        slowdown = kv_deep_slowdown(rates[(t, 0)], rates[(t, args.depth)], rates[(t, 2 * args.depth)])
        slowdowns[t] = round(slowdown, 2)
        figures[t] = {"block_us": round(cost.block_us), "kv_gbs_per_thread": round(cost.kv_gbs, 2)}
        if args.depth == KV_PROFILE_DEPTH:
            # The plan's figure is stated for these two depths only; at another --depth the record keeps it.
            figures[t]["kv_deep_slowdown"] = stated_slowdown(slowdown)
        elif not 1.0 <= slowdown <= 10.0:
            print(f"host_profile: with {t} threads a position at {2 * args.depth} took {slowdown:.2f} times its time at "
                  f"{args.depth}, outside 1-10 (recorded, not printed: at the default depth the profile is refused)",
                  file=sys.stderr)
        print(f"{t:3} threads: read {bandwidth[t]:.1f} GB/s; {SHAPE} {QUANT} {rates[(t, 0)]:.2f} tok/s empty, "
              f"{rates[(t, args.depth)]:.2f} at {args.depth}, {rates[(t, 2 * args.depth)]:.2f} at {2 * args.depth}: "
              f"{cost.block_us:.0f} us a block, KV {cost.kv_gbs:.2f} GB/s a thread, {slowdown:.2f} times the time per "
              f"position at {2 * args.depth}")
    ratios = {}
    failed = False
    # The f16 rate the plan gives at twice the depth from the figures printed (the slow-down as printed; at another
    # --depth none is printed and the plan draws no slow-down below 4096, so none).
    f16_deep = planned_deep_rate(rates[(most, 0)], rates[(most, args.depth)], figures[most].get("kv_deep_slowdown", 1.0))
    for kind in kv_types:
        mine = {r["depth"]: r for r in rows if cache_type(r) == kind}
        deep = {d: r["tok_s"] for d, r in mine.items()}
        ratio = quantized_kv_ratio((rates[(most, 0)], f16_deep), (deep[0], deep[2 * args.depth]))
        why = quantized_refusal(kind, rates[(most, 0)], mine[0], mine[2 * args.depth], ratio)
        if why:
            # The f16 figures above stand; only this cache's line is left out.
            print(f"host_profile: {why}; run it again on a quiet node", file=sys.stderr)
            failed = True
            continue
        ratios[kind] = round(ratio, 2)
        print(f"{most:3} threads, {kind} KV cache: {deep[0]:.2f} tok/s empty, {deep[2 * args.depth]:.2f} at "
              f"{2 * args.depth}: {ratios[kind]:g} times the f16 cache's time per position there")
    if args.experts:
        if experts_why:
            print(f"host_profile: {experts_why}; no experts figure" + ("" if experts_failed else
                  ": run it again on a quiet node"), file=sys.stderr)
            failed = True
        for t, us in experts.items():
            few, many = EXPERTS_PROFILE_BLOCKS
            print(f"{t:3} threads, experts in RAM: {EXPERTS_PROFILE_SHAPE[0]} {EXPERTS_PROFILE_SHAPE[1]} "
                  f"{folded[(t, few)]['tok_s']:.2f} tok/s with {few} blocks' experts in RAM, "
                  f"{folded[(t, many)]['tok_s']:.2f} with {many}, read {min(experts_read[t]):.1f}-"
                  f"{max(experts_read[t]):.1f} GB/s around them: {us} us a token for each block moved, at the "
                  f"{bandwidth[t]:.1f} GB/s above (the median of the passes', each restated; as measured: "
                  + ", ".join(f"{v:.0f}" for v in pass_figures(moved)[t].values()) + " us)")
    if args.out:
        Path(args.out).write_text(json.dumps({"host_read_gbs": bandwidth, "host_compute_gops": compute_around,
                                              "depth": args.depth, "shape": SHAPE, "quant": QUANT,
                                              "rows": measured + moved, "cpu_decode_by_threads": figures,
                                              "slowdown_at_twice_the_depth": slowdowns,
                                              "cpu_quantized_kv": ratios,
                                              **({"experts_in_ram_us_by_threads": experts,
                                                  "experts_read_gbs_around": experts_read} if args.experts else {}),
                                              **({"experts_refused": experts_why} if args.experts and experts_why else {})},
                                             indent=1))
    print("for the stack file (node_pools.<pool>):")
    print("  memory_bandwidth_by_threads: {" + ", ".join(f"{t}: {bandwidth[t]:.0f}" for t in threads) + "}")
    print("  cpu_decode_by_threads: {" + ", ".join(
        f"{t}: {{" + ", ".join(f"{k}: {v}" for k, v in f.items()) + "}" for t, f in figures.items()) + "}")
    if ratios and args.depth == KV_PROFILE_DEPTH:
        # Stated at 8192 positions (config/types.py): at another --depth the record keeps the ratio, unprinted.
        print("  cpu_quantized_kv: {" + ", ".join(f"{k}: {v:g}" for k, v in ratios.items()) + "}")
    if experts:
        print("  experts_in_ram_us_by_threads: {" + ", ".join(f"{t}: {us}" for t, us in experts.items()) + "}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
