"""make host-profile's rules, which make bench reads its records by too (lab/bench/host_profile.py, decode_error.py):
when a profile, a quantized cache's ratio or the experts figure stands (a host that moved during its runs gives none:
profile_refusal, quantized_refusal, experts_figure), and how the passes of one point fold into its median
(median_rows; a speed grid's too, fold_passes)."""

from __future__ import annotations

import statistics
from typing import Optional

from engines.llamacpp_host import EXPERTS_PROFILE_BLOCKS, HOST, KV_DEEP_DEPTH, kv_deep_slowdown


def cache_type(r: dict) -> str:
    """A decode row's KV cache type: type_k in a recorded row, kv_type in make host-profile's record, f16 if neither."""
    return r.get("type_k") or r.get("kv_type") or "f16"


# An empty context's decode does not depend on the cache type (16 tokens read almost no cache): a quantized run whose
# empty rate is further than this from f16's ran on a host whose speed moved between the runs, and its ratio, a
# difference of two such rates, says more of the move than of the cache. So does a rate whose repetitions spread more.
# The plan's own tolerance (make bench's 15 %): a host that moves more during its profile cannot back a figure within
# it. Recorded profiles that stood: empty rates 2-14 % apart, repetitions spread 2-13 %; lease 11's q8_0 30 % apart.
PROFILE_STEADY = 0.15
RATIO_BOUNDS = (0.25, 20.0)  # what the pool's cpu_quantized_kv takes (config/types.py)


def profile_moved(f16_empty_tok_s: float, quantized_empty_tok_s: float) -> float | None:
    """How far a quantized cache's empty-context rate in make host-profile's run lies from f16's, where it is further
    than PROFILE_STEADY (the host moved: the tool states no ratio for that cache); None where steady."""
    moved = quantized_empty_tok_s / f16_empty_tok_s - 1
    return moved if abs(moved) > PROFILE_STEADY else None


def spread(tok_s: float, stddev: float | None) -> float | None:
    """How far llama-bench's repetitions of one rate spread (stddev over mean), where further than PROFILE_STEADY (the
    node's speed moved during the run: lease 13's first f16 empty rate, 31.7 +- 10.3 tok/s); None where steady."""
    moved = (stddev or 0.0) / tok_s
    return moved if moved > PROFILE_STEADY else None


def profile_refusal(source_rows: list[dict], depth: int) -> str | None:
    """Why make host-profile refuses a profile's f16 figures (it exits 1: run it again), from its f16 rows at 0, depth
    and twice it (passes folded): a rate whose repetitions spread past PROFILE_STEADY, a context of depth tokens no
    slower than the empty one, or at the default depth (where the tool states it) a slow-down past the depth outside
    1-10 (the rates moved more than the attention did); None where it stands. make bench solves a host's figures from
    the first profile of the host that stands, as a user reruns the tool until it does."""
    f16 = [r for r in source_rows if cache_type(r) == "f16"]
    for r in f16:
        if spread(r["tok_s"], r.get("stddev")) is not None:
            return (f"with {r['threads']} threads the rate at {r['depth']} spread {r['stddev'] / r['tok_s']:.0%} over its "
                    f"runs (more than {PROFILE_STEADY:.0%}): the node's speed moved")
    rates = {(r["threads"], r["depth"]): r["tok_s"] for r in f16}
    for threads in sorted({t for t, _ in rates}):
        if (threads, 0) in rates and (threads, depth) in rates and not rates[(threads, depth)] < rates[(threads, 0)]:
            return (f"with {threads} threads the context of {depth} tokens was not slower than the empty one "
                    f"({rates[(threads, depth)]:.2f} against {rates[(threads, 0)]:.2f} tok/s): the node was busy, or "
                    "the depth too small")
        # Held at the profile's own depth only, where the tool states the slow-down (2 * depth == KV_DEEP_DEPTH).
        if 2 * depth == KV_DEEP_DEPTH and all((threads, d) in rates for d in (0, depth, 2 * depth)):
            slowdown = kv_deep_slowdown(rates[(threads, 0)], rates[(threads, depth)], rates[(threads, 2 * depth)])
            if not 1.0 <= slowdown <= 10.0:
                return (f"with {threads} threads a position at {2 * depth} took {slowdown:.2f} times its time at {depth}, "
                        "outside 1-10: the node's speed moved")
    return None


def quantized_refusal(kind: str, f16_empty_tok_s: float, empty: dict, deep: dict, ratio: float) -> str | None:
    """Why make host-profile states no ratio for a quantized cache (the f16 figures stand; it exits 1), from that
    cache's rows at an empty context and at depth (passes folded) and the ratio they give: a rate whose repetitions
    spread past PROFILE_STEADY, an empty rate further than that from f16's (profile_moved), a depth no slower than
    the empty context, or a ratio outside what the pool takes; None where it stands. make bench reads recorded
    profiles by this rule too."""
    for r in (empty, deep):
        if spread(r["tok_s"], r.get("stddev")) is not None:
            return (f"the {kind} cache's rate at {r['depth']} spread {r['stddev'] / r['tok_s']:.0%} over its runs (more "
                    f"than {PROFILE_STEADY:.0%}: the node's speed moved): no {kind} ratio")
    moved = profile_moved(f16_empty_tok_s, empty["tok_s"])
    if moved is not None:
        return (f"the {kind} cache's empty context ran {empty['tok_s']:.2f} tok/s against f16's {f16_empty_tok_s:.2f} "
                f"({moved:+.0%}; a cache type does not change an empty context's decode, so the node's speed moved by "
                f"more than {PROFILE_STEADY:.0%} between the runs): no {kind} ratio")
    if not (deep["tok_s"] < empty["tok_s"] and RATIO_BOUNDS[0] <= ratio <= RATIO_BOUNDS[1]):
        return (f"the {kind} cache gave {empty['tok_s']:.2f} tok/s empty and {deep['tok_s']:.2f} at {deep['depth']} "
                f"({ratio:.2f} times f16's time per position, outside {RATIO_BOUNDS[0]:g}-{RATIO_BOUNDS[1]:g}): the node "
                "was busy")
    return None


def experts_point(r: dict) -> tuple:
    """One point of make host-profile --experts: its threads and blocks of experts in RAM."""
    return r["threads"], r["n_cpu_moe"]


def experts_figure(rows: list[dict], readings: Optional[dict] = None,
                   read_gbs: Optional[dict] = None) -> tuple[dict[int, int], Optional[str], dict[tuple, dict]]:
    """make host-profile --experts's figure (experts_in_ram_us_by_threads) from its rows: per thread count, what each
    block whose experts moved to RAM added per token, in microseconds, from the rates with EXPERTS_PROFILE_BLOCKS's
    blocks in RAM, paired within each pass (pass_figures) and the median over the passes taken; or why none stands
    (the tool exits 1, make bench plans with HOST.expert_share): a rate whose repetitions spread past PROFILE_STEADY,
    or a block that added no more than HOST.expert_block_us (more blocks in RAM about as fast as fewer: the node's speed
    moved between the runs). The passes folded by point (median_rows by experts_point) are returned too, for the
    printed rates.
    Paired, not the difference of two medians: the two rates of one pass run back to back, minutes from the other
    passes', and a host that moves between passes moves both of a pair; a difference of medians may pair a fast pass's
    rate with a slow one's (lease 15's passes gave 353, 463 and 602 us, the medians 554). Chosen before the lease that
    first measured it; lease 16's figure is 316 us where it was 315, lease 15's 463 where it was 554.
    With the read bandwidth read around the step (readings, by threads: before and after each pass's step, in order)
    and the profile's (read_gbs, the memory_bandwidth_by_threads printed beside it), each pass's figure is restated at
    the latter from its own pass's two readings (all of them where the record's readings do not pair with its passes),
    so the pool's figures agree with one another: the experts' reading time scaled by the two bandwidths' ratio,
    HOST.expert_block_us held. The plan solves the share against memory_bandwidth_by_threads (node_expert_share); the
    step runs minutes after the profile's reading, and lease 15's host read 45.7-88.1 GB/s within a call. The card's
    time for the block's bytes is scaled with the rest: off by that time times the ratio less one (about 9 us a block on
    an H100, 90 on a 360 GB/s card; at a ratio of 0.87, 1 and 12 us)."""
    folded = {experts_point(r): r for r in median_rows(rows, experts_point)}
    # Each pass's rate (the figure takes each pass's own), not only their median.
    for r in rows:
        if spread(r["tok_s"], r.get("stddev")) is not None:
            return {}, (f"with {r['n_cpu_moe']} blocks of experts in RAM the rate spread {r['stddev'] / r['tok_s']:.0%} over "
                        f"its runs (more than {PROFILE_STEADY:.0%}): the node's speed moved"), folded
    read_gbs = {int(t): v for t, v in (read_gbs or {}).items()}
    readings = {int(t): [float(v) for v in around] for t, around in (readings or {}).items()}
    figures = {}
    for threads, pairs in pass_figures(rows).items():
        us = statistics.median(pairs.values())
        if us <= HOST.expert_block_us:
            return {}, (f"with {threads} threads a block of experts moved to RAM added {us:.0f} us a token, no more than "
                        f"the {HOST.expert_block_us:.0f} us of moving the hidden state alone: the node's speed moved"), folded
        around = readings.get(threads)
        if around and read_gbs.get(threads):
            # The tool reads before and after each pass's step, pass by pass: pass n's two are around[2n:2n+2].
            passes = list(pairs)
            numbered = all(isinstance(n, int) for n in passes) and len(around) >= 2 * (max(passes) + 1)
            each = {n: around[2 * n:2 * n + 2] if numbered else around for n in passes}
            us = statistics.median(HOST.expert_block_us + (pairs[n] - HOST.expert_block_us)
                                   * (sum(each[n]) / len(each[n])) / read_gbs[threads] for n in passes)
        figures[threads] = round(us)
    return figures, None, folded


def pass_figures(rows: list[dict]) -> dict[int, dict]:
    """make host-profile --experts's rows paired within each pass: per thread count, per pass (None for rows that name
    none), what each block moved to RAM added per token in that pass, in microseconds, from its rates with
    EXPERTS_PROFILE_BLOCKS's blocks in RAM; a pass without both rates gives none."""
    few, many = EXPERTS_PROFILE_BLOCKS
    rates: dict[tuple, dict[int, float]] = {}
    for r in rows:
        rates.setdefault((r["threads"], r.get("pass")), {})[r["n_cpu_moe"]] = r["tok_s"]
    out: dict[int, dict] = {}
    for (threads, n), pair in sorted(rates.items(), key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1])):
        if few in pair and many in pair:
            out.setdefault(threads, {})[n] = (1 / pair[many] - 1 / pair[few]) / (many - few) * 1e6
    return out


def profile_point(r: dict) -> tuple:
    """One point of make host-profile's record (one shape): its cache type, threads and depth."""
    return cache_type(r), r["threads"], r["depth"]


# One point of a speed grid (measure_decode --jobs): what llama-bench ran, less the pass.
GRID_POINT = ("shape", "quant", "routing", "n_prompt", "n_gen", "depth", "threads", "ngl", "n_cpu_moe", "type_k", "type_v",
              "flash_attn", "n_ubatch")


def grid_point(r: dict) -> tuple:
    return tuple(r.get(k) for k in GRID_POINT)


def median_rows(rows: list[dict], point=profile_point) -> list[dict]:
    """Passes of the same points folded into one row per point (make host-profile's, by default; a grid's with
    grid_point): the median rate over the passes (one pass the host moved in does not move it), the median of
    llama-bench's spreads, every host bandwidth and compute read around them, and how far the passes' rates lay apart
    (passes_apart: the fastest over the slowest, less 1); a record of one pass, or none named, is its own."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(point(r), []).append(r)
    out = []
    for group in groups.values():
        read = [v for r in group for v in r.get("read_gbs_around") or ()]
        compute = [v for r in group for v in r.get("compute_gops_around") or ()]
        out.append({**{k: v for k, v in group[0].items() if k != "pass"}, **({"read_gbs_around": read} if read else {}),
                    **({"compute_gops_around": compute} if compute else {}),
                    "tok_s": statistics.median(r["tok_s"] for r in group),
                    "stddev": statistics.median(r.get("stddev") or 0.0 for r in group), "passes": len(group),
                    "passes_apart": max(r["tok_s"] for r in group) / min(r["tok_s"] for r in group) - 1})
    return out


def fold_passes(run: dict) -> dict:
    """A speed grid measured in interleaved passes (measure_decode --passes: every row names its pass) with each
    point's passes folded (median_rows by grid_point), as make host-profile folds its own; a job that failed or ran out
    of time (measure_decode's {"job", "error"} rows) measured nothing and is left out; make host-profile's record
    (folded where its figures are solved: profile_rows) and a grid of one pass are as recorded."""
    measured = [r for r in run["rows"] if "error" not in r]
    if run.get("host_profile") or not measured or not all("pass" in r for r in measured):
        return run
    return {**run, "rows": median_rows(measured, grid_point)}
