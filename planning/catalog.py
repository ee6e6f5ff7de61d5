"""Architecture facts for known models, keyed by Hugging Face repo.

A stack can serve any other model by giving ``models.<key>.facts`` in its config; these are
only defaults, so that a stack naming a known repo does not have to copy them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from config.types import ModelFacts, ModelServer


def _catalog() -> dict[str, "ModelFacts"]:
    from config.types import ModelFacts

    return {
        # Qwen3.6-35B-A3B (qwen35moe arch): 40 layers, 30 Gated DeltaNet + 10 gated full attention;
        # attention KV 2 heads x 256; ~3B active per token. DeltaNet state ~63 MiB per slot in f32.
        # Source: ../shared/reference/llamacpp.md section 4 (HF transformers qwen3_5_moe docs).
        "ggml-org/Qwen3.6-35B-A3B-GGUF": ModelFacts(
            params_b=35.0, active_params_b=3.0, layers=40, full_attention_layers=10, kv_heads=2, head_dim=256,
            recurrent_state_mib=63.0,
        ),
        # Qwen3-Embedding-0.6B: dense, 28 layers, 8 KV heads x 128 (Qwen3 configs); last-token pooling
        # (the model card's "last_token_pool"; pooling_type 3 in its GGUF).
        "Qwen/Qwen3-Embedding-0.6B-GGUF": ModelFacts(params_b=0.6, layers=28, kv_heads=8, head_dim=128, pooling="last"),
        # Qwen3-Embedding-8B: the Qwen3-8B body, dense, 36 layers, 8 KV heads x 128, 7.6B parameters.
        # Source: the Qwen3-8B config.json (num_hidden_layers 36, num_key_value_heads 8, head_dim 128).
        "Qwen/Qwen3-Embedding-8B-GGUF": ModelFacts(params_b=7.6, layers=36, kv_heads=8, head_dim=128, pooling="last"),
    }


_CACHE: dict[str, "ModelFacts"] = {}


def catalog() -> dict[str, "ModelFacts"]:
    """The built-in facts, built on first use (nothing is constructed at import time)."""
    if not _CACHE:
        _CACHE.update(_catalog())
    return _CACHE


def repo_of(hf_repo: str) -> str:
    return hf_repo.split(":", 1)[0]


def facts_for(model: "ModelServer") -> Optional["ModelFacts"]:
    """The model's own facts, else the catalog's for its repo, else None."""
    if model.facts is not None:
        return model.facts
    return catalog().get(repo_of(model.hf_repo)) if model.hf_repo else None
