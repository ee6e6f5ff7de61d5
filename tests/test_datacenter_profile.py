"""The GH100 decode profile (PROFILES["nvidia-datacenter"]): its figures are the least-squares solution of the rows
recorded on an H200 and an H100 (lab/bench/decode_fit.py), K-quant weights are read on the line the two cards give,
a card outside the two bandwidths gets a range and the reason, and the rows measured after the profile was frozen
(lease 11, an H200 machine) hold per KV cache type."""

from __future__ import annotations

import pytest

from conftest import plain_values
from engines.llamacpp_speed import CARD_READ_UNMEASURED, PROFILES, card_read_gbs
from plane import parse_stack, plan_capacity

GH100 = PROFILES["nvidia-datacenter"]


def test_the_profile_is_the_least_squares_solution_of_the_rows_recorded_on_both_cards():
    from lab.bench import decode_fit

    rows = decode_fit.fit_rows()
    assert (len(rows), sum(r["bandwidth"] == 4800 for r in rows), sum(r["bandwidth"] == 3350 for r in rows)) == (96, 86, 10)
    solved = decode_fit.profile_figures(decode_fit.solve(rows))
    assert GH100.block_us == pytest.approx(solved["block_us"], abs=0.5)
    assert GH100.moe_block_us == pytest.approx(solved["moe_block_us"], abs=0.5)
    assert GH100.recurrent_block_us == pytest.approx(solved["recurrent_block_us"], abs=0.5)
    # The shares to two places, as frozen in c51f4ae before lease 11 (Q8_0 solves to 0.655).
    assert GH100.share["f16"] == pytest.approx(solved["f16"], abs=0.006)
    assert GH100.share["q8"] == pytest.approx(solved["q8"], abs=0.006)
    line = dict(GH100.read_line["kquant"])
    assert line[4800.0] == pytest.approx(solved["kquant_4800"], rel=0.005)
    assert line[3350.0] == pytest.approx(solved["kquant_3350"], rel=0.005)
    # What the two cards tell apart: K-quant reads barely follow the bandwidth (the chip's compute sets them).
    assert 0.9 < line[3350.0] / line[4800.0] < 1.0 and 3350 / 4800 < 0.7


def test_the_rows_the_profile_was_solved_from_are_the_rows_make_bench_marks_as_calibration():
    """One selection: every GPU-only row of the H200 and H100 runs make bench shows as `cal` is a row of the fit, and
    no other (so a row measured after the freeze cannot slip into the fit and still be counted as a prediction)."""
    from collections import Counter
    from lab.bench import decode_error, decode_fit

    fit = Counter((f"{r['shape']} {r['quant']}", r["cache"], r["depth"], round(r["tok_s"], 3)) for r in decode_fit.fit_rows())
    shown = Counter((model, cache, depth, round(measured, 3))
                    for device, model, depth, measured, _, cal, _, where, _, cache, _ in decode_error.rows(decode_error.MEASURED)
                    if where == "GPU only" and cal is True and ("H200" in device or "H100 80GB" in device))
    assert fit == shown


def test_kquant_weights_are_read_on_the_line_through_the_two_cards_and_no_faster_than_f16_streams():
    def point(bandwidth):
        slow, fast = card_read_gbs(GH100, "kquant", bandwidth)
        assert slow == pytest.approx(fast)
        return slow

    # Between the two cards one figure, rising with the bandwidth, through each card's measured rate and continuous
    # into the ranges beyond them.
    rates = [point(b) for b in (3350, 3800, 4300, 4800)]
    assert rates == sorted(rates) and rates[0] < rates[-1] < 1.1 * rates[0]
    for card, rate in GH100.read_line["kquant"]:
        assert point(card) == pytest.approx(rate)
    assert card_read_gbs(GH100, "kquant", 3349.9)[1] == pytest.approx(rates[0], rel=1e-4)
    assert card_read_gbs(GH100, "kquant", 4800.1)[0] == pytest.approx(rates[-1], rel=1e-4)
    # Legacy quants have no figure of their own here: the K-quant line; F16 and Q8_0 their shares of any bandwidth.
    assert card_read_gbs(GH100, "legacy", 3800) == card_read_gbs(GH100, "kquant", 3800)
    assert card_read_gbs(GH100, "f16", 2000) == (2000 * GH100.share["f16"],) * 2
    # Outside the two cards: a range whose ends are the nearer card's share of the bandwidth and the line.
    for bandwidth, nearer in ((2000, 3350.0), (8000, 4800.0)):
        low, high = card_read_gbs(GH100, "kquant", bandwidth)
        at_share = bandwidth * dict(GH100.read_line["kquant"])[nearer] / nearer
        assert low < high and at_share in (pytest.approx(low), pytest.approx(high))
    # A slower card reads K-quants at a larger share of its bandwidth (compute-bound), a faster one at a smaller.
    assert card_read_gbs(GH100, "kquant", 2000)[0] == pytest.approx(2000 * 1835 / 3350)
    assert card_read_gbs(GH100, "kquant", 8000)[1] == pytest.approx(8000 * 1910 / 4800)
    # Far below: the line would read faster than F16 streams; it is held to that.
    assert card_read_gbs(GH100, "kquant", 500)[1] == pytest.approx(500 * GH100.share["f16"])


def datacenter_stack(bandwidth: float) -> dict:
    values = plain_values("rtx4090")
    pool = values["node_pools"]["rtx4090"]
    pool.update(decode_profile="nvidia-datacenter", vram_bandwidth_gbs=bandwidth)
    return values


def test_a_card_outside_the_measured_bandwidths_gets_a_range_and_the_summary_says_why():
    inside = plan_capacity(parse_stack(datacenter_stack(4000))).servers["chat"]
    assert inside.decode_range_tok_s is None and inside.decode_predicted_tok_s["empty"] > 0
    outside = plan_capacity(parse_stack(datacenter_stack(2000))).servers["chat"]
    low, high = outside.decode_range_tok_s["empty"]
    assert low < high and outside.decode_predicted_tok_s["empty"] == low
    expected = CARD_READ_UNMEASURED.format(quant="Q4_K_M", low=3350.0, high=4800.0, bandwidth=2000)
    assert expected in outside.decode_range_why


def test_the_rows_measured_after_the_profile_was_frozen_hold_per_cache_type():
    """Lease 11 (an H200 machine, bench/jobs-gpu-10*.json), measured after c51f4ae froze the profile: every layer on
    the card, 1.7B to 70B, dense, MoE and hybrid, F16/Q8_0/K-quant weights, f16/q8_0/q4_0 caches at 0 to 32k."""
    from lab.bench import decode_error

    rows = [row for row in decode_error.rows(decode_error.MEASURED)
            if "lease 11" in row[0] and row[7] == "GPU only"]
    assert rows and not any(row[5] for row in rows)  # none of them calibrated anything
    for cache in ("f16", "q8_0", "q4_0"):
        errors = [abs(p - m) / m for _, _, _, m, p, _, _, _, _, c, _ in rows if c == cache]
        assert len(errors) >= 12 and sum(e <= 0.15 for e in errors) / len(errors) >= 0.9, (cache, errors)
