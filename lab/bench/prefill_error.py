"""The prefill prediction (engines/llamacpp_prefill.py prompt_seconds) against every recorded llama-bench
prompt-processing run: one row per run with the predicted rate and the error; docs/capacity-planning.md's
table ("Prefill: predicted and measured") is this output.

    python -m lab.bench.prefill_error   (reads the records in MEASURED)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]

from lab.bench.decode_error import GIB, preset_facts, recorded_runs, server_and_pool
from lab.bench.decode_sorting import class_counts
from engines.llamacpp_prefill import prompt_seconds

TOLERANCE = 0.25
# Runs a profile's numbers were solved from (shape, quant, routing, prompt, depth, layers offloaded, experts in RAM).
CALIBRATION = {("llama-3.1-8b", "Q4_K_M", "zero", 4096, 0, 99, 0), ("llama-3.1-8b", "Q8_0", "zero", 4096, 0, 99, 0),
               ("llama-3.1-8b", "F16", "zero", 4096, 0, 99, 0), ("qwen3-30b-a3b", "Q4_K_M", "token", 4096, 0, 99, 0),
               ("qwen3.6-35b-a3b", "Q4_K_M", "token", 4096, 0, 99, 0),
               ("qwen3-8b", "Q4_K_M", "zero", 512, 16384, 99, 0), ("llama-3.1-8b", "Q4_K_M", "zero", 4096, 0, 20, 0),
               ("llama-3.1-8b", "Q4_K_M", "zero", 256, 0, -1, 0)}
# The pp512 rows (one call of the prompt) the per-call time was solved from (PrefillProfile.call_ms, moe_call_ms).
CALIBRATION |= {("llama-3.1-8b", q, "zero", 512, 0, 99, 0) for q in ("Q4_K_M", "Q8_0", "F16")} | {
    ("qwen3-8b", "Q4_K_M", "zero", 512, 0, 99, 0), ("qwen3-30b-a3b", "Q4_K_M", "token", 512, 0, 99, 0),
    ("qwen3.6-35b-a3b", "Q4_K_M", "token", 512, 0, 99, 0)}
# The narrow models the width term was solved from (PrefillProfile.full_width, width_power).
CALIBRATION |= {("qwen3-1.7b", "Q4_K_M", "zero", p, 0, 99, 0) for p in (512, 4096)} | {
    ("llama-3.2-3b", "Q4_K_M", "zero", p, 0, 99, 0) for p in (256, 1024, 2048, 4096)}


# Each record of llama-bench prompt runs: its card's bandwidth (GB/s), None for a CPU's.
MEASURED = {ROOT / "bench" / "results-speed-h200.json": 4800, ROOT / "bench" / "results-prefill-cpu.json": None,
            ROOT / "bench" / "results-kvcache-h200-2.json": 4800}


def predicted(r: dict, bandwidth: Optional[float], host: Optional[dict]) -> float:
    discrete = bandwidth is not None
    model, facts, pool = server_and_pool(
        "nvidia-datacenter" if discrete else "cpu", "cuda" if discrete else "cpu", bandwidth, discrete,
        preset_facts(r["shape"]), r["quant"], r["weights_bytes"] / GIB, r["depth"], 1, r.get("ngl"), r.get("n_cpu_moe"),
        r.get("threads") or 2, host, ctx_size=max(r["n_prompt"] + r["depth"], 512), ubatch=r.get("n_ubatch") or None,
        cache=r.get("type_k") or "f16")
    seconds = prompt_seconds(model, facts, pool, "cuda" if discrete else "cpu", discrete)
    return r["n_prompt"] / seconds(r["n_prompt"], r["depth"]) if seconds else None


def rows() -> list[tuple]:
    out = []
    for path, bandwidth in MEASURED.items():
        discrete = bandwidth is not None
        for run in recorded_runs(str(path)):
            # The host's read bandwidth where the run recorded it (a CPU's prefill is compute-bound: not needed).
            host = {int(k): v for k, v in run["host_read_gbs"].items()} if run.get("host_read_gbs") else None
            for r in run["rows"]:
                if not r.get("n_prompt"):
                    continue
                key = (r["shape"], r["quant"], r.get("routing", "zero"), r["n_prompt"], r["depth"], r.get("ngl"), r.get("n_cpu_moe") or 0)
                where = ("CPU only" if not discrete else "experts in RAM" if r.get("n_cpu_moe")
                         else "partial offload" if (99 if r.get("ngl") is None else r["ngl"]) < 99 else "GPU only")
                zero_moe = "qwen3" in r["shape"] and "a3b" in r["shape"] and r.get("routing") != "token"
                out.append((where, r["device"], f"{r['shape']} {r['quant']}", r["n_prompt"], r["depth"],
                            r.get("type_k") or "f16", r["tok_s"], predicted(r, bandwidth, host),
                            "not reproduced" if run.get("not_counted") else "zero routing" if zero_moe
                            else r.get("cal") or key in CALIBRATION, path.name))
    return out


def summary(table) -> list[tuple[str, int, int]]:
    """Per placement and KV cache type: predictions (calibration rows left out) within TOLERANCE, and how many."""
    points = [(where, c, m, p, cal) for where, *_, c, m, p, cal, _ in table]
    return [(f"{where}, {cache} cache", within, count) for where, cache, within, count in class_counts(points, TOLERANCE)]


def main() -> int:
    table = rows()
    print("| placement | device | model | prompt | depth | KV cache | measured t/s | predicted t/s | error | source |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for where, device, model, prompt, depth, cache, measured, pred, cal, source in table:
        error = f"{(pred - measured) / measured:+.0%}" if pred else "-"
        mark = f" ({cal})" if isinstance(cal, str) else " (cal)" if cal else ""
        print(f"| {where} | {device} | {model} | {prompt} | {depth} | {cache} | {measured:,.1f} | {pred:,.1f} | {error}{mark} | {source} |")
    print()
    for label, within, count in summary(table):
        print(f"prefill {label}: {within} of {count} predictions within +-{TOLERANCE:.0%}")
    counted = [abs(p - m) / m for *_, m, p, cal, _ in table if p and not cal]
    print(f"prefill: {sum(e <= TOLERANCE for e in counted)} of {len(counted)} predictions within +-{TOLERANCE:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
