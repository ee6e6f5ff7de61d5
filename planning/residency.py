"""Which on-demand models may be resident together (``models.<key>.on_demand``): planned from
memory, never guessed as a count. llama.cpp's router bounds residency only by a count
(--models-max) and evicts the least recently used; so the planner renders the count that makes an
out-of-memory load impossible: the largest N such that ANY N of the models (the pinned ones
always among them) fit what the node gives the router, in system RAM and on its GPU."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .memory import MemoryEstimate, VramEstimate

Problem = tuple[str, str]
# The router process itself, beside its children (each child's own runtime is in its estimate):
# a margin, not a measurement.
ROUTER_HOST_GIB = 0.25
# The router pod's keeper sidecar (components/prefetch): its memory request, taken from the node's
# RAM before the models' residency is planned.
KEEPER_MEMORY_REQUEST = "64Mi"


@dataclass(frozen=True)
class ResidentModel:
    name: str
    pinned: bool
    ram_gib: float  # what the child holds in the pod's memory (its estimate with the limit's headroom)
    vram_gib: float  # on the router's GPU; 0 without one
    weights_gib: float
    load_seconds: float  # from the cache at the stack's load rate: the cost of a swap
    decode_predicted_tok_s: Optional[dict[str, float]]
    estimate: MemoryEstimate
    vram: Optional[VramEstimate]
    source: str = ""  # the weights it loads (org/repo:TAG): a change refetches them


@dataclass(frozen=True)
class Residency:
    max_loaded: int
    ram_budget_gib: float
    vram_budget_gib: Optional[float]
    models: tuple[ResidentModel, ...] = field(default_factory=tuple)

    def worst(self) -> list[ResidentModel]:
        """The resident set that holds the most system RAM: the pinned models and the largest others."""
        return _largest(self.models, self.max_loaded, lambda m: m.ram_gib)

    def worst_vram(self) -> list[ResidentModel]:
        return _largest(self.models, self.max_loaded, lambda m: m.vram_gib)

    def to_dict(self) -> dict:
        return {
            "max_loaded": self.max_loaded,
            "ram_budget_gib": self.ram_budget_gib,
            "vram_budget_gib": self.vram_budget_gib,
            "models": {m.name: {"pinned": m.pinned, "source": m.source, "ram_gib": m.ram_gib, "vram_gib": m.vram_gib,
                                "weights_gib": m.weights_gib, "load_seconds": m.load_seconds,
                                "decode_predicted_tok_s": m.decode_predicted_tok_s} for m in self.models},
        }


def _largest(models, count: int, size) -> list[ResidentModel]:
    pinned = [m for m in models if m.pinned]
    others = sorted((m for m in models if not m.pinned), key=lambda m: (-size(m), m.name))
    return pinned + others[: max(0, count - len(pinned))]


def plan_residency(path: str, wanted: Optional[int], models: list[ResidentModel], ram_budget_gib: float,
                   vram_budget_gib: Optional[float], others: str) -> tuple[Optional[Residency], list[Problem]]:
    """The largest safe --models-max, or the problems that make every count unsafe. ``path``: the
    server's on_demand block; ``wanted``: the max_loaded it asks for (None: planned). ``others`` says
    what else the budgets were reduced by, for the messages."""

    def within(ram_set: list[ResidentModel], vram_set: list[ResidentModel]) -> bool:
        # RAM as the pod's limit, rounded up to a whole GiB: what the node must give.
        vram = sum(m.vram_gib for m in vram_set)
        return limit_gib(ram_set) <= ram_budget_gib + 1e-9 and (vram_budget_gib is None or vram <= vram_budget_gib + 1e-9)

    def fits(count: int) -> bool:
        return within(_largest(models, count, lambda m: m.ram_gib), _largest(models, count, lambda m: m.vram_gib))

    pinned = [m for m in models if m.pinned]
    problems: list[Problem] = []
    if len(pinned) > 1 and not fits(len(pinned)):
        return None, [(f"{path}.models", f"the pinned models together need {sum(m.ram_gib for m in pinned):.1f} GiB of "
                       f"RAM and {sum(m.vram_gib for m in pinned):.1f} GiB of VRAM, more than the router has "
                       f"({_budget(ram_budget_gib, vram_budget_gib)}{others}); pin fewer")]
    # Each model must fit beside the pinned ones: otherwise a request for it can never be served.
    for m in models:
        beside = [p for p in pinned if p is not m]
        if not within([m, *beside], [m, *beside]):
            pins = f" beside the pinned {', '.join(p.name for p in beside)}" if beside else ""
            problems.append((f"{path}.models.{m.name}", f"can never be loaded{pins}: it needs {m.ram_gib:.1f} GiB of RAM "
                             f"and {m.vram_gib:.1f} GiB of VRAM ({_needs(m)}), the router has "
                             f"{_budget(ram_budget_gib, vram_budget_gib)}{others}; use a smaller quant or ctx_size, fewer "
                             "gpu_layers, or remove it"))
    if problems:
        return None, problems
    safe = max(1, len(pinned))
    while safe < len(models) and fits(safe + 1):
        safe += 1
    if wanted is not None and wanted > safe:
        largest = _largest(models, wanted, lambda m: m.ram_gib)
        return None, [(f"{path}.max_loaded", f"{wanted} is not safe: {', '.join(m.name for m in largest)} loaded together "
                       f"need {sum(m.ram_gib for m in largest) + ROUTER_HOST_GIB:.1f} GiB of RAM and "
                       f"{sum(m.vram_gib for m in largest):.1f} GiB of VRAM, the router has "
                       f"{_budget(ram_budget_gib, vram_budget_gib)}{others}; remove it (planned: {safe})")]
    return Residency(max_loaded=wanted or safe, ram_budget_gib=ram_budget_gib, vram_budget_gib=vram_budget_gib,
                     models=tuple(models)), []


def _budget(ram: float, vram: Optional[float]) -> str:
    return f"{ram:.1f} GiB of RAM" + (f" and {vram:.1f} GiB of VRAM" if vram is not None else "")


def _needs(m: ResidentModel) -> str:
    parts = [f"RAM: {m.estimate.breakdown()}"]
    if m.vram is not None:
        parts.append(f"GPU: {m.vram.breakdown()}")
    return "; ".join(parts)


def limit_gib(models: list[ResidentModel]) -> int:
    """The router pod's memory limit for a resident set: every child with its headroom, and the router."""
    return math.ceil(sum(m.ram_gib for m in models) + ROUTER_HOST_GIB - 1e-9)


def summed_estimate(models: list[ResidentModel]) -> MemoryEstimate:
    return MemoryEstimate(
        weights_gib=sum(m.estimate.weights_gib for m in models),
        kv_gib=sum(m.estimate.kv_gib for m in models),
        recurrent_gib=sum(m.estimate.recurrent_gib for m in models),
        overhead_gib=sum(m.estimate.overhead_gib for m in models) + ROUTER_HOST_GIB,
        host_caches_gib=sum(m.estimate.host_caches_gib for m in models),
    )


def summed_vram(models: list[ResidentModel]) -> Optional[VramEstimate]:
    cards = [m.vram for m in models if m.vram is not None]
    if not cards:
        return None
    return VramEstimate(
        layers_offloaded=sum(v.layers_offloaded for v in cards), layers=sum(v.layers for v in cards),
        weights_gib=sum(v.weights_gib for v in cards), kv_gib=sum(v.kv_gib for v in cards),
        recurrent_gib=sum(v.recurrent_gib for v in cards), reserve_gib=sum(v.reserve_gib for v in cards),
        experts_in_ram=sum(v.experts_in_ram for v in cards),
    )
