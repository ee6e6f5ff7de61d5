"""llama.cpp's decode speed, predicted: the plan's `decode ~` figure beside the `decode <=` bound.

The bound reads every weight once per token at the memory's full bandwidth. What llama.cpp really
reaches is less, and it depends on the backend: a fixed cost per block per token (kernel launches,
synchronisation; larger for a mixture-of-experts block, which routes), an effective share of the
bandwidth that depends on the weight type (F16 streams near the bandwidth, K-quants need more work
per byte), and the KV cache, read once per token for every token already in the context, at a
lower share still. So a prediction per context depth: empty, half and full. What stays in system RAM
(a CPU server, blocks or experts kept there beside a discrete card) is read by the server's threads at
the node's read bandwidth for that many threads (HOST, host_read_gbs), and costs per block and for the
KV cache that differ from host to host (HostCost, measured by `make host-profile`); where the node's
figures are not measured the prediction is a range.

Each profile's numbers come from measurements, cited beside them; the error of the predictions
against every recorded measurement is in docs/capacity-planning.md ("Decode speed: predicted and measured") and is
recomputed by `make bench` (lab/bench/decode_error.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from config.gpus import drives_elsewhere

from .llamacpp_host import (EXPERT_SHARE_BOUNDS, HOST, HOST_KV_GROUP, KV_PROFILE_DEPTH, HostCost, figure_shares,
                            host_cost, host_read_gbs, node_expert_share)
from .llamacpp_memory import KV_TYPE_BYTES, layout, quant_of

if TYPE_CHECKING:
    from config.types import ModelFacts, ModelServer, NodePool


@dataclass(frozen=True)
class DecodeProfile:
    """How one backend class turns bandwidth into tokens."""

    block_us: float  # fixed cost per transformer block per token
    moe_block_us: float  # extra for a mixture-of-experts block
    share: dict[str, float]  # weight class -> share of the bandwidth reached reading it
    kv_share: float  # share of the bandwidth reached reading the KV cache
    source: str
    recurrent_block_us: float = 0.0  # extra for a linear-attention (Gated DeltaNet) block of a hybrid model
    # A quantized KV cache read by flash attention, per cache type: (us per attention block per token, ps per
    # position already in the context per query head x head_dim x attention block), beside its bytes at kv_share.
    # Empty where not measured: the prediction is then a range (QuantizedKV).
    quantized_kv: dict[str, tuple[float, float]] = field(default_factory=dict)
    # A weight class measured on two cards of one chip at different bandwidths, in place of its share: class ->
    # ((GB/s of bandwidth, GB/s reached), (the same on the other card)); card_read_gbs puts another card on the line.
    read_line: dict[str, tuple[tuple[float, float], tuple[float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One figure per weight class (a share or a line, not both); F16's share caps every line, K-quants need one.
        if "f16" not in self.share or "kquant" not in {*self.share, *self.read_line} or set(self.share) & set(self.read_line):
            raise ValueError(f"DecodeProfile ({self.source}): one share or read_line per weight class, f16 and kquant given")


# A quantized KV cache on CUDA with flash attention decodes slower than f16 on an H200, and slower the deeper the
# context (issue #44's table: bench/results-kvcache-h200.json, llama-bench b10729, Qwen3-8B/14B/30B-A3B at 0-32k):
# the time a token takes grows by a fixed cost per attention block and by a cost per position that scales with the
# query heads (Qwen3-30B-A3B, 4 KV heads, costs what Qwen3-8B, 8 KV heads, does per query head), not with the
# cache's bytes: the kernel dequantizes for each query head. Solved by least squares on those 28 points (in-sample:
# within 2.2 %), frozen before the out-of-sample grid (bench/results-kvcache-h200-2.json).
H200_QUANTIZED_KV = {"q8_0": (12.0, 0.75), "q4_0": (12.5, 0.92)}
# On a CPU a quantized cache is not cheaper for its fewer bytes: its attention took this many times what an f16
# cache of the same shape takes per position on the project's CI machine (2-core EPYC, 2 threads; llama-bench
# b10729, Qwen3-1.7B Q4_K_M at depths 0 and 4096: bench/results-decode-cpu.json, the KV cache run; Llama-3.2-3B of
# that run, not used, lies within 7 %). On the GPU lease's 16-thread host the partial-offload rows with a quantized
# cache (bench/results-kvcache-h200-2.json) paid about f16's time. So a CPU's part of a quantized cache is a range:
# this ratio at the slow end, the probe's f16 time (16 query heads) at the fast end (QUANTIZED_KV_CPU says so in the
# plan). Stated at 4096; make
# host-profile's form at 8192 gave 1.82 and 2.3 on the same machine (2026-12-06): the slow end stays the larger.
CPU_QUANTIZED_KV = {"q8_0": 2.37, "q4_0": 2.60}
# A served model of more query heads than make host-profile's probe (Qwen3-1.7B, PROBE_QUERY_HEADS) pays 1.2 times
# the probe's time per KV byte for the CPU's part of its cache, f16 or quantized, whatever its heads over the threads
# (cpu_kv_work's group term draws too little of it): fitted to leases 13-19's 150 quantized points at depth beside
# layers in RAM and on the CPU alone (24, 32 and 40 heads on 16 threads; median error near 0 for each head count) and
# frozen for quantized caches in 3762243; leases 20 and 21 measured each such point beside an f16 twin, out of sample:
# the served models' q8_0 depth cost over the twin's was about the probe's ratio (1.08-1.30 against 1.23-1.26), not
# 1.2 times it, and the 32-head twins beside layers in RAM were planned 10-24 % fast at 16384, so the factor is the
# attention's, every cache type's (lease 21's q4_0 twins, 1.13 and 1.21 against a probe's 0.95, do not tell). Charging the
# kernel's last partly idle round of heads instead (3c91f6f) did not show: it hands heads out one at a time to
# whichever thread is free (ggml_threadpool_chunk_add). An empirical factor, not a mechanism.
CPU_KV_SHAPES = 1.2
PROBE_QUERY_HEADS = 16  # lab/bench/host_profile.py's SHAPE (tests/test_speed_model.py holds the two together)

PROFILES: dict[str, DecodeProfile] = {
    # Published llama-bench runs (tg512, CUDA, build 2824, XiongjieDai/GPU-Benchmarks-on-LLM-Inference
    # aa72e0ec, LLaMA 3/Gaming GPUs/{4090,3090}_v3.ipynb): Llama-3-8B F16 54.84 / 47.40 t/s and Q4_K_M
    # 130.58 / 115.42 t/s on an RTX 4090 (1008 GB/s) / 3090 (936 GB/s); solved for ~40 us per block and
    # shares F16 0.90, K-quants 0.73 (Q8_0 between); tg512 -> tg8192 on the 4090 (130.58 -> 110.66) for
    # the KV read. A mixture-of-experts block's extra cost on CUDA is not measured: taken as a block's.
    "nvidia": DecodeProfile(block_us=40.0, moe_block_us=40.0, share={"f16": 0.90, "q8": 0.80, "kquant": 0.73},
                            kv_share=0.40, source="RTX 4090/3090 llama-bench, XiongjieDai aa72e0ec"),
    # Measured on the GH100 chip at two bandwidths, an NVIDIA H200 (4.8 TB/s) and an H100 SXM (3.35 TB/s): CUDA builds
    # of b10729, lab/bench/measure_decode.py on real shapes from 1.7B to 70B, dense, MoE and hybrid, at depths 0-64k
    # (bench/results-decode-h200.json, results-speed-h200.json, results-kvcache-h200*.json, results-speed-h100.json).
    # Solved together by least squares (python -m lab.bench.decode_fit, which tests/test_datacenter_profile.py holds these
    # to): ~45 us per block, 7.5 more for a mixture-of-experts block, 63 more for a Gated DeltaNet block; F16 at 92 %
    # of the bandwidth, Q8_0 at 65 %; K-quants barely follow the bandwidth (1.91 TB/s on the H200, 1.84 on the H100:
    # the chip's compute, not its memory, sets most of their time). Measured on the H200 first (then K-quants at 38 %
    # of its bandwidth, 35 us a block); the H100's rows showed the plan 10-16 % low there (issue #44).
    "nvidia-datacenter": DecodeProfile(block_us=45.0, moe_block_us=7.5, share={"f16": 0.92, "q8": 0.65},
                                       read_line={"kquant": ((4800.0, 1910.0), (3350.0, 1835.0))},
                                       kv_share=0.50, source="H200 and H100 llama-bench (lab/bench/decode_fit.py)",
                                       recurrent_block_us=63.0, quantized_kv=H200_QUANTIZED_KV),
    # Intel Iris Xe, Vulkan (seed 000, llama-bench on the homelab node, against its 53.9 GB/s measured
    # for dense decoding): dense 8B Q4_K_M 10.78 t/s and dense 27B (16.5 GB/token) 3.3 t/s read at the
    # full 53.9 GB/s; the MoE block's extra cost (1.3 ms: routing on 96 EUs) is calibrated on the
    # seed's Qwen3.6-35B-A3B run (11.59 t/s), so that point is in-sample.
    "intel-igpu": DecodeProfile(block_us=0.0, moe_block_us=1300.0, share={"f16": 1.0, "q8": 1.0, "kquant": 1.0},
                                kv_share=1.0, source="seed 000 llama-bench on an Iris Xe (Vulkan)"),
    # AMD Strix Halo (Radeon 8060S), ROCm 7.2.3 / Vulkan RADV (kyuz0/amd-strix-halo-toolboxes d1a34bee,
    # benchmark/results): llama-2-7b Q4_0 (3.82 GB) 50.59 / 55.73 t/s on 256 GB/s; Qwen3-30B-A3B
    # UD-Q4_K_XL 77.96 t/s (Vulkan, lhl/strix-halo-testing 5ee14b5b) gives the MoE block's cost.
    "amd-apu": DecodeProfile(block_us=0.0, moe_block_us=75.0, share={"f16": 0.80, "q8": 0.80, "kquant": 0.80},
                             kv_share=0.80, source="Strix Halo llama-bench, kyuz0 d1a34bee, lhl 5ee14b5b"),
    # Discrete cards from llama.cpp's own scoreboards, one published point each (Llama-2-7B Q4_0, 3.825 GB,
    # tg128): so one share and no fixed cost, a fit to that point; the MoE block and KV costs are not
    # measured (taken as NVIDIA's GeForce profile). RX 7900 XTX (960 GB/s), ROCm, build 2f0c2db:
    # 167.11 t/s (discussion #15021, as transcribed in two independent copies; issue #20934, March 2026,
    # reports 129-144 with -fa 1 -b 128): 67% of the bandwidth. A second, newer point of the same card on ROCm
    # (llama.cpp PR #26284, RDNA3 MMQ tuning): Llama-3-8B Q4_K_M (4.92 GB) tg64 105.75 t/s and 98.67 at depth 4096:
    # K-quants at 51% of the bandwidth (of the 4.6 GB read per token), the f16 KV cache at 82%; Q4_0 stays at 67%
    # (weight class "legacy").
    "amd-discrete-rocm": DecodeProfile(block_us=0.0, moe_block_us=40.0, share={"f16": 0.67, "q8": 0.67, "kquant": 0.51, "legacy": 0.67},
                                       kv_share=0.82, source="RX 7900 XTX ROCm llama-bench (llama.cpp #15021, PR #26284)"),
    # RX 7900 XTX, Vulkan RADV: 182.63 t/s (discussion #10879, transcribed; issue #20934: 167-177): 73%.
    "amd-discrete-vulkan": DecodeProfile(block_us=0.0, moe_block_us=40.0, share={"f16": 0.73, "q8": 0.73, "kquant": 0.73},
                                         kv_share=0.40, source="RX 7900 XTX Vulkan llama-bench 182.63 t/s (llama.cpp #10879)"),
    # Intel Arc B580 (456 GB/s), SYCL: 65.13 t/s (PR #13885, 2025-05; Vulkan 70.14 in #10879): 55%.
    "intel-arc-b": DecodeProfile(block_us=0.0, moe_block_us=40.0, share={"f16": 0.55, "q8": 0.55, "kquant": 0.55},
                                 kv_share=0.40, source="Arc B580 SYCL llama-bench 65.13 t/s (llama.cpp PR #13885)"),
    # Intel Arc A770 (560 GB/s), Vulkan, Mesa 24.0.9: 54.51 t/s (PR #10721, 2024-12): 37%. Its figures range
    # from 20% to 38% by driver and backend (SYCL with and without the Q4_0 reorder): the least certain here.
    "intel-arc-a": DecodeProfile(block_us=0.0, moe_block_us=40.0, share={"f16": 0.37, "q8": 0.37, "kquant": 0.37},
                                 kv_share=0.40, source="Arc A770 Vulkan llama-bench 54.51 t/s (llama.cpp PR #10721)"),
}


# One card's published llama-bench decode on two of llama.cpp's backends (Llama-2-7B Q4_0, tg128; the sources
# of the profiles above): which image to run on a Radeon or an Arc card, in the words the stack writer uses.
BACKEND_FIGURES: dict[str, tuple[str, tuple[tuple[str, float, str], ...]]] = {
    "amd-discrete-rocm": ("an RX 7900 XTX", (("rocm", 167.11, "llama.cpp discussion #15021"),
                                             ("vulkan", 182.63, "llama.cpp discussion #10879"))),
    "intel-arc-b": ("an Arc B580", (("sycl", 65.13, "llama.cpp PR #13885"), ("vulkan", 70.14, "llama.cpp discussion #10879"))),
}


BACKEND_NAMES = {"rocm": "ROCm", "sycl": "SYCL", "vulkan": "Vulkan", "cuda": "CUDA", "cpu": "CPU"}

# How much slower a q8_0 KV cache decodes than an f16 one, in percent, least and most over the measured points
# (bench/results-kvcache-h200.json: issue #44's llama-bench b10729 runs on an H200, flash attention on, three
# models at depths 0-32k; the deeper, the slower). The decode figures above do not count it yet (issue #44):
# the stack writer takes f16 wherever it fits and says this where it cannot.
Q8_0_KV_SLOWER_PCT_H200 = (7, 52)


def quantized_kv_cost() -> str:
    low, high = Q8_0_KV_SLOWER_PCT_H200
    return f"on an H200 a q8_0 cache decodes {low}-{high} % slower than f16 at 0-32k"


def backend_advice(profile: str) -> Optional[str]:
    """What llama.cpp's published runs say of the backends for this class of card, or None where none compare."""
    if profile not in BACKEND_FIGURES:
        return None
    card, figures = BACKEND_FIGURES[profile]
    ranked = sorted(figures, key=lambda f: -f[1])
    (best, top, _), (_, low, _) = ranked[0], ranked[-1]
    said = ", ".join(f"{BACKEND_NAMES[name]} {tok_s:.1f} t/s ({source})" for name, tok_s, source in ranked)
    return (f"published llama-bench decode on {card} (Llama-2-7B Q4_0, tg128): {said}; "
            f"{BACKEND_NAMES[best]} about {(top / low - 1) * 100:.0f}% faster on that "
            "model; other models, quants and prompt processing may rank them otherwise")


def profile_name(pool: "NodePool", backend: Optional[str]) -> str:
    """The pool's named profile, else its default by backend and card (DEFAULT_PROFILE); "" where none."""
    return pool.decode_profile or DEFAULT_PROFILE.get((backend or "", pool.vram is not None), "")


# The profile a pool gets when it names none (node_pools.<pool>.decode_profile): by backend and by
# whether the card is discrete (vram set), never another class's. Vulkan and SYCL run on very different
# GPUs (an Iris Xe, a Radeon APU, a discrete Radeon or Arc): no default, so no number.
DEFAULT_PROFILE = {("cuda", True): "nvidia", ("rocm", False): "amd-apu",
                   ("rocm", True): "amd-discrete-rocm"}


def weight_class(model: "ModelServer", facts: "ModelFacts") -> str:
    """f16, q8, legacy (Q4_0, Q4_1, Q5_0, Q5_1: simpler blocks, read faster where measured) or kquant."""
    if facts.bits_per_weight is not None and facts.bits_per_weight >= 16:
        return "f16"
    quant = quant_of(model.hf_repo or ":Q4_K_M")
    if quant in ("F16", "BF16", "F32"):
        return "f16"
    return "q8" if quant == "Q8_0" else "legacy" if quant in ("Q4_0", "Q4_1", "Q5_0", "Q5_1") else "kquant"


def share_of(shares: dict[str, float], kind: str) -> float:
    """A class's share; a profile that has no figure for legacy quants reads them as K-quants."""
    return shares[kind] if kind in shares else shares["kquant"]


def card_read_gbs(profile: DecodeProfile, kind: str, bandwidth: float) -> tuple[float, float]:
    """(slow, fast) GB/s a card of this profile reads a weight class at: its share of the bandwidth, or where the class
    was measured on two cards of one chip (read_line), the time per byte on the line through them against
    1/bandwidth, never faster than the profile's F16 share of the bandwidth (what streaming reaches). At a bandwidth
    outside the two the line is not backed (another chip's compute, another card's memory): a range from it to the
    nearer card's share of the bandwidth (CARD_READ_UNMEASURED). Legacy quants follow K-quants where the profile has
    no figure of their own."""
    line = read_line_of(profile, kind)
    if line is None:
        rate = bandwidth * share_of(profile.share, kind)
        return rate, rate
    (b0, r0), (b1, r1) = line
    per_byte = 1 / r0 + (1 / r1 - 1 / r0) / (1 / b1 - 1 / b0) * (1 / bandwidth - 1 / b0)
    on_line = min(1 / per_byte, bandwidth * profile.share["f16"])
    if b0 <= bandwidth <= b1:
        return on_line, on_line
    nearer_bandwidth, nearer_rate = (b0, r0) if bandwidth < b0 else (b1, r1)
    at_nearer_share = bandwidth * nearer_rate / nearer_bandwidth
    return min(on_line, at_nearer_share), max(on_line, at_nearer_share)


def read_line_of(profile: DecodeProfile, kind: str) -> Optional[tuple[tuple[float, float], tuple[float, float]]]:
    """The profile's read_line for a weight class, its two cards in order of bandwidth; legacy quants take K-quants'
    where the profile has no share of their own. None: the class is read at its share."""
    line = profile.read_line.get("kquant" if kind == "legacy" and "legacy" not in profile.share else kind)
    return tuple(sorted(line)) if line else None


def routes_experts(facts: "ModelFacts") -> bool:
    """A mixture-of-experts model: its blocks cost DecodeProfile.moe_block_us more."""
    return bool(facts.expert_params_b or facts.active_params_b)


def recurrent_blocks(facts: "ModelFacts") -> int:
    """A hybrid's linear-attention (Gated DeltaNet) blocks, DecodeProfile.recurrent_block_us more each."""
    return facts.layers - facts.full_attention_layers if facts.full_attention_layers and facts.recurrent_state_mib else 0


def kv_bytes_per_position(model: "ModelServer", facts: "ModelFacts") -> float:
    """KV bytes read per generated token for each token already in the context."""
    layers = facts.full_attention_layers or facts.layers
    per_element = KV_TYPE_BYTES[model.cache_type_k or "f16"] + KV_TYPE_BYTES[model.cache_type_v or "f16"]
    return layers * facts.kv_heads * facts.head_dim * per_element


@dataclass(frozen=True)
class DecodeTerms:
    """One server's decode, term by term: seconds per token = fixed + the CPU's blocks x block_us + what the
    card reads at its share + what the CPU reads at the node's read bandwidth + the KV cache on each side."""

    fixed: float  # seconds: the card's blocks, blocks whose experts are in RAM
    host_blocks: int  # blocks the CPU runs (HostCost.block_us each)
    gpu_read: float  # bytes per token the card (or unified memory) reads, at gpu_rate
    gpu_rate: tuple[float, float]  # bytes/s at the slow end and at the fast end (equal unless card_read_gbs is a range)
    gpu_rate_bandwidth: float  # GB/s: the bandwidth gpu_rate was read at (the card's, or unified memory's)
    gpu_kv_rate: float  # bytes/s for the KV cache on that side
    dense: float  # bytes of dense weights per token the CPU reads
    experts: float  # bytes of routed experts per token the CPU reads
    kv_per_position: float  # KV bytes per token already in the context
    kv_layers_share: float  # of the KV cache on the card's side
    group: float  # query heads per KV head
    threads: int
    # A quantized cache on the card's side: (seconds per token, seconds per position already in the context),
    # at the slow end and at the fast end (equal where the backend's cost is measured: DecodeProfile.quantized_kv).
    kv_quantized: tuple[tuple[float, float], tuple[float, float]] = ((0.0, 0.0), (0.0, 0.0))
    # The CPU's time for its part of the cache against its bytes, (slow end, fast end): the model's shapes_factor for
    # f16; a quantized cache the node's ratio times that, or not measured CPU_QUANTIZED_KV's times it at the slow end
    # and the probe's f16 time at the fast end (cpu_kv_scale).
    cpu_kv_scale: tuple[float, float] = (1.0, 1.0)
    # Of the node's read bandwidth, what its CPU reads routed experts at: the node's own (node_expert_share, from
    # make host-profile --experts) where measured, else HOST.expert_share.
    expert_share: float = HOST.expert_share
    own_expert_share: bool = False  # expert_share is the node's own (experts_at_host_share)

    def cpu_kv_work(self, depth: int, end: int = 0) -> float:
        """The CPU's KV cache at this depth in bytes as HostCost.kv_gbs is stated (4 query heads per KV head, f16)."""
        return (self.kv_per_position * depth * (1 - self.kv_layers_share) * (1 + self.group / HOST_KV_GROUP) / 2
                * self.cpu_kv_scale[end])

    def seconds(self, depth: int, read_gbs: float, cost: HostCost, end: int = 0) -> float:
        """At one end of the range: 0 the slow end, 1 the fast end."""
        gpu_kv = self.kv_per_position * depth * self.kv_layers_share
        per_token, per_position = self.kv_quantized[end]
        seconds = self.fixed + self.host_blocks * cost.block_us / 1e6 + per_token + per_position * depth
        if self.gpu_read > 0 or gpu_kv > 0:
            seconds += self.gpu_read / self.gpu_rate[end] + gpu_kv / self.gpu_kv_rate
        if self.dense + self.experts > 0:
            ceiling = self.threads * HOST.thread_gbs * 1e9
            seconds += self.dense / min(read_gbs * 1e9 * HOST.weight_share, ceiling)
            seconds += self.experts / min(read_gbs * 1e9 * self.expert_share, ceiling)
        return seconds + (self.cpu_kv_work(depth, end) / (self.threads * cost.kv_gbs * 1e9)
                          * cost.kv_time_scale(depth))


def decode_terms(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
                 discrete: bool) -> Optional[DecodeTerms]:
    """The terms of a server's decode; None where the backend's profile or the card's bandwidth is unknown."""
    cpu_only = backend == "cpu"
    main = None if cpu_only else PROFILES.get(profile_name(pool, backend))
    if (main is None and not cpu_only) or model.role == "embedding":
        return None
    place = layout(model, facts)
    kind = weight_class(model, facts)
    # What the GPU reads (VRAM, or the node's memory on unified memory) and what the CPU reads.
    if discrete:
        gpu_read, cpu_read = place.read_per_token(True)
        gpu_bandwidth = pool.vram_bandwidth_gbs
    elif cpu_only:
        gpu_read, cpu_read = 0.0, sum(place.read_per_token(False))
        gpu_bandwidth = None
    else:
        gpu_read, cpu_read = sum(place.read_per_token(False)), 0.0
        gpu_bandwidth = pool.memory_bandwidth_gbs
    kv_layers_share = (place.gpu_blocks / facts.layers) if discrete else (0.0 if cpu_only else 1.0)
    if (gpu_read > 0 or kv_layers_share > 0) and gpu_bandwidth is None:
        return None
    ram_blocks = place.layers - place.gpu_blocks
    experts_on_cpu = (ram_blocks + place.experts_in_ram) if (discrete and place.experts_per_block) else 0
    expert_read = experts_on_cpu * place.experts_per_block * place.active_expert_share * place.read_share
    own_share = (node_expert_share(pool, model.threads, card_read_gbs(main, "kquant", gpu_bandwidth)[0])
                 if discrete and expert_read > 0 and main and gpu_bandwidth else None)
    fixed = 0.0
    if not cpu_only:
        fixed = place.gpu_blocks if discrete else facts.layers
        fixed = fixed * (main.block_us + (main.moe_block_us if routes_experts(facts) else 0.0)) / 1e6
        fixed += recurrent_blocks(facts) * main.recurrent_block_us / 1e6
        if discrete:
            fixed += experts_on_cpu * HOST.expert_block_us / 1e6
    return DecodeTerms(
        kv_quantized=quantized_kv_terms(model, facts, main, place.gpu_blocks / facts.layers if discrete else
                                        0.0 if cpu_only else 1.0),
        fixed=fixed, host_blocks=facts.layers if cpu_only else ram_blocks if discrete else 0,
        gpu_read=gpu_read, gpu_rate=tuple(rate * 1e9 for rate in (card_read_gbs(main, kind, gpu_bandwidth or 1) if main
                                                                  else (gpu_bandwidth or 1, gpu_bandwidth or 1))),
        gpu_rate_bandwidth=gpu_bandwidth or 1,
        gpu_kv_rate=(gpu_bandwidth or 1) * 1e9 * (main.kv_share if main else 1),
        dense=cpu_read - expert_read, experts=expert_read, kv_per_position=kv_bytes_per_position(model, facts),
        kv_layers_share=kv_layers_share,
        group=query_heads(facts) / facts.kv_heads,
        threads=model.threads, cpu_kv_scale=cpu_kv_scale(model, facts, pool),
        expert_share=own_share or HOST.expert_share, own_expert_share=own_share is not None)


def experts_at_host_share(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
                          discrete: bool) -> bool:
    """Whether the plan reads routed experts on the CPU beside a card (of blocks whose experts stay in RAM, or of whole
    blocks left there) at HOST.expert_share, measured on other hosts: the pool states no share of its own
    (experts_in_ram_us_by_threads). The summary's line (llamacpp_held) and make bench's span of such rows use it."""
    terms = decode_terms(model, facts, pool, backend, discrete)
    return terms is not None and terms.experts > 0 and not terms.own_expert_share


def experts_figure_problems(pool: "NodePool", backend: Optional[str], path: str) -> list[tuple[str, str]]:
    """A pool's experts_in_ram_us_by_threads the plan cannot use (it would plan HOST.expert_share unsaid): no read
    bandwidth by threads to solve the share against, or a share outside EXPERT_SHARE_BOUNDS on this pool's card."""
    figure, where = pool.experts_in_ram_us_by_threads, f"{path}.experts_in_ram_us_by_threads"
    if not figure or drives_elsewhere(backend, pool.gpu_resource):
        return []  # none, or a build that does not drive this card (config/checks.py refuses it): no share to solve
    if not pool.memory_bandwidth_by_threads:
        return [(where, "the plan solves this figure against the node's read bandwidth by threads, which the pool "
                 "does not state: set memory_bandwidth_by_threads from the same make host-profile EXPERTS=1 run")]
    main = PROFILES.get(profile_name(pool, backend))
    if main is None or pool.vram_bandwidth_gbs is None:
        return []  # no decode figure on this card at all (the summary says why)
    _, refused = figure_shares(figure, pool.memory_bandwidth_by_threads,
                               card_read_gbs(main, "kquant", pool.vram_bandwidth_gbs)[0])
    if refused is None:
        return []
    (threads, us, share), (low, high) = refused, EXPERT_SHARE_BOUNDS
    said = (f"is no more than moving a block adds without reading its experts ({HOST.expert_block_us:g} us, less the "
            "card's time for them)" if share is None else f"gives a share of {share:.2f} of "
            f"memory_bandwidth_by_threads for routed experts, outside {low}-{high} (hosts measured: 0.65-1.15)")
    return [(f"{where}.{threads}", f"{us:g} us a block with {threads} threads {said}: a figure of another node or "
             "another run; measure both on this node with make host-profile EXPERTS=1")]


def cpu_quantized_ratio(kind: str) -> float:
    """CPU_QUANTIZED_KV's ratio for a cache type; a type not measured: the slowest measured."""
    return CPU_QUANTIZED_KV.get(kind, max(CPU_QUANTIZED_KV.values()))


def query_heads(facts: "ModelFacts") -> int:
    """The model's query heads; where the facts do not give them, HOST_KV_GROUP per KV head."""
    return facts.attention_heads or facts.kv_heads * HOST_KV_GROUP


def shapes_factor(facts: "ModelFacts") -> float:
    """CPU_KV_SHAPES for a model of more query heads than make host-profile's probe; 1 for one of as few."""
    return CPU_KV_SHAPES if query_heads(facts) > PROBE_QUERY_HEADS else 1.0


def cpu_kv_scale(model: "ModelServer", facts: "ModelFacts", pool: "NodePool") -> tuple[float, float]:
    """What a CPU's part of the cache costs per byte against the probe's f16 cache, (slow end, fast end): the model's
    shapes_factor for f16; a quantized cache's time is the node's measured multiple of an f16 cache's on make
    host-profile's probe (cpu_quantized_kv) times that at both ends; not measured, CPU_QUANTIZED_KV's (a type not
    measured: the slowest measured) times it at the slow end, and at the fast end the probe's f16 time, unshaped (lease
    15's quantized points at depth reached it: the range held them); all over its own bytes."""
    factor = shapes_factor(facts)
    kind = quantized_kv_type(model)
    if kind is None:
        return factor, factor
    per_byte = 2 * KV_TYPE_BYTES["f16"] / (KV_TYPE_BYTES[model.cache_type_k or "f16"] + KV_TYPE_BYTES[model.cache_type_v or "f16"])
    # host-profile measures K and V of one type: a mixed pair keeps the range.
    measured = (pool.cpu_quantized_kv or {}).get(kind) if model.cache_type_k == model.cache_type_v else None
    if measured is not None:
        return (measured * factor * per_byte,) * 2
    return cpu_quantized_ratio(kind) * factor * per_byte, per_byte


def quantized_kv_type(model: "ModelServer") -> Optional[str]:
    """The server's cache type where it is quantized (K and V of one type: engines/llamacpp.py refuses a pair on
    CUDA), else None."""
    return next((t for t in (model.cache_type_k, model.cache_type_v) if t not in (None, "f16", "bf16", "f32")), None)


def quantized_kv_terms(model: "ModelServer", facts: "ModelFacts", main: Optional[DecodeProfile],
                       card_share: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """A quantized cache's cost beyond its bytes on the card's side, (slow end, fast end), each (seconds per token,
    seconds per position): the profile's measured cost at both ends; where the backend's is not measured, the
    H200's at the slow end and its bytes alone at the fast end (llama.cpp PR #16208 measured a q4_0 cache faster
    than f16 on an RTX 4090: QUANTIZED_KV_UNMEASURED says so in the plan)."""
    kind = quantized_kv_type(model)
    if kind is None or main is None or card_share <= 0:
        return (0.0, 0.0), (0.0, 0.0)
    blocks = (facts.full_attention_layers or facts.layers) * card_share
    unit = blocks * query_heads(facts) * facts.head_dim
    measured = main.quantized_kv.get(kind)
    block_us, unit_ps = measured or H200_QUANTIZED_KV.get(kind, H200_QUANTIZED_KV["q4_0"])
    slow = (blocks * block_us / 1e6, unit * unit_ps / 1e12)
    return slow, (slow if measured else (0.0, 0.0))


QUANTIZED_KV_CPU = ("its {kind} KV cache on the CPU: from {ratio:g} times an f16 cache's time (a 2-core EPYC) to "
                    "an f16 cache's time for 16 query heads (a 16-thread host), not measured on this node (make "
                    "host-profile)")
KV_DEEP_UNMEASURED = (f"this node's attention past {KV_PROFILE_DEPTH} positions not measured (kv_deep_slowdown, make "
                     "host-profile): from no slow-down to the most measured")
CARD_READ_UNMEASURED = ("its {quant} weights' read measured on two cards of this profile ({low:g} and {high:g} GB/s), "
                        "not at this card's {bandwidth:g}: from the nearer card's share of the bandwidth to the line "
                        "through both (no faster than F16 streams)")
QUANTIZED_KV_UNMEASURED = ("its {kind} KV cache's decode not measured on this backend: from the cost measured on an "
                           "H200 to its bytes alone (llama.cpp PR #16208: q4_0 faster than f16 on an RTX 4090)")


def range_reasons(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
                  discrete: bool) -> list[str]:
    """Why a server's decode is a range, in the summary's words: the node's CPU not measured, its quantized KV cache
    not measured on this backend, or its weights' read not measured at this card's bandwidth (card_read_gbs)."""
    terms = decode_terms(model, facts, pool, backend, discrete)
    if terms is None:
        return []
    reasons = []
    if terms.dense + terms.experts > 0 and not (pool.memory_bandwidth_by_threads and pool.cpu_decode_by_threads):
        reasons.append("this node's CPU not measured, make host-profile")
    elif (terms.kv_layers_share < 1 and (model.ctx_size or 0) > KV_PROFILE_DEPTH and pool.cpu_decode_by_threads
          and not any(f.kv_deep_slowdown for f in pool.cpu_decode_by_threads.values())):
        reasons.append(KV_DEEP_UNMEASURED)
    if terms.gpu_read > 0 and terms.gpu_rate[0] != terms.gpu_rate[1]:
        (first_gbs, _), (second_gbs, _) = read_line_of(PROFILES[profile_name(pool, backend)], weight_class(model, facts))
        reasons.append(CARD_READ_UNMEASURED.format(quant=quant_of(model.hf_repo or ":Q4_K_M"), low=first_gbs,
                                                   high=second_gbs, bandwidth=terms.gpu_rate_bandwidth))
    if terms.kv_quantized[0] != terms.kv_quantized[1]:
        reasons.append(QUANTIZED_KV_UNMEASURED.format(kind=quantized_kv_type(model)))
    if terms.cpu_kv_scale[0] != terms.cpu_kv_scale[1] and terms.kv_layers_share < 1:
        kind = quantized_kv_type(model)
        reasons.append(QUANTIZED_KV_CPU.format(kind=kind, ratio=cpu_quantized_ratio(kind)))
    return reasons


def is_range(low: float, high: float) -> bool:
    """Whether a (low, high) decode figure is a range as the plan prints it: its ends more than 0.5 % apart (closer,
    one figure)."""
    return high > low * 1.005


def predict_tok_s(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
                  discrete: bool, depths: dict[str, int]) -> Optional[dict[str, float]]:
    """Predicted decode rate at each named context depth (tokens already in the context); None where
    a bandwidth or the backend's profile is unknown (Vulkan unnamed, SYCL, MUSA: nothing measured). Where
    the CPU does part of the work on a node not measured, the low end of predict_range_tok_s."""
    rates = predict_range_tok_s(model, facts, pool, backend, discrete, depths)
    return {name: low for name, (low, _) in rates.items()} if rates else None


def predict_range_tok_s(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", backend: Optional[str],
                        discrete: bool, depths: dict[str, int]) -> Optional[dict[str, tuple[float, float]]]:
    """(low, high) decode rate at each depth: equal unless the CPU does part of the work on a node whose read
    bandwidth (host_read_gbs) or decode figures (host_cost) are known only as a range, a quantized cache's cost is
    not measured on the backend, or the card's read of its weights is known only as a range (card_read_gbs)."""
    terms = decode_terms(model, facts, pool, backend, discrete)
    if terms is None:
        return None
    cpu_work = terms.dense + terms.experts > 0
    host = host_read_gbs(pool, model.threads) if cpu_work else (0.0, 0.0)
    if host is None:
        return None
    ends = list(zip(host, host_cost(pool, model.threads)))
    rates: dict[str, tuple[float, float]] = {}
    for name, depth in depths.items():
        seconds = [terms.seconds(depth, read_gbs, cost, end) for end, (read_gbs, cost) in enumerate(ends)]
        if min(seconds) <= 0:
            return None
        rates[name] = (1 / max(seconds), 1 / min(seconds))
    return rates


def solve_host_cost(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", depth: int, empty_s: float,
                    deep_s: float) -> HostCost:
    """The HostCost that makes a CPU server's prediction meet llama-bench's seconds per token at an empty context
    and at depth, given the node's read bandwidth at the server's threads (pool.memory_bandwidth_by_threads):
    what the weights do not explain is spread over the blocks (never below 0), the rest at depth is the KV cache."""
    terms = decode_terms(model, facts, pool, "cpu", False)
    read = host_read_gbs(pool, model.threads) if pool.memory_bandwidth_by_threads else None
    if terms is None or read is None or not 0 < empty_s < deep_s or depth <= 0:
        raise ValueError("solve_host_cost: a CPU server, the node's measured read bandwidth, and a slower token at depth")
    weights_only = terms.seconds(0, read[0], HostCost(0.0, float("inf")))
    block_us = max(0.0, (empty_s - weights_only) / terms.host_blocks * 1e6)
    return HostCost(block_us=block_us, kv_gbs=terms.cpu_kv_work(depth) / ((deep_s - empty_s) * terms.threads) / 1e9)


def quantized_kv_ratio(f16: tuple[float, float], quantized: tuple[float, float]) -> float:
    """A node's cpu_quantized_kv for one cache type: its slow-down from an empty context to a depth against the
    f16 cache's, from (empty, deep) tokens/s of each (make host-profile's runs of one shape at one thread count)."""
    return (1 / quantized[1] - 1 / quantized[0]) / (1 / f16[1] - 1 / f16[0])
