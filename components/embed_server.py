"""EmbedServer: the embedding endpoint, for RAG and semantic search, in-cluster unless exposed.

Deliberately separate from the chat server and never on a chat path: an embedding model has no
generative training, and `--embeddings` does not make llama.cpp refuse chat completions, so a chat
request answers fluent nonsense ("capital capital capital ...") instead of an error. llama.cpp
cannot hide a model from the WebUI picker, so the only way to keep it out is to keep it off every
chat-facing endpoint. Exposed on request (a notes app on the LAN), its Ingress routes the exact
embeddings path alone, and only a server that takes an API key may be exposed.
"""

from __future__ import annotations

from config.types import ModelServer
from engines import ServerBuild

from .model_server import ModelServerArgs, ModelServerBase

__all__ = ["EmbedServer", "ModelServerArgs"]


class EmbedServer(ModelServerBase):
    """llama.cpp with --embeddings and --no-ui behind a ClusterIP-only Service."""

    type_name = "EmbedServer"
    role = "embedding"

    def _check(self, model: ModelServer, built: ServerBuild) -> None:
        super()._check(model, built)
        if model.exposure is not None and model.api_key is None:  # refused by config first
            raise ValueError(f"{model.name}: an exposed embedding server needs an API key")
        if model.webui:
            raise ValueError(f"{model.name}: an embedding server runs with --no-ui")
