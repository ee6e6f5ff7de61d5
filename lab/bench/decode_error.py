"""The decode prediction (engines/llamacpp_speed.py) against every recorded measurement: prints one
row per measurement with the predicted rate and the error, and docs/capacity-planning.md's table is this output.

    python -m lab.bench.decode_error   (reads bench/results-decode-*.json beside the cited rows)

A row marked `cal` is a measurement a profile was solved from (its error says how well the profile's
few numbers fit it, not how well it predicts); the others are predictions.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]

from common.constants import LLAMACPP_IMAGE_BUILD
from config.types import ModelFacts, ModelServer, NodePool
from engines.llamacpp_held import DECODE_GOAL
from engines.llamacpp_host import EXPERTS_PROFILE_SHAPE, KV_DEEP_DEPTH, HostCost, kv_deep_slowdown
from engines.llamacpp_speed import (PROBE_QUERY_HEADS, PROFILES, experts_at_host_share, is_range, predict_range_tok_s,
                                    quantized_kv_ratio, solve_host_cost)
from config.catalog import lookup
from lab.bench.decode_sorting import TOLERANCE, class_counts, compute_drift, drift_counts, head_counts
from lab.bench.host_readings import compute_pace, experts_at, profile_compute
from lab.bench.profile_rules import (cache_type, experts_figure, fold_passes, median_rows, profile_refusal,
                                     quantized_refusal)
from lab.contract.real_shape import PRESETS, expected_weights_bytes, tensor_table

GIB = 2**30
LLAMA3_8B = dict(params_b=8.03, layers=32, kv_heads=8, head_dim=128, embedding_length=4096, vocab_size=128256,
                 feed_forward_length=14336)
LLAMA2_7B = dict(params_b=6.74, layers=32, kv_heads=32, head_dim=128, embedding_length=4096, vocab_size=32000,
                 feed_forward_length=11008)
SEEN_BEFORE_RANGE = "seen before its range"
XIONGJIE = "XiongjieDai/GPU-Benchmarks-on-LLM-Inference aa72e0ec, LLaMA 3/*_v3.ipynb, llama-bench build 2824"
# (device, profile, backend, GB/s, discrete, facts, quant, weights GiB, depth, gpus, measured t/s, calibration?, source)
RECORDS = [
    ("RTX 4090", "nvidia", "cuda", 1008, True, LLAMA3_8B, "Q4_K_M", 4.58, 256, 1, 130.58, True, XIONGJIE),
    ("RTX 4090", "nvidia", "cuda", 1008, True, LLAMA3_8B, "F16", 14.96, 256, 1, 54.84, True, XIONGJIE),
    ("RTX 4090", "nvidia", "cuda", 1008, True, LLAMA3_8B, "Q4_K_M", 4.58, 4096, 1, 110.66, True, XIONGJIE + " (tg8192)"),
    ("RTX 3090", "nvidia", "cuda", 936, True, LLAMA3_8B, "Q4_K_M", 4.58, 256, 1, 115.42, False, XIONGJIE),
    ("RTX 3090", "nvidia", "cuda", 936, True, LLAMA3_8B, "F16", 14.96, 256, 1, 47.40, False, XIONGJIE),
    ("2x RTX 3090", "nvidia", "cuda", 936, True, "bartowski/Llama-3.3-70B-Instruct-GGUF", "Q4_K_M", 39.59, 256, 2, 16.57,
     False, XIONGJIE),
    # The two K-quant rows were seen against the GH100 line frozen in c51f4ae (+64 %, +40 %) before a card off that
    # line got a range (806f209): shown against the range, not counted as its test.
    ("H100 PCIe", "nvidia-datacenter", "cuda", 2000, True, LLAMA3_8B, "Q4_K_M", 4.58, 256, 1, 145.55, SEEN_BEFORE_RANGE,
     XIONGJIE),
    ("H100 PCIe", "nvidia-datacenter", "cuda", 2000, True, LLAMA3_8B, "F16", 14.96, 256, 1, 68.03, False, XIONGJIE),
    ("H100 PCIe", "nvidia-datacenter", "cuda", 2000, True, "bartowski/Llama-3.3-70B-Instruct-GGUF", "Q4_K_M", 39.59, 256, 1, 25.03,
     SEEN_BEFORE_RANGE, XIONGJIE),
    ("Iris Xe (homelab)", "intel-igpu", "vulkan", 53.9, False, "ggml-org/Qwen3.6-35B-A3B-GGUF", "Q4_K_M", 19.8, 0, 1,
     11.59, True, "seed 000: llama-bench tg128 on k8s-1"),
    ("Iris Xe (homelab)", "intel-igpu", "vulkan", 53.9, False, LLAMA3_8B, "Q4_K_M", 4.58, 0, 1, 10.78, False,
     "seed 000: dense 8B tg128 on k8s-1"),
    ("Iris Xe (homelab)", "intel-igpu", "vulkan", 53.9, False,
     dict(params_b=27.0, layers=64, kv_heads=8, head_dim=128), "Q4_K_M", 16.5e9 / GIB, 0, 1, 3.3, False,
     "seed 000: dense 27B, 16.5 GB/token"),
    ("RX 7900 XTX", "amd-discrete-rocm", "rocm", 960, True, LLAMA3_8B, "Q4_K_M", 4.58, 0, 1, 105.75, True,
     "llama.cpp PR #26284 (RDNA3 MMQ tuning), llama 8B Q4_K_M tg64"),
    ("RX 7900 XTX", "amd-discrete-rocm", "rocm", 960, True, LLAMA3_8B, "Q4_K_M", 4.58, 4096, 1, 98.67, True,
     "llama.cpp PR #26284, llama 8B Q4_K_M tg64@d4096"),
    ("RX 7900 XTX", "amd-discrete-rocm", "rocm", 960, True, LLAMA2_7B, "Q4_0", 3.56, 128, 1, 167.11, True,
     "llama.cpp discussion #15021, llama 7B Q4_0 tg128 (an older build)"),
    ("Strix Halo", "amd-apu", "rocm", 256, False, LLAMA2_7B, "Q4_0", 3.56, 0, 1, 50.59, True,
     "kyuz0/amd-strix-halo-toolboxes d1a34bee, llama-2-7b.Q4_0 rocm-7_2_3 fa1, tg128"),
    ("Strix Halo", "amd-apu", "vulkan", 256, False, LLAMA2_7B, "Q4_0", 3.56, 0, 1, 55.73, False,
     "kyuz0/amd-strix-halo-toolboxes d1a34bee, llama-2-7b.Q4_0 vulkan_radv fa1, tg128"),
    ("Strix Halo", "amd-apu", "vulkan", 256, False, "Qwen/Qwen3-30B-A3B-GGUF", "Q4_K_M", 16.49, 0, 1, 77.96, True,
     "lhl/strix-halo-testing 5ee14b5b, Qwen3-30B-A3B-UD-Q4_K_XL, tg128"),
]


def server_and_pool(profile, backend, bandwidth, discrete, facts, quant, weights_gib, depth, gpus, ngl=None, cpu_moe=None,
                    threads=8, host=None, cost=None, ctx_size=None, ubatch=None, cache="f16", quantized=None, experts_us=None):
    """The model server and node pool a measured row stands for: host is the node's read bandwidth by threads
    (memory_bandwidth_by_threads), cost its decode figures by threads (cpu_decode_by_threads), quantized its CPU's
    quantized-cache ratios (cpu_quantized_kv), experts_us what a block of experts moved to RAM adds
    (experts_in_ram_us_by_threads); the context twice
    the depth unless given (a prompt's run: the prompt and the depth), the micro-batch llama.cpp's unless given."""
    model_facts = lookup(facts) if isinstance(facts, str) else ModelFacts.model_validate(facts)
    model = ModelServer.model_validate({
        "role": "chat", "name": "m", "image": f"ghcr.io/ggml-org/llama.cpp:server-b{LLAMACPP_IMAGE_BUILD}", "node_pool": "p",
        "hf_repo": f"x/y-GGUF:{quant}", "weights": f"{weights_gib:.3f}Gi",
        "gpu_layers": (999 if ngl is None or ngl >= 99 else ngl) if discrete else 0, "cpu_moe_layers": cpu_moe or None,
        "ctx_size": ctx_size or max(depth, 512) * 2, "gpus": gpus, "facts": model_facts.model_dump(), "threads": threads,
        "ubatch_size": ubatch, "cache_type_k": cache, "cache_type_v": cache, "resources": {"cpu_request": "1", "cpu_limit": str(max(threads, 8))},
    })
    pool = NodePool.model_validate({
        "memory": "256Gi", "allocatable": "250Gi", "memory_bandwidth_gbs": max((host or {0: 60}).values()) if discrete else bandwidth,
        "memory_bandwidth_by_threads": host, "cpu_decode_by_threads": cost, "cpu_quantized_kv": quantized,
        "experts_in_ram_us_by_threads": experts_us,
        "decode_profile": profile if backend != "cpu" else None, "backend": backend,
        **({"vram": "80Gi", "vram_bandwidth_gbs": bandwidth, "gpu_resource": "nvidia.com/gpu", "gpus_per_node": gpus} if discrete else {}),
    })
    return model, model_facts, pool


def prediction(*args, **kwargs) -> Optional[float]:
    """The plan's decode rate for a measured row (prediction_range's low end: the point the summary prints)."""
    span = prediction_range(*args, **kwargs)
    return span[0] if span else None


def prediction_range(profile, backend, bandwidth, discrete, facts, quant, weights_gib, depth, gpus, ngl=None, cpu_moe=None,
                     threads=8, host=None, cost=None, cache="f16", quantized=None, experts_us=None) -> Optional[tuple[float, float]]:
    """(low, high): equal where the plan prints one figure; a range where the plan prints one (the CPU's part on a node
    whose figures, make host-profile, were not measured; a card off its profile's measured bandwidths), as the summary
    prints it."""
    model, model_facts, pool = server_and_pool(profile, backend, bandwidth, discrete, facts, quant, weights_gib, depth,
                                               gpus, ngl, cpu_moe, threads, host, cost, cache=cache, quantized=quantized,
                                               experts_us=experts_us)
    rates = predict_range_tok_s(model, model_facts, pool, backend, discrete, {"depth": depth})
    return rates["depth"] if rates else None


def solved_cost(shape: str, quant: str, threads: int, depth: int, empty_tok_s: float, deep_tok_s: float,
                host: dict[int, float]) -> HostCost:
    """A node's decode figures at a thread count from llama-bench's rates for a CPU server of a real shape at an
    empty context and at depth (what `make host-profile` measures), given its read bandwidth by threads."""
    model, model_facts, pool = server_and_pool("cpu", "cpu", None, False, preset_facts(shape), quant,
                                               expected_weights_bytes(shape, quant) / GIB, depth, 1, threads=threads, host=host)
    return solve_host_cost(model, model_facts, pool, depth, 1 / empty_tok_s, 1 / deep_tok_s)


def stated_slowdown(slowdown: float) -> float:
    """A kv_deep_slowdown as make host-profile states it for the stack file: held to 1-10 (what the pool takes), rounded."""
    return round(min(max(slowdown, 1.0), 10.0), 2)


def planned_deep_rate(empty_tok_s: float, profile_tok_s: float, slowdown: float) -> float:
    """The f16 rate at twice the profiling depth as the plan gives it from the node's figures: the time per position
    at the profiling depth, times the node's slow-down (make host-profile's third depth; 1 where not stated)."""
    return 1 / (1 / empty_tok_s + 2 * slowdown * (1 / profile_tok_s - 1 / empty_tok_s))


def placement(discrete: bool, ngl, cpu_moe) -> str:
    if not discrete:
        return "CPU only"
    if cpu_moe:
        return "experts in RAM"
    return "partial offload" if ngl is not None and ngl < 99 else "GPU only"


def preset_facts(preset: str) -> dict:
    """A real shape's facts, counted from its tensor table (lab/contract/real_shape.py)."""
    shape, table = PRESETS[preset], tensor_table(preset)
    params = sum(math.prod(ne) for _, ne, _, _ in table) / 1e9
    experts = sum(math.prod(ne) for name, ne, _, _ in table if "_exps" in name) / 1e9
    facts = dict(params_b=params, layers=shape.n_layer, kv_heads=shape.n_head_kv, head_dim=shape.head_dim,
                 embedding_length=shape.n_embd, vocab_size=shape.n_vocab, attention_heads=shape.n_head)
    if shape.full_attention_interval:
        facts["full_attention_layers"] = shape.n_layer // shape.full_attention_interval
        facts["recurrent_state_mib"] = 62.8  # llama.cpp's RS buffer per slot (tests/test_memory_oracle.py)
    if shape.n_expert:
        facts.update(expert_params_b=experts, active_params_b=params - experts * (1 - shape.n_expert_used / shape.n_expert),
                     experts_used=shape.n_expert_used, expert_feed_forward_length=shape.n_ff_exp)
    else:
        facts["feed_forward_length"] = shape.n_ff
    return facts


# Rows of results-speed-h200.json a profile was solved from: (shape, quant, threads, layers offloaded or None,
# blocks of experts in RAM or None, depth). HOST (engines/llamacpp_host.py): the weight share from Llama-3.1-8B
# all in RAM, the KV rate from the same at depth 4096, the experts' share and per-block cost from Qwen3-30B-A3B
# with 24 and 48 blocks in RAM at 4 and 16 threads.
SPEED_CALIBRATION = ({("llama-3.1-8b", "Q4_K_M", t, 0, None, d) for t in (4, 8, 16) for d in (0, 4096)}
                     | {("qwen3-30b-a3b", "Q4_K_M", t, None, m, 0) for t in (4, 16) for m in (24, 48)})
# The runs the GH100 profile (PROFILES["nvidia-datacenter"]) was solved from (python -m lab.bench.decode_fit), by
# file and run (None: every run of the file): each row there with every layer on the card is `cal`, as is issue #44's
# table (KV_CACHE_TABLE); rows of runs measured after are its predictions.
DATACENTER_FIT = {"results-decode-h200.json": None, "results-kvcache-h200-2.json": None,
                  "results-speed-h200.json": tuple(f"H200 machine, lease {n}" for n in (1, 2, 3, 4, 5, 7)),
                  "results-speed-h100.json": tuple(f"H100 machine, lease {n}" for n in (8, 9, 10))}


def in_datacenter_fit(path: str, run: dict, r: dict) -> bool:
    """Whether a recorded row is one the GH100 profile was solved from (lab/bench/decode_fit.py takes exactly these): a
    run DATACENTER_FIT names and not marked not reproduced, decode with every layer on the card, a MoE file routing by
    token (a file routing every token alike reads fewer experts)."""
    hosts = DATACENTER_FIT.get(Path(path).name, ())
    in_run = (hosts is None or run.get("host") in (hosts or ())) and not run.get("not_counted")
    on_card = (r.get("ngl") is None or r["ngl"] >= 99) and not r.get("n_cpu_moe")
    routed = not PRESETS[r["shape"]].n_expert or r.get("routing") == "token"
    return in_run and on_card and routed and not r.get("n_prompt")


def profile_rows(run: dict, source: dict) -> list[dict]:
    """A run's CPU-only decode rows of the shape host_cost_from names, at 0, its depth and twice it, its passes folded
    (median_rows)."""
    return median_rows([r for r in run["rows"] if not r.get("n_prompt") and not r.get("ngl")
                        and r["depth"] in (0, source["depth"], 2 * source["depth"])
                        and (r["shape"], r["quant"]) == (source["shape"], source["quant"])])


def node_figures(runs: list[dict], run: dict) -> tuple[Optional[dict], Optional[dict], set, Optional[dict], Optional[dict]]:
    """What `make host-profile` gives a user for the host a run was measured on: its read bandwidth by threads,
    its decode figures by threads (cpu_decode_by_threads), both from the one run of that host that holds the
    CPU-only rows host_cost_from names (solved from them), those rows' keys (shape, quant, threads, depth), where
    that run measured quantized caches too (the tool's step 4), their ratios (cpu_quantized_kv), and where it
    measured experts in RAM (--experts), what a block moved there adds (experts_in_ram_us_by_threads).
    Every run of the host is predicted from these, as a user's servers would be."""
    source = run.get("host_cost_from")
    home = home_run(runs, run)
    if home is None:
        bandwidth = run.get("host_read_gbs")
        return ({int(k): v for k, v in bandwidth.items()} if bandwidth else None), None, set(), None, None
    host = {int(k): v for k, v in home["host_read_gbs"].items()}
    source_rows = profile_rows(home, source)
    rates = {(r["threads"], r["depth"]): r["tok_s"] for r in source_rows if cache_type(r) == "f16"
             and r["depth"] < 2 * source["depth"]}
    costs, used, deep_used = {}, set(), set()
    # The same shape at twice the depth: its kv_deep_slowdown (make host-profile's third depth), from the profile itself
    # (its passes folded) where it has the row, else from a run of this host that is not a profile (lease 10's).
    others = [profile_rows(other, source) for other in runs if other.get("host") == run.get("host")
              and not other.get("not_counted") and not other.get("host_profile")]
    deep_rates = {r["threads"]: r["tok_s"] for rows_ in [*others, source_rows]  # the profile's last: its rate stands
                  for r in rows_ if cache_type(r) == "f16" and r["depth"] == 2 * source["depth"]}
    for threads in sorted({t for t, _ in rates}):
        if (threads, 0) in rates and (threads, source["depth"]) in rates:
            cost = solved_cost(source["shape"], source["quant"], threads, source["depth"], rates[(threads, 0)],
                               rates[(threads, source["depth"])], host)
            costs[threads] = {"block_us": cost.block_us, "kv_gbs_per_thread": cost.kv_gbs}
            used |= {(source["shape"], source["quant"], threads, d) for d in (0, source["depth"])}
            if threads in deep_rates and 2 * source["depth"] == KV_DEEP_DEPTH:
                costs[threads]["kv_deep_slowdown"] = stated_slowdown(kv_deep_slowdown(
                    rates[(threads, 0)], rates[(threads, source["depth"])], deep_rates[threads]))
                deep_used.add((source["shape"], source["quant"], threads, KV_DEEP_DEPTH))
    most = max((t for t, _ in rates), default=None)
    quantized = {}
    for kind in ("q8_0", "q4_0"):
        mine = {r["depth"]: r for r in source_rows if cache_type(r) == kind and r["threads"] == most}
        deep = {d: r["tok_s"] for d, r in mine.items()}
        if not (home.get("host_profile") and 0 in deep and (most, 0) in rates and (most, source["depth"]) in rates):
            continue
        # The tool states the ratio at twice the depth, against the f16 time per position the plan gives there (its
        # slow-down included: without one the ratio is not stated); a profile recorded before it did (leases 7-11)
        # measured the quantized caches at the depth itself.
        at = 2 * source["depth"] if 2 * source["depth"] in deep else source["depth"] if source["depth"] in deep else None
        slowdown = (costs.get(most) or {}).get("kv_deep_slowdown")
        if at is None or (at != source["depth"] and slowdown is None):
            continue
        f16 = rates[(most, source["depth"])] if at == source["depth"] else planned_deep_rate(
            rates[(most, 0)], rates[(most, source["depth"])], slowdown)
        ratio = quantized_kv_ratio((rates[(most, 0)], f16), (deep[0], deep[at]))
        if quantized_refusal(kind, rates[(most, 0)], mine[0], mine[at], ratio) is not None:
            continue  # the tool states no ratio for this cache (the host moved between or during the runs)
        quantized[kind] = round(ratio, 2)
        used |= {(source["shape"], source["quant"], most, d, kind) for d in (0, at)}
    experts_us = None
    moved = [r for r in home["rows"] if r.get("n_cpu_moe") and (r["shape"], r["quant"]) == EXPERTS_PROFILE_SHAPE]
    if home.get("host_profile") and moved:
        # Restated at the profile's bandwidth from the readings around the step, as the tool prints it (recorded since
        # lease 15); refused (the reason is the tool's): HOST.expert_share, as for a user.
        figure, _, _ = experts_figure(moved, home.get("experts_read_gbs_around"), host)
        if figure:
            experts_us = figure
            used |= {(r["shape"], r["quant"], r["threads"], r["depth"], "experts", r["n_cpu_moe"]) for r in moved}
    # The rows the figures came from, as this run holds them: all of them for the home; for another profile of the
    # host (refused, or not the first that stands) none, its rows its own (measured_row); for any other run the row
    # at twice the depth it may have supplied.
    mine = used | deep_used if run is home else set() if run.get("host_profile") else deep_used
    return host, costs or None, mine, quantized or None, experts_us


def home_run(runs: list[dict], run: dict) -> Optional[dict]:
    """The run of this run's host its figures come from (node_figures): the first with its read bandwidth, the shape
    host_cost_from names at the profiling depth, and no refusal; None where the run names no source or none stands."""
    source = run.get("host_cost_from")

    def stands(other: dict) -> bool:
        """A run of this host with its read bandwidth, the source shape at the profiling depth, and no refusal."""
        if other.get("host") != run.get("host") or not other.get("host_read_gbs"):
            return False
        mine = profile_rows(other, source)
        return any(r["depth"] == source["depth"] for r in mine) and profile_refusal(mine, source["depth"]) is None

    return next((other for other in runs if stands(other)), None) if source else None


def rows(measured_files: dict[str, tuple[str, str, float, bool]]) -> list[tuple]:
    return fixed_rows() + [row for _, _, row in measured_rows(measured_files)]


def fixed_rows() -> list[tuple]:
    """The rows of published and issue #44's figures (RECORDS, kv_cache_rows), the recorded leases' aside."""
    out = []
    for device, profile, backend, bw, discrete, facts, quant, weights, depth, gpus, measured, cal, source in RECORDS:
        low, high = prediction_range(profile, backend, bw, discrete, facts, quant, weights, depth, gpus) or (None, None)
        span = (low, high) if low and is_range(low, high) else None
        name = facts if isinstance(facts, str) else f"{facts['params_b']:g}B dense"
        where = "GPU only" if discrete else ("CPU only" if backend == "cpu" else "GPU, unified memory")
        out.append((device, f"{name} {quant}", depth, measured, low, RANGE if span and not cal else cal, source, where,
                    None, "f16", span))
    return out + kv_cache_rows()


def measured_rows(measured_files: dict[str, tuple[str, str, float, bool]]):
    """Each recorded decode row with the read bandwidth by threads its host's figures give (node_figures) and its row of
    the table (measured_row); a counted MoE point whose routed experts the plan reads at HOST.expert_share marked so
    (experts_at_host_share: unfigured_experts_errors)."""
    for path, (profile, backend, bandwidth, discrete) in measured_files.items():
        runs = recorded_runs(path) if Path(path).exists() else []
        for run in runs:
            host, cost, cost_rows, quantized, experts_us = node_figures(runs, run)
            compute = profile_compute(home_run(runs, run))
            for r in run["rows"]:
                if r.get("n_prompt"):
                    continue  # prefill: lab/bench/prefill_error.py
                pace = compute_pace(r, compute)  # the row marked with it for make bench's line by compute
                r = r | ({"compute_pace": pace} if pace else {})
                row = measured_row(r, run, path, profile, backend, bandwidth, discrete, host, cost, cost_rows, quantized,
                                   experts_us)
                if row[4] and not row[5] and PRESETS[r["shape"]].n_expert:  # a counted MoE point
                    args, kwargs = planned_inputs(r, profile, backend, bandwidth, discrete, host, cost, quantized,
                                                  experts_us)
                    if experts_at_host_share(*server_and_pool(*args, **kwargs), args[1], args[3]):
                        r = r | {"experts_at_host_share": True}
                yield r, host, row


def planned_inputs(r, profile, backend, bandwidth, discrete, host, cost, quantized=None, experts_us=None) -> tuple:
    """A recorded row's server and pool as make bench plans it (server_and_pool's and prediction_range's arguments)."""
    weights = r.get("weights_bytes")
    if weights is None:
        weights = expected_weights_bytes(r["shape"], r["quant"])
    ngl = r.get("ngl") if r.get("ngl") is not None and r.get("ngl") < 99 else None
    cpu_moe, threads = r.get("n_cpu_moe") or None, r.get("threads") or 8
    on_card = discrete and ngl != 0
    if host and r.get("read_gbs_around"):
        # The host's read bandwidth read around this row's job (measure_decode --host-bandwidth): a shared host's drifts.
        around = sum(r["read_gbs_around"]) / len(r["read_gbs_around"])
        if experts_us and on_card and profile in PROFILES:
            experts_us = experts_at(experts_us, host, threads, around, profile, bandwidth)
        host = {**host, threads: around}
    # The compute read around the job (compute_pace) is not planned with: restating the CPU's own work at it (5df4fcd)
    # planned seven of lease 18's eight deep points 16-73 % fast, the probe reading 1.0-2.7 times the profile's where the
    # attention did not follow. It stays on the row for make bench's line by compute (compute_drift).
    return ((profile if on_card else "cpu", backend if on_card else "cpu", bandwidth if on_card else None, on_card,
             preset_facts(r["shape"]), r["quant"], weights / GIB, r["depth"], 1, ngl, cpu_moe, threads, host, cost),
            dict(cache=cache_type(r), quantized=quantized, experts_us=experts_us))


def measured_row(r, run, path, profile, backend, bandwidth, discrete, host, cost, cost_rows, quantized=None,
                 experts_us=None) -> tuple:
    args, kwargs = planned_inputs(r, profile, backend, bandwidth, discrete, host, cost, quantized, experts_us)
    on_card, ngl, cpu_moe, threads, host, cache = args[3], args[9], args[10], args[11], args[12], kwargs["cache"]
    low, high = prediction_range(*args, **kwargs) or (None, None)
    predicted = low
    # Where the host's figures were not measured (none, or not its attention past KV_PROFILE_DEPTH) the plan prints a
    # range (its summary says why; the plan's own test for one, engines/llamacpp.py), so the row is held to that
    # range, not to one end of it as a point (range_summary), and is counted there, not among the points.
    span = (low, high) if low and is_range(low, high) else None
    key = (r["shape"], r["quant"], threads, r["depth"])
    # HOST's rows (SPEED_CALIBRATION) and a row recorded as calibration (cal: true) are f16; the GH100 fit takes every
    # cache type.
    cal = (cache == "f16" and (r.get("cal") is True or (r["shape"], r["quant"], threads, r.get("ngl") if r.get("ngl") != 99
                                                        else None, cpu_moe, r["depth"]) in SPEED_CALIBRATION)) or (
        profile == "nvidia-datacenter" and in_datacenter_fit(path, run, r))
    if run.get("host_profile") and cpu_moe:
        # make host-profile --experts's own row: the node's experts figure came from it, or it was refused.
        cal = "node figures" if (*key, "experts", cpu_moe) in cost_rows else "refused by the profile"
    elif not on_card and ((cache == "f16" and key in cost_rows) or (*key, cache) in cost_rows):
        cal = "node figures"  # the host's decode figures were solved from this row (make host-profile's)
    elif not on_card and run.get("host_profile"):
        cal = "refused by the profile"  # make host-profile's own row of a profile or a ratio it refuses (not the home's)
    if PRESETS[r["shape"]].n_expert and r.get("routing") != "token":
        cal = "zero routing"  # every token routed alike (issue #33 item 7): shown, not counted
    if isinstance(r.get("cal"), str):
        cal = r["cal"]  # what the row calibrated, recorded with it
    where = placement(on_card, ngl, cpu_moe)
    if run.get("not_counted"):
        cal = "not reproduced"
    elif where != "GPU only" and not host:
        # No read bandwidth for the plan to start from (a user states the node's): shown, not counted, no figure.
        cal, predicted, span = "host not measured", None, None
    elif span and not cal:
        cal = RANGE
    detail = (f"t{threads}" + (f" ngl {ngl}" if ngl else "") + (f" cmoe {cpu_moe}" if cpu_moe else "")
              + (" token routing" if r.get("routing") == "token" else ""))
    machine = run.get("host") or ""  # the run's host label (host, above, is its read bandwidth)
    device = (r["device"] if machine in r["device"] else machine if machine.startswith(r["device"])
              else f"{r['device']}, {machine}")
    return (device, f"{r['shape']} {r['quant']}", r["depth"], r["tok_s"], predicted, cal,
            f"lab/bench/measure_decode.py, b10729 ({Path(path).name})", where, detail, cache, span)


def unfigured_experts_errors(walked: list[tuple]) -> list[float]:
    """The error of every counted point (measured_rows, walked) whose routed experts the plan reads from RAM beside the
    card at HOST.expert_share (the host's experts figure not measured, refused or not usable), every lease."""
    return [(row[4] - row[3]) / row[3] for r, _, row in walked if r.get("experts_at_host_share")]


MEASURED = {
    str(ROOT / "bench" / "results-decode-h200.json"): ("nvidia-datacenter", "cuda", 4800, True),
    str(ROOT / "bench" / "results-speed-h200.json"): ("nvidia-datacenter", "cuda", 4800, True),
    str(ROOT / "bench" / "results-decode-cpu.json"): ("cpu", "cpu", None, False),
    str(ROOT / "bench" / "results-kvcache-h200-2.json"): ("nvidia-datacenter", "cuda", 4800, True),
    str(ROOT / "bench" / "results-speed-h100.json"): ("nvidia-datacenter", "cuda", 3350, True),
}


# Issue #44's table (llama-bench b10729 on an H200, flash attention on, every layer on the card, three cache types at
# depths 0-32k): the rows H200_QUANTIZED_KV (engines/llamacpp_speed.py) was solved from, and with its f16 rows part of
# the GH100 profile's fit (DATACENTER_FIT), so every row is `cal`.
KV_CACHE_TABLE = ROOT / "bench" / "results-kvcache-h200.json"
KV_CACHE_SHAPES = {"Qwen3-8B": "qwen3-8b", "Qwen3-14B": "qwen3-14b", "Qwen3-30B-A3B": "qwen3-30b-a3b"}


def kv_cache_rows() -> list[tuple]:
    record = json.loads(KV_CACHE_TABLE.read_text())
    out = []
    for row in record["rows"]:
        shape = KV_CACHE_SHAPES[row["model"]]
        for depth, measured in zip(record["depths"], row["tok_s"]):
            predicted = prediction("nvidia-datacenter", "cuda", 4800, True, preset_facts(shape), row["quant"],
                                   expected_weights_bytes(shape, row["quant"]) / GIB, depth, 1, cache=row["cache"])
            out.append(("NVIDIA H200", f"{shape} {row['quant']}", depth, measured, predicted, True,
                        f"issue #44 ({KV_CACHE_TABLE.name})", "GPU only", "token routing" if "A3B" in row["model"] else "",
                        row["cache"], None))
    return out


def recorded_runs(path: str) -> list[dict]:
    """A results file's runs, a grid's passes folded (fold_passes); an early file that is a bare list of rows is one
    run with no host."""
    record = json.loads(Path(path).read_text())
    return [fold_passes(run) for run in record["runs"]] if isinstance(record, dict) else [{"rows": record}]


def recorded_node_figures(experts: bool = False) -> dict[str, tuple]:
    """Each measured host's read bandwidth and decode figures by threads, as make host-profile gives them (with
    experts, its experts figure too, or None)."""
    out = {}
    for path in MEASURED:
        runs = recorded_runs(path)
        for run in runs:
            host, costs, _, _, figure = node_figures(runs, run)
            if costs:
                out[run["host"]] = (host, costs, figure) if experts else (host, costs)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-figures", action="store_true", help="print each measured host's figures instead")
    args = parser.parse_args(argv)
    if args.node_figures:
        for name, (host, costs, experts) in recorded_node_figures(experts=True).items():
            print(f"{name}: read GB/s {host}; " + ", ".join(
                f"{t} threads {c['block_us']:.0f} us a block, KV {c['kv_gbs_per_thread']:.2f} GB/s a thread"
                + (f", {c['kv_deep_slowdown']:.2f} times the time per position at 8192" if c.get("kv_deep_slowdown") else "")
                for t, c in costs.items()) + "".join(
                f"; experts in RAM {us} us a block moved with {t} threads" for t, us in (experts or {}).items()))
        return 0
    walked = list(measured_rows(MEASURED))
    table = fixed_rows() + [row for _, _, row in walked]
    print("| placement | device | model | settings | KV cache | depth | measured t/s | predicted t/s | error | source |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for device, model, depth, measured_tok_s, predicted, cal, source, where, detail, cache, span in table:
        error = f"{(predicted - measured_tok_s) / measured_tok_s:+.0%}" if predicted else "-"
        mark = f" ({cal})" if isinstance(cal, str) else " (cal)" if cal else ""
        shown = f"{predicted:.1f}" if predicted else "-"
        if span:
            shown = f"{span[0]:.1f}-{span[1]:.1f}"
            error = "within" if span[0] <= measured_tok_s <= span[1] else (
                f"{(span[0] - measured_tok_s) / measured_tok_s:+.0%} of its low end" if measured_tok_s < span[0]
                else f"{(span[1] - measured_tok_s) / measured_tok_s:+.0%} of its high end")
        print(f"| {where} | {device} | {model} | {detail or ''} | {cache} | {depth} | {measured_tok_s:.2f} | {shown} | {error}{mark} | {source} |")
    print()
    within, count = range_summary(table)
    if count:
        print("decode where the plan prints a range (a host's figures, or a card's K-quant read at its bandwidth, not "
              f"measured): {within} of {count} measurements within it ({within / count:.0%}; goal {DECODE_GOAL:.0%})")
    commit, hosts = FROZEN
    def but(moved):
        return ", all but " + ", ".join(f"{w} of {o}" + (f" ({rest[0]})" if rest else "") for o, w, *rest in moved)
    before = "; ".join(f"commit {c}: {', '.join(h)}" + (but(m) if m else "") for c, h, m, _ in CARRIED)
    print(f"decode measured after the model was last frozen (commit {commit}; {', '.join(hosts) or 'no host since'}), "
          f"and after it was frozen before where no change since moved the prediction ({before}), out of sample:")
    print_classes([row for row in table if out_of_sample(row)], "  ")
    walked_out = [w for w in walked if out_of_sample(w[2])]  # the out-of-sample points, for the lines below
    drift = [f"{label}: {within} of {count} within +-{TOLERANCE:.0%}"
             for label, within, count in drift_counts(walked_out) if count]
    if drift:
        print("  by the host's read bandwidth around the job, against what its figures were measured at (points beside "
              "layers or experts in RAM or CPU only that carry a reading): " + "; ".join(drift))
    paced = [f"{label}: {within} of {count} within +-{TOLERANCE:.0%}"
             for label, within, count in drift_counts(walked_out, compute_drift) if count]
    if paced:
        print("  by the host's compute around the job, against what it read while its figures were measured (points "
              "that carry both readings, since lease 18): " + "; ".join(paced))
    heads = [f"{h} heads on {t} threads: {within} of {count} within +-{TOLERANCE:.0%}, median {median:+.0%}"
             for h, t, within, count, median in head_counts(walked_out)]
    if heads:
        print("  by query heads over threads, a quantized cache at depth beside layers in RAM or on the CPU alone (the "
              "kernel's one head to a thread; median of predicted over measured, less 1): " + "; ".join(heads))
    errors = unfigured_experts_errors(walked)  # the summary's span (engines/llamacpp_held.UNFIGURED_EXPERTS_ERROR)
    print(f"experts read from RAM at HOST's share (no experts figure of the host's; every lease): {len(errors)} points, "
          f"{min(errors):+.0%} to {max(errors):+.0%}, {sum(abs(e) <= TOLERANCE for e in errors)} within +-{TOLERANCE:.0%}")
    print("every recorded measurement (each lease against the model as it is now):")
    print_classes(table, "decode ")
    return 0


def print_classes(table, lead: str) -> None:
    """One line per placement and KV cache type (summary): the predictions within TOLERANCE, of how many."""
    for where, within, count in summary(table):
        print(f"{lead}{where}: {within} of {count} predictions within +-{TOLERANCE:.0%} ({within / count:.0%}; "
              f"goal {DECODE_GOAL:.0%})")


RANGE = "the plan's range"
# The commit the decode model (engines/llamacpp_speed.py, llamacpp_host.py; make host-profile's rules: profile_rules.py)
# was last frozen at, and the hosts measured after it: their rows are the out-of-sample figure. A change to the model
# after a host's rows were seen moves the commit and empties the hosts (the rows seen stay in the all-leases lines, in
# sample; those whose prediction it left as it was stay out of sample: CARRIED); one that leaves every prediction of
# those hosts' rows as it was does not (the node's experts figure,
# experts_in_ram_us_by_threads, added before lease 15 measured the first; moving code between modules; the unmeasured
# range's slow end following the most measured, KV_DEEP_SLOWDOWN_MOST with lease 16, which moved only earlier leases'
# ranges).
FROZEN = ("07fbb1b", ("H100 machine, lease 22", "H100 machine, lease 23", "H100 machine, lease 24", "H100 machine, lease 25"))
# The freezes before, newest first: each one's commit, the hosts measured after it, the rows of those hosts a change
# since moved ((host, placement): all of that placement's; (host, placement, AT_DEPTH): its quantized caches at a
# depth only; (host, placement, F16_AT_DEPTH): its f16 caches at a depth, of more query heads than the probe's), and
# the commit whose docs table printed their predictions before that change (tests/test_speed_model.py holds every
# unmoved row to it). Their other rows were predicted before they were seen, by the model as it still is for them: out
# of sample still. The changes: CPU_KV_SHAPES on f16 caches too (07fbb1b) moved the f16 caches at depth beside layers
# in RAM and on the CPU alone of models of more than 16 query heads, of leases 20 and 21 (no carried host before them
# has one); CPU_KV_SHAPES on quantized caches only, with head_rounds out (3762243), moved the quantized caches at
# depth beside layers in RAM and on the CPU alone of leases 14-17 and 19; 29c4b85 took the compute pace out: it moved
# lease 18's rows beside layers in RAM and on the CPU alone, not its experts rows; 5df4fcd's compute pace moved none of
# lease 17's rows, which carry no compute reading; a3c9d1b paired the experts step's passes: it moved only the experts
# rows of hosts with an experts figure, leases 15 and 16.
AT_DEPTH = "quantized cache at depth, but of 40 query heads"
# 40 query heads on 16 threads: head_rounds charged them 1.2, as CPU_KV_SHAPES does; their rows did not move.
UNMOVED_HEADS = 40
F16_AT_DEPTH = "f16 cache at depth, of more query heads than the probe's"
CARRIED = (
    ("3762243", ("H100 machine, lease 20", "H100 machine, lease 21"),
     tuple((f"H100 machine, lease {n}", place, F16_AT_DEPTH) for n in (20, 21)
           for place in ("partial offload", "CPU only")),
     "b4f301c"),
    ("29c4b85", ("H100 machine, lease 19",),
     (("H100 machine, lease 19", "partial offload", AT_DEPTH), ("H100 machine, lease 19", "CPU only", AT_DEPTH)),
     "8770137"),
    ("5df4fcd", ("H200 machine, lease 18",),
     (("H200 machine, lease 18", "partial offload"), ("H200 machine, lease 18", "CPU only")), "5793314"),
    ("a3c9d1b", ("H100 machine, lease 17",),
     (("H100 machine, lease 17", "partial offload", AT_DEPTH), ("H100 machine, lease 17", "CPU only", AT_DEPTH)),
     "88e4cbd"),
    ("a0782b9", ("H100 machine, lease 14", "H100 machine, lease 15", "H100 machine, lease 16"),
     (("H100 machine, lease 15", "experts in RAM"), ("H100 machine, lease 16", "experts in RAM"),
      *((f"H100 machine, lease {n}", place, AT_DEPTH) for n in (14, 15, 16) for place in ("partial offload", "CPU only"))),
     "203242d"),
)


def moved_by(row, moved) -> bool:
    """Whether a change since its host's freeze moved this row of the table (rows): one of CARRIED's moved entries."""
    device, depth, where, cache = row[0], row[2], row[7], row[9]
    heads = PRESETS[row[1].split()[0]].n_head
    part = {AT_DEPTH: cache != "f16" and depth > 0 and heads != UNMOVED_HEADS,
            F16_AT_DEPTH: cache == "f16" and depth > 0 and heads > PROBE_QUERY_HEADS}
    return any(device.endswith(host) and where == place and (not rest or part[rest[0]]) for host, place, *rest in moved)


def out_of_sample(row) -> bool:
    """Whether a row of the table (rows) is counted out of sample: a host measured after the last freeze (FROZEN), or
    one measured after a freeze before whose prediction no change since moved (CARRIED)."""
    return row[0].endswith(FROZEN[1]) or any(row[0].endswith(carried) and not moved_by(row, moved)
                                             for _, carried, moved, _ in CARRIED)


def summary(table) -> list[tuple[str, int, int]]:
    """Per placement and KV cache type: predictions (calibration rows left out) within TOLERANCE, and how many;
    the quantized caches first, so an f16 CPU-only line ends the table (tools/bench_tables.py)."""
    points = [(w, c, m, p, cal) for _, _, _, m, p, cal, _, w, _, c, _ in table]
    return [(where if cache == "f16" else f"{where}, {cache} cache", within, count)
            for where, cache, within, count in class_counts(points, TOLERANCE)]


def range_summary(table) -> tuple[int, int]:
    """Rows the plan prints a range for (a host not profiled, a card outside its profile's measured bandwidths), held to
    that range: (within it, how many)."""
    spans = [(m, span) for _, _, _, m, _, cal, _, _, _, _, span in table if span and cal == RANGE]
    return sum(low <= m <= high for m, (low, high) in spans), len(spans)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
