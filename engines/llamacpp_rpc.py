"""One model over several nodes with llama.cpp's RPC backend (issue #47): which layers each device holds, and what the
split costs in decode speed over the link between the nodes.

llama.cpp b10729 (src/llama-model.cpp, load_tensors) puts the RPC devices first and the main server's own device
last; with --tensor-split s_0..s_k (normalised, cumulative) the repeating layer il (and the output layer, il =
n_layer) goes to the first device whose cumulative split exceeds il / (n_layer + 1), computed in float32. The input
embedding always stays in the main server's RAM.

Per generated token the main server sends each RPC device its input (the hidden state, n_embd x 4 bytes; the
attention mask, 2 bytes per KV cell with flash attention; positions and KV indices) and waits once for its output
(GET_TENSOR, n_embd x 4 bytes back): one round trip per device, and the devices run one after another
(ggml/src/ggml-rpc/ggml-rpc.cpp; SET_TENSOR and GRAPH_RECOMPUTE are not answered). So a token costs what each
node's layers cost on that node, plus per RPC device the link's round trip, those bytes at its bandwidth, and a
fixed cost per token (RPC_TOKEN_MS: measured, and different from host to host, so the plan gives a range).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from config.types import ModelFacts, ModelServer


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def layers_per_device(n_layer: int, split: Sequence[float]) -> list[int]:
    """How many of the n_layer repeating layers each device holds (RPC devices first, the main device last), as
    llama.cpp assigns them with every layer offloaded; the output layer is on the device of il = n_layer."""
    total = sum(split)
    cumulative, running = [], 0.0
    for share in split:
        running = _f32(running + share)
        cumulative.append(_f32(running / _f32(total)))
    counts = [0] * len(split)
    for il in range(n_layer):
        x = _f32(il / (n_layer + 1))
        device = next((i for i, edge in enumerate(cumulative) if edge > x), len(split) - 1)
        counts[device] += 1
    return counts


def output_device(n_layer: int, split: Sequence[float]) -> int:
    total = sum(split)
    running, x = 0.0, _f32(n_layer / (n_layer + 1))
    for i, share in enumerate(split):
        running = _f32(running + share)
        if _f32(running / _f32(total)) > x:
            return i
    return len(split) - 1


def split_for_layers(counts: Sequence[int]) -> list[int]:
    """A --tensor-split that gives each device exactly these many layers (RPC devices first): llama.cpp's rule
    with the output layer counted on the last device; checked by layers_per_device."""
    split = list(counts)
    split[-1] += 1  # the output layer
    return split


# What an RPC device costs a token beyond its blocks' compute and the link (the helper's graph run and its
# synchronisation with the main server), least and most, in ms: issue #47's first run on an H200 (Qwen3-14B and
# Qwen3-30B-A3B split 1/1 over loopback: 0.67 and 1.04 ms against the same model whole) and a later lease
# (bench/results-rpc-h200.json, through lab/bench/link_relay.py on loopback: 1.3-2.1 ms for Qwen3-14B, Llama-3.1-8B,
# Qwen3-30B-A3B against the plan's whole-model figure). A per-block cost, the model frozen before that lease, did not
# hold there (Llama-3.1-8B split 1/3 paid as much as Qwen3-14B split 1/1): it is per token, and it is the host's.
RPC_TOKEN_MS = (0.7, 2.1)
# What a token's requests to one RPC device carry beyond their data (ggml-rpc.cpp b10729: a command is 1 byte and
# an 8-byte size before its data; a serialised rpc_tensor is 296 bytes). Counted on the real split by
# tests/test_rpc_contract.py (lab/bench/link_relay.py reads the commands): per token and device, 5 SET_TENSOR (the
# hidden state, the mask, the K and V cell indices, the positions; a sixth, the rows to output, where the output
# layer is), one GRAPH_RECOMPUTE (the graph is re-sent only when the mask's cells change, every 256 positions) and
# one GET_TENSOR, whose answer the main server waits for.
RPC_SET_FRAMING = 9 + 296 + 8       # header, tensor, offset
RPC_GET_REQUEST = 9 + 296 + 8 + 8   # header, tensor, offset, size
RPC_RECOMPUTE_REQUEST = 9 + 4       # header, device
RPC_INPUTS_PER_TOKEN = 5


# A ggml-rpc-server offers its device's plain buffer type only, so a CPU helper never repacks the weights it holds
# into the interleaved layout a CPU llama-server's matrix products read faster (ggml-cpu/repack.cpp b10729, x86-64:
# Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K with AVX-512; the load report shows no CPU_REPACK buffer on an RPC
# device), while a node's prefill figure is a CPU server's, repacked. Prompt tokens/s without it over with it,
# measured on the CI machine (llama-server b10729 --no-repack against its default, Qwen3-1.7B at 1 and 2 threads:
# bench/results-repack-cpu.json): Q4_K_M 0.73, Q4_K_S 0.68, Q8_0 1.00 (not repacked on x86); Llama-3.2-3B Q4_K_M,
# not used to set them, 0.73 / 0.71. Decode moved -11 to +1 % for the Q4_K mixes and +3 / +16 % for Q8_0, which
# repacks nothing: this machine's noise at two threads, so only prefill pays it. x86-64 only: on ARM more types
# repack.
CPU_HELPER_PREFILL = {"Q4_K_M": 0.73, "Q4_K_S": 0.68}
# File types whose tensors are mostly of a type that repacks on every x86-64 host with AVX2 (and unsloth's UD- mixes
# of them): one not measured takes the most-repacked measured mix's figure. Not counted: Q2_K (repacked only with
# AVX-512, which the plan cannot tell), and the few Q4_K tensors of a Q3_K or Q2_K mix (the plan is then a little
# fast).
REPACKED_ON_X86 = ("Q4_0", "Q4_K", "IQ4_NL", "MXFP4")


def cpu_helper_prefill(quant: str | None) -> float:
    """A CPU helper's prompt speed over the same node's whole-model figure (CPU_HELPER_PREFILL): 1.0 for a file type
    x86-64 does not repack, or with no quant known."""
    if quant is None:
        return 1.0
    quant = {"Q4_K": "Q4_K_M"}.get(quant, quant)  # llama-quantize's alias
    if quant in CPU_HELPER_PREFILL:
        return CPU_HELPER_PREFILL[quant]
    return min(CPU_HELPER_PREFILL.values()) if any(t in quant for t in REPACKED_ON_X86) else 1.0


@dataclass(frozen=True)
class Link:
    """A link between the main server's node and a helper's: round trip and bandwidth, as tools/link_probe.py
    measures them."""

    rtt_ms: float
    gbps: float


def ubatch_bytes(n_embd: int, tokens: int, depth: int, logits: int = 0) -> tuple[float, float]:
    """(to the helper, back) for one RPC device and one micro-batch of `tokens` after `depth` in the cache (flash
    attention on); logits: the vocabulary, where this device holds the output layer (one row of logits comes back,
    4 bytes each, the batch's last)."""
    cells = -(-(depth + tokens) // 256) * 256  # the mask covers the KV cells in use, padded to 256 (f16, 2 bytes a cell)
    # Per token: hidden state (f32), its mask row, K and V cell indices (i64), position (i32).
    data = tokens * (n_embd * 4 + cells * 2 + 2 * 8 + 4)
    up = data + RPC_INPUTS_PER_TOKEN * RPC_SET_FRAMING + RPC_RECOMPUTE_REQUEST + RPC_GET_REQUEST
    if logits:
        up += RPC_SET_FRAMING + 4  # the output layer's device also gets the rows to output (i32 each)
    down = (logits if logits else tokens * n_embd) * 4 + 8
    return float(up), float(down)


def token_bytes(n_embd: int, depth: int, logits: int = 0) -> tuple[float, float]:
    """(to the helper, back) per generated token for one RPC device at this context depth."""
    return ubatch_bytes(n_embd, 1, depth, logits)


def link_seconds(link: Link, n_embd: int, depth: int, logits: int = 0, tokens: int = 1) -> float:
    """What one RPC device's hop costs a token (or a micro-batch of `tokens`): one round trip and its bytes both
    ways."""
    up, down = ubatch_bytes(n_embd, tokens, depth, logits)
    return link.rtt_ms / 1e3 + (up + down) * 8 / (link.gbps * 1e9)


def split_decode_seconds(whole_seconds: Sequence[float], counts: Sequence[int], links: Sequence[Link], n_layer: int,
                         n_embd: int, depth: int, token_ms: float, n_vocab: int = 0, output: int = -1) -> float:
    """Seconds per generated token for a split: each device's share of the seconds the whole model takes on its
    node (whole_seconds, per device, the plan's decode model at this depth), each RPC device's link, and the cost of
    token_ms per RPC device (RPC_TOKEN_MS). links: one per RPC device (the devices but the last, the main server's own;
    without a GPU there the last is an RPC device too: one link per device). output: the device with the output
    layer (its logits, n_vocab x 4 bytes, cross the link where it is an RPC device)."""
    seconds = sum(whole * count / n_layer for whole, count in zip(whole_seconds, counts))
    output = output % len(counts)
    for i, (link, count) in enumerate(zip(links, counts)):
        if count or i == output:
            seconds += link_seconds(link, n_embd, depth, n_vocab if i == output else 0) + token_ms / 1e3
    return seconds


def split_prefill_seconds(whole_seconds: Sequence, counts: Sequence[int], links: Sequence[Link], n_layer: int,
                          n_embd: int, tokens: int, depth: int, ubatch: int, n_vocab: int = 0, output: int = -1) -> float:
    """Seconds to process a prompt of `tokens` after `depth` in the cache, split: each device's share of the time its
    node takes for the whole model (whole_seconds: per device, seconds(tokens, depth) from the plan's prefill model)
    and, per micro-batch and RPC device, a round trip and the batch's bytes at the link's rate. The link's time is
    added to the compute, not overlapped with it (llama.cpp's pipeline can overlap some; bench/results-rpc-h200.json's
    dense rows over 1 and 2.5 GbE lie within 5 % of this sum where the loopback figure is steady)."""
    seconds = sum(whole(tokens, depth) * count / n_layer for whole, count in zip(whole_seconds, counts))
    output = output % len(counts)
    done = 0
    while done < tokens:
        batch = min(ubatch, tokens - done)
        for i, (link, count) in enumerate(zip(links, counts)):
            if count or i == output:
                seconds += link_seconds(link, n_embd, depth + done, n_vocab if i == output else 0, batch)
        done += batch
    return seconds


# --- memory per device --------------------------------------------------------------------------------------------

# With more than one device and every layer offloaded, llama.cpp runs the devices as a pipeline
# (llama-context.cpp: pipeline_parallel; CUDA, ROCm, Vulkan, SYCL and RPC devices all have async compute and
# events) and its scheduler keeps GGML_SCHED_MAX_COPIES (4) copies of each split's inputs: measured on the CPU
# build with two and three ggml-rpc-servers (Qwen3-1.7B and Llama-3.2-3B, contexts 2048-8192, micro-batches
# 256-512), each device's compute buffer holds 4 x (the hidden state, n_embd x 4 bytes a token, and the f16
# attention mask) beside its own graph, and the main server's CPU 4 masks and 2 hidden states.
PIPELINE_COPIES = 4


@dataclass(frozen=True)
class DeviceMemory:
    """What one device of a split holds, bytes, as llama.cpp reports it ("<dev> model / KV / compute buffer size")."""

    blocks: int
    output: bool
    model: float
    kv: float
    compute: float

    @property
    def total(self) -> float:
        return self.model + self.kv + self.compute


def split_memory(model: "ModelServer", facts: "ModelFacts", counts: Sequence[int], output: int,
                 single_compute: Sequence[float]) -> tuple[list[DeviceMemory], DeviceMemory]:
    """Each device's buffers for a split (RPC devices first), and the main server's host: the input embedding
    (always in its RAM) and its CPU compute buffer. single_compute, one per device: the compute buffer its backend
    takes for the whole model alone (engines/llamacpp_memory.py), from which its buffer in the split is derived."""
    from .llamacpp_memory import DEFAULT_UBATCH, CTX_PAD, kv_bytes, slots

    embedding, output_bytes, per_block = split_weights(model, facts)
    total_kv = kv_bytes(facts, model.ctx_size, model.cache_type_k, model.cache_type_v, slots(model),
                        model.ubatch_size or DEFAULT_UBATCH)
    tokens = min(model.ubatch_size or DEFAULT_UBATCH, model.ctx_size)
    mask = tokens * -(-model.ctx_size // CTX_PAD) * CTX_PAD * 2
    hidden = tokens * (facts.embedding_length or facts.kv_heads * facts.head_dim) * 4
    copies = PIPELINE_COPIES if len(counts) > 1 else 1
    # The pipeline's copies of the inputs in place of the one mask a lone device holds.
    pipeline = copies * (hidden + mask) - mask if copies > 1 else 0.0
    devices = [
        DeviceMemory(blocks=count, output=i == output,
                     model=count * per_block + (output_bytes if i == output else 0.0),
                     kv=total_kv * count / facts.layers, compute=single + pipeline)
        for i, (count, single) in enumerate(zip(counts, single_compute, strict=True))
    ]
    host = DeviceMemory(blocks=0, output=False, model=embedding, kv=0.0, compute=copies * mask + 2 * hidden)
    return devices, host


# llama-quantize's type for the output layer (and a tied embedding, which is the same tensor): Q6_K below 6.5625
# bits a weight, the file's own type above (Q8_0, F16); a separate input embedding keeps the file's base type, the
# K-quant mixes' own (Q4_K for Q4_K_M), not their mean (lab/contract/real_shape.py writes files by the same rules).
OUTPUT_BITS = 6.5625
BASE_BITS = {"Q2_K": 2.625, "Q3_K_S": 3.4375, "Q3_K_M": 3.4375, "Q3_K_L": 3.4375, "Q4_K_S": 4.5, "Q4_K_M": 4.5,
             "Q5_K_S": 5.5, "Q5_K_M": 5.5, "Q6_K": 6.5625, "Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5,
             "Q5_1": 6.0, "F16": 16.0, "BF16": 16.0, "F32": 32.0}


def split_weights(model: "ModelServer", facts: "ModelFacts") -> tuple[float, float, float]:
    """(input embedding, output layer, one block) in bytes: the file's weights less its embedding tensors,
    spread over the blocks. Where a block sits matters in a split, so the output layer is counted at its own type
    rather than at the file's mean bits."""
    from .llamacpp_memory import weights_bytes

    from .llamacpp_memory import quant_of

    weights = weights_bytes(model, facts)
    if not (facts.vocab_size and facts.embedding_length):
        return 0.0, 0.0, weights / facts.layers
    mean_bits = weights * 8 / (facts.params_b * 1e9)
    base_bits = BASE_BITS.get(quant_of(model.hf_repo), mean_bits) if model.hf_repo else mean_bits
    cells = facts.vocab_size * facts.embedding_length
    output = 0.0 if facts.output_layer == "none" else cells * max(base_bits, OUTPUT_BITS) / 8
    embedding = output if facts.output_layer == "tied" else cells * base_bits / 8
    in_file = embedding + (output if facts.output_layer == "separate" else 0.0)
    return embedding, output, max(weights - in_file, 0.0) / facts.layers
