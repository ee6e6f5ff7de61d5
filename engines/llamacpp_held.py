"""How far the plan's decode figure has held, per placement and KV cache type, against llama-bench on hosts measured
after the model was last frozen (make bench's out-of-sample lines, lab/bench/decode_error.py), so that a summary
printing one figure for a class short of the goal says so where the user reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .llamacpp_host import HOST
from .llamacpp_memory import layout
from .llamacpp_speed import experts_at_host_share

if TYPE_CHECKING:
    from config.types import ModelFacts, ModelServer, NodePool


# (placement, KV cache type) -> (points within DECODE_TOLERANCE of llama-bench, points measured): make bench's lines
# "decode measured after the model was last frozen" (commit 07fbb1b, CPU_KV_SHAPES on f16 too: leases 22-25), and
# after the freezes before where no change since moved the prediction: leases 20's and 21's rows but their f16 caches
# at depth of models of more query heads than the probe's beside layers in RAM and on the CPU alone (3762243), lease
# 19's (29c4b85), lease 18's experts rows (5df4fcd), lease 17's (a3c9d1b), leases 14-16's but leases 15's and 16's
# experts in RAM (a0782b9); of those beside layers in RAM and on the CPU alone, the quantized caches at depth (but of
# 40-head models') of leases 14-17 and 19 moved with 3762243, in sample now.
# tests/test_speed_model.py holds every entry to make bench's count. A class not listed was not measured there.
DECODE_HELD = {
    ("GPU only", "q4_0"): (8, 8), ("GPU only", "q8_0"): (4, 4), ("GPU only", "f16"): (2, 2),
    ("experts in RAM", "q4_0"): (33, 46), ("experts in RAM", "q8_0"): (29, 42),
    ("partial offload", "q4_0"): (23, 23), ("partial offload", "q8_0"): (55, 61), ("partial offload", "f16"): (11, 11),
    ("CPU only", "q4_0"): (14, 14), ("CPU only", "q8_0"): (8, 8), ("CPU only", "f16"): (9, 10),
}
DECODE_TOLERANCE, DECODE_GOAL = 0.15, 0.9  # issue #44's: within +-15 % on 90 % of points in every class


def decode_class(model: "ModelServer", facts: "ModelFacts", backend: Optional[str], discrete: bool) -> tuple[str, str]:
    """The placement and KV cache type make bench counts a server's decode under (decode_error.placement): on the CPU
    backend, CPU only; a GPU sharing the node's memory; beside a discrete card, experts of offloaded blocks in RAM,
    blocks in RAM (partial offload), or every block on the card. The cache is its K type (a pair of types is refused
    on CUDA)."""
    place = layout(model, facts)
    if not discrete:
        where = "CPU only" if backend == "cpu" else "GPU, unified memory"
    elif place.experts_in_ram:
        where = "experts in RAM"
    else:
        where = "partial offload" if place.gpu_blocks < place.layers else "GPU only"
    return where, model.cache_type_k or "f16"


def decode_held_warning(model: "ModelServer", facts: "ModelFacts", backend: Optional[str], discrete: bool,
                        path: str) -> Optional[str]:
    """The summary's line for a server whose decode the plan prints as one figure (a node measured by make
    host-profile) in a class that held within DECODE_TOLERANCE on fewer than DECODE_GOAL of its points out of sample;
    None otherwise (a range says its own why)."""
    where, cache = decode_class(model, facts, backend, discrete)
    held = DECODE_HELD.get((where, cache))
    if held is None or held[0] >= DECODE_GOAL * held[1]:
        return None
    within, count = held
    return (f"{path}: decode ({where}, {cache} KV cache) is a class whose figure lay within "
            f"+-{DECODE_TOLERANCE:.0%} of llama-bench on {within} of {count} points measured after the model was "
            "frozen (make bench, docs/capacity-planning.md): this one may be further off")


# Routed experts read from RAM beside a card at HOST.expert_share, the pool stating no share of its own
# (experts_in_ram_us_by_threads): the least and most of make bench's errors (plan less llama-bench, over llama-bench) on
# every such point of every lease, 76 points of H200 and H100 hosts, 55 within +-15 %
# (decode_error.unfigured_experts_errors; tests/test_speed_model.py holds it).
UNFIGURED_EXPERTS_ERROR = (-0.24, 0.21)


def unfigured_experts_warning(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
                              discrete: bool, path: str) -> Optional[str]:
    """The summary's line for a server printed as one figure whose routed experts the CPU reads beside a card
    (experts_at_host_share): at a share measured on other hosts, which hosts since ran either side of."""
    if not experts_at_host_share(model, facts, pool, backend, discrete):
        return None
    low, high = UNFIGURED_EXPERTS_ERROR
    return (f"{path}: decode with experts read from RAM is planned at a share of the node's read bandwidth measured on "
            f"other hosts ({HOST.expert_share:g}), not this node's: on hosts planned so it lay {-low:.0%} below to "
            f"{high:.0%} above llama-bench (make bench); make host-profile EXPERTS=1 on this node states its own "
            f"(node_pools.{model.node_pool}.experts_in_ram_us_by_threads)")
