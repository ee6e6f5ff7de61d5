"""Names, labels and type tokens shared by every component."""

from __future__ import annotations

from typing import Optional

TOKEN_PREFIX = "inference-plane:index"
# What the offline render passes for a `secure:` config value, which only the Pulumi CLI can decrypt.
OFFLINE_SECRET_PLACEHOLDER = "offline-render-placeholder"
NAME_LABEL = "app.kubernetes.io/name"
PART_OF = {"app.kubernetes.io/part-of": "inference-plane", "app.kubernetes.io/managed-by": "pulumi"}


def one_line(text: str) -> str:
    """An error message as exactly one printable line: control characters, line breaks and lone
    surrogates (which a stack value can hold) are shown escaped, never echoed raw."""
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else repr(c)[1:-1] for c in text)


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
