"""One home per engine: what a model server's engine is told (args, env), how it is probed and
scraped, which model name it answers to, and how much memory it holds.

``engine_of(model)`` is the only place that asks which engine a model runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from .llamacpp import LlamaCpp
from .openai_compatible import OpenAICompatible

if TYPE_CHECKING:
    from config.types import ModelServer

Engine = Union[LlamaCpp, OpenAICompatible]
ENGINES: dict[str, Engine] = {"llamacpp": LlamaCpp(), "openai": OpenAICompatible()}


def engine_of(model: "ModelServer") -> Engine:
    return ENGINES[model.engine]


def weights_flags() -> dict[str, str]:
    """Every engine's flags that name the weights it downloads, by their long form."""
    return {flag: long for engine in ENGINES.values() for flag, long in engine.weights_flags.items()}


__all__ = ["ENGINES", "Engine", "LlamaCpp", "OpenAICompatible", "engine_of", "weights_flags"]
