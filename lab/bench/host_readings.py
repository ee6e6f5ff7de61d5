"""A host's side of a measured job restated at what the host read around it (make bench, lab/bench/decode_error.py):
a shared host drifts within minutes, so each job is planned with the read bandwidth read before and after it
(measure_decode's read_gbs_around) against what make host-profile read while it measured the node's figures; the
compute read beside it (compute_gops_around) is only banded by (compute_pace: planning the CPU's own work at it failed
on lease 18). A user's plan is unchanged: a node is planned as profiled."""

from __future__ import annotations

from typing import Optional

from engines.llamacpp_host import expert_block_seconds, expert_share
from engines.llamacpp_speed import PROFILES, card_read_gbs


def experts_at(experts_us: dict, host: dict, threads: int, read_gbs: float, profile: str, bandwidth: float) -> dict:
    """A node's experts figure restated at the read bandwidth measured around a row's job: the same share of the
    bandwidth (what the figure means: node_expert_share, solved against the profile's own bandwidth), so the experts'
    time follows the host's drift as its dense weights' does; the figure as given where no share comes of it."""
    card_gbs = card_read_gbs(PROFILES[profile], "kquant", bandwidth)[0]
    share = expert_share(experts_us, host, threads, card_gbs)
    return {threads: expert_block_seconds(share, read_gbs, card_gbs) * 1e6} if share else experts_us


def profile_compute(home: Optional[dict]) -> Optional[dict[int, float]]:
    """The compute (Gop/s, bench/host_bandwidth.c) a host read by threads while make host-profile measured its figures
    (host_compute_gops: before and after its passes, their mean), from the run its figures come from (decode_error's
    home_run); None where there is none or it read none (make host-profile before 2026-12-06)."""
    readings = (home or {}).get("host_compute_gops")
    return {int(t): sum(v) / len(v) for t, v in readings.items() if v} if readings else None


def compute_pace(r: dict, compute: Optional[dict[int, float]]) -> Optional[float]:
    """The compute read around a row's job over what its host read at profiling, at the job's threads (profile_compute);
    None where either is missing."""
    threads = r.get("threads") or 8
    if not (compute and compute.get(threads) and r.get("compute_gops_around")):
        return None
    return sum(r["compute_gops_around"]) / len(r["compute_gops_around"]) / compute[threads]
