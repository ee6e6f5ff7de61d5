"""Turn recorded registrations into the Kubernetes manifests the provider would apply."""

from __future__ import annotations

from typing import Any

import yaml

from .offline import ProgramRun, Registered

# How the Pulumi SDK marks a secret value on the wire.
_SECRET_SIG = "4dabf18193072939515e22adb298388d"
SECRET_TEXT = "<secret: set by Pulumi at deploy time, not rendered>"
_FIRST_KEYS = ("apiVersion", "kind", "metadata")


def _clean(value: Any) -> Any:
    """Wire values back to manifest values: secrets masked, integral floats back to ints."""
    if isinstance(value, dict):
        if value.get(_SECRET_SIG) is not None and "value" in value:
            return SECRET_TEXT
        return {k: _clean(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _unwrap(value: Any) -> Any:
    if isinstance(value, dict) and value.get(_SECRET_SIG) is not None and "value" in value:
        return value["value"]
    return value


def to_manifest(resource: Registered) -> dict[str, Any]:
    raw = dict(resource.inputs)
    if raw.get("kind") == "Secret":
        # Rendered Secrets carry placeholders; the values exist only in Pulumi's state.
        for field in ("data", "stringData"):
            if field in raw:
                raw[field] = {k: SECRET_TEXT for k in _unwrap(raw[field])}
    inputs = _clean(raw)
    ordered = {k: inputs[k] for k in _FIRST_KEYS if k in inputs}
    ordered.update({k: v for k, v in inputs.items() if k not in _FIRST_KEYS})
    return ordered


def file_name(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    parts = [manifest["kind"].lower()]
    if meta.get("namespace"):
        parts.append(meta["namespace"])
    parts.append(meta["name"])
    return "_".join(parts) + ".yaml"


# Applied first: everything else lives in a namespace or is governed by its policies.
_KIND_ORDER = {"Namespace": 0, "CiliumNetworkPolicy": 1, "NetworkPolicy": 1, "PersistentVolumeClaim": 2, "Secret": 2}


def manifests(run: ProgramRun) -> dict[str, dict[str, Any]]:
    """File name -> manifest for every Kubernetes resource of a run, in apply order."""
    rendered = [to_manifest(r) for r in run.kubernetes()]
    rendered.sort(key=lambda m: (_KIND_ORDER.get(m["kind"], 9), file_name(m)))
    result: dict[str, dict[str, Any]] = {}
    for manifest in rendered:
        name = file_name(manifest)
        if name in result:
            raise ValueError(f"two resources render to {name}: {manifest['kind']} names must be unique")
        result[name] = manifest
    return result


# libyaml's emitter when PyYAML was built with it: the pure-Python one was a third of a large render.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(manifest: dict[str, Any]) -> str:
    return yaml.dump(manifest, Dumper=_DUMPER, sort_keys=False, default_flow_style=False, width=120)
