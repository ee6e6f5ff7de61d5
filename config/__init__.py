"""The stack's configuration, laid out one job per module (after kind's apis/config):

- ``values``: what a single field may hold (DNS names, quantities, pinned images ...)
- ``defaults``: defaults that encode a lesson, with the reason
- ``types``: the models, every field documented, with the checks between fields beside them
- ``validation``: user values -> ``StackConfig`` or one ``ConfigError`` line
- ``load``: reading the running stack's config from the Pulumi engine
"""

from common.errors import ConfigError

from .load import load_stack
from .types import StackConfig
from .validation import parse_stack

__all__ = ["ConfigError", "StackConfig", "load_stack", "parse_stack"]
