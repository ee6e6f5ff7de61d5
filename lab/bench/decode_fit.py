"""The GH100 decode profile (engines/llamacpp_speed.py, PROFILES["nvidia-datacenter"]) solved from the recorded rows:

    python -m lab.bench.decode_fit

prints the figures least squares gives on every row measured with every layer on an H200 or an H100 card (the runs
lab/bench/decode_error.py's DATACENTER_FIT names; a MoE file whose routing ignores the token and a run marked not
reproduced are left out), each row weighted by its rate so that the error minimised is relative. Unknowns: the time
per block, the extra per mixture-of-experts block and per Gated DeltaNet block, F16's and Q8_0's share of the
bandwidth, and K-quants' time per byte as a line in 1/bandwidth (what the two cards' bandwidths tell apart). The KV
cache's share and a quantized cache's cost (H200_QUANTIZED_KV, solved before on issue #44's table) are held.
tests/test_datacenter_profile.py holds the profile's figures to this solution and this fit to the rows make bench marks `cal`.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np

from engines.llamacpp_host import HostCost
from engines.llamacpp_speed import decode_terms, recurrent_blocks, routes_experts, weight_class
from lab.bench.decode_error import (GIB, KV_CACHE_SHAPES, KV_CACHE_TABLE, MEASURED, in_datacenter_fit, preset_facts,
                                    recorded_runs, server_and_pool)
from lab.contract.real_shape import expected_weights_bytes

UNKNOWNS = ("block_us", "moe_block_us", "recurrent_block_us", "f16", "q8", "kquant_per_bandwidth", "kquant_ps")


def fit_rows() -> list[dict]:
    """Every row of the fit: shape, quant, cache type, depth, the card's bandwidth (GB/s) and the measured rate."""
    out = []
    record = json.loads(KV_CACHE_TABLE.read_text())
    for row in record["rows"]:
        for depth, tok_s in zip(record["depths"], row["tok_s"]):
            out.append(dict(shape=KV_CACHE_SHAPES[row["model"]], quant=row["quant"], cache=row["cache"], depth=depth,
                            bandwidth=4800, tok_s=tok_s))
    for path, (profile, _, bandwidth, _) in MEASURED.items():
        if profile != "nvidia-datacenter":
            continue
        for run in recorded_runs(path):
            out += [dict(shape=r["shape"], quant=r["quant"], cache=r.get("type_k") or "f16", depth=r["depth"],
                         bandwidth=bandwidth, tok_s=r["tok_s"], weights=r.get("weights_bytes"))
                    for r in run["rows"] if in_datacenter_fit(path, run, r)]
    return out


def features(row: dict) -> tuple[dict[str, float], float]:
    """A row's seconds per token as a sum over the unknowns (their coefficients) plus what is held (the KV cache)."""
    facts = preset_facts(row["shape"])
    weights = row.get("weights") or expected_weights_bytes(row["shape"], row["quant"])
    model, model_facts, pool = server_and_pool("nvidia-datacenter", "cuda", row["bandwidth"], True, facts, row["quant"],
                                               weights / GIB, row["depth"], 1, cache=row["cache"])
    terms = decode_terms(model, model_facts, pool, "cuda", True)
    bandwidth = row["bandwidth"] * 1e9
    blocks = model_facts.layers
    coefficients = dict.fromkeys(UNKNOWNS, 0.0)
    coefficients.update(block_us=blocks / 1e6, moe_block_us=(blocks if routes_experts(model_facts) else 0) / 1e6,
                        recurrent_block_us=recurrent_blocks(model_facts) / 1e6)
    kind = weight_class(model, model_facts)
    if kind in ("f16", "q8"):
        coefficients[kind] = terms.gpu_read / bandwidth  # times 1/share
    else:
        coefficients["kquant_per_bandwidth"] = terms.gpu_read / bandwidth
        coefficients["kquant_ps"] = terms.gpu_read / 1e12
    # The plan's own time for the rest, the fixed costs and the weights taken out: the KV cache's read at kv_share and a
    # quantized cache's cost (every layer on the card: no CPU term).
    held = dataclasses.replace(terms, fixed=0.0, gpu_read=0.0).seconds(row["depth"], 0.0, HostCost(0.0, float("inf")))
    return coefficients, held


def solve(rows: list[dict]) -> dict[str, float]:
    """The unknowns, by least squares on each row's time relative to its own (a row's error counts as a share)."""
    matrix, target = [], []
    for row in rows:
        coefficients, held = features(row)
        matrix.append([coefficients[name] * row["tok_s"] for name in UNKNOWNS])
        target.append((1 / row["tok_s"] - held) * row["tok_s"])
    solution, *_ = np.linalg.lstsq(np.array(matrix), np.array(target), rcond=None)
    return dict(zip(UNKNOWNS, map(float, solution)))


def profile_figures(solution: dict[str, float]) -> dict[str, float]:
    """The solution in the profile's terms: shares, and the K-quant rate (GB/s) on the H200 and on the H100."""
    kquant = {bw: 1 / (solution["kquant_per_bandwidth"] / bw + solution["kquant_ps"] / 1e3) for bw in (4800.0, 3350.0)}
    return dict(block_us=solution["block_us"], moe_block_us=solution["moe_block_us"],
                recurrent_block_us=solution["recurrent_block_us"], f16=1 / solution["f16"], q8=1 / solution["q8"],
                kquant_4800=kquant[4800.0], kquant_3350=kquant[3350.0])


def main() -> int:
    rows = fit_rows()
    figures = profile_figures(solve(rows))
    print(f"{len(rows)} rows (H200: {sum(r['bandwidth'] == 4800 for r in rows)}, H100: {sum(r['bandwidth'] == 3350 for r in rows)})")
    for name, value in figures.items():
        print(f"{name}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
