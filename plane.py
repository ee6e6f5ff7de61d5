"""The stack as the program uses it: config checked by every engine, and planned by asking each
server's engine. The layers below take the engines as a parameter (config and planning never
import engines/); this is where they are handed in, for ``__main__``, the render and the tests."""

from __future__ import annotations

from typing import Any, Mapping

import config
from config.types import StackConfig
from engines import engine_of, stack_problems
from planning import capacity


def parse_stack(raw: Mapping[str, Any]) -> StackConfig:
    """A stack's config values, validated with every engine's checks; raises ConfigError."""
    return config.parse_stack(raw, stack_problems)


def load_stack() -> StackConfig:
    """The running Pulumi stack's config, validated with every engine's checks."""
    return config.load_stack(stack_problems)


def plan_capacity(stack: StackConfig) -> capacity.CapacityPlan:
    """The capacity plan, each server's memory estimated by its engine; raises CapacityError."""
    return capacity.plan_capacity(stack, engine_of)
