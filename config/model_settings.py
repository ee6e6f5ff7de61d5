"""A model's llama.cpp settings, one shape: what a single-model server sets (``ModelServer`` has them
as its own fields) and what each model of a router may set for itself (``OnDemandModel``: the same
fields, each null for the server's). A new per-model flag is one field here."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field, create_model

from .facts import KvCacheType, ModelFacts
from .values import ContextTokens, LayerCount, Memory, MicroBatch, Slots, Strict, doc


class ModelSettings(Strict):
    """The llama.cpp settings that belong to a model (its weights, its placement, its context)."""

    weights: Optional[Memory] = doc(
        "Size of the weights download; null: parameters x the quant's bits per weight.", default=None
    )
    facts: Optional[ModelFacts] = doc(
        "Architecture facts; null: the catalog's for hf_repo. For a repo in the catalog, each key given replaces that "
        "one of the catalog's entry (an explicit null unsets an optional one); for another repo, the whole set.",
        default=None)
    gpu_layers: LayerCount = doc(
        "--n-gpu-layers: llama.cpp offloads the output layer and then the last N-1 transformer blocks; 0 runs on the "
        "CPU and requests no GPU; layers + 1 or more: everything.",
        default=99,
    )
    cpu_moe_layers: Optional[LayerCount] = doc(
        "Mixture-of-experts on a small card: the experts of the first N blocks stay in system RAM (--n-cpu-moe N) "
        "while attention, shared weights and KV stay on the GPU; planned per part, decode from both memories. "
        "Needs the model's expert_params_b. null: none.",
        default=None,
    )
    ctx_size: ContextTokens = doc(
        "--ctx-size: the longest request (prompt and answer) in tokens. All slots share one KV pool of this size "
        "(--kv-unified), so requests running at once share it too.",
        default=4096,
    )
    ubatch_size: Optional[MicroBatch] = doc(
        "--ubatch-size; null: llama.cpp's 512. Above 2048, --batch-size is raised with it (llama.cpp clamps the "
        "micro-batch to the batch).", default=None
    )
    parallel: Optional[Slots] = doc(
        "Slots (--parallel); null: the server's auto, 4 slots sharing one KV pool.", default=None
    )
    cache_type_k: Optional[KvCacheType] = doc(
        "--cache-type-k: q8_0 halves the K cache (about 1.06 bytes per element instead of 2), but decodes slower at "
        "depth where measured; null (with cache_type_v null): f16 where it fits the card, else q8_0 where that fits "
        "(the plan says so); a type set is kept.", default=None
    )
    cache_type_v: Optional[KvCacheType] = doc(
        "--cache-type-v: as cache_type_k for V (a quantized V cache needs flash attention, which the server turns on "
        "itself where the backend supports it); null: f16 (the server's default; the plan's choice sets both).",
        default=None,
    )


def over_the_catalog(data: object) -> object:
    """A `facts` block given for a repo in the catalog is read over the catalog's entry, key by key (the rest
    kept; an explicit null replaces too): one field changed without copying the other nine."""
    if not (isinstance(data, dict) and isinstance(data.get("facts"), dict) and isinstance(data.get("hf_repo"), str)):
        return data
    from .catalog import lookup

    base = lookup(data["hf_repo"])
    if base is None:
        return data
    return {**data, "facts": {**base.model_dump(exclude_defaults=True), **data["facts"]}}


# What a model of a router never takes from the server: what it is (its download, its architecture).
OWN = frozenset({"weights", "facts"})


def _overrides() -> type[Strict]:
    """ModelSettings with every field optional and null by default: a router's model takes the server's
    value for each it leaves null (ModelServer.as_single)."""
    fields = {}
    for name, info in ModelSettings.model_fields.items():
        annotation = info.annotation
        for meta in info.metadata:  # constraints (ge, le ...) stay with the value, inside the Optional
            annotation = Annotated[annotation, meta]
        described = info.description if name in OWN else f"{info.description} Null: the server's."
        fields[name] = (Optional[annotation], Field(default=None, description=described))
    return create_model("ModelOverrides", __base__=Strict, __doc__="A router model's own settings.", **fields)


ModelOverrides = _overrides()
