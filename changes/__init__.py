"""Change preview: what ``pulumi up`` would do to each resource between two runs of the program,
modelled on the pulumi-kubernetes provider's and the Pulumi engine's rules, and what that means
for the running model servers (restarts, downloads, claims, collisions, downtime).

``python -m changes STACK --base REF`` compares a stack file at a git ref with the working tree's.
The two runs come from the offline runner (render.offline).
"""

from __future__ import annotations

from .preview import preview
from .provider import Action, ProviderOptions, decide
from .report import ChangeReport, Consequence, Entry

__all__ = ["Action", "ChangeReport", "Consequence", "Entry", "ProviderOptions", "decide", "preview"]
