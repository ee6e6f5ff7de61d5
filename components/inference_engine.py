"""InferenceEngine: an OpenAI-compatible engine other than llama.cpp (the Strix Halo engine).

Any server that speaks the OpenAI API: its own image, arguments, port and health and metrics
paths, typically a StatefulSet with one replica per node and weights prefetched per replica.
"""

from __future__ import annotations

from config.types import ModelServer

from .model_server import ModelServerArgs, ModelServerBase

__all__ = ["InferenceEngine", "ModelServerArgs"]


class InferenceEngine(ModelServerBase):
    type_name = "InferenceEngine"
    role = None

    def _check(self, model: ModelServer) -> None:
        if model.engine != "openai":
            raise ValueError(f"{model.name}: InferenceEngine runs engine 'openai'; use LlamaServer for llama.cpp")
