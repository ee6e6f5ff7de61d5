"""A model split over llama.cpp's RPC backend, planned against what was measured (bench/results-rpc-h200.json, made by
lab/bench/measure_rpc.py on the GPU machine): each device's buffers against llama.cpp's own report, and decode over
shaped links against the plan's range (engines/llamacpp_rpc.py). `make bench` prints both tables.

    python -m lab.bench.rpc_error
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from config.catalog import lookup
from config.types import ModelServer
from engines.llamacpp_memory import cuda_compute_bytes, layout
from engines.llamacpp_rpc import (RPC_TOKEN_MS, Link, cpu_helper_prefill, layers_per_device, output_device,
                                  split_decode_seconds, split_memory, split_prefill_seconds)
from engines.llamacpp_prefill import prompt_seconds
from lab.bench.decode_error import GIB, prediction, preset_facts, server_and_pool
from lab.contract.repo_shapes import REPO_SHAPES

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results-rpc-h200.json"
CPU_RESULTS = ROOT / "bench" / "results-rpc-cpu.json"
MIB = 2**20
DECODE_TOLERANCE = 0.20
MEMORY_TOLERANCE = 0.05
PREFILL_TOLERANCE = 0.25
HASH_THRESHOLD = 10 << 20  # ggml-rpc.cpp: a tensor above this is offered by hash first, and a helper with -c keeps it


def restored_in_timing(facts: dict, depth: int) -> bool:
    """Whether a row of bench/results-rpc-h200.json timed llama-bench's restore of its cached depth state: before
    its timer llama-bench writes the KV back (llama_state_seq_set_data), and the relay of that run took whatever was
    written at once, so where each layer's K and V tensors were under HASH_THRESHOLD (sent whole every time, no
    answer awaited) their bytes crossed the shaped wire during the timed tokens. Over that threshold a helper with
    its tensor cache answered each by hash. Reproduced and removed on the CPU (bench/results-rpc-cpu.json, runs 1
    and 2); the relay now holds a sender back."""
    return depth > 0 and facts["kv_heads"] * facts["head_dim"] * depth * 2 < HASH_THRESHOLD


def _split_row(r: dict, facts: dict, gbps_digits: int = 1) -> tuple[list[int], int, Link, str]:
    """A measured row's split: blocks per device (llama.cpp's rule), the output layer's device, the link as
    tools/link_probe.py measured it, and the link's label."""
    split = [float(x) for x in r["split"].split("/")]
    measured = r["link_measured"]
    label = f"{r['link']['name']} ({measured['rtt_ms']:.2f} ms, {measured['gbps']:.{gbps_digits}f} Gbit/s)"
    return (layers_per_device(facts["layers"], split), output_device(facts["layers"], split),
            Link(measured["rtt_ms"], measured["gbps"]), label)


def _server(shape: str, quant: str, ctx: int, weights: float) -> tuple[ModelServer, object]:
    repo = next(r for r, s in REPO_SHAPES.items() if s == shape)
    facts = lookup(repo)
    model = ModelServer.model_validate({
        "role": "chat", "name": "m", "image": "ghcr.io/ggml-org/llama.cpp:server-cuda-b10729", "node_pool": "p",
        "hf_repo": f"{repo}:{quant}", "weights": f"{weights / MIB:.2f}Mi", "ctx_size": ctx, "parallel": 1,
        "gpu_layers": 999, "resources": {"cpu_request": "1", "cpu_limit": "2"}})
    return model, facts


def memory_rows(record: dict) -> list[tuple]:
    """(shape, device, kind, planned MiB, reported MiB) for each memory run, CUDA devices both sides."""
    from lab.contract.real_shape import expected_weights_bytes

    out = []
    for run in record["runs"]:
        for r in run["rows"]:
            if r.get("kind") != "memory" or not r.get("buffers"):
                continue
            model, facts = _server(r["shape"], r["quant"], r["ctx"], expected_weights_bytes(r["shape"], r["quant"]))
            split = [float(x) for x in r["split"].split("/")]
            counts = layers_per_device(facts.layers, split)
            single = cuda_compute_bytes(model, facts, layout(model, facts)) or 0.0
            devices, host = split_memory(model, facts, counts, output_device(facts.layers, split), [single] * len(counts))
            names = [k for k in r["buffers"] if k.startswith("RPC")] + ["CUDA0"]
            for name, device in zip(names, devices):
                for kind, planned in (("model", device.model), ("KV", device.kv), ("compute", device.compute)):
                    out.append((r["shape"], name.split("[")[0], kind, planned / MIB, r["buffers"][name].get(kind, 0.0)))
            out.append((r["shape"], "host", "model", host.model / MIB, r["buffers"].get("CPU_Mapped", {}).get("model", 0.0)))
    return out


def decode_rows(record: dict) -> list[tuple]:
    """(shape, link, depth, measured, low, high, the restore timed (restored_in_timing)) for each decode row."""
    out = []
    for run in record["runs"]:
        for r in run["rows"]:
            if r.get("kind") != "speed" or r.get("n_prompt"):
                continue
            facts = preset_facts(r["shape"])
            whole = prediction("nvidia-datacenter", "cuda", 4800, True, facts, r["quant"], r["weights_bytes"] / GIB, r["depth"], 1)
            counts, output, link, label = _split_row(r, facts)
            ends = [1 / split_decode_seconds([1 / whole] * 2, counts, [link], facts["layers"], facts["embedding_length"],
                                             r["depth"], cost, facts["vocab_size"], output)
                    for cost in RPC_TOKEN_MS]
            out.append((r["shape"], label, r["depth"], r["tok_s"], min(ends), max(ends), restored_in_timing(facts, r["depth"])))
    return out


def prefill_rows(record: dict) -> list[tuple]:
    """(shape, link, depth, measured, planned, the restore timed) for each prefill row on the GPU machine: the plan's
    whole-model prefill on the H200 shared by blocks, plus per micro-batch the link's round trip and bytes."""
    out = []
    for run in record["runs"]:
        for r in run["rows"]:
            if r.get("kind") != "speed" or not r.get("n_prompt"):
                continue
            facts = preset_facts(r["shape"])
            model, model_facts, pool = server_and_pool("nvidia-datacenter", "cuda", 4800, True, facts, r["quant"],
                                                       r["weights_bytes"] / GIB, r["depth"], 1,
                                                       ctx_size=r["n_prompt"] + r["depth"] + 512)
            whole = prompt_seconds(model, model_facts, pool, "cuda", True)
            counts, output, link, label = _split_row(r, facts)
            seconds = split_prefill_seconds([whole] * 2, counts, [link], facts["layers"], facts["embedding_length"],
                                            r["n_prompt"], r["depth"], 512, facts["vocab_size"], output)
            out.append((r["shape"], label, r["depth"], r["tok_s"], r["n_prompt"] / seconds,
                        restored_in_timing(facts, r["depth"])))
    return out


def cpu_rows(rows: list[dict], prompt: bool) -> list[tuple]:
    """(shape, link, depth, measured, low, high) for each decode (prompt False) or prefill row of a CPU split over
    two ggml-rpc-servers (lab/bench/measure_rpc.py --helpers 2): each helper's share is taken from the same model
    measured whole on that host with the helpers' thread count (the baseline rows), so what is checked is what the
    split adds: the link's round trips and bytes (counted exactly by tests/test_rpc_contract.py) and, for decode,
    RPC_TOKEN_MS (low and high: its ends)."""
    def kind(r: dict) -> bool:
        return bool(r.get("n_prompt")) == prompt

    whole = {(r["shape"], r["quant"], r["depth"]): r["tok_s"] for r in rows if r.get("kind") == "baseline" and kind(r)}
    out = []
    for r in rows:
        if r.get("kind") != "speed" or not kind(r) or (r["shape"], r["quant"], r["depth"]) not in whole:
            continue
        facts = preset_facts(r["shape"])
        counts, output, link, label = _split_row(r, facts, gbps_digits=3)
        links = [link] * len(counts)
        rate = whole[(r["shape"], r["quant"], r["depth"])]
        if prompt:
            # The whole-model figure is repacked, a helper's is not. The plan slows the matrix products alone; at
            # these prompts (128 tokens after at most 512) they are all but the whole of it.
            rate *= cpu_helper_prefill(r["quant"])
            seconds = split_prefill_seconds([lambda tokens, depth: tokens / rate] * len(counts), counts, links,
                                            facts["layers"], facts["embedding_length"], r["n_prompt"], r["depth"], 512,
                                            facts["vocab_size"], output)
            ends = [r["n_prompt"] / seconds] * 2
        else:
            ends = [1 / split_decode_seconds([1 / rate] * len(counts), counts, links, facts["layers"],
                                             facts["embedding_length"], r["depth"], cost, facts["vocab_size"], output)
                    for cost in RPC_TOKEN_MS]
        out.append((f"{r['shape']} {r['quant']}", label, r["depth"], r["tok_s"], min(ends), max(ends)))
    return out


def main(argv: list[str]) -> int:
    record = json.loads(RESULTS.read_text())
    print("| shape | device | buffer | plan MiB | llama.cpp MiB | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    memory = memory_rows(record)
    for shape, device, kind, planned, reported in memory:
        error = (planned - reported) / reported if reported else 0.0
        print(f"| {shape} | {device} | {kind} | {planned:.1f} | {reported:.1f} | {error:+.1%} |")
    totals = {}
    for shape, device, _, planned, reported in memory:
        p, m = totals.get((shape, device), (0.0, 0.0))
        totals[(shape, device)] = (p + planned, m + reported)
    within = sum(abs(p - m) / m <= MEMORY_TOLERANCE for p, m in totals.values() if m)
    print(f"\nrpc memory: {within} of {len(totals)} devices within +-{MEMORY_TOLERANCE:.0%} of llama.cpp's report (CUDA)")
    print("\n| shape | link | depth | measured t/s | plan range t/s | middle | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = decode_rows(record)
    for shape, link, depth, measured, low, high, restored in rows:
        middle = (low + high) / 2
        print(f"| {shape}{' (restore timed)' if restored else ''} | {link} | {depth} | {measured:.1f} | {low:.1f}-{high:.1f} "
              f"| {middle:.1f} | {(middle - measured) / measured:+.0%} |")
    for label, chosen in (("dense rows, in-sample: the range was fitted on them",
                           [r for r in rows if "a3b" not in r[0] and not r[-1]]),
                          ("mixture-of-experts rows, out of sample", [r for r in rows if "a3b" in r[0] and not r[-1]])):
        inside = sum(lo * 0.95 <= m <= hi * 1.05 for *_, m, lo, hi, _ in chosen)
        near = sum(abs((lo + hi) / 2 - m) / m <= DECODE_TOLERANCE for *_, m, lo, hi, _ in chosen)
        print(f"\nrpc decode on the GPU machine ({label}): {inside} of {len(chosen)} inside the range, "
              f"{near} of {len(chosen)} within +-{DECODE_TOLERANCE:.0%} of its middle")
    print(f"({sum(r[-1] for r in rows)} rows timed llama-bench's restore of its depth state through the relay: "
          "not counted, see restored_in_timing)")
    print("\n| shape | link | depth | measured prefill t/s | plan t/s | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    prefill = prefill_rows(record)
    for shape, link, depth, measured, planned, restored in prefill:
        print(f"| {shape}{' (restore timed)' if restored else ''} | {link} | {depth} | {measured:.0f} | {planned:.0f} "
              f"| {(planned - measured) / measured:+.0%} |")
    clean = [(m, p) for *_, m, p, restored in prefill if not restored]
    print(f"\nrpc prefill on the GPU machine (the model was written after these rows were seen): "
          f"{sum(abs(p - m) / m <= PREFILL_TOLERANCE for m, p in clean)} of {len(clean)} within +-{PREFILL_TOLERANCE:.0%} "
          f"({len(prefill) - len(clean)} rows timed the restore: not counted)")
    if CPU_RESULTS.exists():
        runs = json.loads(CPU_RESULTS.read_text())["runs"]
        # Run 1 timed the test relay's artifact (docs/rpc-split.md); runs 2 and 3 hold a sender back as a link does.
        said_of = [{False: "out of sample: the model was set before this run",
                    True: "seen: a helper's missing repack (CPU_HELPER_PREFILL) was found on this run's miss and set "
                          "from whole-model runs"},
                   {False: "out of sample", True: "out of sample: measured after CPU_HELPER_PREFILL was frozen"}]
        for run, said in zip(runs[1:], said_of):
            for prompt, tolerance in ((False, DECODE_TOLERANCE), (True, PREFILL_TOLERANCE)):
                _print_cpu(cpu_rows(run["rows"], prompt), prompt, tolerance, said[prompt])
    return 0


def _print_cpu(cpu: list[tuple], prompt: bool, tolerance: float, said: str) -> None:
    what = "prefill" if prompt else "decode"
    print(f"\n| shape (CPU, two helpers) | link | depth | measured {what} t/s | plan t/s | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape, link, depth, measured, low, high in cpu:
        middle = (low + high) / 2
        figure = f"{low:.2f}-{high:.2f}" if high > low * 1.001 else f"{low:.2f}"
        print(f"| {shape} | {link} | {depth} | {measured:.2f} | {figure} | {(middle - measured) / measured:+.0%} |")
    near = sum(abs((lo + hi) / 2 - m) / m <= tolerance for *_, m, lo, hi in cpu)
    print(f"\nrpc {what} on a CPU ({said}): {near} of {len(cpu)} within +-{tolerance:.0%}"
          f"{' of the range middle' if not prompt else ''}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
