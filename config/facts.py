"""A model's architecture facts (what the memory and speed plans read) and the KV cache types."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from .values import doc, Number, Positive, Strict

KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


class Projector(Strict):
    """A vision projector as llama.cpp holds it (measured: tests/test_projector_oracle.py)."""

    weights_mib: Annotated[Number, Field(gt=0)] = doc("Its weights as loaded (the mmproj file's tensors).")
    compute_mib: Annotated[Number, Field(ge=0)] = doc(
        "The compute buffer llama.cpp reserves for it at load with flash attention, its default on CPU and CUDA.")
    compute_no_fa_mib: Optional[Annotated[Number, Field(ge=0)]] = doc(
        "The same without flash attention, counted on the other backends; null: compute_mib.", default=None)


# Ten trillion parameters: past any model, and keeps every product of the plan finite.
MAX_PARAMS_B = 10_000
# llama.cpp's smallest file type is IQ1_S at 1.5625 bits per weight; F32 the largest (tools/quantize, b10729).
MIN_BITS, MAX_BITS = 1.5, 32


class ModelFacts(Strict):
    """What the memory model needs to know about a model's architecture."""

    params_b: Annotated[Number, Field(gt=0, le=MAX_PARAMS_B)] = doc("Parameters, in billions.")
    active_params_b: Optional[Annotated[Number, Field(gt=0, le=MAX_PARAMS_B)]] = doc(
        "Parameters read per token, for mixture-of-experts; null: dense (all of them).", default=None
    )
    layers: Positive = doc("Transformer blocks.")
    full_attention_layers: Optional[Positive] = doc(
        "Layers with a KV cache; hybrid models (Gated DeltaNet, Mamba) have fewer than layers. null: all.", default=None
    )
    sliding_window: Optional[Positive] = doc(
        "Window of the sliding-window attention layers (Gemma 3: 1024, gpt-oss: 128). llama.cpp keeps only "
        "window-sized KV for them (unless --swa-full); null: the model has none.",
        default=None,
    )
    sliding_window_layers: Optional[Positive] = doc(
        "How many layers use the sliding window (they are not in full_attention_layers).", default=None
    )
    expert_params_b: Optional[Annotated[Number, Field(gt=0, le=MAX_PARAMS_B)]] = doc(
        "Mixture-of-experts: parameters in the routed experts, all layers together (the rest, attention and shared "
        "parts, is read for every token). Needed to plan cpu_moe_layers; null: not known.",
        default=None,
    )
    embedding_length: Optional[Positive] = doc(
        "Width of the token embedding (hidden size). With vocab_size: the input embedding, which llama.cpp always "
        "keeps in system RAM, and the output layer, which -ngl offloads first. null: not known (counted as layers).",
        default=None,
    )
    vocab_size: Optional[Positive] = doc("Tokens in the vocabulary (see embedding_length).", default=None)
    output_layer: Literal["separate", "tied", "none"] = doc(
        "The output (LM head) layer in the GGUF: separate (output.weight), tied (none in the file: llama.cpp uses a "
        "copy of the token embedding, so with -ngl >= 1 the table is held twice, in system RAM as the input and in "
        "VRAM as the output; measured: bench/results-vram-h200.json) or none (encoder-only embedding models).",
        default="separate")
    feed_forward_length: Optional[Positive] = doc(
        "Width of a dense block's feed-forward layer (intermediate_size): with embedding_length, sizes llama.cpp's "
        "compute buffer on a CPU. null: a 10% margin instead.",
        default=None,
    )
    experts_used: Optional[Positive] = doc("Mixture-of-experts: experts each token is routed to.", default=None)
    expert_feed_forward_length: Optional[Positive] = doc(
        "Mixture-of-experts: width of one expert's feed-forward layer (moe_intermediate_size).", default=None
    )
    kv_heads: Positive = doc("Key/value heads per attention layer.")
    attention_heads: Optional[Positive] = doc(
        "Query heads per attention layer (num_attention_heads): a CPU's attention over the KV cache costs per query "
        "head, so the decode prediction reads the cache slower where more query heads share a KV head. null: 4 per "
        "KV head, the measured models' usual.", default=None)
    head_dim: Positive = doc("Dimension of one head.")
    recurrent_state_mib: Annotated[Number, Field(ge=0)] = doc(
        "Fixed-size recurrent state per slot (hybrid models), independent of context.", default=0.0
    )
    bits_per_weight: Optional[Annotated[Number, Field(ge=MIN_BITS, le=MAX_BITS)]] = doc(
        "Overrides the quant's table value (checkpoints that are not GGUF): between llama.cpp's smallest type "
        "(IQ1_S, 1.56) and F32.", default=None
    )
    mmproj: Optional[Projector] = doc(
        "The vision projector the repo ships (mmproj-*.gguf): llama.cpp fetches and loads it beside the model, on the "
        "GPU when the model offloads, so the plan counts it. null: none, and a router's downloader fetches none even "
        "where the repo has one.", default=None)
    pooling: Optional[Literal["none", "mean", "cls", "last", "rank"]] = doc(
        "Embedding models: how token vectors are pooled into one (the GGUF's pooling_type). mean and cls need the "
        "whole input in one micro-batch: llama.cpp refuses a longer input (HTTP 500).",
        default=None,
    )

    @model_validator(mode="after")
    def _consistent(self) -> "ModelFacts":
        """The facts held to their own arithmetic: a part is never more than the whole."""
        for part, name in ((self.active_params_b, "active_params_b"), (self.expert_params_b, "expert_params_b")):
            if part is not None and part > self.params_b:
                raise ValueError(f"{name} {part} is more than params_b {self.params_b}: a part of the model is not "
                                 "larger than all of it")
        for part, name in ((self.full_attention_layers, "full_attention_layers"),
                           (self.sliding_window_layers, "sliding_window_layers")):
            if part is not None and part > self.layers:
                raise ValueError(f"{name} {part} is more than layers {self.layers}")
        return self
