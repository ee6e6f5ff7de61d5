"""Models on demand: one llama.cpp server in router mode holding several models, each loaded when a
request names it (``ModelServer.on_demand``). Which may be loaded together is decided by memory, planned
(planning/residency.py) and held at run time by the admission proxy in the pod (incluster/admission_proxy.py)."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field, model_validator

from .defaults import PREFETCH_IMAGE
from .model_settings import ModelOverrides, over_the_catalog
from .values import HfRepo, PinnedImage, Strict, doc

# The most models one router serves: the plan checks every set of them that can be resident (2^16).
MAX_MODELS = 256

# A public model name: what a client sends as "model" and the router's preset section.
ModelName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class OnDemandModel(ModelOverrides):
    """One model the router may load: its own llama.cpp settings (config/model_settings.py), each null for
    the server's."""

    @model_validator(mode="before")
    @classmethod
    def _facts_over_the_catalog(cls, data: object) -> object:
        return over_the_catalog(data)

    hf_repo: HfRepo = doc("llama.cpp's --hf-repo for this model (org/Model-GGUF:QUANT).")
    pinned: bool = doc(
        "Loaded by the admission proxy when the server starts, and kept: the proxy never unloads it to make "
        "room, and loads it again within 30 s when the router loses it (llama.cpp's router has no pin of its own). "
        "Every other model must fit beside the pinned ones.",
        default=False,
    )


class OnDemand(Strict):
    """Several models behind one server, loaded on request (llama.cpp's router)."""

    models: Annotated[dict[ModelName, OnDemandModel], Field(min_length=2, max_length=MAX_MODELS)] = doc(
        f"The models, by the name clients send as \"model\" (2 to {MAX_MODELS}; more: a second server)."
    )
    max_loaded: Optional[Annotated[int, Field(ge=1, le=MAX_MODELS)]] = doc(
        "At most this many models resident at once, whatever fits; null: as many as fit. Which fit is decided "
        "by memory: the admission proxy in the pod loads a model only when the plan's memory of the resident "
        "models and it fits what the node and its GPU leave the server, unloading the least recently used idle "
        "model first.",
        default=None,
    )
    programs_image: PinnedImage = doc(
        "The image of the init container that fetches the models, of the keeper sidecar and of the admission proxy "
        "(needs python3; nothing "
        "is installed): a registry mirror's copy on an air-gapped cluster.", default=PREFETCH_IMAGE)
    idle_unload_seconds: Optional[Annotated[int, Field(ge=10, le=86_400)]] = doc(
        "--sleep-idle-seconds: a model idle this long is put to sleep, giving its memory back; null: never.",
        default=None,
    )
