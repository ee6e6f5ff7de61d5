"""The stack as the program uses it: config checked by every engine, and planned by asking each
server's engine. The layers below take the engines as a parameter (config and planning never
import engines/); this is where they are handed in, for ``__main__``, the render and the tests."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import config
from config.types import StackConfig
from common.errors import CapacityError
from engines import engine_of, engine_problems, quantized_kv_cost
from planning import capacity


def parse_stack(raw: Mapping[str, Any]) -> StackConfig:
    """A stack's config values, validated with every engine's checks; raises ConfigError."""
    return config.validate_values(raw, engine_problems)


def load_stack() -> StackConfig:
    """The running Pulumi stack's config, validated with every engine's checks."""
    return config.read_config(engine_problems)


def plan_stack(stack: StackConfig, leaving: Optional[Mapping[str, Any]] = None
               ) -> tuple[StackConfig, capacity.CapacityPlan]:
    """The stack as it will run and its plan. A server on a discrete card that leaves its KV cache type unset
    gets f16 (faster at depth where measured) where that fits, else its engine's fallback (llama.cpp's q8_0, half
    the bytes) where that fits, said in the plan's warnings with what it costs; a stack that sets a type keeps
    it. Where neither fits, the f16 plan's CapacityError (whose fixes name the cache types)."""
    try:
        return stack, plan_capacity(stack, leaving)
    except CapacityError as error:
        f16 = error  # (the name `error` ends with its except clause)
        # Only a server refused for its card's memory (the plan's VRAM refusals name gpu_layers or gpus): any other
        # refusal stands as it is, never met by a quietly smaller cache.
        refused = {path.split(".")[1] for path, _ in error.problems if _card_refusal(path)}
        fallback = {key: engine_of(model).kv_cache_fallback for key, model in stack.models.items()
                    if key in refused and model.cache_type_k is None and model.cache_type_v is None
                    and model.uses_gpu(stack.node_pools[model.node_pool])
                    and stack.node_pools[model.node_pool].vram is not None}
        fallback = {key: kind for key, kind in fallback.items() if kind is not None}
        if not fallback:
            raise
        models = {key: model.model_copy(update={"cache_type_k": fallback[key], "cache_type_v": fallback[key]})
                  if key in fallback else model for key, model in stack.models.items()}
        chosen = stack.model_copy(update={"models": models})
        try:
            plan = plan_capacity(chosen, leaving)
        except CapacityError:
            raise error from None
    why = {path.split(".")[1]: message for path, message in reversed(f16.problems) if _card_refusal(path)}
    for key, kind in fallback.items():
        plan.warnings.append(
            f"models.{key}: cache_type_k/v unset, and an f16 KV cache does not fit ({why[key]}); planned and run "
            f"with {kind}, half the bytes ({quantized_kv_cost()}); set cache_type_k/v to keep a type")
    return chosen, plan


def _card_refusal(path: str) -> bool:
    """A refusal of a server for what it needs on its card (planning/capacity.py _vram_problems)."""
    parts = path.split(".")
    return len(parts) == 3 and parts[0] == "models" and parts[2] in ("gpu_layers", "gpus")


def plan_capacity(stack: StackConfig, leaving: Optional[Mapping[str, Any]] = None) -> capacity.CapacityPlan:
    """The capacity plan, each server's memory estimated by its engine; raises CapacityError. ``leaving``: the
    GPU servers this update removes from a router's pool (config.history)."""
    return capacity.plan_stack(
        stack, lambda model, pool, path: (engine_of(model).estimate(model, pool, path, stack.node_pools) if model.rpc
                                          else engine_of(model).estimate(model, pool, path)), leaving)


# The stack output that carries config.history.snapshot() from one update to the next.
HISTORY_OUTPUT = "history"


def previous_history() -> Optional[dict[str, Any]]:
    """The ``history`` output of this stack's last update, or None (first update, offline).

    Read with the engine's builtin invoke ``pulumi:pulumi:readStackOutputs`` (pkg/resource/deploy/
    builtins.go), the call the SDKs' StackReference makes to read a stack's outputs, here naming
    the running stack itself; synchronous, so it decides before any resource is registered."""
    import pulumi

    name = f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    try:
        result = pulumi.runtime.invoke("pulumi:pulumi:readStackOutputs", {"name": name})
    except Exception:  # noqa: BLE001 - no state yet (a new stack) reads as no history
        return None
    outputs = (result.value or {}).get("outputs") if result is not None else None
    found = (outputs or {}).get(HISTORY_OUTPUT)
    return found if isinstance(found, dict) else None
