"""Which on-demand models may be resident together (``models.<key>.on_demand``): planned from
memory, and held to it at run time by the admission proxy in the router's pod (incluster/admission_proxy.py).

llama.cpp's router bounds residency only by a count (--models-max) and evicts the least recently
used idle model, whichever it is (b10729 has no pin: common/arg.cpp; measured on a GPU: the model
loaded at start went first and the two largest stayed). A count that is safe for every set leaves a
card of mixed sizes half empty (the shipped library: any 2 of 5, a full set 58-99 % of the card). So
the router's count is above any library's (it never evicts on its own), and the proxy admits a
model only when the planned memory of what stays resident plus it fits the budget, unloading the
least recently used idle models first and never a pinned one. The plan checks every set the proxy
can reach: each is within the budget by construction; each model fits beside the pinned ones, or it
is refused; the pod's memory limit is the largest such set's."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Optional

from common.quantity import Quantity
from incluster.fit import Budget, fits, ram_limit_gib

from .memory import MemoryEstimate, VramEstimate

Problem = tuple[str, str]
# The router process itself, beside its children (each child's own runtime is in its estimate):
# a margin, not a measurement.
ROUTER_HOST_GIB = 0.25
# The router pod's keeper sidecar (components/prefetch): its memory request, taken from the node's
# RAM before the models' residency is planned.
KEEPER_MEMORY_REQUEST = Quantity("64Mi")
# The admission proxy beside it (incluster/admission_proxy.py): ~20 MiB of Python idle; its limit holds the
# request bodies it may hold while a model is admitted.
ADMISSION_MEMORY_REQUEST = Quantity("64Mi")


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
    cap: Optional[int]  # on_demand.max_loaded: at most this many resident; None: as many as fit
    ram_budget_gib: float
    vram_budget_gib: Optional[float]
    models: tuple[ResidentModel, ...] = field(default_factory=tuple)

    @property
    def budget(self) -> Budget:
        return Budget(ram_gib=self.ram_budget_gib, vram_gib=self.vram_budget_gib, host_gib=ROUTER_HOST_GIB, cap=self.cap)

    def within(self, resident) -> bool:
        """What the admission proxy checks before a model loads (incluster/fit.py, the proxy's own function,
        on the numbers admission.json gives it): the set's RAM (as the pod's limit, a whole GiB) and its VRAM
        within the budgets, and no more models than the cap."""
        return fits(self.budget, [(m.vram_gib, m.ram_gib) for m in resident])

    def reachable(self) -> list[tuple[ResidentModel, ...]]:
        """Every set of models the proxy can leave resident: the pinned ones (loaded at start, never
        unloaded to make room) and any others, within the budgets."""
        return self._reachable

    @functools.cached_property
    def _reachable(self) -> list[tuple[ResidentModel, ...]]:
        # Up to 2^16 sets (config/on_demand.py MAX_MODELS): enumerated once per plan, read by the limit,
        # the fill, the summary and plan.json.
        pinned = tuple(m for m in self.models if m.pinned)
        others = [m for m in self.models if not m.pinned]
        return [pinned + extra for count in range(len(others) + 1)
                for extra in itertools.combinations(others, count) if self.within(pinned + extra)]

    def full(self) -> list[tuple[ResidentModel, ...]]:
        """The reachable sets beside which no other model fits: where a request for another model
        unloads one first."""
        return self._full

    @functools.cached_property
    def _full(self) -> list[tuple[ResidentModel, ...]]:
        return [s for s in self.reachable() if not any(self.within(s + (m,)) for m in self.models if m not in s)]

    def worst(self) -> list[ResidentModel]:
        """The reachable set that holds the most system RAM: what the pod's memory limit is sized for."""
        return list(max(self.reachable(), key=lambda s: (sum(m.ram_gib for m in s), len(s))))

    def worst_vram(self) -> list[ResidentModel]:
        return list(max(self.reachable(), key=lambda s: (sum(m.vram_gib for m in s), len(s))))

    @property
    def most_resident(self) -> int:
        return max(len(s) for s in self.reachable())

    def fill(self) -> dict[str, float]:
        """The share of the budget (VRAM where the models use a card, else RAM) that a full resident set
        holds, over every full set the proxy can reach: the emptiest (worst), their mean (typical), the
        fullest (best: never above 1, the plan's guarantee)."""
        on_card = self.vram_budget_gib is not None
        budget = self.vram_budget_gib if on_card else self.ram_budget_gib
        shares = [sum(m.vram_gib if on_card else m.ram_gib for m in s) / budget for s in self.full()]
        return {"worst": min(shares), "typical": sum(shares) / len(shares), "best": max(shares)}

    def admission_plan(self) -> dict:
        """What the admission proxy holds the router to (incluster/admission_proxy.py reads it): the budget the
        plan checked every reachable set against, and each model's figures."""
        budget = self.budget
        return {"vram_budget_gib": budget.vram_gib, "ram_budget_gib": budget.ram_gib, "host_gib": budget.host_gib,
                "max_loaded": budget.cap,
                "models": {m.name: {"vram_gib": m.vram_gib, "ram_gib": m.ram_gib, "pinned": m.pinned} for m in self.models}}

    def to_dict(self) -> dict:
        return {
            "admission": "memory",
            "max_loaded": self.cap,
            "most_resident": self.most_resident,
            "fill": self.fill(),
            # Every full set the proxy can reach (beside which no other model fits), fullest first.
            "full_sets": [[m.name for m in s] for s in sorted(
                self.full(), key=lambda s: (-sum(m.vram_gib if self.vram_budget_gib is not None else m.ram_gib for m in s),
                                            [m.name for m in s]))],
            "ram_budget_gib": self.ram_budget_gib,
            "vram_budget_gib": self.vram_budget_gib,
            "models": {m.name: {"pinned": m.pinned, "multimodal": m.multimodal, "source": m.source, "ram_gib": m.ram_gib, "vram_gib": m.vram_gib,
                                "weights_gib": m.weights_gib, "swap_seconds": m.swap_seconds,
                                "decode_predicted_tok_s": m.decode_predicted_tok_s} for m in self.models},
        }


def plan_residency(path: str, cap: Optional[int], models: list[ResidentModel], ram_budget_gib: float,
                   vram_budget_gib: Optional[float], others: str) -> tuple[Optional[Residency], list[Problem]]:
    """The residency the admission proxy will hold, or the problems that make a model unloadable.
    ``path``: the server's on_demand block; ``cap``: the max_loaded it asks for (None: as many as fit).
    ``others`` says what else the budgets were reduced by, for the messages."""
    residency = Residency(cap=cap, ram_budget_gib=ram_budget_gib, vram_budget_gib=vram_budget_gib, models=tuple(models))
    pinned = [m for m in models if m.pinned]
    if cap is not None and len(pinned) > cap:
        return None, [(f"{path}.models", f"{len(pinned)} models are pinned (loaded at start and kept: "
                       f"{', '.join(m.name for m in pinned)}) but max_loaded is {cap}; pin at most {cap} or raise max_loaded")]
    if not residency.within(pinned):
        return None, [(f"{path}.models", f"the pinned models {', '.join(m.name for m in pinned)} (loaded at start and kept) "
                       f"need {sum(m.ram_gib for m in pinned) + ROUTER_HOST_GIB:.1f} GiB of RAM and "
                       f"{sum(m.vram_gib for m in pinned):.1f} GiB of VRAM together, the router has "
                       f"{_budget(ram_budget_gib, vram_budget_gib)}{others}; pin fewer")]
    problems: list[Problem] = []
    # Each model must fit beside the pinned ones: otherwise a request for it can never be served.
    for m in models:
        if m.pinned or residency.within(pinned + [m]):
            continue
        beside = f" beside the pinned {', '.join(p.name for p in pinned)}" if pinned else ""
        problems.append((f"{path}.models.{m.name}", f"can never be loaded{beside}: it needs {m.ram_gib:.1f} GiB of RAM "
                         f"and {m.vram_gib:.1f} GiB of VRAM ({_needs(m)}), the router has "
                         f"{_budget(ram_budget_gib, vram_budget_gib)}{others}; use a smaller quant or ctx_size, fewer "
                         f"gpu_layers or more cpu_moe_layers, {'pin fewer models, ' if pinned else ''}or remove it"))
    if problems:
        return None, problems
    return residency, []


def _budget(ram: float, vram: Optional[float]) -> str:
    return f"{ram:.1f} GiB of RAM" + (f" and {vram:.1f} GiB of VRAM" if vram is not None else "")


def _needs(m: ResidentModel) -> str:
    parts = [f"RAM: {m.estimate.breakdown()}"]
    if m.vram is not None:
        parts.append(f"GPU: {m.vram.breakdown()}")
    return "; ".join(parts)


def limit_gib(models: list[ResidentModel]) -> int:
    """The router pod's memory limit for a resident set: every child with its headroom, and the router."""
    return ram_limit_gib((m.ram_gib for m in models), ROUTER_HOST_GIB)


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
