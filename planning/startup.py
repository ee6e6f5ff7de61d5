"""Start-up budgets: how long a cold start may take, derived from the model's size.

A model server on an empty cache downloads its weights, then loads them; /health answers 503
(or nothing) until both are done. The startup probe, Kubernetes' progress deadline and Pulumi's
wait all have to outlast that, or a first start is killed or reported failed half-way through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .quantity import MIB, parse_quantity

if TYPE_CHECKING:
    from config.types import Startup


@dataclass(frozen=True)
class StartupBudget:
    download_seconds: int
    load_seconds: int
    # What the startup probe allows: periods x failures.
    probe_period_seconds: int
    probe_failure_threshold: int
    # What Pulumi waits for the workload to become ready, image pull included.
    wait_seconds: int

    @property
    def startup_seconds(self) -> int:
        return self.probe_period_seconds * self.probe_failure_threshold


def startup_budget(weights: str, startup: "Startup", prefetched: bool = False) -> StartupBudget:
    """The budget for a cold start. ``prefetched``: an init container downloads before the
    engine starts, so the startup probe (which starts with the engine) only covers the load."""
    size_mib = float(parse_quantity(weights)) / MIB
    download = math.ceil(size_mib / startup.download_mib_per_s)
    load = math.ceil(size_mib / startup.load_mib_per_s)
    seconds = max(startup.min_seconds, load if prefetched else download + load)
    period = startup.probe_period_seconds
    threshold = math.ceil(seconds / period)
    before_probe = startup.image_pull_seconds + (download if prefetched else 0)
    return StartupBudget(
        download_seconds=download,
        load_seconds=load,
        probe_period_seconds=period,
        probe_failure_threshold=threshold,
        wait_seconds=before_probe + threshold * period + period,
    )


def rollout_waits(budget: StartupBudget, kind: str, replicas: int) -> tuple[int, int]:
    """(create, update) seconds a rollout may take. A Deployment's replicas share one cache, so
    one download serves them all. A StatefulSet's replicas start together (Parallel) and each
    downloads into its own claim over one uplink, so a first start takes every download in a row;
    an update rolls one pod at a time, each possibly fetching a new revision at the full rate."""
    if kind != "StatefulSet":
        return budget.wait_seconds, budget.wait_seconds
    create = budget.wait_seconds + (replicas - 1) * budget.download_seconds
    return create, replicas * budget.wait_seconds
