"""LlamaServer: the chat endpoint, and the only model server that may sit behind an Ingress."""

from __future__ import annotations

from .model_server import ModelServerArgs, ModelServerBase

__all__ = ["LlamaServer", "ModelServerArgs"]


class LlamaServer(ModelServerBase):
    """llama.cpp serving one chat model, with its WebUI, optionally exposed on the LAN."""

    type_name = "LlamaServer"
    role = "chat"
