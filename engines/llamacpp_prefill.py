"""llama.cpp's prompt processing (prefill) speed: a prompt's matrix products at a backend class's effective rate,
its attention, the weights kept in system RAM copied to the card, and a cache not in F16 converted or read row by
row (the rates measured: bench/results-speed-h200.json, results-prefill-cpu.json; lab/bench/prefill_error.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .llamacpp_memory import DEFAULT_UBATCH, KV_TYPE_BYTES, effective_batch, layout
from .llamacpp_speed import profile_name, share_of, weight_class

if TYPE_CHECKING:
    from config.types import ModelFacts, ModelServer, NodePool


@dataclass(frozen=True)
class PrefillProfile:
    """How a backend class turns a prompt into a KV cache: matrix products at an effective rate (FLOPs of
    2 x parameters read per token), a mixture of experts at a share of it, attention at its own rate."""

    tflops: dict[str, float]  # weight class -> effective TFLOPS of the matrix products
    moe_share: float  # a mixture of experts' share of that (many small products)
    attention_tflops: float  # 4 x layers x width x depth FLOPs per token
    source: str
    recurrent_layer_us: float = 0.0  # per token per linear-attention (Gated DeltaNet) layer
    call_ms: float = 0.0  # per call of up to a batch (--batch-size) of prompt tokens, dense
    moe_call_ms: float = 0.0  # the same for a mixture of experts
    full_width: int = 0  # a dense model narrower than this (embedding_length) reaches (width / full_width) ** width_power
    width_power: float = 0.0  # of the products' rate (small matrices leave the card partly idle)


PREFILL: dict[str, PrefillProfile] = {
    # Measured (bench/results-speed-h200.json, llama-bench pp, b10729 CUDA on an H200): solved on the pp4096
    # rows with the per-call time below, dense K-quant 155 TFLOPS effective, Q8_0 185, F16 373; Qwen3-30B-A3B
    # and Qwen3.6-35B-A3B with token-dependent routing at 0.295 of dense; qwen3-8b pp512 at depth 4096/16384 for
    # attention.
    # Qwen3.6-35B-A3B's 30 Gated DeltaNet layers cost 1.5 us per token each (solved on its pp4096: in-sample).
    # A short prompt is slower than the long prompts' rate says (the card is not full): 6 ms more per call of up
    # to a batch for a dense model, 27 for a mixture of experts, fitted on the pp512 rows (4-20 ms over). A fit,
    # not a measured per-call cost: pp1024 against pp2048 (one call each) differ by under 2 ms of fixed time, and
    # a 256-token prompt is still 15-23 % slower than predicted.
    "nvidia-datacenter": PrefillProfile(tflops={"kquant": 155.0, "q8": 185.0, "f16": 373.0}, moe_share=0.295,
                                        attention_tflops=250.0, source="H200 llama-bench pp (bench/results-speed-h200.json)",
                                        recurrent_layer_us=1.5, call_ms=6.0, moe_call_ms=27.0,
                                        # Qwen3-1.7B (2048 wide) reached 0.61 of the 8B's rate, Llama-3.2-3B (3072)
                                        # 0.79: a fit on those two (their rows are `cal`), none measured narrower.
                                        full_width=4096, width_power=0.75),
}
# A CPU: GFLOPS per thread of the matrix products, measured on the CI machine (llama-bench pp256, 2 threads,
# Llama-3.1-8B Q4_K_M 14.28 t/s, 2026-12-05: bench/results-prefill-cpu.json). The same row read 7.6 t/s once (the
# figure was 57 then; the machine's load was not recorded, and a quiet re-run did not reproduce it).
CPU_PREFILL_GFLOPS_PER_THREAD = 107.0
# Its attention, per thread: 57 (the depth's cost on the same machine: Qwen3-1.7B 66, Llama-3.2-3B 57).
CPU_ATTENTION_GFLOPS_PER_THREAD = 57.0
# A prompt's attention on a CPU with a quantized K/V cache: ggml-cpu's tiled flash attention takes F16/F32 caches
# only (ops.cpp use_tiled), so a quantized one goes row by row as decode does; its rate as a share of
# CPU_ATTENTION_GFLOPS_PER_THREAD,
# solved on the CI machine from what 2048 positions of depth add to a 512-token prompt (Qwen3-1.7B, 2 threads: f16
# 1.7 us a token a position, q8_0 13.4, q4_0 22.6; bench/results-prefill-cpu.json).
CPU_QUANTIZED_PREFILL = {"q8_0": 0.15, "q4_0": 0.089}
# Weights kept in system RAM are copied to the card for every micro-batch of a prompt (llama.cpp offloads a
# large batch's products): measured 6.6-9.1 GB/s on the H200 machine (mmap'd, pageable memory), for
# Llama-3.1-8B / Qwen3-14B with 13 / 17 blocks in RAM and Qwen3 MoE with 20-24 blocks of experts in RAM.
HOST_TO_CARD_GBS = 7.0
PROMPT_TOKENS = 4096  # the prompt a prefill figure is given for (a RAG or coding prompt), or the context if smaller


def prefill(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
            discrete: bool) -> Optional[tuple[float, float]]:
    """(prompt tokens/s at PROMPT_TOKENS or the context, seconds to the first token of a prompt that fills the
    context); None where the backend class has no measured prefill (only the H200's CUDA and a CPU are)."""
    seconds = prompt_seconds(model, facts, pool, backend, discrete)
    if seconds is None:
        return None
    prompt = min(PROMPT_TOKENS, model.ctx_size)
    return prompt / seconds(prompt, 0), seconds(model.ctx_size, 0)


def prompt_seconds(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str], discrete: bool,
                   weight_rate: float = 1.0):
    """seconds(tokens, depth): the time to process a prompt of `tokens` after `depth` already in the cache;
    None where not predicted. weight_rate scales the speed of the matrix products with the weights alone (a CPU
    helper of a split, which does not repack them: CPU_HELPER_PREFILL), not the attention's."""
    if model.role == "embedding":
        return None
    cpu_only = backend == "cpu"
    profile = None if cpu_only else PREFILL.get(profile_name(pool, backend))
    if profile is None and not cpu_only:
        return None
    place = layout(model, facts)
    kind = weight_class(model, facts)
    active = (facts.active_params_b or facts.params_b) * 1e9
    if facts.vocab_size and facts.embedding_length:
        active -= facts.vocab_size * facts.embedding_length  # the input embedding is a lookup, not a product
    moe = bool(facts.expert_params_b or facts.active_params_b)
    width = facts.embedding_length or (facts.kv_heads * facts.head_dim)
    attention_layers = facts.full_attention_layers or facts.layers
    batch, ubatch = effective_batch(model), model.ubatch_size or DEFAULT_UBATCH
    call = 0.0
    # A CPU server's attention with a cache the tiled kernel does not take (F16, F32) goes row by row; a type not
    # measured (bf16, q5_x, iq4_nl) at the slowest measured share. Beside a card the prompt's attention is the
    # card's: partially offloaded servers' long prompts are as fast as the card's rate says (pp512 to pp4096 on the
    # H200), not the CPU's.
    if cpu_only:
        slowest = min((CPU_QUANTIZED_PREFILL.get(t, min(CPU_QUANTIZED_PREFILL.values())) for t in
                       (model.cache_type_k or "f16", model.cache_type_v or "f16") if t not in ("f16", "f32")), default=1.0)
        rate = model.threads * CPU_PREFILL_GFLOPS_PER_THREAD * 1e9
        matmul, copy = 2 * active / (rate * weight_rate), 0.0
        attention_rate = model.threads * CPU_ATTENTION_GFLOPS_PER_THREAD * 1e9 * slowest
    else:
        call = (profile.moe_call_ms if moe else profile.call_ms) / 1e3
        # A dense model's; the mixture-of-experts share was measured on 2048-wide models and holds their width.
        narrow = min(1.0, width / profile.full_width) ** profile.width_power if profile.full_width and not moe else 1.0
        matmul = 2 * active / (share_of(profile.tflops, kind) * 1e12 * (profile.moe_share if moe else 1.0) * narrow
                               * weight_rate)
        attention_rate = profile.attention_tflops * 1e12
        # What stays in RAM but the input embedding (a lookup), copied once per micro-batch.
        copy = (place.ram_weights - place.embedding) / ubatch / (HOST_TO_CARD_GBS * 1e9) if discrete else 0.0
        if facts.full_attention_layers and facts.recurrent_state_mib:
            matmul += (facts.layers - facts.full_attention_layers) * profile.recurrent_layer_us / 1e6
    # A cache not in F16 on a card: a prompt's flash-attention kernel reads F16, so each micro-batch first copies
    # the whole cache of every offloaded attention layer to F16 (ggml-cuda fattn-common.cuh launch_fattn,
    # need_f16_K/V; decode's vector kernel reads it as stored): read at its type, written at 2 bytes, at the card's
    # bandwidth. Seconds per cached position per micro-batch.
    convert = 0.0
    if discrete and not cpu_only and pool.vram_bandwidth_gbs:
        moved = sum(KV_TYPE_BYTES[t] + 2 for t in (model.cache_type_k or "f16", model.cache_type_v or "f16") if t != "f16")
        convert = (attention_layers * place.gpu_blocks / facts.layers * facts.kv_heads * facts.head_dim * moved
                   / (pool.vram_bandwidth_gbs * 1e9))

    attention = 4 * attention_layers * width / attention_rate

    def seconds(tokens: int, depth: int) -> float:
        # Each token attends to what was there before and half of the prompt before it, on average; micro-batch i
        # of n converts the depth and i of them.
        n = -(-tokens // ubatch)
        return (-(-tokens // batch) * call + convert * (n * depth + ubatch * n * (n - 1) / 2 + tokens)
                + tokens * (matmul + copy + attention * (depth + tokens / 2)))

    return seconds
