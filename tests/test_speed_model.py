"""The speed plan's inputs and outputs as a user meets them: decode where a CPU reads part of the model follows
the node's read bandwidth at the server's threads (memory_bandwidth_by_threads), and is a range where that is not
measured; prefill and the first token of a full-context prompt are predicted where a backend class was measured
(an H200's CUDA, a CPU) and said to be unknown elsewhere. The predictions are held to the recorded measurements
(bench/results-speed-h200.json, results-decode-cpu.json, results-prefill-cpu.json) per placement class."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT, plain_values
from engines.llamacpp_speed import HOST, host_read_gbs
from plane import parse_stack, plan_capacity

sys.path.insert(0, str(ROOT / "bench"))

TABLE = {4: 28.0, 8: 49.0, 16: 82.0}


def cpu_cluster(table=None, threads=None) -> dict:
    values = plain_values("cpu-cluster")
    if table is not None:
        values["node_pools"]["minipc"]["memory_bandwidth_by_threads"] = table
    if threads is not None:
        values["models"]["chat"]["threads"] = threads
    return values


def test_the_read_bandwidth_at_a_thread_count_is_the_measured_figure_or_a_range():
    pool = parse_stack(cpu_cluster(TABLE)).node_pools["minipc"]
    assert host_read_gbs(pool, 8) == (49.0, 49.0)
    assert host_read_gbs(pool, 12) == (65.5, 65.5)  # between 8 and 16, on the line
    assert host_read_gbs(pool, 2) == (14.0, 14.0)  # below the first count: in proportion
    assert host_read_gbs(pool, 32) == (82.0, 82.0)  # beyond the last: the node's figure
    bare = parse_stack(cpu_cluster()).node_pools["minipc"]  # 70 GB/s, not by threads
    assert host_read_gbs(bare, 8) == (8 * HOST.thread_read_gbs, 70.0)
    assert host_read_gbs(bare, 32) == (70.0, 70.0)


def test_a_cpu_server_decodes_as_its_threads_read_and_the_summary_shows_the_range_when_unmeasured():
    measured = plan_capacity(parse_stack(cpu_cluster(TABLE, threads=4))).servers["chat"]
    faster = plan_capacity(parse_stack(cpu_cluster(TABLE, threads=8))).servers["chat"]
    assert measured.decode_range_tok_s is None
    # The weights are read at 0.92 of what 4 and 8 threads read (28 and 49 GB/s) unless a thread's compute
    # ceiling binds (4 x 15.3 GB/s > 0.92 x 28; 8 x 15.3 > 0.92 x 49); the per-block cost is the same at both, so
    # with an empty context the two times differ by the bytes read per token (the bound's: 70 GB/s x its time)
    # over the two bandwidths.
    read = 70e9 / measured.decode_bound_tok_s
    slower, quicker = (1 / p.decode_predicted_tok_s["empty"] for p in (measured, faster))
    assert slower - quicker == pytest.approx(read / HOST.weight_share * (1 / 28e9 - 1 / 49e9), rel=1e-6)
    unmeasured = plan_capacity(parse_stack(cpu_cluster(threads=8))).servers["chat"]
    low, high = unmeasured.decode_range_tok_s["empty"]
    assert unmeasured.decode_predicted_tok_s["empty"] == low < high
    # The low end reads 8 threads x 5 GB/s, the high end the node's 70 GB/s (at 0.92, under the 122 GB/s ceiling).
    read = 70e9 / unmeasured.decode_bound_tok_s
    assert 1 / low - 1 / high == pytest.approx(read / HOST.weight_share * (1 / 40e9 - 1 / 70e9), rel=1e-6)
    from render.output import predicted_cell

    assert "host bandwidth unmeasured" in predicted_cell(unmeasured.decode_predicted_tok_s, unmeasured.decode_range_tok_s)
    assert predicted_cell(measured.decode_predicted_tok_s, measured.decode_range_tok_s).endswith(" tok/s")


def test_prefill_and_the_first_token_of_a_full_prompt_are_predicted_only_where_measured():
    chat = plan_capacity(parse_stack(cpu_cluster(TABLE, threads=8))).servers["chat"]
    model = parse_stack(cpu_cluster(TABLE, threads=8)).models["chat"]
    assert chat.prefill_tok_s > 0 and chat.first_token_full_s > 0
    # A full-context prompt takes longer per token than the 4096-token one (attention grows with the prompt).
    assert chat.first_token_full_s > model.ctx_size / chat.prefill_tok_s
    # Twice the threads, twice the prompt rate on a CPU (its products are compute-bound).
    slower = plan_capacity(parse_stack(cpu_cluster(TABLE, threads=4))).servers["chat"]
    assert chat.prefill_tok_s / slower.prefill_tok_s == pytest.approx(2.0, rel=0.05)
    # A GeForce card (nvidia profile): no prefill was measured for that class, so none is said.
    rtx = plan_capacity(parse_stack(plain_values("rtx4090"))).servers["chat"]
    assert rtx.prefill_tok_s is None and rtx.first_token_full_s is None


def test_the_predictions_hold_to_the_recorded_measurements_per_placement():
    """Out-of-sample rows only (the rows a profile was solved from, and zero-weight MoE files, which route every
    token alike, are shown by make bench and not counted). The classes that meet the goal are held to it; the
    others (partial offload, CPU only) are printed by make bench with their count."""
    import decode_error
    import prefill_error

    table = decode_error.rows({
        str(ROOT / "bench" / "results-decode-h200.json"): ("nvidia-datacenter", "cuda", 4800, True),
        str(ROOT / "bench" / "results-speed-h200.json"): ("nvidia-datacenter", "cuda", 4800, True),
        str(ROOT / "bench" / "results-decode-cpu.json"): ("cpu", "cpu", None, False),
    })
    counts = {where: (within, total) for where, within, total in decode_error.summary(table)}
    for where in ("GPU only", "experts in RAM"):
        within, total = counts[where]
        assert total >= 10 and within / total >= 0.90, (where, counts[where])
    errors = [abs(p - m) / m for *_, m, p, cal, _ in prefill_error.rows() if p and not cal]
    assert len(errors) >= 20 and sum(e <= 0.25 for e in errors) / len(errors) >= 0.85


def test_the_thread_table_survives_pulumis_json_config():
    """Pulumi stores a config object as JSON, so the thread counts reach the program as text keys: the program run
    on the stack file (as `pulumi up` and `make render` read it) plans with the measured figure, one number, no
    range; a key that is not a thread count is refused by its path."""
    from conftest import run_stack_file, stack_file_config

    mapping = stack_file_config("cpu-cluster")
    mapping["inference-plane:node_pools"]["minipc"]["memory_bandwidth_by_threads"] = {4: 28, 8: 49}
    run = run_stack_file("cpu-cluster", mapping)
    chat = run.outputs["capacity_plan"]["servers"]["chat"]
    assert chat["decode_range_tok_s"] is None and chat["decode_predicted_tok_s"]["empty"] > 0
    mapping["inference-plane:node_pools"]["minipc"]["memory_bandwidth_by_threads"] = {"four": 28}
    import pulumi

    with pytest.raises(pulumi.RunError, match=r"node_pools\.minipc\.memory_bandwidth_by_threads\.four"):
        run_stack_file("cpu-cluster", mapping)
