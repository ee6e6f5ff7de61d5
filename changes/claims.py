"""Consequences for claims: the ones lost or orphaned, claim templates the controller no longer
applies, a cache that must hold old and new weights at once, a claim resized in place."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from common.constants import NODE_LOCAL_CLASSES
from common.quantity import GIB

from .consequences import _Context, _Start
from .provider import ObjectId, diff_values, format_path, object_id, unwrap_secrets
from .workloads import ClaimKey, ServerHint, _bytes, _ClaimFate, _pvc_fate, _template_claim_fate, workload


def _old_claims(ctx: _Context, gone: Mapping[str, str]) -> dict[ClaimKey, _ClaimFate]:
    after_sets = {(w.namespace, w.name): w for w in (workload(e.applied) for e in ctx.entries) if w and w.kind == "StatefulSet"}
    fates: dict[ClaimKey, _ClaimFate] = {}
    for e in ctx.entries:
        if e.before is None or e.op == "create":
            continue
        if e.before.kind == "PersistentVolumeClaim" and e.before.name:
            key = (e.before.namespace, e.before.name)
            fates[key] = _pvc_fate(e)
        old_set = workload(e.old)
        if old_set is None or old_set.kind != "StatefulSet":
            continue
        for template in old_set.claim_templates:
            for i in range(old_set.replicas):
                key = (old_set.namespace, f"{template}-{old_set.name}-{i}")
                fates[key] = _template_claim_fate(e, old_set, template, i, after_sets.get((old_set.namespace, old_set.name)))
    for key, fate in fates.items():
        if key[0] in gone and fate.fate != "lost":
            fates[key] = _ClaimFate("lost", f"{gone[key[0]]}, which takes every object in it, retained or not", fate.source)
    return fates


def _claims(ctx: _Context, gone: Mapping[str, str]) -> dict[ClaimKey, _ClaimFate]:
    """Every claim that exists before the edit, with its fate; reports the lost and orphaned ones."""
    fates = _old_claims(ctx, gone)
    mounted_after: set[ClaimKey] = set()
    for w in (workload(e.applied) for e in ctx.entries):
        if w is not None:
            mounted_after.update(w.claims())
    for key, fate in sorted(fates.items()):
        subject = f"PersistentVolumeClaim {key[0]}/{key[1]}"
        if fate.fate == "lost":
            ctx.add("claim-lost", "error", subject, f"{fate.why}: the weights on it are gone")
        elif key not in mounted_after and not fate.managed_after:
            why = fate.why or "nothing mounts it after the edit"
            ctx.add("claim-orphaned", "warning", subject, f"{why}; nothing mounts it any more, its space stays taken")
    return fates


def _template_changes(ctx: _Context) -> None:
    """A StatefulSet whose claim template changes but whose claims already exist keeps them as
    they are: the controller only creates missing claims."""
    for e in ctx.entries:
        old_set, new_set = workload(e.old), workload(e.applied)
        if not (old_set and new_set and old_set.kind == new_set.kind == "StatefulSet"):
            continue
        if (old_set.namespace, old_set.name) != (new_set.namespace, new_set.name):
            continue
        for template, spec in new_set.claim_templates.items():
            before = old_set.claim_templates.get(template)
            if before is None:
                continue
            changed = [format_path(("spec",) + c.path) for c in diff_values(before, spec)]
            if not changed:
                continue
            existing = [f"{template}-{new_set.name}-{i}" for i in range(min(old_set.replicas, new_set.replicas))]
            ctx.add(
                "claim-template-ignored",
                "warning",
                new_set.label,
                f"claim template {template!r} changes ({', '.join(changed)}) but the existing claims "
                f"{', '.join(existing)} are re-used as they are: the change applies only to claims created later",
            )


def _cache_space(ctx: _Context, start: _Start, hint: ServerHint) -> None:
    """Nothing removes the old weights: a claim must hold them beside the new ones (and, on the
    shared cache, beside every other server's)."""
    w = start.workload
    old_hint = ctx.old_hints.get(start.previous.name) if start.previous is not None else None
    if hint.weights_gib is None or old_hint is None or old_hint.weights_gib is None:
        return
    places: list[tuple[str, Optional[float], float]] = []
    for template, spec in w.claim_templates.items():
        size = _bytes(((spec.get("resources") or {}).get("requests") or {}).get("storage"))
        places.append((f"each {template}-{w.name}-<i> claim", size, old_hint.weights_gib + hint.weights_gib))
    for claim in w.shared_claims:
        pvc = next((e for e in ctx.entries if e.kind == "PersistentVolumeClaim" and e.applied is not None
                    and (object_id(e.applied) or ObjectId("", "", "", None)).name == claim), None)
        size = _bytes(_get(pvc.applied.inputs, ("spec", "resources", "requests", "storage"))) if pvc else None
        others = sum(
            (ctx.hints.get(other.name) or ServerHint(None, None, None)).weights_gib or 0.0
            for other in (workload(e.applied) for e in ctx.entries)
            if other is not None and other.name != w.name and claim in other.shared_claims
        )
        places.append((f"the shared claim {claim}", size, others + old_hint.weights_gib + hint.weights_gib))
    for where, size, need in places:
        if size is not None and need > size / GIB:
            ctx.add("cache-space", "error", w.label,
                    f"{where} ({size / GIB:g} GiB) must hold {need:g} GiB with the old weights still on it: the download "
                    "runs out of space and the server never starts; grow the claim first, or delete the old weights from it")


def _pvc_size(ctx: _Context) -> None:
    for e in ctx.entries:
        if e.op != "update" or e.before is None or e.before.kind != "PersistentVolumeClaim" or e.applied is None or e.old is None:
            continue
        path = ("spec", "resources", "requests", "storage")
        old_size = _get(unwrap_secrets(e.old.inputs), path)
        new_size = _get(unwrap_secrets(e.applied.inputs), path)
        old_b, new_b = _bytes(old_size), _bytes(new_size)
        if old_b is None or new_b is None or old_b == new_b:
            continue
        if new_b < old_b:
            ctx.add("update-rejected", "error", e.subject,
                    f"storage {old_size} -> {new_size}: the API server refuses to shrink a claim; pulumi up fails")
        else:
            storage_class = _get(unwrap_secrets(e.applied.inputs), ("spec", "storageClassName"))
            if storage_class in NODE_LOCAL_CLASSES:
                ctx.add("update-rejected", "error", e.subject,
                        f"storage {old_size} -> {new_size}: {storage_class} volumes cannot grow (its StorageClass has no "
                        "allowVolumeExpansion), so the API server refuses the resize and every pulumi up fails until the "
                        "size is set back")
            else:
                ctx.add("volume-expansion", "warning", e.subject,
                        f"storage {old_size} -> {new_size} in place: only if its StorageClass sets allowVolumeExpansion; "
                        "otherwise the API server refuses it and every pulumi up fails until the size is set back")



def _get(value: Any, path: Sequence[str]) -> Any:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value
