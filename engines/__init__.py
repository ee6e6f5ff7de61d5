"""One home per engine: what a model server's engine is told (args, env), how it is probed,
scraped and authenticated, which model name it answers to, how much memory it holds, and which of
its settings are wrong. Every engine implements ``engines.base.Engine`` in a module of its own and
is registered in ENGINES below; that is all adding an engine takes.

``engine_of(model)`` is the only place that asks which engine a model runs: the config's `engine:`
value, and which engine's settings block (``Engine.settings_block``) the server sets.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from .base import Credentials, Engine, Problem, ServerBuild
from .llamacpp import LlamaCpp
from .llamacpp_router import LlamaCppRouter
from .llamacpp_speed import (BACKEND_NAMES, backend_advice,  # the stack writer's word on Radeon and Arc images
                             quantized_kv_cost)  # and on the KV cache type it writes
from .openai_compatible import OpenAICompatible

if TYPE_CHECKING:
    from config.types import ModelServer, StackConfig
    from planning.capacity import CapacityPlan

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (LlamaCpp(), LlamaCppRouter(), OpenAICompatible())}


def config_names() -> tuple[str, ...]:
    """The values of a server's `engine:` setting."""
    return tuple(dict.fromkeys(engine.config_name for engine in ENGINES.values()))


def _block_set(model: "ModelServer", engine: Engine) -> bool:
    return engine.settings_block is not None and getattr(model, engine.settings_block, None) is not None


def engine_of(model: "ModelServer") -> Engine:
    """The engine of the server's `engine:` value whose settings block it sets, else the one without a
    block (else the first: its checks say the block is missing)."""
    named = [engine for engine in ENGINES.values() if engine.config_name == model.engine]
    if not named:
        raise KeyError(f"{model.name}: no engine {model.engine!r}")
    return next((e for e in named if _block_set(model, e)), None) or next(
        (e for e in named if e.settings_block is None), named[0])


def block_problems(model: "ModelServer", path: str) -> list[Problem]:
    """Another engine's settings block on a server is refused: its engine would never read it."""
    return [(f"{path}.{engine.settings_block}",
             f"engine {model.engine} does not read an {engine.settings_block} block; remove it, or set engine: "
             f"{engine.config_name}") for engine in ENGINES.values()
            if _block_set(model, engine) and engine.config_name != model.engine]


def weights_flags() -> dict[str, str]:
    """Every engine's flags that name the weights it downloads, by their long form."""
    return {flag: long for engine in ENGINES.values() for flag, long in engine.weights_flags.items()}


def engine_problems(stack: "StackConfig") -> list[Problem]:
    """What each server's engine says of its settings, and the checks between servers that depend on
    what an engine can do (run by config validation with the field checks, one report)."""
    problems: list[Problem] = []
    gateway_reaches = stack.gateway.local_models() if stack.gateway is not None else set()
    for key, model in stack.models.items():
        path = f"models.{key}"
        names = config_names()
        if model.engine not in names:
            near = difflib.get_close_matches(model.engine, names, n=1, cutoff=0.6)
            problems.append((f"{path}.engine", (f"did you mean {near[0]}? " if near else "") +
                             f"{model.engine!r} is no engine this program runs; one of {', '.join(names)}"))
            continue
        blocks = block_problems(model, path)
        problems += blocks
        if blocks:
            continue
        engine = engine_of(model)
        problems += engine.config_problems(model, path, stack.node_pools.get(model.node_pool))
        if engine.credentials(model) is None or (model.role == "embedding" and model.exposure is not None):
            continue  # an exposed embedding server needs its key by config/checks.py (model_problems) already
        # An engine that takes a key is unauthenticated without one: required once anything outside
        # its namespace (an Ingress, the gateway's Envoy pods) reaches it.
        if model.api_key is None and (model.exposure is not None or key in gateway_reaches):
            via = "its Ingress" if model.exposure is not None else "the gateway"
            problems.append((
                f"{path}.api_key",
                f"required: {via} reaches this server from outside its namespace; "
                "set api_key: {secret_name: ..., from_config: <secret config key>}",
            ))
        elif key in gateway_reaches and model.api_key is not None and model.api_key.from_config is None:
            problems.append((
                f"{path}.api_key.from_config",
                "the gateway must send this server's key, so the key has to come from Pulumi config",
            ))
    direct = stack.gateway.llamacpp_embeddings if stack.gateway is not None else None
    if direct is not None:
        target = stack.models.get(direct.model)
        if target is None or target.role != "embedding" or not isinstance(engine_of(target), LlamaCpp):
            problems.append(("gateway.llamacpp_embeddings.model", "must name a llama.cpp embedding server in models"))
    return problems


def server_builds(stack: "StackConfig", plan: "CapacityPlan") -> dict[str, ServerBuild]:
    """Each planned server as its engine builds it (``Engine.build``): the one place the build side asks
    which engine a server runs; the components render from these."""
    return {key: engine_of(model).build(model, plan.servers[key], stack.model_cache.mount_path)
            for key, model in stack.models.items()}


__all__ = ["BACKEND_NAMES", "ENGINES", "Credentials", "Engine", "LlamaCpp", "LlamaCppRouter", "OpenAICompatible", "ServerBuild", "engine_of", "engine_problems",
           "backend_advice", "quantized_kv_cost", "server_builds", "weights_flags"]
