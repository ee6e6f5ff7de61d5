"""The stack as the program uses it: config checked by every engine, and planned by asking each
server's engine. The layers below take the engines as a parameter (config and planning never
import engines/); this is where they are handed in, for ``__main__``, the render and the tests."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import config
from config.types import StackConfig
from engines import engine_of, engine_problems
from planning import capacity


def parse_stack(raw: Mapping[str, Any]) -> StackConfig:
    """A stack's config values, validated with every engine's checks; raises ConfigError."""
    return config.validate_values(raw, engine_problems)


def load_stack() -> StackConfig:
    """The running Pulumi stack's config, validated with every engine's checks."""
    return config.read_config(engine_problems)


def plan_capacity(stack: StackConfig, leaving: Optional[Mapping[str, Any]] = None) -> capacity.CapacityPlan:
    """The capacity plan, each server's memory estimated by its engine; raises CapacityError. ``leaving``: the
    GPU servers this update removes from a router's pool (config.history)."""
    return capacity.plan_stack(stack, lambda model, pool, path: engine_of(model).estimate(model, pool, path), leaving)


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
