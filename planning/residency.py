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
import math
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

    @functools.cached_property
    def budget(self) -> Budget:
        return Budget(ram_gib=self.ram_budget_gib, vram_gib=self.vram_budget_gib, host_gib=ROUTER_HOST_GIB, cap=self.cap)

    def within(self, resident) -> bool:
        """What the admission proxy checks before a model loads (incluster/fit.py, the proxy's own function,
        on the numbers admission.json gives it): the set's RAM (as the pod's limit, a whole GiB) and its VRAM
        within the budgets, and no more models than the cap."""
        return fits(self.budget, [(m.vram_gib, m.ram_gib) for m in resident])

    @functools.cached_property
    def _walk(self) -> "_Walk":
        """One walk over every set the proxy can leave resident (the pinned models and any others, within the
        budgets), extending only sets that still fit: the work grows with what memory allows, not with 2^n (a
        hundred models of 1.7-32B on one card: ~7,000 sets, 0.05 s; `make bench`). Past WALK_LIMIT sets (a
        hundred 5 GiB models, four at once: millions), the plan holds bounds instead (_bounds)."""
        try:
            return _walk(self)
        except TooManySets:
            return _bounds(self)

    def worst(self) -> list[ResidentModel]:
        """The reachable set that holds the most system RAM: what the pod's memory limit is sized for."""
        return list(self._walk.worst_ram)

    def worst_vram(self) -> list[ResidentModel]:
        return list(self._walk.worst_vram)

    @property
    def most_resident(self) -> int:
        return self._walk.most

    def full(self) -> list[tuple[ResidentModel, ...]]:
        """The fullest reachable sets beside which no other model fits (where a request for another model
        unloads one first), at most FULL_SETS_LISTED of them."""
        return list(self._walk.fullest)

    def fill(self) -> Optional[dict[str, float]]:
        """The share of the budget (VRAM where the models use a card, else RAM) that a full resident set
        holds, over every full set the proxy can reach: the emptiest (worst), their mean (typical), the
        fullest (best: never above 1, the plan's guarantee). None where the sets were too many to walk."""
        walk = self._walk
        if not walk.exact:
            return None
        return {"worst": walk.share_min, "typical": walk.share_sum / walk.full_count, "best": walk.share_max}

    @property
    def on_card(self) -> bool:
        return self.vram_budget_gib is not None

    def share(self, resident) -> float:
        budget = self.vram_budget_gib if self.on_card else self.ram_budget_gib
        return sum(m.vram_gib if self.on_card else m.ram_gib for m in resident) / budget

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
            # null: more resident sets than a plan walks (WALK_LIMIT); the figures above are then bounds.
            "fill": self.fill(),
            # Every full set the proxy can reach (beside which no other model fits), fullest first.
            # The fullest full sets (beside which no other model fits), fullest first, and how many there are.
            "full_sets": [[m.name for m in s] for s in self.full()],
            "full_sets_count": self._walk.full_count if self._walk.exact else None,
            "ram_budget_gib": self.ram_budget_gib,
            "vram_budget_gib": self.vram_budget_gib,
            "models": {m.name: {"pinned": m.pinned, "multimodal": m.multimodal, "source": m.source, "ram_gib": m.ram_gib, "vram_gib": m.vram_gib,
                                "weights_gib": m.weights_gib, "swap_seconds": m.swap_seconds,
                                "decode_predicted_tok_s": m.decode_predicted_tok_s} for m in self.models},
        }


# The full sets plan.json lists and plan.svg draws: the fullest ones (a large library has thousands).
FULL_SETS_LISTED = 24
# The resident sets one plan walks at most: a hundred models of 1.7-32B on a 24 GiB card are ~7,000 (0.04 s);
# dozens of tiny models on a large card can be billions, which no plan walks.
WALK_LIMIT = 500_000


class TooManySets(Exception):
    """More resident sets than WALK_LIMIT."""


@dataclass
class _Walk:
    exact: bool = True
    worst_ram: tuple = ()
    worst_vram: tuple = ()
    most: int = 0
    full_count: int = 0
    share_min: float = math.inf
    share_max: float = 0.0
    share_sum: float = 0.0
    fullest: list = field(default_factory=list)


def _walk(residency: Residency) -> _Walk:
    """Depth first over the models in ascending VRAM (RAM on a CPU router), extending a set only while it
    fits (fit.py, the proxy's own rule): a model that does not fit by that figure ends the branch, since every
    later one is larger. A set is full when no model outside it fits beside it."""
    on_card = residency.on_card
    budget = residency.budget
    pinned = tuple(m for m in residency.models if m.pinned)
    others = sorted((m for m in residency.models if not m.pinned), key=lambda m: (m.vram_gib if on_card else m.ram_gib, m.name))
    size = [m.vram_gib if on_card else m.ram_gib for m in others]
    limit = budget.vram_gib if on_card else budget.ram_gib
    order = {m.name: i for i, m in enumerate(residency.models)}
    walk = _Walk()
    base = [(m.vram_gib, m.ram_gib) for m in pinned]
    if not fits(budget, base):
        return walk
    worst_ram_key = worst_vram_key = None
    best: list = []

    def fits_with(figures: list, index: int) -> bool:
        return fits(budget, figures + [(others[index].vram_gib, others[index].ram_gib)])

    def too_large(used: float, index: int) -> bool:
        # By the binding figure alone (the card's VRAM, or RAM on a CPU router, whose limit is whole GiB).
        if on_card:
            return used + size[index] > limit + 1e-9
        return ram_limit_gib((used, size[index]), budget.host_gib) > limit + 1e-9

    visits = [0]

    def visit(chosen: tuple, figures: list, start: int) -> None:
        nonlocal worst_ram_key, worst_vram_key
        visits[0] += 1
        if visits[0] > WALK_LIMIT:
            raise TooManySets
        ram, vram = sum(r for _, r in figures), sum(v for v, _ in figures)
        used = vram if on_card else ram
        count = len(figures)
        if worst_ram_key is None or (ram, count) > worst_ram_key:
            worst_ram_key, walk.worst_ram = (ram, count), chosen
        if worst_vram_key is None or (vram, count) > worst_vram_key:
            worst_vram_key, walk.worst_vram = (vram, count), chosen
        walk.most = max(walk.most, count)
        extended = False
        if budget.cap is None or count < budget.cap:
            for index in range(start, len(others)):
                if too_large(used, index):
                    break  # every later model is larger by the binding figure: none fits here
                if fits_with(figures, index):
                    extended = True
                    visit(chosen + (index,), figures + [(others[index].vram_gib, others[index].ram_gib)], index + 1)
        if extended:
            return
        # Full: nothing outside the set fits beside it (the models this branch skipped included).
        skipped = set(chosen)
        if budget.cap is None or count < budget.cap:
            for index in range(start):
                if too_large(used, index):
                    break
                if index not in skipped and fits_with(figures, index):
                    return
        share = used / limit
        walk.full_count += 1
        walk.share_min, walk.share_max = min(walk.share_min, share), max(walk.share_max, share)
        walk.share_sum += share
        best.append((-round(share, 9), chosen))
        if len(best) > 4 * FULL_SETS_LISTED:
            best.sort(key=lambda b: (b[0], names(b[1])))
            del best[FULL_SETS_LISTED:]

    def names(chosen: tuple) -> list[str]:
        return [m.name for m in listed(chosen)]

    def listed(chosen: tuple) -> tuple:
        return pinned + tuple(sorted((others[i] for i in chosen), key=lambda m: order[m.name]))

    visit((), base, 0)
    best.sort(key=lambda b: (b[0], names(b[1])))
    walk.fullest = [listed(chosen) for _, chosen in best[:FULL_SETS_LISTED]]
    walk.worst_ram, walk.worst_vram = listed(walk.worst_ram), listed(walk.worst_vram)
    return walk


def _bounds(residency: Residency) -> _Walk:
    """For a library with more resident sets than a plan walks: bounds that hold for every one of them. The
    most at once: the smallest models by each figure, taken until the next does not fit (no set holds more);
    the worst sets: that many of the largest models by RAM, and by VRAM (no set holds more; the pod's limit is
    sized for it, never above the budget). The fill of the full sets is not said, nor are they listed."""
    budget = residency.budget
    pinned = tuple(m for m in residency.models if m.pinned)
    others = [m for m in residency.models if not m.pinned]

    def most_by(index: int) -> int:
        """The most models that fit by one figure alone (the other counted as nothing): a bound on any set."""
        only = lambda f: (f[0], 0.0) if index == 0 else (0.0, f[1])  # noqa: E731
        held, count = [only((m.vram_gib, m.ram_gib)) for m in pinned], 0
        for figures in sorted(((m.vram_gib, m.ram_gib) for m in others), key=lambda f: f[index]):
            if not fits(budget, held + [only(figures)]):
                break
            held, count = held + [only(figures)], count + 1
        return count

    most = min(most_by(0), most_by(1)) if residency.on_card else most_by(1)
    worst_ram = pinned + tuple(sorted(others, key=lambda m: -m.ram_gib)[:most])
    worst_vram = pinned + tuple(sorted(others, key=lambda m: -m.vram_gib)[:most])
    return _Walk(exact=False, worst_ram=worst_ram, worst_vram=worst_vram, most=len(pinned) + most)


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
        if cap is not None and len(pinned) + 1 > cap:
            problems.append((f"{path}.max_loaded", f"{cap} with {len(pinned)} pinned leaves no room for {m.name} or any "
                             f"other model (memory would hold it); raise max_loaded above {len(pinned)} or pin fewer"))
            break
        beside = f" beside the pinned {', '.join(p.name for p in pinned)}" if pinned else ""
        problems.append((f"{path}.models.{m.name}", f"can never be loaded{beside}: it needs {m.ram_gib:.1f} GiB of RAM "
                         f"and {m.vram_gib:.1f} GiB of VRAM ({_needs(m)}), the router has "
                         f"{_budget(ram_budget_gib, vram_budget_gib)}{others}; use a smaller quant or ctx_size, fewer "
                         f"gpu_layers or more cpu_moe_layers, {'drop its vision projector (facts.mmproj: null), ' if m.multimodal else ''}"
                         f"{'pin fewer models, ' if pinned else ''}or remove it"))
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
