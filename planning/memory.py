"""The memory model: what a model server holds, from its weights, context, slots and backend.
Facts about llama.cpp's defaults that the estimate depends on are stated here, once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.quantity import GIB, MIB, parse_quantity

if TYPE_CHECKING:
    from config.types import GpuBackend, ModelFacts, ModelServer

# Memory the backend holds on top of the weights, per GiB of weights, counted against the pod.
BACKEND_OVERHEAD: dict[str, float] = {
    # Vulkan allocates the iGPU's working set from system RAM and it is charged to the pod's
    # cgroup: the seed measured 7.54 GiB RSS for 5.2 GiB of weights (x1.45).
    "vulkan": 7.54 / 5.2 - 1,
    # HIP maps the weights into GTT, which amdgpu does not charge to the memcg; the node pays for
    # them all the same. Compute buffers on top: a 10% margin, not a measurement.
    "rocm": 0.10,
    # Weights are counted as node memory, as on every unified-memory node this program targets;
    # compute buffers on top: a 10% margin, not a measurement.
    "cuda": 0.10,
    # mmap'd weights are page cache charged to the pod; compute buffers on top: a 10% margin.
    "cpu": 0.10,
    # Intel's SYCL build on an iGPU: allocations come from system RAM like Vulkan's, but no
    # measurement exists here; a 10% margin, not a measurement.
    "sycl": 0.10,
}

# Bits per weight of common GGUF quantisations (llama.cpp's quantize table, averaged over tensors).
BITS_PER_WEIGHT: dict[str, float] = {
    "Q2_K": 2.96, "Q3_K_S": 3.50, "Q3_K_M": 3.91, "Q3_K_L": 4.27, "Q4_0": 4.55, "Q4_1": 5.0, "Q4_K_S": 4.58,
    "Q4_K_M": 4.85, "Q5_0": 5.54, "Q5_1": 6.0, "Q5_K_S": 5.54, "Q5_K_M": 5.69, "Q6_K": 6.56, "Q8_0": 8.5,
    "F16": 16.0, "BF16": 16.0, "F32": 32.0,
}
KV_BYTES_PER_ELEMENT = 2  # f16 K and V, llama.cpp's default cache type
# Bytes per element of each --cache-type (ggml block sizes: q8_0 is 34 bytes per 32 values, q4_0
# 18, q4_1 20, q5_0 22, q5_1 24, iq4_nl 18).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                 "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}
# A discrete GPU holds, besides the offloaded weights and KV, the runtime's context (~0.3-0.5 GiB)
# and the compute buffer, which grows with the micro-batch (llama.cpp logs it at start as
# "CUDA0 compute buffer size"): 0.5 GiB + 0.5 GiB per 512 tokens of micro-batch. A margin, not a
# measurement.
VRAM_CONTEXT_GIB = 0.5
VRAM_COMPUTE_GIB_PER_512 = 0.5
# What the process keeps in system RAM beside a discrete GPU: the runtime, pinned staging buffers
# and the token-embedding table, which llama.cpp always keeps on the CPU. A margin, not a measurement.
DISCRETE_HOST_GIB = 1.0
CTX_PAD = 256  # llama.cpp pads the context to a multiple of this
AUTO_SLOTS = 4  # --parallel unset: 4 slots sharing one unified KV pool
DEFAULT_CACHE_RAM_MIB = 8192  # --cache-ram unset
DEFAULT_CTX_CHECKPOINTS = 32  # --ctx-checkpoints unset
DEFAULT_UBATCH = 512  # --ubatch-size unset (common/common.h n_ubatch)


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gib: float
    kv_gib: float
    recurrent_gib: float
    overhead_gib: float
    host_caches_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.recurrent_gib + self.overhead_gib + self.host_caches_gib

    def breakdown(self) -> str:
        return (
            f"weights {self.weights_gib:.1f} + KV {self.kv_gib:.2f} + recurrent {self.recurrent_gib:.2f} "
            f"+ backend {self.overhead_gib:.1f} + host caches {self.host_caches_gib:.1f}"
        )


def quant_of(hf_repo: str) -> str:
    return hf_repo.rsplit(":", 1)[1].upper()


def model_bits(model: "ModelServer", facts: "ModelFacts") -> float:
    """Bits per weight: the facts' override, else the quant's table value; KeyError if unknown."""
    if facts.bits_per_weight is not None:
        return facts.bits_per_weight
    if model.hf_repo is None:
        raise KeyError("no quant")
    return BITS_PER_WEIGHT[quant_of(model.hf_repo)]


def weights_bytes(model: "ModelServer", facts: "ModelFacts") -> float:
    if model.weights is not None:
        return float(parse_quantity(model.weights))
    return facts.params_b * 1e9 * model_bits(model, facts) / 8


def kv_bytes(facts: "ModelFacts", ctx_size: int, type_k: str | None = None, type_v: str | None = None,
             n_slots: int = AUTO_SLOTS, ubatch: int = DEFAULT_UBATCH) -> float:
    """K and V for every full-attention layer, for the whole context (shared by all slots), and for
    sliding-window layers a window per slot plus one micro-batch of cells, never more than the
    context (src/llama-kv-cache-iswa.cpp at b10729; llama-server leaves --swa-full off)."""
    layers = facts.full_attention_layers or facts.layers
    tokens = math.ceil(ctx_size / CTX_PAD) * CTX_PAD
    per_element = KV_TYPE_BYTES[type_k or "f16"] + KV_TYPE_BYTES[type_v or "f16"]
    total = layers * facts.kv_heads * facts.head_dim * per_element * tokens
    if facts.sliding_window and facts.sliding_window_layers:
        cells = math.ceil(min(ctx_size, facts.sliding_window * n_slots + ubatch) / CTX_PAD) * CTX_PAD
        total += facts.sliding_window_layers * facts.kv_heads * facts.head_dim * per_element * cells
    return total


def slots(model: "ModelServer") -> int:
    return model.parallel or AUTO_SLOTS


def llamacpp_estimate(model: "ModelServer", facts: "ModelFacts", backend: "GpuBackend") -> MemoryEstimate:
    weights = weights_bytes(model, facts)
    n_slots = slots(model)
    # llama.cpp's -c is the total context: with N slots each gets ctx/N, so KV does not scale with
    # slots. The recurrent state of a hybrid model is per slot, and so are its checkpoints.
    recurrent = facts.recurrent_state_mib * MIB * n_slots
    checkpoints = model.ctx_checkpoints if model.ctx_checkpoints is not None else DEFAULT_CTX_CHECKPOINTS
    cache_ram = model.cache_ram_mib if model.cache_ram_mib is not None else DEFAULT_CACHE_RAM_MIB
    host = cache_ram * MIB + checkpoints * n_slots * facts.recurrent_state_mib * MIB
    return MemoryEstimate(
        weights_gib=weights / GIB,
        kv_gib=kv_bytes(facts, model.ctx_size, model.cache_type_k, model.cache_type_v, n_slots,
                        model.ubatch_size or DEFAULT_UBATCH) / GIB,
        recurrent_gib=recurrent / GIB,
        overhead_gib=weights * BACKEND_OVERHEAD[backend] / GIB,
        host_caches_gib=host / GIB,
    )


def resident_estimate(resident_memory: str, backend: "GpuBackend") -> MemoryEstimate:
    """An engine that reports what it locks (weights and KV pool, measured) plus the backend's margin."""
    resident = float(parse_quantity(resident_memory))
    return MemoryEstimate(
        weights_gib=resident / GIB,
        kv_gib=0.0,
        recurrent_gib=0.0,
        overhead_gib=resident * BACKEND_OVERHEAD[backend] / GIB,
        host_caches_gib=0.0,
    )


@dataclass(frozen=True)
class VramEstimate:
    """What one replica holds on one discrete GPU."""

    layers_offloaded: int
    layers: int
    weights_gib: float
    kv_gib: float
    recurrent_gib: float
    reserve_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.recurrent_gib + self.reserve_gib

    def breakdown(self) -> str:
        return (f"{self.layers_offloaded}/{self.layers} layers: weights {self.weights_gib:.1f} + KV {self.kv_gib:.2f} "
                f"+ recurrent {self.recurrent_gib:.2f} + context and compute {self.reserve_gib:.1f}")

    def layers_that_fit(self, vram_gib: float) -> int:
        """How many layers fit in this much VRAM, everything else unchanged."""
        per_layer = (self.weights_gib + self.kv_gib + self.recurrent_gib) / max(self.layers_offloaded, 1)
        return max(0, min(self.layers, int((vram_gib - self.reserve_gib) / per_layer))) if per_layer > 0 else self.layers


def vram_reserve_gib(model: "ModelServer") -> float:
    ubatch = model.ubatch_size or DEFAULT_UBATCH
    return VRAM_CONTEXT_GIB + VRAM_COMPUTE_GIB_PER_512 * ubatch / 512


def discrete_split(model: "ModelServer", facts: "ModelFacts") -> tuple[MemoryEstimate, VramEstimate]:
    """llama.cpp on a discrete GPU: the offloaded layers' weights, KV and recurrent state live in
    VRAM (-ngl N offloads N of the repeating layers; the KV cache follows its layer unless
    --no-kv-offload); the rest, the host caches and the runtime live in system RAM. mmap'd weights
    that were copied to the GPU are unmapped after the load, so they are not counted twice."""
    whole = llamacpp_estimate(model, facts, "cpu")
    offloaded = min(model.gpu_layers, facts.layers)
    share = offloaded / facts.layers
    vram = VramEstimate(
        layers_offloaded=offloaded,
        layers=facts.layers,
        weights_gib=whole.weights_gib * share,
        kv_gib=whole.kv_gib * share,
        recurrent_gib=whole.recurrent_gib * share,
        reserve_gib=vram_reserve_gib(model),
    )
    ram = MemoryEstimate(
        weights_gib=whole.weights_gib * (1 - share),
        kv_gib=whole.kv_gib * (1 - share),
        recurrent_gib=whole.recurrent_gib * (1 - share),
        overhead_gib=DISCRETE_HOST_GIB + whole.weights_gib * (1 - share) * BACKEND_OVERHEAD["cpu"],
        host_caches_gib=whole.host_caches_gib,
    )
    return ram, vram


def discrete_resident(resident_memory: str, model: "ModelServer") -> tuple[MemoryEstimate, VramEstimate]:
    """Another engine on a discrete GPU: what it is measured to lock is on the GPU."""
    resident = float(parse_quantity(resident_memory)) / GIB
    ram = MemoryEstimate(weights_gib=0.0, kv_gib=0.0, recurrent_gib=0.0, overhead_gib=DISCRETE_HOST_GIB, host_caches_gib=0.0)
    vram = VramEstimate(layers_offloaded=1, layers=1, weights_gib=resident, kv_gib=0.0, recurrent_gib=0.0,
                        reserve_gib=VRAM_CONTEXT_GIB)
    return ram, vram
