"""`make host-profile` run for real on this machine (lab/bench/host_profile.py: bench/host_bandwidth.c, then llama.cpp's
own llama-bench on a real-shape Qwen3-1.7B, with an f16 and with quantized KV caches): the three lines it prints are
a stack file's pool fields the program accepts and plans with (one decode figure, no range, a quantized cache's
too, once the slow-down past 4096 positions is given), and the figures give back the rates llama-bench measured.
Timing on a shared machine varies, so the test holds what the figures are made of, not their size."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, plain_values
from engines.llamacpp_speed import predict_range_tok_s
from lab.bench import profile_rules
from plane import parse_stack, plan_capacity


from lab.llama_build import build  # a module that builds: its tests are marked llama


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> tuple[str, dict]:
    bench = build(program="llama-bench")
    out = tmp_path_factory.mktemp("host-profile") / "record.json"
    # A shared machine's speed can move during a run, and the tool then refuses it (exit 1, "run it again on a quiet
    # node"): as a user would, run it again, at most three times in all.
    for _ in range(3):
        run = subprocess.run([sys.executable, "-m", "lab.bench.host_profile", "--threads", "2", "--depth", "1024",
                              "--passes", "2", "--llama-bench", str(bench), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                             timeout=1800)  # 429 s on an idle 2-core machine: a loaded one takes longer
        if not (run.returncode == 1 and "run it again on a quiet node" in run.stderr):
            break
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, json.loads(out.read_text())


def test_the_printed_lines_are_pool_fields_the_plan_uses(profile):
    stdout, record = profile
    assert "2 passes: each figure below is from the median rate of each point" in stdout
    lines = stdout.split("for the stack file (node_pools.<pool>):\n", 1)[1]
    fields = yaml.safe_load(lines)
    # At a --depth other than 4096 the slow-down past it and the quantized ratios (measured at twice the depth) are
    # recorded, not printed: the plan's figures are stated for 4096 and 8192 positions.
    assert set(fields) == {"memory_bandwidth_by_threads", "cpu_decode_by_threads"}
    assert set(fields["cpu_decode_by_threads"]) == {2} == set(fields["memory_bandwidth_by_threads"])
    assert set(record["cpu_quantized_kv"]) == {"q8_0", "q4_0"}
    fields["cpu_quantized_kv"] = record["cpu_quantized_kv"]
    assert all("kv_deep_slowdown" not in f for f in fields["cpu_decode_by_threads"].values())
    assert set(record["slowdown_at_twice_the_depth"]) == {"2"} and record["slowdown_at_twice_the_depth"]["2"] > 0
    for cache in ("f16", "q8_0"):
        values = plain_values("cpu-cluster")
        values["node_pools"]["minipc"].update(copy.deepcopy(fields))
        values["models"]["chat"].update(threads=2, cache_type_k=cache, cache_type_v=cache)
        # Past 4096 positions the node's slow-down is not measured: a range from none to the most measured, and the
        # summary says why; with it, one figure.
        deep = plan_capacity(parse_stack(values)).servers["chat"]
        assert deep.decode_range_tok_s is not None and any("past 4096 positions" in why for why in deep.decode_range_why)
        values["node_pools"]["minipc"]["cpu_decode_by_threads"][2]["kv_deep_slowdown"] = 1.4
        chat = plan_capacity(parse_stack(values)).servers["chat"]
        assert chat.decode_range_tok_s is None and chat.decode_predicted_tok_s["full"] < chat.decode_predicted_tok_s["empty"]
        assert deep.decode_predicted_tok_s["full"] < chat.decode_predicted_tok_s["full"]
        # Without the node's ratio a quantized cache's decode is a range, and the summary says why.
        del values["node_pools"]["minipc"]["cpu_quantized_kv"]
        unmeasured = plan_capacity(parse_stack(values)).servers["chat"]
        assert (unmeasured.decode_range_tok_s is None) == (cache == "f16")
    # The compute read before the passes and after them, at the thread count profiled: make bench restates a later
    # job's CPU work at the compute read around it against these (lab/bench/decode_error.py, profile_compute).
    assert set(record["host_compute_gops"]) == {"2"} and len(record["host_compute_gops"]["2"]) == 2
    assert all(v > 1.0 for v in record["host_compute_gops"]["2"])
    # The bandwidth printed is host_bandwidth's, the figures the record's (rounded for the stack file).
    assert fields["memory_bandwidth_by_threads"] == {int(t): round(v) for t, v in record["host_read_gbs"].items()}
    assert fields["cpu_decode_by_threads"] == {int(t): f for t, f in record["cpu_decode_by_threads"].items()}


def test_the_figures_it_prints_give_back_the_rates_it_measured(profile):
    """The tool's plumbing end to end (bandwidth, llama-bench's JSON, the solver, rounding for the stack file): a CPU
    server of the profiled shape, planned with the printed figures, decodes at llama-bench's rates — at an empty
    context where the weights leave time for the blocks (else the block time is 0 and the plan is the slower), and
    always the same slow-down at depth (the KV cache's rate)."""
    _, record = profile
    from lab.bench import decode_error
    # Two passes, each point's figure their median (the mean of two), as the tool folds them.
    assert sorted({r["pass"] for r in record["rows"]}) == [0, 1]
    folded = profile_rules.median_rows(record["rows"])
    for threads in (2,):
        rates = {r["depth"]: r["tok_s"] for r in folded if r["threads"] == threads and r["kv_type"] == "f16"}
        model, facts, pool = decode_error.server_and_pool(
            "cpu", "cpu", None, False, decode_error.preset_facts(record["shape"]), record["quant"],
            decode_error.expected_weights_bytes(record["shape"], record["quant"]) / decode_error.GIB, record["depth"], 1,
            threads=threads, host={int(t): v for t, v in record["host_read_gbs"].items()},
            cost=record["cpu_decode_by_threads"])
        planned = predict_range_tok_s(model, facts, pool, "cpu", False, {"empty": 0, "deep": record["depth"]})
        empty, deep = planned["empty"][0], planned["deep"][0]
        assert planned["empty"][0] == planned["empty"][1]  # measured: one figure
        if record["cpu_decode_by_threads"][str(threads)]["block_us"] > 0:
            assert empty == pytest.approx(rates[0], rel=0.02)
        else:
            assert empty <= rates[0] * 1.02
        assert 1 / deep - 1 / empty == pytest.approx(1 / rates[record["depth"]] - 1 / rates[0], rel=0.02)


def test_a_quantized_cache_planned_with_the_printed_ratio_slows_with_depth_as_measured(profile):
    """The ratio's plumbing end to end: a CPU server of the profiled shape with a q8_0 or q4_0 cache, planned with the
    printed figures, pays between an empty context and twice the depth (where the tool measures a quantized cache)
    what llama-bench measured with that cache."""
    _, record = profile
    deep = 2 * record["depth"]
    from lab.bench import decode_error
    threads = max(int(t) for t in record["cpu_decode_by_threads"])
    for cache, ratio in record["cpu_quantized_kv"].items():
        rates = {r["depth"]: r["tok_s"] for r in profile_rules.median_rows(record["rows"]) if r["kv_type"] == cache}
        model, facts, pool = decode_error.server_and_pool(
            "cpu", "cpu", None, False, decode_error.preset_facts(record["shape"]), record["quant"],
            decode_error.expected_weights_bytes(record["shape"], record["quant"]) / decode_error.GIB, deep, 1,
            threads=threads, host={int(t): v for t, v in record["host_read_gbs"].items()},
            cost=record["cpu_decode_by_threads"], cache=cache, quantized=record["cpu_quantized_kv"])
        planned = predict_range_tok_s(model, facts, pool, "cpu", False, {"empty": 0, "deep": deep})
        assert planned["deep"][0] == planned["deep"][1]  # measured: one figure
        assert ratio > 0 and set(rates) == {0, deep}
        assert 1 / planned["deep"][0] - 1 / planned["empty"][0] == pytest.approx(
            1 / rates[deep] - 1 / rates[0], rel=0.03), cache


def test_experts_with_a_build_that_lists_no_card_is_refused_before_anything_runs(tmp_path):
    """--experts measures experts moved from the card to system RAM: this machine's real CPU build of llama-bench lists
    no device (`--list-devices`), so the tool says so in one line, exits 2 and measures and writes nothing."""
    bench = build(program="llama-bench")
    listed = subprocess.run([str(bench), "--list-devices"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "(none)" in listed.stdout
    out = tmp_path / "record.json"
    run = subprocess.run([sys.executable, "-m", "lab.bench.host_profile", "--threads", "2", "--experts",
                          "--llama-bench", str(bench), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and not out.exists() and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert "--experts" in line and "lists no GPU" in line
