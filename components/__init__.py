"""inference-plane's components: one ComponentResource per module.

SERVER_COMPONENTS maps the component type an engine names (``Engine.component_type``) to its class."""

from .embed_server import EmbedServer
from .llama_server import LlamaServer
from .model_server import ModelServerBase
from .openai_server import OpenAIServer

SERVER_COMPONENTS: dict[str, type[ModelServerBase]] = {c.type_name: c for c in (LlamaServer, EmbedServer, OpenAIServer)}

__all__ = ["SERVER_COMPONENTS", "EmbedServer", "LlamaServer", "OpenAIServer"]
