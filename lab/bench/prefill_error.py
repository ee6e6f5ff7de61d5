"""The prefill prediction (engines/llamacpp_speed.py prompt_seconds) against every recorded llama-bench
prompt-processing run: one row per run with the predicted rate and the error; docs/capacity-planning.md's
table ("Prefill: predicted and measured") is this output.

    python -m lab.bench.prefill_error   (reads bench/results-speed-h200.json and bench/results-prefill-cpu.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]

from lab.bench.decode_error import GIB, preset_facts, server_and_pool
from engines.llamacpp_speed import prompt_seconds

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


def predicted(r: dict, discrete: bool, host: Optional[dict]) -> float:
    model, facts, pool = server_and_pool(
        "nvidia-datacenter" if discrete else "cpu", "cuda" if discrete else "cpu", 4800 if discrete else None, discrete,
        preset_facts(r["shape"]), r["quant"], r["weights_bytes"] / GIB, r["depth"], 1, r.get("ngl"), r.get("n_cpu_moe"),
        r.get("threads") or 2, host, ctx_size=max(r["n_prompt"] + r["depth"], 512), ubatch=r.get("n_ubatch") or None)
    seconds = prompt_seconds(model, facts, pool, "cuda" if discrete else "cpu", discrete)
    return r["n_prompt"] / seconds(r["n_prompt"], r["depth"]) if seconds else None


def rows() -> list[tuple]:
    out = []
    for path, discrete in ((ROOT / "bench" / "results-speed-h200.json", True), (ROOT / "bench" / "results-prefill-cpu.json", False)):
        record = json.loads(path.read_text())
        for run in record["runs"]:
            # The host's read bandwidth where the run recorded it (a CPU's prefill is compute-bound: not needed).
            host = {int(k): v for k, v in run["host_read_gbs"].items()} if run.get("host_read_gbs") else None
            for r in run["rows"]:
                if not r.get("n_prompt"):
                    continue
                key = (r["shape"], r["quant"], r.get("routing", "zero"), r["n_prompt"], r["depth"], r.get("ngl"), r.get("n_cpu_moe") or 0)
                where = ("CPU only" if not discrete else "experts in RAM" if r.get("n_cpu_moe")
                         else "partial offload" if (r.get("ngl") or 99) < 99 else "GPU only")
                zero_moe = "qwen3" in r["shape"] and "a3b" in r["shape"] and r.get("routing") != "token"
                out.append((where, r["device"], f"{r['shape']} {r['quant']}", r["n_prompt"], r["depth"], r["tok_s"],
                            predicted(r, discrete, host), "zero routing" if zero_moe else key in CALIBRATION, path.name))
    return out


def main() -> int:
    table = rows()
    print("| placement | device | model | prompt | depth | measured t/s | predicted t/s | error | source |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for where, device, model, prompt, depth, measured, pred, cal, source in table:
        error = f"{(pred - measured) / measured:+.0%}" if pred else "-"
        mark = f" ({cal})" if isinstance(cal, str) else " (cal)" if cal else ""
        print(f"| {where} | {device} | {model} | {prompt} | {depth} | {measured:,.1f} | {pred:,.1f} | {error}{mark} | {source} |")
    counted = [abs(p - m) / m for *_, m, p, cal, _ in table if p and not cal]
    print(f"\nprefill: {sum(e <= TOLERANCE for e in counted)} of {len(counted)} predictions within +-{TOLERANCE:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
