"""Tiny random-weight GGUF models that a real llama-server loads in well under a second.

The tokenizer comes from a vocab-only GGUF that ships in llama.cpp's source (models/ggml-vocab-*.gguf);
the weights are random (the answers are noise, the server's behaviour is real). One architecture
(llama) serves both roles: `pooling` makes it an embedding model (mean pooling, as Qwen3-Embedding's
last-token pooling is, a pooled embedding per input), None a chat model.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, PoolingType

# head dim 32: a quantized KV cache (q8_0, q4_0 ...) needs head dims divisible by its 32-value blocks.
N_EMBD, N_LAYER, N_HEAD, N_FF = 128, 2, 4, 256
# Larger than any --ctx-size a stack renders, so the server never warns that -c exceeds training.
N_CTX_TRAIN = 262144


@lru_cache(maxsize=None)
def _tokenizer_fields(vocab_gguf: Path) -> tuple[tuple[str, object, GGUFValueType, GGUFValueType | None], ...]:
    """(key, value, type, array item type) of every tokenizer.* field; read once per vocab file
    (reading one takes ~1.4 s, most of a model's writing time)."""
    reader = GGUFReader(vocab_gguf)
    fields = []
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            value_type = field.types[0]
            fields.append((name, field.contents(), value_type, field.types[-1] if value_type == GGUFValueType.ARRAY else None))
    return tuple(fields)


def write_tiny_model(vocab_gguf: Path, out: Path, pooling: int | None = None, seed: int = 0) -> Path:
    writer = GGUFWriter(str(out), "llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)
    if pooling is not None:
        writer.add_pooling_type(PoolingType(pooling))
    n_vocab = 0
    for name, value, value_type, sub_type in _tokenizer_fields(vocab_gguf):
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        writer.add_key_value(name, value, value_type, sub_type=sub_type)
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int, ones: bool = False) -> None:
        data = np.ones(shape, dtype=np.float32) if ones else rng.standard_normal(shape, dtype=np.float32) * 0.02
        writer.add_tensor(name, data)

    tensor("token_embd.weight", n_vocab, N_EMBD)
    tensor("output_norm.weight", N_EMBD, ones=True)
    tensor("output.weight", n_vocab, N_EMBD)
    for i in range(N_LAYER):
        tensor(f"blk.{i}.attn_norm.weight", N_EMBD, ones=True)
        for part in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{part}.weight", N_EMBD, N_EMBD)
        tensor(f"blk.{i}.ffn_norm.weight", N_EMBD, ones=True)
        tensor(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        tensor(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        tensor(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
