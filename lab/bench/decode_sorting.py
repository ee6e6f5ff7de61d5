"""How make bench sorts the decode points it counts (lab/bench/decode_error.py prints each line): by placement and KV
cache type (class_counts), by how far the host moved around a job (drift_counts), by the model's query heads over the
job's threads (head_counts)."""

from __future__ import annotations

import math
import statistics
from typing import Optional

from engines.llamacpp_held import DECODE_TOLERANCE
from engines.llamacpp_host import read_gbs_at
from lab.contract.real_shape import PRESETS

TOLERANCE = DECODE_TOLERANCE  # the goal's, one figure with the summary's (engines/llamacpp_held.py)


# How far the read bandwidth around a job (measure_decode --host-bandwidth) lay from the one the host's figures were
# measured at: a shared host that moved that far is not the node its figures describe (lease 16 read 31-48 GB/s
# around most of its grid against its profile's 88), which make bench shows beside the out-of-sample lines, counting
# none apart.
DRIFT_BANDS = ((0.0, 0.75, "below 0.75 times"), (0.75, 1.25, "0.75-1.25 times"), (1.25, math.inf, "above 1.25 times"))


def read_drift(r: dict, host: Optional[dict]) -> Optional[float]:
    """The read bandwidth around a row's job over what its host's figures give at the job's threads (read_gbs_at, the
    plan's rule); None without a reading."""
    if not (host and r.get("read_gbs_around")):
        return None
    return sum(r["read_gbs_around"]) / len(r["read_gbs_around"]) / read_gbs_at(host, r.get("threads") or 8)


def compute_drift(r: dict, host: Optional[dict]) -> Optional[float]:
    """The compute around a row's job over the profile's (compute_pace, marked by measured_rows); None without both."""
    return r.get("compute_pace")


def drift_counts(walked, drift=read_drift) -> list[tuple[str, int, int]]:
    """Of measured_rows' rows given, the points the class lines count (summary: not calibration, not held to a range)
    whose host's side the plan restates at the readings around their job (every placement but GPU only) and that carry
    one, by DRIFT_BANDS of the reading over the host's own (drift: read_drift, the bandwidth; compute_drift, the
    compute): (band, within TOLERANCE, how many)."""
    counted = {(where, cache) for where, cache, _, _ in class_counts(
        [(row[7], row[9], row[3], row[4], row[5]) for _, _, row in walked], TOLERANCE)}
    counts = {label: [0, 0] for _, _, label in DRIFT_BANDS}
    for r, host, (_, _, _, measured, predicted, cal, _, where, _, cache, _) in walked:
        ratio = drift(r, host)
        if cal or not predicted or (where, cache) not in counted or where == "GPU only" or ratio is None:
            continue
        label = next(label for low, high, label in DRIFT_BANDS if low <= ratio < high)
        counts[label][0] += abs(predicted - measured) / measured <= TOLERANCE
        counts[label][1] += 1
    return [(label, *counts[label]) for _, _, label in DRIFT_BANDS]


def head_counts(walked) -> list[tuple[int, int, int, int, float]]:
    """Of measured_rows' rows given, the points the class lines count with a quantized cache at a depth, beside layers
    in RAM or on the CPU alone (the CPU's attention: one query head to a thread at a time), by the model's query
    heads and the job's threads: (heads, threads, within TOLERANCE, how many, median signed error), fewest heads first."""
    groups: dict[tuple[int, int], list[float]] = {}
    for r, _, (_, _, depth, measured, predicted, cal, _, where, _, cache, _) in walked:
        if cal or not predicted or not depth or cache == "f16" or where not in ("partial offload", "CPU only"):
            continue
        key = (PRESETS[r["shape"]].n_head, r.get("threads") or 8)
        groups.setdefault(key, []).append((predicted - measured) / measured)
    return [(h, t, sum(abs(e) <= TOLERANCE for e in errors), len(errors), statistics.median(errors))
            for (h, t), errors in sorted(groups.items())]


def class_counts(points, tolerance: float) -> list[tuple[str, str, int, int]]:
    """(placement, KV cache, within tolerance, how many) for each class that has counted points, the quantized caches
    first; points: (placement, cache, measured, predicted, calibration mark), a marked point left out."""
    out = []
    for cache in ("q4_0", "q8_0", "f16"):
        for where in ("GPU only", "experts in RAM", "partial offload", "CPU only"):
            errors = [abs(p - m) / m for w, c, m, p, cal in points if (w, c) == (where, cache) and p and not cal]
            if errors:
                out.append((where, cache, sum(e <= tolerance for e in errors), len(errors)))
    return out
