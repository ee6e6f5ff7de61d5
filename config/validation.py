"""Validation: the user's values become a ``StackConfig`` here, or every problem is reported in
one line (path, what is wrong, the fix). Nothing else in the program checks user input."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any, Callable, Mapping, Optional, Sequence

from pydantic import ValidationError

from common.errors import ConfigError

from .checks import stack_problems
from .types import Problem, StackConfig

# Each engine's checks of its own settings (engines.engine_problems), handed in by the caller:
# config sits below the engines and never imports them.
EngineChecks = Callable[[StackConfig], list[Problem]]


def path_part(part: Any) -> str:
    """A path segment as the user typed it, or quoted when it holds anything unusual."""
    text = str(part)
    return text if re.fullmatch(r"[A-Za-z0-9_./:-]{1,80}", text) else repr(text)[:80]


def _model_at(loc: tuple) -> Any:
    """The config model class at a path, or None: walks the models' annotations through
    Optional/Annotated, dict values and list items (whose key or index is the next part)."""

    def unwrap(annotation: Any) -> tuple[Any, bool]:
        """(a model class or None, whether a dict key / list index comes first)."""
        while getattr(annotation, "model_fields", None) is None:
            origin, args = typing.get_origin(annotation), [a for a in typing.get_args(annotation) if a is not type(None)]
            if origin in (dict, list):
                inner, _ = unwrap(args[-1]) if args else (None, False)
                return inner, True
            if not args:
                return None, False
            annotation = args[0]
        return annotation, False

    current, keyed = StackConfig, False
    for part in loc:
        if current is None:
            return None
        if keyed:
            keyed = False
            continue
        field = current.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        current, keyed = unwrap(field.annotation)
    return None if keyed else current


def _keys_at(loc: tuple) -> list[str]:
    """The field names valid at a config path (for "did you mean")."""
    model = _model_at(loc)
    return list(model.model_fields) if model is not None else []


def _indentation_slip(key: str, parent: tuple) -> Optional[str]:
    """Where the key is valid one level up or one level down: an indentation slip that is still valid YAML."""
    if len(parent) >= 1 and key in _keys_at(parent[:-1]):
        return (f"unknown key here, but {config_path(parent[:-1]) or 'the stack'} takes {key}: an indentation slip? "
                "move it one level out")
    for child in _keys_at(parent):
        if key in _keys_at(parent + (child,)):
            return f"unknown key here, but {config_path(parent + (child,))} takes {key}: an indentation slip? move it under {child}"
    return None


def config_path(loc: Sequence[Any]) -> str:
    """models.chat.extra_args[0]: list positions in brackets, as `pulumi config set --path` takes them."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + path_part(part))
    return out


# What to write instead, for pydantic's type errors (which say only what was expected).
_TYPE_FIXES = {
    "int_parsing": "write a whole number without quotes or units, e.g. 16384",
    "int_type": "write a whole number without quotes or units, e.g. 16384",
    "int_from_float": "write a whole number, e.g. 16384",
    "float_parsing": "write a number without quotes or units, e.g. 12.5",
    "float_type": "write a number without quotes or units, e.g. 12.5",
    "bool_parsing": "write true or false, without quotes",
    "bool_type": "write true or false, without quotes",
    "string_type": "quote it, e.g. \"1.33\" (unquoted, YAML reads a number)",
    "list_type": "write a list, e.g. [a, b] (a single item too)",
    "greater_than": "raise it",
    "greater_than_equal": "raise it",
    "less_than": "lower it",
    "less_than_equal": "lower it",
}


# Keys a release renamed: what to write instead, and why the name changed.
RENAMED = {
    "downloader_image": "renamed programs_image: the image also runs the admission proxy and the keeper, not only "
                        "the downloader; rename the key (same value)",
}


def _describe(error: Mapping[str, Any]) -> tuple[str, str]:
    path = config_path(error["loc"]) or "(stack)"
    kind = error["type"]
    if kind == "extra_forbidden":
        key, parent = str(error["loc"][-1]), error["loc"][:-1]
        if key in RENAMED:
            return path, RENAMED[key]
        near = difflib.get_close_matches(key, _keys_at(parent), n=1, cutoff=0.6)
        if near:
            return path, f"unknown key; did you mean {near[0]}?"
        slip = _indentation_slip(key, parent)
        return path, slip or "unknown key; remove it or check its spelling"
    if kind == "missing":
        return path, "required; set it"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        # Never name a Python class to the user: say what the YAML should look like.
        return path, f"expected a mapping of settings (key: value lines under {path.rsplit('.', 1)[-1]}){_null_ok(error)}"
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, (str, int, float, bool)):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        if shown not in message:
            message = f"{message} (got {shown})"
    fix = _TYPE_FIXES.get(kind)
    if fix:
        message = f"{message}; {fix}"
    if len(message) > 300:
        message = message[:297] + "..."
    return path, message


def _null_ok(error: Mapping[str, Any]) -> str:
    """', or null' when the field may be left out with null."""
    loc = error["loc"]
    parent = _model_at(loc[:-1]) if loc else None
    field = parent.model_fields.get(loc[-1]) if parent is not None else None
    return ", or null" if field is not None and type(None) in typing.get_args(field.annotation) else ""


def validate_values(raw: Mapping[str, Any], engine_checks: EngineChecks) -> StackConfig:
    """Validate a stack's config values (top-level key -> decoded value): the fields, the checks
    between them and every engine's checks, reported together; raise ConfigError."""
    try:
        stack = StackConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigError([_describe(e) for e in exc.errors()]) from None
    problems = stack_problems(stack) + engine_checks(stack)
    if problems:
        raise ConfigError(problems)
    return stack
