"""OpenAIServer: an OpenAI-compatible engine other than llama.cpp (the Strix Halo engine).

Any server that speaks the OpenAI API: its own image, arguments, port and health and metrics
paths, typically a StatefulSet with one replica per node and weights prefetched per replica.
"""

from __future__ import annotations

from .model_server import ModelServerArgs, ModelServerBase

__all__ = ["OpenAIServer", "ModelServerArgs"]


class OpenAIServer(ModelServerBase):
    type_name = "OpenAIServer"
    # Its type until this release: running stacks know their servers by it (an alias keeps them).
    former_type_names = ("InferenceEngine",)
    role = None
