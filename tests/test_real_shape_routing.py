"""Real-shape GGUF files with token-dependent routing (lab/contract/real_shape.py, routing="token").

With all-zero weights every token of a mixture-of-experts model routes to the same experts, which times
MoE prefill and expert offload wrong (issue #33 item 7). routing="token" writes, in the zero file's exact
layout, a random token embedding, random routers and the pre-router norms at 1.0; everything else stays a
hole. Here the file is read back through its offsets (holes read as zeros, nothing else is read) and the
routing llama.cpp computes is redone in numpy: the residual stream is the token's embedding at every layer
(attention and expert outputs are zero), so layer l picks top-k(gate_inp[l] @ rms_norm(embd[token]) *
norm[l]).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T



from lab.contract.gguf_layout import read_layout
from lab.contract.real_shape import PRESETS, random_rows, routing_norm, write_real_shape

PRESET = "qwen3-30b-a3b"
MOE = [name for name, p in PRESETS.items() if p.n_expert]
N_TOKENS = 64


@pytest.fixture(scope="module")
def files(tmp_path_factory, llama_source):
    folder = tmp_path_factory.mktemp("routing")
    return {r: write_real_shape(PRESET, folder / f"{PRESET}-{r}.gguf", routing=r) for r in ("zero", "token")}


class _Tensors:
    """A GGUF's tensors by name, as views of a read-only memmap (a hole reads as zeros, unread)."""

    def __init__(self, path):
        self.kvs, infos, start = read_layout(path)
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        self.info = {name: (ne, t, start + off) for name, ne, t, off in infos}

    def raw_rows(self, name, rows):
        ne, t, at = self.info[name]
        block, size = GGML_QUANT_SIZES[t]
        row = ne[0] // block * size
        return t, np.stack([self.map[at + r * row: at + (r + 1) * row] for r in rows])

    def f32(self, name):
        ne, t, at = self.info[name]
        assert t == T.F32, (name, t)
        n = int(np.prod(ne))
        return self.map[at:at + 4 * n].view(np.float32).reshape(ne[::-1])


def _choices(f: _Tensors, layer: int, tokens: np.ndarray, eps: float) -> list[frozenset[int]]:
    """The experts llama.cpp's build_moe_ffn picks (softmax then top-k: the top-k of the logits)."""
    p = PRESETS[PRESET]
    t, raw = f.raw_rows("token_embd.weight", tokens)
    x = quants.dequantize(raw, t).astype(np.float64)
    x = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    x = x * f.f32(f"blk.{layer}.{routing_norm(p)}.weight")
    logits = x @ f.f32(f"blk.{layer}.ffn_gate_inp.weight").astype(np.float64).T   # (tokens, n_expert)
    top = np.argsort(-logits, axis=1, kind="stable")[:, :p.n_expert_used]
    return [frozenset(row.tolist()) for row in top]


def test_same_layout_as_the_zero_file(files):
    zero, token = (read_layout(files[r]) for r in ("zero", "token"))
    assert token[1] == zero[1]            # names, shapes, types, offsets
    assert token[2] == zero[2]            # data start
    assert os.path.getsize(files["token"]) == os.path.getsize(files["zero"])
    with open(files["zero"], "rb") as a, open(files["token"], "rb") as b:
        assert a.read(zero[2]) == b.read(zero[2])   # the whole header, byte for byte


def test_only_the_routing_tensors_take_disk(files):
    p = PRESETS[PRESET]
    f = _Tensors(files["token"])
    ne, t, _ = f.info["token_embd.weight"]
    written = ne[1] * ne[0] // GGML_QUANT_SIZES[t][0] * GGML_QUANT_SIZES[t][1] + p.n_layer * (p.n_expert + 1) * p.n_embd * 4
    allocated = os.stat(files["token"]).st_blocks * 512
    assert written <= allocated < written + (64 << 20), (written, allocated)
    assert allocated < os.path.getsize(files["token"]) // 50     # ~230 MB of an 18.6 GB file
    assert os.stat(files["zero"]).st_blocks * 512 < 32 << 20


def test_embedding_is_valid_random_blocks(files):
    f = _Tensors(files["token"])
    rows = np.random.default_rng(0).choice(PRESETS[PRESET].n_vocab, 256, replace=False)
    t, raw = f.raw_rows("token_embd.weight", rows)
    x = quants.dequantize(raw, t)
    assert t == T.Q4_K                    # Q4_K_M keeps token_embd at Q4_K
    assert np.isfinite(x).all()
    assert 0.01 < x.std() < 0.05 and abs(x.mean()) < 0.002
    assert len({r.tobytes() for r in raw}) == len(rows)   # every token its own row


def test_norms_and_routers(files):
    p = PRESETS[PRESET]
    f = _Tensors(files["token"])
    for layer in (0, p.n_layer // 2, p.n_layer - 1):
        assert (f.f32(f"blk.{layer}.{routing_norm(p)}.weight") == 1).all()
        gate = f.f32(f"blk.{layer}.ffn_gate_inp.weight")
        assert gate.shape == (p.n_expert, p.n_embd) and np.isfinite(gate).all()
        assert 0.8 < gate.std() * np.sqrt(p.n_embd) < 1.2
        assert not f.f32(f"blk.{layer}.attn_norm.weight").any()   # attention still sees zeros
    assert not np.array_equal(f.f32("blk.0.ffn_gate_inp.weight"), f.f32(f"blk.{p.n_layer - 1}.ffn_gate_inp.weight"))


def test_experts_depend_on_the_token(files):
    p = PRESETS[PRESET]
    eps = PRESETS[PRESET].rms_eps
    tokens = np.random.default_rng(1).choice(p.n_vocab, N_TOKENS, replace=False)
    token, zero = _Tensors(files["token"]), _Tensors(files["zero"])
    for layer in (0, p.n_layer - 1):
        chosen = _choices(token, layer, tokens, eps)
        assert len(set(chosen)) >= N_TOKENS // 2, layer
        assert len(frozenset().union(*chosen)) >= 0.75 * p.n_expert, layer
        # the zero file: every logit 0, so llama.cpp's top-k is the same set for every token
        assert not zero.f32(f"blk.{layer}.ffn_gate_inp.weight").any()
        assert not zero.raw_rows("token_embd.weight", tokens)[1].any()
    assert _choices(token, 0, tokens, eps) != _choices(token, p.n_layer - 1, tokens, eps)


@pytest.mark.parametrize("preset", MOE)
def test_every_moe_preset_writes_token_routing(preset, tmp_path, llama_source):
    p = PRESETS[preset]
    path = write_real_shape(preset, tmp_path / "m.gguf", routing="token")
    zero = write_real_shape(preset, tmp_path / "z.gguf")
    assert read_layout(path)[1:] == read_layout(zero)[1:]
    f = _Tensors(path)
    assert (f.f32(f"blk.{p.n_layer - 1}.{routing_norm(p)}.weight") == 1).all()
    assert f.f32(f"blk.{p.n_layer - 1}.ffn_gate_inp.weight").any()
    t, raw = f.raw_rows("token_embd.weight", [0, p.n_vocab - 1])
    assert np.isfinite(quants.dequantize(raw, t)).all() and raw.any()


def test_another_mix(tmp_path, llama_source):
    path = write_real_shape(PRESET, tmp_path / "m.gguf", "Q8_0", routing="token")
    t, raw = _Tensors(path).raw_rows("token_embd.weight", range(0, PRESETS[PRESET].n_vocab, 4099))
    x = quants.dequantize(raw, t)
    assert t == T.Q8_0 and np.isfinite(x).all() and 0.01 < x.std() < 0.05


@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.F16, T.BF16, T.F32, T.Q5_0, T.Q5_1])
def test_random_rows_every_embedding_type(t):
    """Each type a token_embd can have in these mixes (Q5_0/Q5_1: llama-quantize's fallbacks)."""
    raw = random_rows(t, 16, 2048, np.random.default_rng(2))
    assert raw.dtype == np.uint8 and raw.shape == (16, 2048 // GGML_QUANT_SIZES[t][0] * GGML_QUANT_SIZES[t][1])
    x = quants.dequantize(raw, t)
    assert x.shape == (16, 2048) and np.isfinite(x).all()
    assert 0.015 < x.std() < 0.03 and abs(x.mean()) < 0.002


def test_dense_presets_refuse_token_routing(tmp_path, llama_source):
    with pytest.raises(ValueError, match="no experts"):
        write_real_shape("qwen3-8b", tmp_path / "d.gguf", routing="token")
    with pytest.raises(ValueError, match="routing"):
        write_real_shape(PRESET, tmp_path / "d.gguf", routing="random")
    assert not (tmp_path / "d.gguf").exists()
