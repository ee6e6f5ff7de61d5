"""The stack's configuration, laid out one job per module (after kind's apis/config):

- ``values``: what a single field may hold (DNS names, quantities, pinned images ...)
- ``defaults``: defaults that encode a lesson, with the reason
- ``types``: the models, every field documented (``model_settings``, ``on_demand``, ``gateway``, ``facts``
  and ``gpus`` hold parts of them)
- ``checks``: the checks between fields, each a config path and the fix
- ``validation``: user values -> ``StackConfig`` or one ``ConfigError`` line (``validate_values``)
- ``load``: reading the running stack's config from the Pulumi engine (``read_config``); ``history``:
  the last update's record
"""

from common.errors import ConfigError

from .load import read_config
from .types import StackConfig
from .validation import validate_values

__all__ = ["ConfigError", "StackConfig", "read_config", "validate_values"]
