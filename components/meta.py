"""Labels, metadata and type tokens every component builds its objects with."""

from __future__ import annotations

from typing import Optional

from common.constants import NAME_LABEL, PART_OF, TOKEN_PREFIX


def token(type_name: str) -> str:
    return f"{TOKEN_PREFIX}:{type_name}"


def selector(app: str) -> dict[str, str]:
    """The only labels a selector uses: selectors are immutable, so they stay this small."""
    return {NAME_LABEL: app}


def labels(app: str, component: Optional[str] = None) -> dict[str, str]:
    result = {**selector(app), **PART_OF}
    if component:
        result["app.kubernetes.io/component"] = component
    return result


def metadata(name: str, namespace: str, app: Optional[str] = None, component: Optional[str] = None,
             annotations: Optional[dict[str, str]] = None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": labels(app or name, component)}
    if annotations:
        meta["annotations"] = annotations
    return meta


# On a Secret the program creates: what each of its keys must hold, one "key: what" per line. A
# rendered folder has no values, so its SECRETS.md says how the keys relate (e.g. a metrics token
# that must be the first line of the key file) instead of leaving a person to guess.
VALUE_NOTES_ANNOTATION = "inference-plane/values"


def value_notes(holds: dict[str, str]) -> str:
    return "\n".join(f"{key}: {what}" for key, what in sorted(holds.items()))
