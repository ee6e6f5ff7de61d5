"""What an edit does to the running system: ``preview(before, after)`` over two program runs.

Resources are paired by URN, then by alias (the engine's order, provider.py fact 9); each pair
gets the provider's action (:func:`changes.provider.decide`); the consequences an operator cares
about follow from the actions and the objects. Facts used, with where they are established
(``k8s`` is github.com/kubernetes/kubernetes at commit 00bdb3fade2ef1ada898bd8fae2c6a1958da3a5d,
whose claim logic current releases keep; ``docs`` is github.com/kubernetes/website at commit
7cac5582a71b2207c35a3f5d0e73ea02f1032ae1):

* Restarts: a pod template change restarts a workload's pods. A Deployment with ``Recreate``
  stops every pod before starting new ones; with ``RollingUpdate`` (the default) it starts a new
  pod before stopping an old one. A StatefulSet with ``RollingUpdate`` (the default) deletes and
  re-creates one pod at a time from the highest ordinal, waiting for each to be Ready, whatever
  its podManagementPolicy ("Parallel ... only affects the behavior for scaling operations.
  Updates are not affected"); ``OnDelete`` leaves pods alone until deleted by hand (docs
  content/en/docs/concepts/workloads/controllers/statefulset.md, "Update Strategies").
* Claims: a StatefulSet's claims are named ``<template>-<statefulset>-<ordinal>`` (k8s
  pkg/controller/statefulset/stateful_set_utils.go ``getPersistentVolumeClaimName``); the
  controller creates a claim only when none of that name exists and never changes an existing
  one (k8s pkg/controller/statefulset/stateful_pod_control.go ``createPersistentVolumeClaims``),
  so a re-created StatefulSet of the same name re-adopts its old claims with their old spec.
  ``persistentVolumeClaimRetentionPolicy`` ``Retain`` (the default) keeps them when the
  StatefulSet is deleted or scaled down, ``Delete`` deletes them (API reference,
  StatefulSetPersistentVolumeClaimRetentionPolicy). Deleting a Namespace deletes everything in it,
  whatever Pulumi retains (docs content/en/docs/tasks/administer-cluster/namespaces.md, "This
  deletes everything under the namespace"). A claim cannot shrink (k8s
  pkg/apis/core/validation/validation.go, "field can not be less than previous value").
* Downloads: a pod that mounts a claim that did not exist before the edit (new name, replaced,
  new namespace, lost) downloads its weights again: once for a shared claim, once per replica
  for a StatefulSet's claims.
* Collisions: creating an object whose (group, kind, namespace, name) is still held by an object
  deleted only at the end of the update (removed resources, create-first replacements: provider.py
  fact 7) or never (retained: fact 6) fails with AlreadyExists at ``pulumi up`` (fact 8).
* Waits that cannot finish: pods requesting a GPU that start while pods removed only later still
  hold theirs stay Pending when the cluster's GPUs are all taken; Pulumi waits out the resource's
  custom timeout and fails the update, before deleting the old pods.
* Downtime per workload: from the moment its pods are all gone until a new pod is ready: the
  capacity plan's download (only when the weights are downloaded again) and load times, else the
  workload's cold-start annotation; image pulls and scheduling are not counted.
"""

from __future__ import annotations

from typing import Any

from .claims import _claims, _pvc_size, _template_changes
from .consequences import (
    _collisions,
    _Context,
    _deleted_namespaces,
    _gpu_waits,
    _ignored,
    _missing_volumes,
    _namespace_targets,
    _protect,
    _redirected_traffic,
    _secrets,
    _starts,
)
from .downloads import _restarts_and_downloads
from .library import _card_overlaps, _library_edits
from .pairing import _applied, pair
from .provider import DEFAULT_OPTIONS, ProviderOptions, decide, object_id
from .report import SEVERITY_ORDER, ChangeReport, Entry
from .workloads import card_plans, gpu_slots, server_hints


def preview(before: Any, after: Any, options: ProviderOptions = DEFAULT_OPTIONS) -> ChangeReport:
    """The change report for going from the ``before`` run's resources to the ``after`` run's."""
    pairs, _ = pair(before.resources, after.resources)
    entries = []
    for old, new, alias in pairs:
        action = decide(old, new, options)
        entries.append(Entry(
            urn=(new or old).urn,
            type=(new or old).type,
            name=(new or old).name,
            action=action,
            old_urn=old.urn if old is not None else None,
            before=object_id(old) if old is not None else None,
            after=object_id(new) if new is not None else None,
            via_alias=alias,
            old=old,
            new=new,
            applied=_applied(old, new, action),
        ))
    ctx = _Context(entries, server_hints(after), server_hints(before), gpu_slots(after) or gpu_slots(before), options,
                   cards=card_plans(after), old_cards=card_plans(before))
    gone = _deleted_namespaces(entries)
    _protect(ctx)
    _ignored(ctx)
    _missing_volumes(ctx)
    _collisions(ctx)
    _namespace_targets(ctx, gone)
    fates = _claims(ctx, gone)
    _template_changes(ctx)
    starts = _starts(ctx)
    _restarts_and_downloads(ctx, starts, fates)
    _library_edits(ctx, starts)
    _card_overlaps(ctx, starts)
    pending = _gpu_waits(ctx, starts)
    _redirected_traffic(ctx, starts, pending)
    _pvc_size(ctx)
    restarted = {(s.workload.namespace, s.workload.name) for s in starts if not s.how.startswith(("OnDelete", "scaled up"))}
    _secrets(ctx, restarted)
    consequences = sorted(ctx.out, key=lambda c: (SEVERITY_ORDER[c.severity], c.kind, c.subject))
    return ChangeReport(stack=getattr(after, "stack", "") or "", entries=entries, consequences=consequences,
                        library=ctx.library)
