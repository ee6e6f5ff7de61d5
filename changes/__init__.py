"""Change preview: what ``pulumi up`` would do to each resource between two runs of the program,
modelled on the pulumi-kubernetes provider's and the Pulumi engine's rules, and what that means
for the running model servers (restarts, downloads, claims, collisions, downtime).

``python -m changes STACK --base REF`` compares a stack file at a git ref with the working tree's.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .preview import ChangeReport, Consequence, Entry, preview
from .provider import Action, ProviderOptions, decide

__all__ = ["Action", "ChangeReport", "Consequence", "Entry", "ProviderOptions", "decide", "engine", "preview"]

def engine() -> ModuleType:
    """The offline engine's module (run_program, stack_config, config_from_mapping, Registered)."""
    return importlib.import_module("render.offline")
