"""Where a decode figure cannot be right (issue #44 item 3): keeping blocks or experts in system RAM beside a discrete
card cannot make a token faster than holding the same model entirely on a card of that bandwidth, and a figure for a
model on such a card is held to a published run of it where one exists. The summary flags such a figure as an upper
bound (engines/llamacpp.py puts the line in the estimate's warnings)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from common.quantity import Quantity

from .llamacpp_memory import layout, quant_of
from .llamacpp_host import host_read_gbs
from .llamacpp_speed import is_range, predict_range_tok_s, profile_name

if TYPE_CHECKING:
    from config.types import ModelFacts, ModelServer, NodePool


# Published decode of a model held entirely on a discrete card, to hold a placement with weights in system RAM
# beside such a card to (issue #44 item 3): keeping blocks or experts in RAM cannot make a token faster than holding
# them on a card of the same bandwidth. (profile, the model's parameters and active parameters in billions, its
# quant, the card's bandwidth GB/s, tokens/s, source.) Qwen3.6-35B-A3B UD-Q4_K_M (20.60 GiB) on an Arc Pro B60 (456 GB/s, as
# the B580), SYCL, llama-bench tg128 50.29 t/s at build 9159 (llama.cpp issue #22413, 2026-05-18; that build had
# asserts enabled, so a release may be faster): the profile's MoE block cost is not measured and the plan's own
# figure for it on the card is about twice that. A run holds only for its quant (another reads other bytes).
PUBLISHED_ON_CARD: tuple[tuple[str, float, float, str, float, float, str], ...] = (
    ("intel-arc-b", 34.66, 3.45, "Q4_K_M", 456.0, 50.29, "an Arc Pro B60, SYCL, llama.cpp issue #22413"),
)


# How far a figure for a model held on a card may lie above a published run of it before the summary flags it: the
# decode tolerance the plan is held to (issue #44: within 15 %).
DECODE_FLAG_TOLERANCE = 0.15


def published_on_card(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str]
                      ) -> Optional[tuple[float, str]]:
    """A published run of this model at its quant on a card of this pool's profile (PUBLISHED_ON_CARD), scaled by
    the pool's card bandwidth; (tokens/s, where it comes from). None off a discrete card, for a server on the CPU,
    or where none is published."""
    if not pool.discrete() or pool.vram_bandwidth_gbs is None or backend == "cpu":
        return None
    profile = profile_name(pool, backend)
    quant = quant_of(model.hf_repo) if model.hf_repo else None
    for name, params, active, published_quant, bandwidth, tok_s, source in PUBLISHED_ON_CARD:
        if (name == profile and quant == published_quant and abs(facts.params_b - params) <= 0.01 * params
                and abs((facts.active_params_b or facts.params_b) - active) <= 0.01 * active):
            return tok_s * float(pool.vram_bandwidth_gbs) / bandwidth, f"published for it on {source}"
    return None


def on_card_ceiling(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str]
                    ) -> Optional[tuple[float, str]]:
    """What the same model decodes at, at an empty context, held entirely on a card of this pool's profile and
    bandwidth: a published run of it (published_on_card), else the fast end of the plan's own figure for every block
    on the card; (tokens/s, where it comes from). None off a discrete card, or for a server on the CPU."""
    if not pool.discrete() or pool.vram_bandwidth_gbs is None or backend == "cpu":
        return None
    published = published_on_card(model, facts, pool, backend)
    if published is not None:
        return published
    whole = model.model_copy(update={"gpu_layers": 999, "cpu_moe_layers": None})
    card = pool.model_copy(update={"vram": Quantity("100000Gi")})  # room for every block
    rates = predict_range_tok_s(whole, facts, card, backend, True, {"empty": 0})
    return (rates["empty"][1], "the plan's figure for it with every block on the card") if rates else None


def faster_than_on_card(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
                        path: str, span: dict[str, tuple[float, float]]) -> Optional[str]:
    """The summary's flag where a placement with weights in system RAM beside a discrete card is predicted faster,
    at either end of its range, than the same model held entirely on such a card (on_card_ceiling), or where a
    model held on the card is predicted above a published run of it by more than DECODE_FLAG_TOLERANCE."""
    if not span:
        return None
    place = layout(model, facts)
    on_card = place.gpu_blocks >= place.layers and not place.experts_in_ram
    ceiling = (published_on_card if on_card else on_card_ceiling)(model, facts, pool, backend)
    if ceiling is None:
        return None
    low, high = span["empty"]
    figure = f"{low:.1f}-{high:.1f}" if is_range(low, high) else f"{low:.1f}"
    if on_card:
        if high <= ceiling[0] * (1 + DECODE_FLAG_TOLERANCE):
            return None
        return (f"{path}: decode ~{figure} tok/s at an empty context is more than the {ceiling[0]:.1f} tok/s "
                f"{ceiling[1]}: the backend's cost for this model is not measured, so this figure is too high; take "
                "it as an upper bound")
    host = host_read_gbs(pool, model.threads)
    if high <= ceiling[0] * 1.005 or (host is not None and host[1] >= float(pool.vram_bandwidth_gbs)):
        return None  # within the ceiling, or a host that reads as fast as the card: the premise does not hold
    return (f"{path}: decode ~{figure} tok/s at an empty context with weights in system RAM is more than the "
            f"{ceiling[0]:.1f} tok/s {ceiling[1]}: keeping blocks or experts in RAM cannot be faster than the card, so "
            "this figure is too high (the backend's cost for this model is not measured); take it as an upper bound")
