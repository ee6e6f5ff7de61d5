"""GGUF files with a real model's shape and no weights: the real architecture hyperparameters and the
real tensor table (names, shapes, quantization types), over a tensor-data region that is a hole in the
file (all zeros, never written), so a 20 GiB model costs no disk and no time to write.

llama.cpp's own programs accept them: `llama-fit-params` (metadata only, but it bounds-checks every tensor
against the file size, hence the full-size sparse file), `llama-bench` and `llama-server` (they load and
run the zero weights: the answers are noise, the memory and timing are the real shape's).

    write_real_shape("qwen3-8b", Path("/tmp/q.gguf"))          # the preset's usual quantization
    write_real_shape("qwen3-8b", Path("/tmp/q.gguf"), "Q8_0")  # another mix
    expected_weights_bytes("qwen3-8b")                         # tensor bytes written (llama.cpp's model size)

The tensor table of each architecture follows llama.cpp b10729's loader for it (src/models/<arch>.cpp,
load_arch_tensors); the per-tensor types follow llama-quantize's mix rules for the chosen file type
(src/llama-quant.cpp, llama_tensor_get_type_impl), reimplemented here for F16/Q8_0/Q6_K/Q5_K_M/Q5_K_S/
Q4_K_M/Q4_K_S (Q4_K and Q5_K are llama-quantize's aliases of the _M mixes). The tokenizer is a real one
from the vocab-only GGUFs in llama.cpp's source (models/ggml-vocab-*.gguf), cut or padded (with
[PAD<i>] tokens, as convert_hf_to_gguf.py pads) to the model's vocabulary size.

Zero weights are harmless to the programs (norms of zero are zero, no NaN), with one exception written
for real: Llama 3.1's `rope_freqs.weight` (RoPE frequency divisors) is filled with 1.0, since zeros there
divide by zero (256 bytes, one disk block).

Routing (mixture-of-experts presets, arch qwen3moe and qwen35moe). With zero weights every token's router
logits are zero, so every token picks the same top-k experts: decode is timed right, but prefill (a batch
of tokens touches only k experts instead of most of them) and expert offload (llama.cpp copies only the
experts in use to the GPU for a large batch) are not; measured on an H200 (issue #33 item 7), a file with
token-dependent routing prefilled 1.7x slower on the GPU and 10.5x slower with 24 blocks of experts in RAM.
`routing=` picks:

    write_real_shape("qwen3-30b-a3b", out)                     # routing="zero": all holes, same experts
    write_real_shape("qwen3-30b-a3b", out, routing="token")    # experts chosen by the token

"token" writes real data for exactly what makes the choice depend on the token, the rest staying a hole:
  - `token_embd.weight`: random values (seeded, reproducible) in the tensor's own type, as valid blocks
    built by hand (gguf-py has no K-quant quantizer): random quant codes, 6-bit sub-block scales and
    mins centred so the values have mean ~0, an f16 block scale jittered per block, std ~0.02; F16/BF16/
    Q4_0-style types go through gguf.quants.quantize of N(0, 0.02) floats;
  - every block's router `ffn_gate_inp.weight` (F32): N(0, 1/n_embd), so logits are ~N(0, 1);
  - the norm in front of the router, 1.0: `ffn_norm.weight` (qwen3moe), `post_attention_norm.weight`
    (qwen35moe).
attn_norm stays zero, so attention (and Gated DeltaNet) sees a zero input and adds zero; the experts'
down projections are zero, so the FFN adds zero too: the residual stream is the token's embedding at
every layer, and each layer's router sees rms_norm(embedding) and routes by the token (differently per
layer, the routers being independent). The file's header, tensor offsets and size are byte-identical to
the "zero" file's; what is written on disk is the embedding and the routers (qwen3-30b-a3b Q4_K_M:
~175 MB + 50 MB).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, GGUFWriter, LlamaFileType, PoolingType

from lab.contract.gguf_layout import _add_tokenizer, _Writer, vocab_dir

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Shape:
    """A model's architecture facts, as its config.json gives them (names in llama.cpp's terms)."""
    name: str
    arch: str                  # llama.cpp architecture (general.architecture)
    source: str                # where the numbers come from
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int                  # dense FFN width (0: none)
    n_vocab: int
    n_ctx_train: int
    rope_theta: float
    rms_eps: float
    quant: str                 # the usual file type of the published GGUF
    vocab: str                 # llama.cpp models/ggml-vocab-<vocab>.gguf
    tied: bool = False         # no output.weight: llama.cpp reuses token_embd
    pooling: int | None = None  # embedding models: llama.cpp pooling type (3 = last)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0        # shared expert width (0: no shared expert)
    rope_dim: int = 0          # partial rotary dims (0: head_dim)
    rope_sections: tuple[int, ...] = ()  # M-RoPE sections (qwen35*)
    rope_freqs: bool = False   # Llama 3.x writes rope_freqs.weight (llama3 RoPE scaling)
    # Gated DeltaNet (linear attention) layers of the hybrid qwen35* architectures
    full_attention_interval: int = 0
    ssm_d_conv: int = 0        # linear_conv_kernel_dim
    ssm_d_state: int = 0       # linear_key_head_dim (= linear_value_head_dim)
    ssm_n_group: int = 0       # linear_num_key_heads
    ssm_dt_rank: int = 0       # linear_num_value_heads

    @property
    def ssm_d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank

    def is_recurrent(self, il: int) -> bool:
        # llama.cpp src/models/qwen35moe.cpp load_arch_hparams: (i + 1) % full_attention_interval != 0
        return self.full_attention_interval > 0 and (il + 1) % self.full_attention_interval != 0


PRESETS: dict[str, Shape] = {
    # Qwen/Qwen3-Embedding-0.6B config.json: hidden_size 1024, num_hidden_layers 28, num_attention_heads 16,
    # num_key_value_heads 8, head_dim 128, intermediate_size 3072, vocab_size 151669,
    # max_position_embeddings 32768, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings true (the
    # checkpoint is a bare Qwen3Model: no lm_head); last-token pooling (llama.cpp pooling_type 3).
    # Published GGUF: Qwen/Qwen3-Embedding-0.6B-GGUF Q8_0.
    "qwen3-embedding-0.6b": Shape(
        name="qwen3-embedding-0.6b", arch="qwen3", source="Qwen/Qwen3-Embedding-0.6B config.json",
        n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072, n_vocab=151669,
        n_ctx_train=32768, rope_theta=1e6, rms_eps=1e-6, quant="Q8_0", vocab="qwen2", tied=True, pooling=3),
    # Qwen/Qwen3-Embedding-8B config.json: hidden_size 4096, num_hidden_layers 36, num_attention_heads 32,
    # num_key_value_heads 8, head_dim 128, intermediate_size 12288, vocab_size 151665, rope_theta 1e6,
    # rms_norm_eps 1e-6; no lm_head (embedding checkpoint), last-token pooling. Context 32768: the model
    # card's "32K" (assumed; config.json's max_position_embeddings was not checked).
    "qwen3-embedding-8b": Shape(
        name="qwen3-embedding-8b", arch="qwen3", source="Qwen/Qwen3-Embedding-8B config.json / model card",
        n_embd=4096, n_layer=36, n_head=32, n_head_kv=8, head_dim=128, n_ff=12288, n_vocab=151665,
        n_ctx_train=32768, rope_theta=1e6, rms_eps=1e-6, quant="Q6_K", vocab="qwen2", tied=True, pooling=3),
    # Qwen/Qwen3-8B config.json: hidden_size 4096, num_hidden_layers 36, num_attention_heads 32,
    # num_key_value_heads 8, head_dim 128, intermediate_size 12288, vocab_size 151936,
    # max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings false.
    # Published GGUF: Qwen/Qwen3-8B-GGUF Q4_K_M (5.03 GB).
    "qwen3-8b": Shape(
        name="qwen3-8b", arch="qwen3", source="Qwen/Qwen3-8B config.json",
        n_embd=4096, n_layer=36, n_head=32, n_head_kv=8, head_dim=128, n_ff=12288, n_vocab=151936,
        n_ctx_train=40960, rope_theta=1e6, rms_eps=1e-6, quant="Q4_K_M", vocab="qwen2"),
    # Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, num_hidden_layers 48, num_attention_heads 32,
    # num_key_value_heads 4, head_dim 128, intermediate_size 6144, moe_intermediate_size 768,
    # num_experts 128, num_experts_per_tok 8, vocab_size 151936, max_position_embeddings 40960,
    # rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings false. Every layer is MoE (no shared expert).
    "qwen3-30b-a3b": Shape(
        name="qwen3-30b-a3b", arch="qwen3moe", source="Qwen/Qwen3-30B-A3B config.json",
        n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144, n_vocab=151936,
        n_ctx_train=40960, rope_theta=1e6, rms_eps=1e-6, quant="Q4_K_M", vocab="qwen2",
        n_expert=128, n_expert_used=8, n_ff_exp=768),
    # Qwen/Qwen3.6-35B-A3B (model_type qwen3_5_moe; transformers: "Qwen3.6 checkpoints share the same
    # architecture and model_type as Qwen3.5"), text_config: hidden_size 2048, num_hidden_layers 40
    # (layer_types: 3 linear_attention then 1 full_attention, full_attention_interval 4 -> 10 full),
    # num_attention_heads 16, num_key_value_heads 2, head_dim 256 (gated attention: q_proj is 2x),
    # linear_conv_kernel_dim 4, linear_key_head_dim 128, linear_value_head_dim 128,
    # linear_num_key_heads 16, linear_num_value_heads 32, num_experts 256, num_experts_per_tok 8,
    # moe_intermediate_size 512, shared_expert_intermediate_size 512, vocab_size 248320,
    # max_position_embeddings 262144, rope_theta 1e7, partial_rotary_factor 0.25 (rope dims 64),
    # mrope_section [11, 11, 10], rms_norm_eps 1e-6, tie_word_embeddings false, mtp_num_hidden_layers 1.
    # GGUF keys as llama.cpp's conversion/qwen.py (Qwen3NextModel/Qwen3_5MoeTextModel) writes them.
    # Assumed: no MTP block (convert --no-mtp; llama.cpp skips MTP tensors unless asked to load them),
    # no vision tower (that is a separate mmproj file). The tokenizer is qwen2's 151936 tokens padded
    # to 248320 (the real Qwen3.5 vocabulary is not in llama.cpp's source).
    "qwen3.6-35b-a3b": Shape(
        name="qwen3.6-35b-a3b", arch="qwen35moe", source="Qwen/Qwen3.6-35B-A3B config.json (text_config)",
        n_embd=2048, n_layer=40, n_head=16, n_head_kv=2, head_dim=256, n_ff=0, n_vocab=248320,
        n_ctx_train=262144, rope_theta=1e7, rms_eps=1e-6, quant="Q4_K_M", vocab="qwen35",
        n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, rope_dim=64,
        rope_sections=(11, 11, 10, 0), full_attention_interval=4,
        ssm_d_conv=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=32),
    # Qwen/Qwen3-1.7B config.json: hidden_size 2048, num_hidden_layers 28, num_attention_heads 16,
    # num_key_value_heads 8, head_dim 128, intermediate_size 6144, vocab_size 151936,
    # max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings true.
    "qwen3-1.7b": Shape(
        name="qwen3-1.7b", arch="qwen3", source="Qwen/Qwen3-1.7B config.json",
        n_embd=2048, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=6144, n_vocab=151936,
        n_ctx_train=40960, rope_theta=1e6, rms_eps=1e-6, quant="Q4_K_M", vocab="qwen2", tied=True),
    # Qwen/Qwen3-32B config.json: hidden_size 5120, num_hidden_layers 64, num_attention_heads 64,
    # num_key_value_heads 8, head_dim 128, intermediate_size 25600, vocab_size 151936,
    # max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings false.
    "qwen3-32b": Shape(
        name="qwen3-32b", arch="qwen3", source="Qwen/Qwen3-32B config.json",
        n_embd=5120, n_layer=64, n_head=64, n_head_kv=8, head_dim=128, n_ff=25600, n_vocab=151936,
        n_ctx_train=40960, rope_theta=1e6, rms_eps=1e-6, quant="Q4_K_M", vocab="qwen2"),
    # Qwen/Qwen3-14B config.json: hidden_size 5120, num_hidden_layers 40, num_attention_heads 40,
    # num_key_value_heads 8, head_dim 128, intermediate_size 17408, vocab_size 151936,
    # max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings false.
    # Published GGUF: Qwen/Qwen3-14B-GGUF Q4_K_M (9.00 GB; this table's tensors: 8.996 GB).
    "qwen3-14b": Shape(
        name="qwen3-14b", arch="qwen3", source="Qwen/Qwen3-14B config.json",
        n_embd=5120, n_layer=40, n_head=40, n_head_kv=8, head_dim=128, n_ff=17408, n_vocab=151936,
        n_ctx_train=40960, rope_theta=1e6, rms_eps=1e-6, quant="Q4_K_M", vocab="qwen2"),
    # meta-llama/Llama-3.3-70B-Instruct config.json: hidden_size 8192, num_hidden_layers 80,
    # num_attention_heads 64, num_key_value_heads 8, intermediate_size 28672, vocab_size 128256,
    # max_position_embeddings 131072, rope_theta 500000, rms_norm_eps 1e-5, rope_scaling llama3,
    # tie_word_embeddings false. Published GGUF (bartowski) Q4_K_M: 42.5 GB.
    "llama-3.3-70b": Shape(
        name="llama-3.3-70b", arch="llama", source="meta-llama/Llama-3.3-70B-Instruct config.json",
        n_embd=8192, n_layer=80, n_head=64, n_head_kv=8, head_dim=128, n_ff=28672, n_vocab=128256,
        n_ctx_train=131072, rope_theta=5e5, rms_eps=1e-5, quant="Q4_K_M", vocab="llama-bpe", rope_freqs=True),
    # meta-llama/Llama-3.1-8B-Instruct config.json: hidden_size 4096, num_hidden_layers 32,
    # num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, vocab_size 128256,
    # max_position_embeddings 131072, rope_theta 500000, rms_norm_eps 1e-5, rope_scaling llama3
    # (convert writes rope_freqs.weight), tie_word_embeddings false. Common GGUF: Q4_K_M (4.92 GB).
    "llama-3.1-8b": Shape(
        name="llama-3.1-8b", arch="llama", source="meta-llama/Llama-3.1-8B-Instruct config.json",
        n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336, n_vocab=128256,
        n_ctx_train=131072, rope_theta=5e5, rms_eps=1e-5, quant="Q4_K_M", vocab="llama-bpe", rope_freqs=True),
    # meta-llama/Llama-3.2-3B-Instruct config.json: hidden_size 3072, num_hidden_layers 28, num_attention_heads
    # 24, num_key_value_heads 8, head_dim 128, intermediate_size 8192, vocab_size 128256, rope_theta 500000,
    # rms_norm_eps 1e-5, rope_scaling llama3, tie_word_embeddings true (no output.weight in its GGUF).
    "llama-3.2-3b": Shape(
        name="llama-3.2-3b", arch="llama", source="meta-llama/Llama-3.2-3B-Instruct config.json",
        n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, head_dim=128, n_ff=8192, n_vocab=128256,
        n_ctx_train=131072, rope_theta=5e5, rms_eps=1e-5, quant="Q4_K_M", vocab="llama-bpe", rope_freqs=True, tied=True),
    # mistralai/Mistral-Nemo-Instruct-2407 config.json (MistralForCausalLM, llama arch in GGUF): hidden_size
    # 5120, num_hidden_layers 40, num_attention_heads 32, num_key_value_heads 8, head_dim 128, intermediate_size
    # 14336, vocab_size 131072, rope_theta 1e6, rms_norm_eps 1e-5, tie_word_embeddings false. The tokenizer
    # here is llama-bpe's, padded to the vocabulary (its own Tekken is not in llama.cpp's source).
    "mistral-nemo-12b": Shape(
        name="mistral-nemo-12b", arch="llama", source="mistralai/Mistral-Nemo-Instruct-2407 config.json",
        n_embd=5120, n_layer=40, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336, n_vocab=131072,
        n_ctx_train=1024000, rope_theta=1e6, rms_eps=1e-5, quant="Q4_K_M", vocab="llama-bpe"),
    # mistralai/Mistral-Small-3.2-24B-Instruct-2506 text_config: hidden_size 5120, num_hidden_layers 40,
    # num_attention_heads 32, num_key_value_heads 8, head_dim 128, intermediate_size 32768, vocab_size 131072,
    # rope_theta 1e9, rms_norm_eps 1e-5, untied (llama arch in GGUF; the vision tower is a separate mmproj).
    "mistral-small-24b": Shape(
        name="mistral-small-24b", arch="llama", source="mistralai/Mistral-Small-3.2-24B-Instruct-2506 config.json",
        n_embd=5120, n_layer=40, n_head=32, n_head_kv=8, head_dim=128, n_ff=32768, n_vocab=131072,
        n_ctx_train=131072, rope_theta=1e9, rms_eps=1e-5, quant="Q4_K_M", vocab="llama-bpe"),
}

# file type -> (default tensor type, llama.cpp ftype); llama-quantize's names and aliases
FILE_TYPES: dict[str, tuple[T, LlamaFileType]] = {
    "F16": (T.F16, LlamaFileType.MOSTLY_F16),
    "BF16": (T.BF16, LlamaFileType.MOSTLY_BF16),
    "Q8_0": (T.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "Q6_K": (T.Q6_K, LlamaFileType.MOSTLY_Q6_K),
    "Q5_K_M": (T.Q5_K, LlamaFileType.MOSTLY_Q5_K_M),
    "Q5_K_S": (T.Q5_K, LlamaFileType.MOSTLY_Q5_K_S),
    "Q4_K_M": (T.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "Q4_K_S": (T.Q4_K, LlamaFileType.MOSTLY_Q4_K_S),
}
ALIASES = {"Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}  # tools/quantize/quantize.cpp: "alias for Q4_K_M"


def _file_type(quant: str) -> str:
    q = ALIASES.get(quant.upper(), quant.upper())
    if q not in FILE_TYPES:
        raise ValueError(f"quant {quant!r}: one of {', '.join([*FILE_TYPES, *ALIASES])}")
    return q


# --- tensor table (llama.cpp b10729 src/models/<arch>.cpp load_arch_tensors) -------------------------

def _tensor_table(p: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, ne) in file order, ne in ggml order (ne[0] = row length)."""
    e, hd, v = p.n_embd, p.head_dim, p.n_vocab
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (e, v))]
    if p.rope_freqs:
        out.append(("rope_freqs.weight", (hd // 2,)))
    for i in range(p.n_layer):
        b = f"blk.{i}."
        t = [(b + "attn_norm.weight", (e,))]
        recurrent = p.is_recurrent(i)
        if p.arch == "qwen35moe":
            t.append((b + "post_attention_norm.weight", (e,)))
        if recurrent:
            key_dim = p.ssm_d_state * p.ssm_n_group
            value_dim = p.ssm_d_inner
            t += [
                (b + "attn_qkv.weight", (e, key_dim * 2 + value_dim)),
                (b + "attn_gate.weight", (e, value_dim)),
                (b + "ssm_conv1d.weight", (p.ssm_d_conv, key_dim * 2 + value_dim)),
                (b + "ssm_dt.bias", (p.ssm_dt_rank,)),
                (b + "ssm_a", (p.ssm_dt_rank,)),
                (b + "ssm_beta.weight", (e, p.ssm_dt_rank)),
                (b + "ssm_alpha.weight", (e, p.ssm_dt_rank)),
                (b + "ssm_norm.weight", (p.ssm_d_state,)),
                (b + "ssm_out.weight", (value_dim, e)),
            ]
        else:
            q_out = hd * p.n_head * (2 if p.arch == "qwen35moe" else 1)  # qwen35*: gated attention, q and gate
            t += [
                (b + "attn_q.weight", (e, q_out)),
                (b + "attn_k.weight", (e, hd * p.n_head_kv)),
                (b + "attn_v.weight", (e, hd * p.n_head_kv)),
                (b + "attn_output.weight", (hd * p.n_head, e)),
            ]
            if p.arch in ("qwen3", "qwen3moe", "qwen35moe"):
                t += [(b + "attn_k_norm.weight", (hd,)), (b + "attn_q_norm.weight", (hd,))]
        if p.arch != "qwen35moe":
            t.append((b + "ffn_norm.weight", (e,)))
        if p.n_expert:
            t += [
                (b + "ffn_gate_inp.weight", (e, p.n_expert)),
                (b + "ffn_gate_exps.weight", (e, p.n_ff_exp, p.n_expert)),
                (b + "ffn_down_exps.weight", (p.n_ff_exp, e, p.n_expert)),
                (b + "ffn_up_exps.weight", (e, p.n_ff_exp, p.n_expert)),
            ]
            if p.n_ff_shexp:
                t += [
                    (b + "ffn_gate_inp_shexp.weight", (e,)),
                    (b + "ffn_gate_shexp.weight", (e, p.n_ff_shexp)),
                    (b + "ffn_up_shexp.weight", (e, p.n_ff_shexp)),
                    (b + "ffn_down_shexp.weight", (p.n_ff_shexp, e)),
                ]
        else:
            t += [
                (b + "ffn_gate.weight", (e, p.n_ff)),
                (b + "ffn_down.weight", (p.n_ff, e)),
                (b + "ffn_up.weight", (e, p.n_ff)),
            ]
        out += t
    out.append(("output_norm.weight", (e,)))
    if not p.tied:
        out.append(("output.weight", (e, v)))
    return out


# --- quantization mix (llama.cpp b10729 src/llama-quant.cpp) ------------------------------------------

def _allows_quantization(name: str, ne: tuple[int, ...]) -> bool:
    # tensor_allows_quantization: 2-D/3-D weights only, not norms, routers or conv1d
    return (len(ne) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(t: T, ncols: int) -> T:
    # tensor_type_fallback: a row length the block size does not divide
    if ncols % GGML_QUANT_SIZES[t][0] == 0:
        return t
    t = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}.get(t, t)
    return t if ncols % GGML_QUANT_SIZES[t][0] == 0 else T.F16


def _tensor_types(p: Shape, table: list[tuple[str, tuple[int, ...]]], ftype: str) -> list[T]:
    default, _ = FILE_TYPES[ftype]
    quantized = default not in (T.F16, T.BF16)
    names = [n for n, _ in table]
    tied = "output.weight" not in names
    n_wv = sum(1 for n in names if "attn_v.weight" in n or "attn_qkv.weight" in n)
    i_wv = i_down = 0
    types = []
    for name, ne in table:
        if not _allows_quantization(name, ne):
            types.append(T.F32)  # as convert_hf_to_gguf.py writes them (1-D, norms, routers, conv1d)
            continue
        new = default
        if quantized:
            if name == "output.weight" or (tied and name == "token_embd.weight"):
                new = T.Q8_0 if ne[0] % GGML_QUANT_SIZES[new][0] else (new if new == T.Q8_0 else T.Q6_K)
            elif name == "token_embd.weight":
                pass
            elif "attn_v.weight" in name or "attn_qkv.weight" in name:
                if ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i_wv, n_wv):
                    new = T.Q6_K
                elif ftype == "Q4_K_S" and i_wv < 4:
                    new = T.Q5_K
                i_wv += 1
            elif "ffn_up" in name or "ffn_gate" in name:
                pass
            elif "ffn_down" in name:
                # MoE: the layer comes from the name; dense: a running count
                i_layer = int(name.split(".")[1]) if p.n_expert > 1 else i_down
                if ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i_layer, p.n_layer):
                    new = T.Q6_K
                elif ftype == "Q4_K_S" and i_layer < p.n_layer // 8:
                    new = T.Q5_K
                i_down += 1
            new = _fallback(new, ne[0])
        types.append(new)
    return types


def _nbytes(ne: tuple[int, ...], t: T) -> int:
    block, size = GGML_QUANT_SIZES[t]
    n = int(np.prod(ne))
    assert ne[0] % block == 0, (ne, t)
    return n // block * size


def tensor_table(preset: str, quant: str | None = None) -> list[tuple[str, tuple[int, ...], T, int]]:
    """(name, ne, type, bytes) of every tensor the file holds, in file order."""
    p = PRESETS[preset]
    ftype = _file_type(quant or p.quant)
    table = _tensor_table(p)
    return [(n, ne, t, _nbytes(ne, t)) for (n, ne), t in zip(table, _tensor_types(p, table, ftype))]


def expected_weights_bytes(preset: str, quant: str | None = None) -> int:
    """The tensor data written (unpadded), which llama.cpp reports as the model's size."""
    return sum(nbytes for *_, nbytes in tensor_table(preset, quant))


# --- the file ---------------------------------------------------------------------------------------

def _add_hparams(w: GGUFWriter, p: Shape, ftype: str) -> None:
    w.add_name(p.name)
    w.add_file_type(int(FILE_TYPES[ftype][1]))
    w.add_quantization_version(2)
    w.add_context_length(p.n_ctx_train)
    w.add_embedding_length(p.n_embd)
    w.add_block_count(p.n_layer)
    if p.n_ff:
        w.add_feed_forward_length(p.n_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.head_dim)
    w.add_rope_dimension_count(p.rope_dim or p.head_dim)
    w.add_rope_freq_base(p.rope_theta)
    w.add_layer_norm_rms_eps(p.rms_eps)
    if p.arch == "llama":
        w.add_vocab_size(p.n_vocab)
    if p.pooling is not None:
        w.add_pooling_type(PoolingType(p.pooling))
    if p.n_expert:
        w.add_expert_count(p.n_expert)
        w.add_expert_used_count(p.n_expert_used)
        w.add_expert_feed_forward_length(p.n_ff_exp)
        if p.n_ff_shexp:
            w.add_expert_shared_feed_forward_length(p.n_ff_shexp)
    if p.rope_sections:
        w.add_rope_dimension_sections(list(p.rope_sections))
    if p.full_attention_interval:
        w.add_ssm_conv_kernel(p.ssm_d_conv)
        w.add_ssm_state_size(p.ssm_d_state)
        w.add_ssm_group_count(p.ssm_n_group)
        w.add_ssm_time_step_rank(p.ssm_dt_rank)
        w.add_ssm_inner_size(p.ssm_d_inner)
        w.add_full_attention_interval(p.full_attention_interval)


def write_real_shape(preset: str, out: Path, quant: str | None = None, vocab: Path | None = None,
                     routing: str = "zero") -> Path:
    """Write `preset`'s shape to `out` (quantization `quant`, default the preset's), full size and sparse:
    header, metadata and tensor infos are written, the data region is a hole up to the exact end.
    routing "token" (MoE presets only) writes the embedding, routers and pre-router norms for real (see the
    module docstring); "zero" (the default) leaves them holes."""
    if preset not in PRESETS:
        raise KeyError(f"preset {preset!r}: one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r}: one of {', '.join(ROUTINGS)}")
    if routing == "token" and not p.n_expert:
        raise ValueError(f"routing 'token': preset {preset!r} (arch {p.arch}) has no experts to route;"
                         " it is for the mixture-of-experts presets "
                         + ", ".join(n for n, s in PRESETS.items() if s.n_expert))
    ftype = _file_type(quant or p.quant)
    table = tensor_table(preset, ftype)
    out = Path(out)
    w = _Writer(str(out), p.arch)
    _add_hparams(w, p, ftype)
    _add_tokenizer(w, (vocab or vocab_dir()) / f"ggml-vocab-{p.vocab}.gguf", p.n_vocab)
    offsets, offset = {}, 0
    for name, ne, t, nbytes in table:
        # tensor_dtype float32 with raw_dtype: the shape is taken as elements (not bytes)
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=t)
        offsets[name] = offset
        offset += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    data_start = GGUFWriter.ggml_pad(fout.tell(), w.data_alignment)
    fout.truncate(data_start + offset)  # extends with a hole: no blocks allocated, nothing written
    for name, ne, t, nbytes in table:
        if name == "rope_freqs.weight":
            fout.seek(data_start + offsets[name])
            fout.write(np.ones(ne, dtype=np.float32).tobytes())
        elif routing == "token":
            _write_routing(fout, data_start + offsets[name], p, name, ne, t, nbytes)
    w.close()
    return out


# --- token-dependent routing (routing="token") -------------------------------------------------------

ROUTINGS = ("zero", "token")
ROUTING_SEED = 33       # issue #33: the same bytes on every run
EMBD_STD = 0.02         # token embedding values, about a real model's


def routing_norm(p: Shape) -> str:
    """The norm tensor (per block) that the router's input passes through, by architecture."""
    return "post_attention_norm" if p.arch == "qwen35moe" else "ffn_norm"


def _write_routing(fout: Any, at: int, p: Shape, name: str, ne: tuple[int, ...], t: T, nbytes: int) -> None:
    parts = name.split(".")
    rng = np.random.default_rng([ROUTING_SEED, int(parts[1]) + 1 if parts[0] == "blk" else 0])
    if name == "token_embd.weight":
        n_cols, n_rows = ne
        step = max(1, (32 << 20) // (nbytes // n_rows))  # rows per 32 MiB written
        fout.seek(at)
        for r in range(0, n_rows, step):
            fout.write(random_rows(t, min(step, n_rows - r), n_cols, rng).tobytes())
    elif parts[-2] == "ffn_gate_inp" and len(ne) == 2:
        assert t == T.F32, (name, t)
        fout.seek(at)
        fout.write((rng.standard_normal(ne[::-1], dtype=np.float32) / np.float32(np.sqrt(ne[0]))).tobytes())
    elif parts[-2] == routing_norm(p):
        assert t == T.F32, (name, t)
        fout.seek(at)
        fout.write(np.ones(ne, dtype=np.float32).tobytes())


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes of 6-bit sub-block scales and mins ((n, 8) each; inverse of gguf-py's
    Q4_K.get_scale_min, ggml's get_scale_min_k4)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    lo = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    mid = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    hi = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo, mid, hi], axis=1)


def random_rows(t: T, n_rows: int, n_cols: int, rng: np.random.Generator, std: float = EMBD_STD) -> np.ndarray:
    """`n_rows` rows of `n_cols` random values ~std, mean ~0, as valid blocks of type `t`: uint8
    (n_rows, row bytes). K-quants and Q8_0 are built by hand (random codes under random sane scales);
    others go through gguf.quants.quantize of N(0, std) floats."""
    from gguf import quants
    block, size = GGML_QUANT_SIZES[t]
    n = n_rows * n_cols // block
    jitter = rng.uniform(0.5, 1.5, n).astype(np.float32)

    def f16(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float16).view(np.uint8).reshape(n, 2)

    def codes(width: int) -> np.ndarray:
        return rng.integers(0, 256, (n, width), dtype=np.uint8)

    if t in (T.Q4_K, T.Q5_K):
        # value = d*sc*q - dmin*m with dmin = d and m = sc*(q_max/2): centred at 0; std = d*sc*std(q)
        bits = 4 if t == T.Q4_K else 5
        q_half = ((1 << bits) - 1) / 2
        sc = rng.integers(4, 9, (n, 8)) if bits == 4 else rng.integers(2, 5, (n, 8))  # m = sc*q_half <= 63
        mn = np.rint(sc * q_half)
        q_std = np.sqrt(((1 << bits) ** 2 - 1) / 12)
        d = f16(std / (sc.mean() * q_std) * jitter)
        parts = [d, d, _pack_k_scales(sc, mn)]
        parts += [codes(block // 8), codes(block // 2)] if bits == 5 else [codes(block // 2)]
    elif t == T.Q6_K:
        # value = d*scale*(q - 32), q 6 bits; ql[128] qh[64] scales[16] (int8) d
        sc = rng.integers(16, 49, (n, 16)).astype(np.int8).view(np.uint8)
        q_std = np.sqrt((64 ** 2 - 1) / 12)
        parts = [codes(block // 2), codes(block // 4), sc, f16(std / (32 * q_std) * jitter)]
    elif t == T.Q8_0:
        q = rng.integers(-127, 128, (n, block), dtype=np.int8).view(np.uint8)
        parts = [f16(std / np.sqrt((255 ** 2 - 1) / 12) * jitter), q]
    else:
        x = rng.standard_normal((n_rows, n_cols), dtype=np.float32) * np.float32(std)
        return np.asarray(quants.quantize(x, t)).view(np.uint8).reshape(n_rows, -1)
    blocks = np.concatenate(parts, axis=1)
    assert blocks.shape == (n, size), (t, blocks.shape)
    return blocks.reshape(n_rows, n_cols // block * size)


def densify(path: Path, chunk: int = 64 << 20) -> None:
    """Give a real-shape file's holes real blocks: every chunk read (a hole reads as zeros) and written back in
    place, so the bytes are unchanged; then sync, so that the page cache can be dropped."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        offset = 0
        while offset < size:
            f.seek(offset)
            data = f.read(min(chunk, size - offset))
            f.seek(offset)
            f.write(data)
            offset += len(data)
        f.flush()
        os.fsync(f.fileno())
