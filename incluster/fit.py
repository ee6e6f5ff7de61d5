"""Which models may be resident together: the one rule the capacity plan (planning/residency.py)
and the admission proxy (admission_proxy.py, in the router's pod) both run, on the same numbers
(the plan writes them into the proxy's admission.json). Standard library only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

# Figures are hundredths of a GiB summed as floats: a set exactly at its budget must fit.
EPSILON = 1e-9


@dataclass(frozen=True)
class Budget:
    """What a router's resident models may hold together."""

    ram_gib: float  # the pod's memory for the children and the router (a whole-GiB limit is checked against it)
    vram_gib: Optional[float]  # the card's share for the children; None: no card
    host_gib: float  # the router process itself, beside its children
    cap: Optional[int] = None  # at most this many resident; None: as many as fit

    @classmethod
    def from_plan(cls, plan: dict) -> "Budget":
        """From admission.json (planning/residency.py Residency.admission_plan writes it)."""
        vram = plan.get("vram_budget_gib")
        cap = plan.get("max_loaded")
        return cls(ram_gib=float(plan["ram_budget_gib"]), vram_gib=None if vram is None else float(vram),
                   host_gib=float(plan["host_gib"]), cap=None if cap is None else int(cap))


def ram_limit_gib(ram_gibs: Iterable[float], host_gib: float) -> int:
    """The pod memory a resident set needs, as a limit in whole GiB: every child's RAM and the router's."""
    return math.ceil(sum(ram_gibs) + host_gib - EPSILON)


def fits(budget: Budget, figures: Iterable[tuple[float, float]]) -> bool:
    """Whether models of these (VRAM GiB, RAM GiB) figures may be resident together."""
    figures = list(figures)
    if budget.cap is not None and len(figures) > budget.cap:
        return False
    if budget.vram_gib is not None and sum(v for v, _ in figures) > budget.vram_gib + EPSILON:
        return False
    ram = sum(r for _, r in figures)
    if not math.isfinite(ram):  # a model of unknown size: nothing fits beside it
        return False
    return ram_limit_gib([ram], budget.host_gib) <= budget.ram_gib + EPSILON
