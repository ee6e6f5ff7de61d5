"""Vision projectors (mmproj GGUFs) with a real shape and no weights, and the text model they attach to,
for llama-server's `--mmproj`: the real hyperparameters (clip.vision.*, clip.projector_type) and the real
tensor table (names, shapes, types) over a data region that is a hole in the file, as real_shape.py does
for text models (whose helpers this reuses).

    write_mmproj("gemma-3-12b", Path("/tmp/mmproj.gguf"))     # ggml-org/gemma-3-12b-it-GGUF mmproj-model-f16.gguf
    expected_mmproj_bytes("gemma-3-12b")                       # tensor bytes: clip's "model size"
    write_text_shape("gemma-3-12b", Path("/tmp/g.gguf"))       # the text model (gemma3 arch), Q4_K_M
    write_text_shape("gemma-3-12b-width", Path("/tmp/w.gguf"))  # its width only: one layer, 32000 tokens

llama.cpp checks that the projector's output width (mm.input_projection's ne[0] for Gemma 3) equals the
text model's n_embd, so a projector is written for its own text model.

Gemma 3's projector (all sizes share the vision tower; only the projection to the text width differs),
from llama.cpp b10729's converter (conversion/gemma.py Gemma3VisionModel, conversion/base.py MmprojModel)
and loader (tools/mtmd/clip.cpp load_hparams/load_tensors, models/siglip.cpp):
  - SigLIP vision tower: image 896, patch 14 (64 x 64 = 4096 patches), 27 blocks, hidden 1152, FFN 4304,
    16 heads, LayerNorm eps 1e-6, GELU; learned position embeddings for the 4096 patches;
  - projector_type "gemma3": 4 x 4 average pooling (n_merge 4, the default: not written) to 256 tokens,
    RMS norm (mm.soft_emb_norm), then mm.input_projection to the text width;
  - types for the F16 file: 2-D weights F16; 1-D tensors, norms and biases F32; everything under
    `.embeddings.` (patch and position embeddings) F32 (Gemma3VisionModel.tensor_force_quant);
    mm.input_projection F16.
Sum of the tensors for gemma-3-12b: 854,175,168 bytes; the published ggml-org mmproj-model-f16.gguf is
854,200,224 bytes (the rest is its 25,056-byte header; this writer's is 32 bytes longer), unsloth's
mmproj-F16.gguf 854,200,448. gemma-3-4b: 851,226,048 + the same header = 851,251,104, its published size;
gemma-3-27b: 857,714,112 (the Hub lists "858 MB").
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, LlamaFileType, RopeScalingType

from lab.contract.gguf_layout import _add_tokenizer, _Writer, vocab_dir
from lab.contract.real_shape import Shape, _add_hparams, _nbytes, _tensor_types


@dataclass(frozen=True)
class Projector:
    """A vision projector's facts (names in llama.cpp's clip terms)."""
    name: str
    source: str
    projector_type: str        # clip.projector_type
    image_size: int            # clip.vision.image_size (also the warmup image's side)
    patch_size: int
    n_embd: int                # vision hidden size
    n_ff: int
    n_layer: int
    n_head: int
    eps: float
    n_embd_text: int           # clip.vision.projection_dim: the text model's n_embd
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]


_SIGLIP_GEMMA3 = dict(
    projector_type="gemma3", image_size=896, patch_size=14, n_embd=1152, n_ff=4304, n_layer=27, n_head=16,
    eps=1e-6, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))

PROJECTORS: dict[str, Projector] = {
    # google/gemma-3-{4b,12b,27b}-it config.json vision_config (SigLIP): hidden_size 1152, image_size 896,
    # intermediate_size 4304, num_attention_heads 16, num_hidden_layers 27, patch_size 14,
    # layer_norm_eps 1e-6; mm_tokens_per_image 256; preprocessor image_mean/std 0.5. The projection's
    # output is text_config.hidden_size: 2560 (4b), 3840 (12b), 5376 (27b).
    "gemma-3-4b": Projector(name="gemma-3-4b", source="ggml-org/gemma-3-4b-it-GGUF mmproj-model-f16.gguf",
                            n_embd_text=2560, **_SIGLIP_GEMMA3),
    "gemma-3-12b": Projector(name="gemma-3-12b", source="ggml-org/gemma-3-12b-it-GGUF mmproj-model-f16.gguf",
                             n_embd_text=3840, **_SIGLIP_GEMMA3),
    "gemma-3-27b": Projector(name="gemma-3-27b", source="ggml-org/gemma-3-27b-it-GGUF mmproj-model-f16.gguf",
                             n_embd_text=5376, **_SIGLIP_GEMMA3),
}


def mmproj_table(name: str) -> list[tuple[str, tuple[int, ...], T, int]]:
    """(name, ne, type, bytes) of every tensor of the projector's F16 file (ne in ggml order)."""
    p = PROJECTORS[name]
    if p.projector_type != "gemma3":
        raise ValueError(f"{name}: projector type {p.projector_type!r} has no tensor table here")
    e, ff, n_patches = p.n_embd, p.n_ff, (p.image_size // p.patch_size) ** 2
    rows: list[tuple[str, tuple[int, ...], T]] = [
        ("v.patch_embd.weight", (p.patch_size, p.patch_size, 3, e), T.F32),   # under .embeddings.: F32
        ("v.patch_embd.bias", (e,), T.F32),
        ("v.position_embd.weight", (e, n_patches), T.F32),
    ]
    for i in range(p.n_layer):
        b = f"v.blk.{i}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            rows += [(b + t + ".weight", (e, e), T.F16), (b + t + ".bias", (e,), T.F32)]
        rows += [
            (b + "ln1.weight", (e,), T.F32), (b + "ln1.bias", (e,), T.F32),
            (b + "ffn_up.weight", (e, ff), T.F16), (b + "ffn_up.bias", (ff,), T.F32),       # fc1
            (b + "ffn_down.weight", (ff, e), T.F16), (b + "ffn_down.bias", (e,), T.F32),    # fc2
            (b + "ln2.weight", (e,), T.F32), (b + "ln2.bias", (e,), T.F32),
        ]
    rows += [
        ("v.post_ln.weight", (e,), T.F32), ("v.post_ln.bias", (e,), T.F32),
        # multi_modal_projector.mm_input_projection_weight is (vision hidden, text hidden) in PyTorch
        ("mm.input_projection.weight", (p.n_embd_text, e), T.F16),
        ("mm.soft_emb_norm.weight", (e,), T.F32),
    ]
    return [(n, ne, t, _nbytes(ne, t)) for n, ne, t in rows]


def expected_mmproj_bytes(name: str) -> int:
    """The projector's tensor bytes, which clip.cpp logs as `load_hparams: model size`."""
    return sum(nbytes for *_, nbytes in mmproj_table(name))


def _write_sparse(w: GGUFWriter, table: list[tuple[str, tuple[int, ...], T, int]]) -> None:
    """Tensor infos, then a hole for the data up to the exact end of the last tensor."""
    offset = 0
    for name, ne, t, nbytes in table:
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=t)
        offset += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    fout.truncate(GGUFWriter.ggml_pad(fout.tell(), w.data_alignment) + offset)
    w.close()


def write_mmproj(name: str, out: Path) -> Path:
    """Write the projector `name` (F16, as published) to `out`, full size and sparse."""
    if name not in PROJECTORS:
        raise KeyError(f"projector {name!r}: one of {', '.join(PROJECTORS)}")
    p = PROJECTORS[name]
    out = Path(out)
    w = _Writer(str(out), "clip")  # gguf MODEL_ARCH.MMPROJ
    w.add_type("mmproj")
    w.add_name(p.name)
    w.add_file_type(int(LlamaFileType.MOSTLY_F16))
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(p.n_embd_text)
    w.add_vision_image_size(p.image_size)
    w.add_vision_patch_size(p.patch_size)
    w.add_vision_embedding_length(p.n_embd)
    w.add_vision_feed_forward_length(p.n_ff)
    w.add_vision_block_count(p.n_layer)
    w.add_vision_head_count(p.n_head)
    w.add_vision_image_mean(list(p.image_mean))
    w.add_vision_image_std(list(p.image_std))
    w.add_clip_projector_type(p.projector_type)
    w.add_vision_attention_layernorm_eps(p.eps)
    w.add_vision_use_gelu(True)
    _write_sparse(w, mmproj_table(name))
    return out


# --- the text model a projector attaches to (real_shape.py has no gemma3 architecture) ----------------

@dataclass(frozen=True)
class TextShape:
    shape: Shape
    sliding_window: int        # gemma3.attention.sliding_window
    rope_scale: float          # linear RoPE scaling of the global layers


def _gemma3(name: str, source: str, **shape) -> TextShape:
    return TextShape(Shape(name=name, arch="gemma3", source=source, n_vocab=262208, n_ctx_train=131072,
                           rope_theta=1e6, rms_eps=1e-6, quant="Q4_K_M", vocab="llama-spm", tied=True, **shape),
                     sliding_window=1024, rope_scale=8.0)


def _width_only(text: TextShape) -> TextShape:
    """The model's width with one layer and llama-spm's own 32000 tokens: what a projector needs of its
    text model (the n_embd check) at a few hundred MiB. clip's buffers do not depend on the text model
    (measured the same with the full gemma-3-12b shape)."""
    p = text.shape
    return replace(text, shape=replace(p, name=f"{p.name}-width", n_layer=1, n_vocab=32000,
                                       source=f"{p.name}'s width, one layer, llama-spm's 32000 tokens"))


# google/gemma-3-{4b,12b,27b}-it config.json text_config: max_position_embeddings 131072, vocab_size
# 262208, rope_theta 1e6 (global layers; local 1e4), rope_scaling linear factor 8, rms_norm_eps 1e-6,
# sliding_window 1024 (5 local layers per global), tied embeddings. Published GGUFs (ggml-org, Q4_K_M):
# 2.49 GB, 7,300,574,976 bytes, 16.5 GB. The tokenizer is llama-spm's 32000 tokens padded to 262208
# (both SentencePiece; Gemma 3's own vocabulary is not in llama.cpp's source).
_TEXT_FULL = {
    "gemma-3-4b": _gemma3("gemma-3-4b", "google/gemma-3-4b-it config.json (text_config)", n_embd=2560,
                          n_layer=34, n_head=8, n_head_kv=4, head_dim=256, n_ff=10240),
    "gemma-3-12b": _gemma3("gemma-3-12b", "google/gemma-3-12b-it config.json (text_config)", n_embd=3840,
                           n_layer=48, n_head=16, n_head_kv=8, head_dim=256, n_ff=15360),
    "gemma-3-27b": _gemma3("gemma-3-27b", "google/gemma-3-27b-it config.json (text_config)", n_embd=5376,
                           n_layer=62, n_head=32, n_head_kv=16, head_dim=128, n_ff=21504),
}
TEXT: dict[str, TextShape] = {**_TEXT_FULL, **{f"{k}-width": _width_only(v) for k, v in _TEXT_FULL.items()}}


def text_table(name: str) -> list[tuple[str, tuple[int, ...], T, int]]:
    """(name, ne, type, bytes) of the gemma3 text model (llama.cpp b10729 src/models/gemma3.cpp), with
    llama-quantize's mix for its usual file type (real_shape.py's rules)."""
    p = TEXT[name].shape
    e, hd = p.n_embd, p.head_dim
    table: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (e, p.n_vocab))]
    for i in range(p.n_layer):
        b = f"blk.{i}."
        table += [
            (b + "attn_norm.weight", (e,)),
            (b + "attn_q.weight", (e, hd * p.n_head)),
            (b + "attn_k.weight", (e, hd * p.n_head_kv)),
            (b + "attn_v.weight", (e, hd * p.n_head_kv)),
            (b + "attn_output.weight", (hd * p.n_head, e)),
            (b + "post_attention_norm.weight", (e,)),
            (b + "attn_k_norm.weight", (hd,)),
            (b + "attn_q_norm.weight", (hd,)),
            (b + "ffn_norm.weight", (e,)),
            (b + "ffn_gate.weight", (e, p.n_ff)),
            (b + "ffn_up.weight", (e, p.n_ff)),
            (b + "ffn_down.weight", (p.n_ff, e)),
            (b + "post_ffw_norm.weight", (e,)),
        ]
    table.append(("output_norm.weight", (e,)))
    types = _tensor_types(p, table, p.quant)
    return [(n, ne, t, _nbytes(ne, t)) for (n, ne), t in zip(table, types)]


def write_text_shape(name: str, out: Path, vocab: Path | None = None) -> Path:
    """Write the text model `name` (its usual quantization) to `out`, full size and sparse."""
    text = TEXT[name]
    p = text.shape
    out = Path(out)
    w = _Writer(str(out), p.arch)
    _add_hparams(w, p, p.quant)
    w.add_sliding_window(text.sliding_window)
    w.add_rope_scaling_type(RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(text.rope_scale)
    _add_tokenizer(w, (vocab or vocab_dir()) / f"ggml-vocab-{p.vocab}.gguf", p.n_vocab)
    _write_sparse(w, text_table(name))
    return out

