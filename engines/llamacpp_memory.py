"""llama.cpp's memory model: weights by quant, the KV cache as src/llama-kv-cache*.cpp sizes it,
per-slot recurrent state and host-RAM caches, and the split between VRAM and system RAM under
-ngl. Facts about llama.cpp's defaults that the estimate depends on are stated here, once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.quantity import GIB, MIB, parse_quantity
from planning.memory import BACKEND_OVERHEAD, DISCRETE_HOST_GIB, VRAM_CONTEXT_GIB, MemoryEstimate, VramEstimate

if TYPE_CHECKING:
    from config.gpus import GpuBackend
    from config.types import ModelFacts, ModelServer

# Bits per weight of common GGUF quantisations (llama.cpp's quantize table, averaged over tensors).
BITS_PER_WEIGHT: dict[str, float] = {
    "Q2_K": 2.96, "Q3_K_S": 3.50, "Q3_K_M": 3.91, "Q3_K_L": 4.27, "Q4_0": 4.55, "Q4_1": 5.0, "Q4_K_S": 4.58,
    "Q4_K_M": 4.85, "Q5_0": 5.54, "Q5_1": 6.0, "Q5_K_S": 5.54, "Q5_K_M": 5.69, "Q6_K": 6.56, "Q8_0": 8.5,
    "F16": 16.0, "BF16": 16.0, "F32": 32.0,
}
KV_BYTES_PER_ELEMENT = 2  # f16 K and V, llama.cpp's default cache type
# common/common.h (b10729): n_batch 2048. llama.cpp clamps the micro-batch to the batch
# (src/llama-context.cpp: n_ubatch = min(n_batch, n_ubatch)), so a larger ubatch needs --batch-size.
DEFAULT_BATCH = 2048


def effective_batch(model) -> int:
    """--batch-size as the server runs it: llama.cpp's 2048, raised to --ubatch-size above that (engines/llamacpp.py
    passes --batch-size then)."""
    return max(DEFAULT_BATCH, model.ubatch_size or 0)


# Bytes per element of each --cache-type (ggml block sizes: q8_0 is 34 bytes per 32 values, q4_0
# 18, q4_1 20, q5_0 22, q5_1 24, iq4_nl 18).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                 "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}
# On a discrete card other than CUDA (ROCm, Vulkan, SYCL: not measured), the compute buffer is a margin
# that grows with the micro-batch: 0.5 GiB per 512 tokens, beside VRAM_CONTEXT_GIB.
VRAM_COMPUTE_GIB_PER_512 = 0.5
# CUDA, measured (NVIDIA H200, b10729, 24 servers: bench/results-vram-h200.json): what the process holds
# beyond llama.cpp's own buffers is 588-597 MiB at load (CUDA context, cuBLAS) and 12-28 MiB more after the
# first full micro-batch; F16/BF16 weights (cuBLAS workspace) or a mixture of experts (mul_mat_id's pool)
# add 98-122 MiB more.
CUDA_CONTEXT_MIB = 620.0
CUDA_POOL_MIB = 100.0
# The CUDA compute buffer (its "CUDA0 compute buffer size"), fitted on the same 24: the f16 mask (micro-batch
# x cells x 2 bytes, live through the graph) plus the larger of two phases - the feed-forward, 12 bytes per
# token per column of the FFN (the routed experts' for a mixture of experts) and of the hidden state, and
# attention, where a quantized cache is copied to F16 for flash attention (ggml-cuda/fattn-common.cuh,
# get_f16_extra_data: the whole cache, K and V) beside 16 bytes per token per hidden column. Weights kept in
# system RAM are copied to the card for a large batch, one tensor at a time: a dense block's largest tensor
# (~0.4 of a block) or, with experts in RAM, up to 0.86 of a block's experts (Qwen3.6-35B-A3B; Qwen3-30B-A3B
# 0.49). An embedding server's buffer is its outputs, as on the CPU (compute_bytes).
CUDA_FFN_BYTES = 12
CUDA_ATTENTION_BYTES = 16
CUDA_DENSE_COPY_SHARE = 0.4
CUDA_EXPERT_COPY_SHARE = 0.86
CTX_PAD = 256  # llama.cpp pads the context to a multiple of this
AUTO_SLOTS = 4  # --parallel unset: 4 slots sharing one unified KV pool
DEFAULT_CACHE_RAM_MIB = 8192  # --cache-ram unset
DEFAULT_CTX_CHECKPOINTS = 32  # --ctx-checkpoints unset
DEFAULT_UBATCH = 512  # --ubatch-size unset (common/common.h n_ubatch)


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


def compute_bytes(model: "ModelServer", facts: "ModelFacts") -> Optional[float]:
    """llama.cpp's compute buffer on a CPU (sched_reserve: the worst-case graph of min(ctx, ubatch)
    tokens against a full cache; flash attention on, the CPU default). Fitted to llama-server's own
    "CPU compute buffer size" on real model shapes (tests/test_memory_oracle.py re-measures them):
    the f16 attention mask (tokens x context x 2 bytes); an embedding server's output for every token
    (tokens x vocabulary floats) and two hidden-state rows; a chat server's feed-forward intermediates,
    15.5 bytes per dense FFN column and 4 per hidden column, or for a mixture of experts 8 bytes per
    hidden column and 6 per expert column for each expert a token is routed to. None: the facts lack
    the widths (the caller keeps a margin)."""
    embd = facts.embedding_length
    if not embd:
        return None
    tokens = min(model.ubatch_size or DEFAULT_UBATCH, model.ctx_size)
    mask = tokens * math.ceil(model.ctx_size / CTX_PAD) * CTX_PAD * 2
    if model.role == "embedding":
        if not facts.vocab_size:
            return None
        return tokens * (facts.vocab_size * 4 + 2 * embd * 4) + mask
    if facts.experts_used and facts.expert_feed_forward_length:
        per_token = facts.experts_used * (8 * embd + 6 * facts.expert_feed_forward_length)
    elif facts.feed_forward_length:
        per_token = 15.5 * facts.feed_forward_length + 4 * embd
    else:
        return None
    return tokens * per_token + mask


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
    compute = compute_bytes(model, facts) if backend == "cpu" else None
    return MemoryEstimate(
        weights_gib=weights / GIB,
        kv_gib=kv_bytes(facts, model.ctx_size, model.cache_type_k, model.cache_type_v, n_slots,
                        model.ubatch_size or DEFAULT_UBATCH) / GIB,
        recurrent_gib=recurrent / GIB,
        # On a CPU the backend's memory is the compute buffer, sized from the model's widths where the
        # facts give them; elsewhere (and without them) the backend's margin or measured working set.
        overhead_gib=(compute if compute is not None else weights * BACKEND_OVERHEAD[backend]) / GIB,
        host_caches_gib=host / GIB,
    )


def cuda_compute_bytes(model: "ModelServer", facts: "ModelFacts", place: "Layout") -> Optional[float]:
    """llama.cpp's CUDA compute buffer (see CUDA_FFN_BYTES); None: the facts lack the widths."""
    embd = facts.embedding_length
    if not embd:
        return None
    if model.role == "embedding":
        return compute_bytes(model, facts)
    width = (facts.experts_used * facts.expert_feed_forward_length if facts.experts_used and facts.expert_feed_forward_length
             else facts.feed_forward_length)
    if not width:
        return None
    tokens = min(model.ubatch_size or DEFAULT_UBATCH, model.ctx_size)
    cells = math.ceil(model.ctx_size / CTX_PAD) * CTX_PAD
    quantized = sum(1 for t in (model.cache_type_k, model.cache_type_v) if t not in (None, "f16"))
    f16_copy = cells * facts.kv_heads * facts.head_dim * 2 * quantized
    attention = f16_copy + tokens * embd * CUDA_ATTENTION_BYTES
    ffn = tokens * CUDA_FFN_BYTES * (width + embd)
    copies = 0.0
    if place.gpu_blocks < place.layers:
        copies += CUDA_DENSE_COPY_SHARE * place.dense_per_block
    if place.experts_in_ram or place.gpu_blocks < place.layers:
        copies += CUDA_EXPERT_COPY_SHARE * place.experts_per_block
    return tokens * cells * 2 + max(attention, ffn) + copies


def vram_reserve_gib(model: "ModelServer", facts: "ModelFacts", place: "Layout", backend: str) -> float:
    """What the card holds beside the weights, KV and recurrent state: the runtime and the compute buffer.
    Measured on CUDA; elsewhere the margins (VRAM_CONTEXT_GIB, VRAM_COMPUTE_GIB_PER_512)."""
    compute = cuda_compute_bytes(model, facts, place) if backend == "cuda" else None
    if compute is None:
        ubatch = model.ubatch_size or DEFAULT_UBATCH
        return VRAM_CONTEXT_GIB + VRAM_COMPUTE_GIB_PER_512 * ubatch / 512
    pool = CUDA_POOL_MIB if (facts.experts_used or facts.expert_params_b or weight_is_16bit(model, facts)) else 0.0
    return (CUDA_CONTEXT_MIB + pool) / 1024 + compute / GIB


def weight_is_16bit(model: "ModelServer", facts: "ModelFacts") -> bool:
    if facts.bits_per_weight is not None:
        return facts.bits_per_weight >= 16
    return model.hf_repo is not None and quant_of(model.hf_repo) in ("F16", "BF16", "F32")


@dataclass(frozen=True)
class Layout:
    """Where llama.cpp puts a model's weights on a discrete GPU (src/llama-model.cpp, b10729): -ngl N
    offloads the output layer and the last N-1 transformer blocks (the input embedding always stays
    on the CPU); --n-cpu-moe M keeps the experts of blocks 0..M-1 in system RAM
    (common/arg.cpp: blk.<i>.ffn_(up|down|gate)_exps)."""

    layers: int
    gpu_blocks: int  # transformer blocks offloaded
    output_on_gpu: bool
    experts_in_ram: int  # offloaded blocks whose experts stay in system RAM
    embedding: float  # bytes of the input embedding, 0 when unknown
    output: float  # bytes of the output layer (a copy of the embedding where tied; 0 for an encoder)
    dense_per_block: float  # bytes of a block's attention and shared weights
    experts_per_block: float  # bytes of a block's routed experts
    active_expert_share: float  # the share of a block's experts read per token
    # Without expert_params_b, an MoE's reads are its active share of every part.
    read_share: float = 1.0

    @property
    def vram_weights(self) -> float:
        return (self.gpu_blocks * self.dense_per_block + (self.gpu_blocks - self.experts_in_ram) * self.experts_per_block
                + (self.output if self.output_on_gpu else 0.0))

    @property
    def ram_weights(self) -> float:
        """The weights in system RAM: the input embedding, the blocks (or experts) not offloaded, and the output
        layer unless offloaded."""
        ram_blocks = self.layers - self.gpu_blocks
        return (self.embedding + ram_blocks * self.dense_per_block + (ram_blocks + self.experts_in_ram) * self.experts_per_block
                + (0.0 if self.output_on_gpu else self.output))

    def read_per_token(self, discrete: bool = True) -> tuple[float, float]:
        """(bytes from VRAM, bytes from system RAM) read for one generated token; on unified memory or
        a CPU (``discrete`` false) all of it is the node's."""
        ram_blocks = self.layers - self.gpu_blocks
        experts = self.experts_per_block * self.active_expert_share
        vram = self.gpu_blocks * self.dense_per_block + (self.gpu_blocks - self.experts_in_ram) * experts
        ram = ram_blocks * self.dense_per_block + (ram_blocks + self.experts_in_ram) * experts
        if self.output_on_gpu:
            vram += self.output
        else:
            ram += self.output
        vram, ram = vram * self.read_share, ram * self.read_share
        return (vram, ram) if discrete else (0.0, vram + ram)


def layout(model: "ModelServer", facts: "ModelFacts") -> Layout:
    weights = weights_bytes(model, facts)
    bytes_per_param = weights / (facts.params_b * 1e9)
    embedding = (facts.vocab_size * facts.embedding_length * bytes_per_param
                 if facts.vocab_size and facts.embedding_length else 0.0)
    # The file holds the output layer only where it is separate; llama.cpp makes the tied one a copy.
    in_file = {"separate": 2, "tied": 1, "none": 1}[facts.output_layer]
    per_block = max(weights - in_file * embedding, 0.0) / facts.layers
    experts = facts.expert_params_b * 1e9 * bytes_per_param / facts.layers if facts.expert_params_b else 0.0
    experts = min(experts, per_block)
    if facts.expert_params_b and facts.active_params_b:
        dense_params = facts.params_b - facts.expert_params_b
        share = min(max((facts.active_params_b - dense_params) / facts.expert_params_b, 0.0), 1.0)
    else:
        share = 1.0
    ngl = model.gpu_layers
    gpu_blocks = min(max(ngl - 1, 0), facts.layers) if ngl <= facts.layers else facts.layers
    in_ram = min(model.cpu_moe_layers or 0, facts.layers)
    return Layout(
        layers=facts.layers,
        gpu_blocks=gpu_blocks,
        output_on_gpu=ngl >= 1,
        experts_in_ram=max(0, in_ram - (facts.layers - gpu_blocks)),
        embedding=embedding,
        output=0.0 if facts.output_layer == "none" else embedding,
        dense_per_block=per_block - experts,
        experts_per_block=experts,
        active_expert_share=share,
        read_share=facts.active_params_b / facts.params_b if facts.active_params_b and not facts.expert_params_b else 1.0,
    )


def discrete_split(model: "ModelServer", facts: "ModelFacts", backend: str) -> tuple[MemoryEstimate, VramEstimate]:
    """llama.cpp on discrete GPUs: the offloaded blocks' weights (less experts kept in RAM), their KV
    and recurrent state, and the output layer live in VRAM, split evenly over the replica's GPUs
    (--tensor-split, the output layer on the last); the rest, the host caches and the runtime live in
    system RAM. mmap'd weights that were copied to the GPU are unmapped after the load, so they are not
    counted twice. The KV cache follows its block (unless --no-kv-offload)."""
    whole = llamacpp_estimate(model, facts, "cpu")
    place = layout(model, facts)
    share = place.gpu_blocks / facts.layers
    cards = model.gpus
    vram_weights = place.vram_weights / GIB
    output = place.output / GIB if place.output_on_gpu else 0.0
    vram = VramEstimate(
        layers_offloaded=place.gpu_blocks,
        layers=facts.layers,
        weights_gib=(vram_weights - output) / cards + output,
        kv_gib=whole.kv_gib * share / cards,
        recurrent_gib=whole.recurrent_gib * share / cards,
        reserve_gib=vram_reserve_gib(model, facts, place, backend),
        gpus=cards,
        experts_in_ram=place.experts_in_ram,
    )
    ram_weights = place.ram_weights / GIB
    ram = MemoryEstimate(
        weights_gib=ram_weights,
        kv_gib=whole.kv_gib * (1 - share),
        recurrent_gib=whole.recurrent_gib * (1 - share),
        overhead_gib=DISCRETE_HOST_GIB + ram_weights * BACKEND_OVERHEAD["cpu"],
        host_caches_gib=whole.host_caches_gib,
    )
    return ram, vram
