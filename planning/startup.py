"""Start-up budgets: how long a cold start may take, derived from the model's size.

A model server on an empty cache downloads its weights, then loads them; /health answers 503
(or nothing) until both are done. Two different numbers come out of that:

- the estimate, from the stack's `startup` rates (the cold-start annotation the policies check);
- the window: the estimate, but never shorter than the same start at the built-in default rates
  (the seed's: ~19 GiB downloaded and loaded in 40 min). The startup probe allows it, and
  Pulumi's wait, the Deployment's progress deadline and the NotReady alert add the image pull
  (and a prefetch's download) to it, so nothing reports a failure that Kubernetes would not.

The probe is part of the pod (a change restarts it), so the floor is what keeps a rate edit away
from running servers: rates at or above the defaults change nothing; only an estimate slower
than the defaults lengthens the window and restarts the servers (the change preview says which).

A start the probe does cut short keeps its progress: llama.cpp resumes a partial download with a
Range request (tests/test_llama_contract.py), as the prefetch downloader does (tests/test_prefetch.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.constants import probe_allows_seconds

from common.quantity import MIB, parse_quantity

if TYPE_CHECKING:
    from config.types import Startup


@dataclass(frozen=True)
class StartupBudget:
    # The estimate, from the stack's rates.
    download_seconds: int
    load_seconds: int
    # What the startup probe allows: periods x failures (the window: at least the estimate).
    probe_period_seconds: int
    probe_failure_threshold: int
    # What Pulumi waits for the workload to become ready: image pull (and a prefetch) + the window.
    wait_seconds: int

    @property
    def startup_seconds(self) -> int:
        return probe_allows_seconds(self.probe_period_seconds, self.probe_failure_threshold)


def _cold_start(size_mib: float, download_mib_per_s: float, load_mib_per_s: float, min_seconds: int,
                prefetched: bool) -> tuple[int, int, int]:
    """(download, load, what the probe must cover) in seconds."""
    download = math.ceil(size_mib / download_mib_per_s)
    load = math.ceil(size_mib / load_mib_per_s)
    return download, load, max(min_seconds, load if prefetched else download + load)


def startup_budget(weights: str, startup: "Startup", prefetched: bool = False,
                   downloaded: str | None = None, upload_seconds: int = 0) -> StartupBudget:
    """The budget for a cold start. ``prefetched``: an init container downloads before the
    engine starts, so the startup probe (which starts with the engine) only covers the load.
    ``downloaded``: what the init container fetches when it is not what the engine loads at start
    (a router fetches every model and loads none before it answers). ``upload_seconds``: what a split's main
    server sends its helpers over the link as it loads (engines/llamacpp_split.py)."""
    size_mib = float(parse_quantity(weights)) / MIB
    download, load, estimate = _cold_start(
        size_mib, startup.download_mib_per_s, startup.load_mib_per_s, startup.min_seconds, prefetched
    )
    if downloaded is not None:
        download = math.ceil(float(parse_quantity(downloaded)) / MIB / startup.download_mib_per_s)
    load += upload_seconds
    estimate += upload_seconds
    # The floor: the same start at the default rates (type(startup)() is the config's defaults,
    # written once, in config.types.Startup).
    defaults = type(startup)()
    *_, floor = _cold_start(size_mib, defaults.download_mib_per_s, defaults.load_mib_per_s, defaults.min_seconds, prefetched)
    floor += upload_seconds
    period = startup.probe_period_seconds
    # One more than the window's periods: the first probe runs at the start (probe_allows_seconds).
    threshold = math.ceil(max(estimate, floor) / period) + 1
    before_probe = startup.image_pull_seconds + (download if prefetched else 0)
    return StartupBudget(
        download_seconds=download,
        load_seconds=load,
        probe_period_seconds=period,
        probe_failure_threshold=threshold,
        # As long as the probe allows: Pulumi never reports a failure for a start Kubernetes still
        # lets run (and a wait is not part of a pod: changing it restarts nothing).
        wait_seconds=before_probe + probe_allows_seconds(period, threshold) + period,
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


# A model swapped in by a router (planning/residency.py): a prediction, not a budget. A child's start
# (process, backend and context set-up, compute buffers) and the upload of what goes to the GPU; the
# weights kept in system RAM are mapped, not copied. Warm: the files are in the node's page cache (a
# model used since the node's memory last needed the pages); cold: read off the cache volume at the
# stack's load rate first. Fitted to llama.cpp b10729's CUDA children on an H200: warm medians 2.1-3.5 s
# (bench/results-router-soak-h200.json, made by make router-soak; tests/test_residency.py holds the plan to it).
SWAP_START_SECONDS = 1.2
PAGE_CACHE_UPLOAD_GIB_PER_S = 5.3


def swap_seconds(weights: str, gpu_gib: float, startup: "Startup") -> dict[str, float]:
    """Predicted seconds from the request that loads a model to its load's end, warm and cold."""
    upload = gpu_gib / PAGE_CACHE_UPLOAD_GIB_PER_S
    read = float(parse_quantity(weights)) / MIB / startup.load_mib_per_s
    return {"warm": round(SWAP_START_SECONDS + upload, 1), "cold": round(SWAP_START_SECONDS + max(upload, read), 1)}
