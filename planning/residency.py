"""Which on-demand models may be resident together (``models.<key>.on_demand``): planned from
memory, never guessed as a count. llama.cpp's router bounds residency only by a count
(--models-max) and evicts the least recently used idle model, whichever it is: b10729 has no pin
(common/arg.cpp: the option is commented out), and a model loaded at start has the oldest use, so it
is the first evicted (server-models.cpp pick_victim; measured on a GPU: the 'pinned' model went and
the two largest stayed). So the planner renders the count that makes an out-of-memory load
impossible whatever the runtime evicts: the largest N such that ANY N of the models fit what the
node gives the router, in system RAM and on its GPU. No model is assumed resident; a pinned model
is only loaded at start."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from common.quantity import Quantity

from .memory import MemoryEstimate, VramEstimate

Problem = tuple[str, str]
# The router process itself, beside its children (each child's own runtime is in its estimate):
# a margin, not a measurement.
ROUTER_HOST_GIB = 0.25
# The router pod's keeper sidecar (components/prefetch): its memory request, taken from the node's
# RAM before the models' residency is planned.
KEEPER_MEMORY_REQUEST = Quantity("64Mi")


@dataclass(frozen=True)
class ResidentModel:
    name: str
    pinned: bool
    ram_gib: float  # what the child holds in the pod's memory (its estimate with the limit's headroom)
    vram_gib: float  # on the router's GPU; 0 without one
    weights_gib: float
    swap_seconds: dict[str, float]  # a swap's predicted cost, warm (page cache) and cold (off the volume)
    decode_predicted_tok_s: Optional[dict[str, float]]
    estimate: MemoryEstimate
    vram: Optional[VramEstimate]
    source: str = ""  # the weights it loads (org/repo:TAG): a change refetches them
    multimodal: bool = False  # its vision projector is loaded with it (and counted)


@dataclass(frozen=True)
class Residency:
    max_loaded: int
    ram_budget_gib: float
    vram_budget_gib: Optional[float]
    models: tuple[ResidentModel, ...] = field(default_factory=tuple)

    def worst(self) -> list[ResidentModel]:
        """The resident set that holds the most system RAM: the largest N models."""
        return _largest(self.models, self.max_loaded, lambda m: m.ram_gib)

    def worst_vram(self) -> list[ResidentModel]:
        return _largest(self.models, self.max_loaded, lambda m: m.vram_gib)

    def fill(self) -> dict[str, float]:
        """The share of the budget (VRAM where the models use a card, else RAM) that a full resident set
        holds: the smallest max_loaded models (worst), the average over every such set (typical), the
        largest (best: never above 1, the plan's guarantee)."""
        sizes = sorted((m.vram_gib if self.vram_budget_gib is not None else m.ram_gib) for m in self.models)
        budget = self.vram_budget_gib if self.vram_budget_gib is not None else self.ram_budget_gib
        count = min(self.max_loaded, len(sizes))
        return {"worst": sum(sizes[:count]) / budget, "typical": count * sum(sizes) / len(sizes) / budget,
                "best": sum(sizes[-count:]) / budget}

    def to_dict(self) -> dict:
        return {
            "max_loaded": self.max_loaded,
            "fill": self.fill(),
            "ram_budget_gib": self.ram_budget_gib,
            "vram_budget_gib": self.vram_budget_gib,
            "models": {m.name: {"pinned": m.pinned, "multimodal": m.multimodal, "source": m.source, "ram_gib": m.ram_gib, "vram_gib": m.vram_gib,
                                "weights_gib": m.weights_gib, "swap_seconds": m.swap_seconds,
                                "decode_predicted_tok_s": m.decode_predicted_tok_s} for m in self.models},
        }


def _largest(models, count: int, size) -> list[ResidentModel]:
    return sorted(models, key=lambda m: (-size(m), m.name))[:count]


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

    problems: list[Problem] = []
    # Each model must fit alone: otherwise a request for it can never be served.
    for m in models:
        if not within([m], [m]):
            problems.append((f"{path}.models.{m.name}", f"can never be loaded: it needs {m.ram_gib:.1f} GiB of RAM "
                             f"and {m.vram_gib:.1f} GiB of VRAM ({_needs(m)}), the router has "
                             f"{_budget(ram_budget_gib, vram_budget_gib)}{others}; use a smaller quant or ctx_size, fewer "
                             "gpu_layers or more cpu_moe_layers, or remove it"))
    if problems:
        return None, problems
    safe = 1
    while safe < len(models) and fits(safe + 1):
        safe += 1
    pinned = [m.name for m in models if m.pinned]
    if len(pinned) > (wanted or safe):
        # Loaded at start one after another: past the limit the router evicts the first again.
        problems.append((f"{path}.models", f"{len(pinned)} models are pinned (loaded at start: {', '.join(pinned)}) but "
                         f"only {wanted or safe} may be resident at once; pin at most {wanted or safe}"))
        return None, problems
    if wanted is not None and wanted > safe:
        by_ram = _largest(models, wanted, lambda m: m.ram_gib)
        # The set that breaks a budget: the VRAM-largest one when the RAM-largest fits.
        largest = by_ram if limit_gib(by_ram) > ram_budget_gib + 1e-9 else _largest(models, wanted, lambda m: m.vram_gib)
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
