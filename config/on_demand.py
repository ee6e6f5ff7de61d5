"""Models on demand: one llama.cpp server in router mode holding several models, each loaded when a
request names it and unloaded least-recently-used (``ModelServer.on_demand``). How many may be
loaded at once is planned from memory (planning/residency.py), never guessed as a count."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field

from .defaults import PREFETCH_IMAGE
from .facts import KvCacheType, ModelFacts
from .values import ContextTokens, HfRepo, LayerCount, Memory, MicroBatch, PinnedImage, Slots, Strict, doc

# A public model name: what a client sends as "model" and the router's preset section.
ModelName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class OnDemandModel(Strict):
    """One model the router may load. Settings left null take the server's own."""

    hf_repo: HfRepo = doc("llama.cpp's --hf-repo for this model (org/Model-GGUF:QUANT).")
    weights: Optional[Memory] = doc("Size of the weights download; null: parameters x the quant's bits.", default=None)
    facts: Optional[ModelFacts] = doc("Architecture facts; null: from the catalog by hf_repo.", default=None)
    ctx_size: Optional[ContextTokens] = doc("--ctx-size; null: the server's.", default=None)
    gpu_layers: Optional[LayerCount] = doc("--n-gpu-layers; null: the server's.", default=None)
    cpu_moe_layers: Optional[LayerCount] = doc("--n-cpu-moe; null: the server's.", default=None)
    parallel: Optional[Slots] = doc("--parallel; null: the server's.", default=None)
    ubatch_size: Optional[MicroBatch] = doc("--ubatch-size; null: the server's.", default=None)
    cache_type_k: Optional[KvCacheType] = doc("--cache-type-k; null: the server's.", default=None)
    cache_type_v: Optional[KvCacheType] = doc("--cache-type-v; null: the server's.", default=None)
    pinned: bool = doc(
        "Loaded when the server starts (load-on-startup), so the first request for it does not wait. Not kept: "
        "llama.cpp's router has no pin and evicts the least recently used model, this one too; the plan counts it "
        "like any other model (any max_loaded of them fit).",
        default=False,
    )


class OnDemand(Strict):
    """Several models behind one server, loaded on request (llama.cpp's router)."""

    models: Annotated[dict[ModelName, OnDemandModel], Field(min_length=2)] = doc(
        "The models, by the name clients send as \"model\"."
    )
    max_loaded: Optional[Annotated[int, Field(ge=1, le=64)]] = doc(
        "--models-max; null: planned, the most models such that ANY that many fit the memory beside the node's "
        "other servers (none assumed resident: the router evicts whichever is least recently used). A larger value "
        "is refused.",
        default=None,
    )
    downloader_image: PinnedImage = doc(
        "The image of the init container that fetches the models and of the keeper sidecar (needs python3; nothing "
        "is installed): a registry mirror's copy on an air-gapped cluster.", default=PREFETCH_IMAGE)
    idle_unload_seconds: Optional[Annotated[int, Field(ge=10, le=86_400)]] = doc(
        "--sleep-idle-seconds: a model idle this long is put to sleep, giving its memory back; null: never.",
        default=None,
    )
