"""Models on demand: one llama.cpp server in router mode holding several models, each loaded when a
request names it and unloaded least-recently-used (``ModelServer.on_demand``). How many may be
loaded at once is planned from memory (planning/residency.py), never guessed as a count."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field

from .defaults import PREFETCH_IMAGE
from .model_settings import ModelOverrides
from .values import HfRepo, PinnedImage, Strict, doc

# A public model name: what a client sends as "model" and the router's preset section.
ModelName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class OnDemandModel(ModelOverrides):
    """One model the router may load: its own llama.cpp settings (config/model_settings.py), each null for
    the server's."""

    hf_repo: HfRepo = doc("llama.cpp's --hf-repo for this model (org/Model-GGUF:QUANT).")
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
