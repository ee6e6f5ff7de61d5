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

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Optional, Sequence

from common.constants import COMMIT_ID
# The annotation the model servers carry: seconds from pod start to ready on an empty cache
# (download + load), or the load only when an init container prefetches the weights.
from common.constants import COLD_START_ANNOTATION

from .provider import (
    DEFAULT_OPTIONS,
    Action,
    ObjectId,
    ProviderOptions,
    RegisteredLike,
    apply_ignore_changes,
    decide,
    diff_values,
    format_path,
    kind_of,
    object_id,
    unwrap_secrets,
)

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
GPU_RESOURCE = re.compile(r"(^|[./])gpu([./]|$)")
_QUANTITY = re.compile(r"^\s*([0-9.]+)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
GIB = 2**30


def quantity_bytes(text: Any) -> Optional[float]:
    """A Kubernetes quantity ("40Gi", "115.5Gi", "500M") in bytes; None when unreadable."""
    match = _QUANTITY.match(str(text))
    if not match or match.group(2) not in _UNITS:
        return None
    return float(match.group(1)) * _UNITS[match.group(2)]


# ---------------------------------------------------------------------------------------------
# Report types.


@dataclass
class Entry:
    """One resource's change: its URN after the edit (before, for a delete) and the action."""

    urn: str
    type: str
    name: str
    action: Action
    old_urn: Optional[str] = None
    before: Optional[ObjectId] = None
    after: Optional[ObjectId] = None
    via_alias: bool = False
    old: Optional[RegisteredLike] = field(default=None, repr=False, compare=False)
    new: Optional[RegisteredLike] = field(default=None, repr=False, compare=False)
    # ``new`` with its ignoreChanges paths holding their old values: what the cluster gets.
    applied: Optional[RegisteredLike] = field(default=None, repr=False, compare=False)

    @property
    def op(self) -> str:
        return self.action.op

    @property
    def kubernetes(self) -> bool:
        return (self.after or self.before) is not None

    @property
    def kind(self) -> str:
        obj = self.after or self.before
        return obj.kind if obj else self.type.rsplit(":", 1)[-1]

    @property
    def object_name(self) -> Optional[str]:
        obj = self.after or self.before
        return obj.name if obj else None

    @property
    def subject(self) -> str:
        if self.before and self.after and self.before != self.after:
            return f"{self.before} -> {self.after.namespace + '/' if self.after.namespace else ''}{self.after.name}"
        obj = self.after or self.before
        return str(obj) if obj else f"{self.type.rsplit(':', 1)[-1]} {self.name}"


@dataclass(frozen=True)
class Consequence:
    kind: str
    severity: Severity
    subject: str
    message: str

    def line(self) -> str:
        return f"{self.severity:<7} {self.kind:<22} {self.subject}: {self.message}"


@dataclass
class ChangeReport:
    stack: str
    entries: list[Entry]
    consequences: list[Consequence]

    def changed(self) -> list[Entry]:
        return [e for e in self.entries if e.op != "same"]

    def find(self, kind: Optional[str] = None, name: Optional[str] = None, op: Optional[str] = None) -> list[Entry]:
        """Kubernetes entries by kind and object name (before or after the edit) and action."""
        found = []
        for e in self.entries:
            if not e.kubernetes or (kind and e.kind != kind) or (op and e.op != op):
                continue
            names = {o.name for o in (e.before, e.after) if o is not None}
            if name is None or name in names:
                found.append(e)
        return found

    def entry(self, kind: str, name: str) -> Entry:
        found = self.find(kind, name)
        if len(found) != 1:
            raise LookupError(f"expected one {kind} {name!r} in the report, found {len(found)}")
        return found[0]

    def of_kind(self, kind: str) -> list[Consequence]:
        return [c for c in self.consequences if c.kind == kind]

    @property
    def errors(self) -> list[Consequence]:
        return [c for c in self.consequences if c.severity == "error"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "resources": [
                {
                    "urn": e.urn,
                    "old_urn": e.old_urn,
                    "type": e.type,
                    "subject": e.subject,
                    "action": e.action.label,
                    "changed": list(e.action.changed),
                    "replace_paths": list(e.action.replace_paths),
                    "retained": e.action.retained,
                    "blocked": e.action.blocked,
                    "via_alias": e.via_alias,
                }
                for e in self.changed()
            ],
            "consequences": [vars(c) for c in self.consequences],
        }

    def text(self) -> str:
        kube = [e for e in self.entries if e.kubernetes or (e.new or e.old) and (e.new or e.old).custom]
        counts = {op: sum(1 for e in kube if e.op == op) for op in ("update", "replace", "create", "delete", "same")}
        lines = [
            f"{self.stack}: {counts['update']} update, {counts['replace']} replace, {counts['create']} create, "
            f"{counts['delete']} delete, {counts['same']} unchanged"
        ]
        for e in sorted((e for e in kube if e.op != "same"), key=_entry_order):
            lines.append("  " + _entry_line(e))
        if self.consequences:
            lines.append("consequences:")
            lines += ["  " + c.line() for c in self.consequences]
        else:
            lines.append("consequences: none")
        return "\n".join(lines)


_OP_ORDER = {"replace": 0, "delete": 1, "create": 2, "update": 3, "same": 4}


def _entry_order(e: Entry) -> tuple:
    return (_OP_ORDER[e.op], e.kind, e.subject)


_ARG_PATH = re.compile(r"^(?P<list>spec\.template\.spec\.(?:init)?[cC]ontainers\[(?P<i>[0-9]+)\]\.(?P<field>args|command))\[[0-9]+\]$")


def _readable_paths(e: Entry, paths: list[str]) -> list[str]:
    """Changed paths, with a container's changed args shown as the arguments added and removed
    (`args: +--cors-origins localhost`) instead of list positions."""
    out: list[str] = []
    seen: set[str] = set()
    for path in paths:
        match = _ARG_PATH.match(path)
        if match is None or e.old is None or e.applied is None:
            out.append(path)
            continue
        if match["list"] in seen:
            continue
        seen.add(match["list"])
        kind = "initContainers" if ".initContainers[" in path else "containers"
        index = int(match["i"])

        def args_of(registered) -> list[str]:
            containers = ((((registered.inputs or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get(kind) or []
            return [str(a) for a in (containers[index].get(match["field"]) or [])] if index < len(containers) else []

        change = _arg_changes(args_of(e.old), args_of(e.applied))
        out.append(f"{kind}[{index}].{match['field']}: {change[:120]}")
    return out


def _flag_values(args: list[str]) -> tuple[dict[str, list[Optional[str]]], list[str]]:
    """A command line as flag -> its values (None for a bare switch), in order, plus the bare
    arguments. A token after a flag is its value unless it is itself a flag (negative numbers are values)."""
    flags: dict[str, list[Optional[str]]] = {}
    bare: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-") and not _NUMBER.fullmatch(token):
            name, eq, inline = token.partition("=")
            if eq:
                flags.setdefault(name, []).append(inline)
            elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _NUMBER.fullmatch(args[i + 1])):
                flags.setdefault(name, []).append(args[i + 1])
                i += 1
            else:
                flags.setdefault(name, []).append(None)
        else:
            bare.append(token)
        i += 1
    return flags, bare


def _arg_changes(old: list[str], new: list[str]) -> str:
    """`--cache-ram 1024 -> 4; added --cors-origins localhost; removed --metrics`: per flag, not by
    position or as a set of words (a value another flag also has would vanish from a set)."""
    old_flags, old_bare = _flag_values(old)
    new_flags, new_bare = _flag_values(new)

    def shown(flag: str, values: list[Optional[str]]) -> str:
        return " ".join(f"{flag} {v}" if v is not None else flag for v in values)

    parts: list[str] = []
    for flag in dict.fromkeys([*old_flags, *new_flags]):
        before, after = old_flags.get(flag), new_flags.get(flag)
        if before == after:
            continue
        if before is None:
            parts.append(f"added {shown(flag, after or [])}")
        elif after is None:
            parts.append(f"removed {shown(flag, before)}")
        else:
            values = lambda vs: ",".join("(switch)" if v is None else v for v in vs)  # noqa: E731
            parts.append(f"{flag} {values(before)} -> {values(after)}")
    if old_bare != new_bare:
        parts.append(f"arguments {' '.join(old_bare) or '(none)'} -> {' '.join(new_bare) or '(none)'}")
    return "; ".join(parts) or "same flags, another order"


_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def _entry_line(e: Entry) -> str:
    paths = _readable_paths(e, list(e.action.replace_paths or e.action.changed))
    shown = ", ".join(paths[:3]) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
    notes = []
    if e.action.retained and e.op in ("delete", "replace"):
        notes.append("retained")
    if e.action.blocked:
        notes.append("BLOCKED")
    if e.via_alias:
        notes.append("alias")
    tail = f"  [{', '.join(notes)}]" if notes else ""
    return f"{e.action.label:<23} {e.subject:<58} {shown}{tail}".rstrip()


# ---------------------------------------------------------------------------------------------
# Pairing by URN, then alias (provider.py fact 9).


def _urn_parts(urn: str) -> tuple[str, str, str, str]:
    """(stack, project, qualified type, name) of ``urn:pulumi:<stack>::<project>::<type>::<name>``."""
    head, project, qualified, name = urn.split("::", 3)
    return head[len("urn:pulumi:"):], project, qualified, name


def _is_root(urn: str) -> bool:
    return _urn_parts(urn)[2].split("$")[-1] == "pulumi:pulumi:Stack"


class _UrnBuilder:
    """Builds URNs the way the run that recorded them did. Pulumi's engine qualifies a child's
    type with its parent's whole type chain and leaves the root stack out; the SDK's mock monitor
    (the offline runs) uses the parent's own type only, root stack included. Both conventions are
    read off the recorded URNs, so alias URNs compare with them."""

    def __init__(self, resources: Sequence[RegisteredLike]):
        by_urn = {r.urn: r for r in resources}
        self.full_chain = any(
            r.parent in by_urn
            and "$" in _urn_parts(r.parent)[2]
            and _urn_parts(r.urn)[2].startswith(_urn_parts(r.parent)[2] + "$")
            for r in resources
        )
        self.root_in_chain = any(
            r.parent and r.parent not in by_urn and _urn_parts(r.urn)[2].startswith("pulumi:pulumi:Stack$")
            for r in resources
        )

    def make(self, stack: str, project: str, parent: Optional[str], type_: str, name: str) -> str:
        qualified = type_
        if parent and _is_root(parent):
            if self.root_in_chain:
                qualified = f"pulumi:pulumi:Stack${type_}"
        elif parent:
            parent_type = _urn_parts(parent)[2]
            qualified = f"{parent_type if self.full_chain else parent_type.split('$')[-1]}${type_}"
        return f"urn:pulumi:{stack}::{project}::{qualified}::{name}"


def _depth(resource: RegisteredLike, by_urn: Mapping[str, RegisteredLike]) -> int:
    depth, parent, seen = 0, resource.parent, set()
    while parent in by_urn and parent not in seen:
        seen.add(parent)
        depth += 1
        parent = by_urn[parent].parent
    return depth


def _alias_candidates(
    new: RegisteredLike, aliased: Mapping[str, str], builder: _UrnBuilder, root: Optional[str]
) -> list[str]:
    stack, project, _, _ = _urn_parts(new.urn)
    parent = new.parent or root
    candidates: list[str] = []
    for spec in new.aliases:
        if spec.get("urn"):
            candidates.append(spec["urn"])
            continue
        if spec.get("no_parent"):
            alias_parent = root
        elif spec.get("parent_urn"):
            alias_parent = aliased.get(spec["parent_urn"], spec["parent_urn"])
        else:
            alias_parent = parent
        candidates.append(builder.make(stack, project, alias_parent, spec.get("type") or new.type, spec.get("name") or new.name))
    old_parent = aliased.get(new.parent) if new.parent else None
    if old_parent:
        parent_name = _urn_parts(new.parent)[3]
        old_parent_name = _urn_parts(old_parent)[3]
        for urn in [new.urn] + list(candidates):
            _, _, qualified, name = _urn_parts(urn)
            child_type = qualified.split("$")[-1]
            if name.startswith(parent_name):
                name = old_parent_name + name[len(parent_name):]
            candidates.append(builder.make(stack, project, old_parent, child_type, name))
    return candidates


def pair(
    before: Sequence[RegisteredLike], after: Sequence[RegisteredLike]
) -> tuple[list[tuple[Optional[RegisteredLike], Optional[RegisteredLike], bool]], dict[str, str]]:
    """(old, new, via_alias) pairs: every new resource with the old one it continues, if any,
    then every old resource nothing continues; and new URN -> old URN for the aliased ones."""
    olds = {r.urn: r for r in before}
    news = {r.urn: r for r in after}
    builder = _UrnBuilder(list(after) or list(before))
    root = next((r.parent for r in list(after) + list(before) if r.parent and _is_root(r.parent)), None)
    taken: set[str] = set()
    aliased: dict[str, str] = {}
    pairs: list[tuple[Optional[RegisteredLike], Optional[RegisteredLike], bool]] = []
    for new in sorted(after, key=lambda r: (_depth(r, news), r.urn)):
        match: Optional[str] = new.urn if new.urn in olds and new.urn not in taken else None
        if match is None:
            for candidate in _alias_candidates(new, aliased, builder, root):
                if candidate in olds and candidate not in taken and candidate not in news:
                    match = candidate
                    break
        if match is not None:
            taken.add(match)
            if match != new.urn:
                aliased[new.urn] = match
        pairs.append((olds.get(match) if match else None, new, bool(match and match != new.urn)))
    pairs += [(old, None, False) for urn, old in olds.items() if urn not in taken]
    return pairs, aliased


# ---------------------------------------------------------------------------------------------
# Workloads and claims.

ClaimKey = tuple[str, str]  # (namespace, claim name)


@dataclass(frozen=True)
class Workload:
    """A Deployment's or StatefulSet's pods, as far as a change's consequences go."""

    resource: Any
    kind: str
    namespace: str
    name: str
    replicas: int
    strategy: str
    template: Mapping[str, Any]
    gpu: Mapping[str, float]
    shared_claims: tuple[str, ...]
    claim_templates: Mapping[str, Mapping[str, Any]]
    when_deleted: str
    when_scaled: str
    cold_start: Optional[int]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    def weights_source(self) -> tuple[str, ...]:
        """What its pods download: llama.cpp's model flags and the prefetch's repo and revision.
        When it changes, the weights on its claims are not the ones it needs."""
        pod = self.template.get("spec") or {}
        found: list[str] = []
        for container in _all_containers(pod):
            args = [str(a) for a in (container.get("args") or []) + (container.get("command") or [])]
            for i, arg in enumerate(args[:-1]):
                if arg in WEIGHTS_FLAGS:
                    found.append(f"{WEIGHTS_FLAGS[arg]} {args[i + 1]}")
            env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
            if env.get("HF_REPO"):
                found.append(f"{env['HF_REPO']}@{env.get('HF_REVISION') or 'main'}")
        return tuple(found)

    def claims(self) -> list[ClaimKey]:
        """Every claim its pods mount: the shared ones, then one per template per ordinal."""
        return [key for key, _ in self.claim_slots()]

    def claim_slots(self) -> list[tuple[ClaimKey, tuple[str, int]]]:
        """Each claim with the place it fills: ("shared", i) or ("ordinal", i)."""
        slots = [((self.namespace, c), ("shared", i)) for i, c in enumerate(self.shared_claims)]
        for template in self.claim_templates:
            slots += [((self.namespace, f"{template}-{self.name}-{i}"), ("ordinal", i)) for i in range(self.replicas)]
        return slots

    def gpu_total(self, resource: str) -> float:
        return self.gpu.get(resource, 0.0) * self.replicas

    def timeout(self, which: str) -> Optional[str]:
        return (getattr(self.resource, "custom_timeouts", None) or {}).get(which)


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A pod spec's containers in the order they run: init containers first."""
    return (pod.get("initContainers") or []) + (pod.get("containers") or [])


# llama.cpp's flags that name the weights it downloads (common/arg.cpp), by their long form.
WEIGHTS_FLAGS = {"-hf": "--hf-repo", "-hfr": "--hf-repo", "--hf-repo": "--hf-repo", "-hff": "--hf-file",
                 "--hf-file": "--hf-file", "-mu": "--model-url", "--model-url": "--model-url"}


def _int(value: Any, default: int) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def workload(resource: Optional[RegisteredLike]) -> Optional[Workload]:
    if resource is None or object_id(resource) is None or kind_of(resource) not in WORKLOAD_KINDS:
        return None
    inputs = unwrap_secrets(resource.inputs)
    kind = kind_of(resource)
    spec = inputs.get("spec") or {}
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    gpu: dict[str, float] = {}
    for container in pod.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for key, value in limits.items():
            if GPU_RESOURCE.search(key):
                gpu[key] = gpu.get(key, 0.0) + float(quantity_bytes(value) or 0.0)
    shared = tuple(
        v["persistentVolumeClaim"]["claimName"]
        for v in pod.get("volumes") or []
        if isinstance(v.get("persistentVolumeClaim"), dict) and v["persistentVolumeClaim"].get("claimName")
    )
    templates = {
        (t.get("metadata") or {}).get("name", ""): t.get("spec") or {} for t in spec.get("volumeClaimTemplates") or []
    }
    if kind == "Deployment":
        strategy = (spec.get("strategy") or {}).get("type") or "RollingUpdate"
    else:
        strategy = (spec.get("updateStrategy") or {}).get("type") or "RollingUpdate"
    retention = spec.get("persistentVolumeClaimRetentionPolicy") or {}
    annotations = (inputs.get("metadata") or {}).get("annotations") or {}
    cold = annotations.get(COLD_START_ANNOTATION)
    obj = object_id(resource)
    if obj is None:  # a workload without metadata.name: nothing to say about its pods
        return None
    return Workload(
        resource=resource,
        kind=kind,
        namespace=obj.namespace,
        name=obj.name or resource.name,
        replicas=_int(spec.get("replicas"), 1),
        strategy=strategy,
        template=template,
        gpu=gpu,
        shared_claims=shared,
        claim_templates=templates,
        when_deleted=retention.get("whenDeleted") or "Retain",
        when_scaled=retention.get("whenScaled") or "Retain",
        cold_start=_int(cold, 0) if cold is not None else None,
    )


def _secret_names(template: Mapping[str, Any]) -> set[str]:
    pod = template.get("spec") or {}
    names: set[str] = set()
    for volume in pod.get("volumes") or []:
        if isinstance(volume.get("secret"), dict):
            names.add(volume["secret"].get("secretName", ""))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if isinstance(source.get("secret"), dict):
                names.add(source["secret"].get("name", ""))
    for container in _all_containers(pod):
        for env in container.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if isinstance(ref, dict):
                names.add(ref.get("name", ""))
        for source in container.get("envFrom") or []:
            if isinstance(source.get("secretRef"), dict):
                names.add(source["secretRef"].get("name", ""))
    return names - {""}


# ---------------------------------------------------------------------------------------------
# Hints from the run: the capacity plan's budgets, the node pools' GPU slots.


@dataclass(frozen=True)
class ServerHint:
    weights_gib: Optional[float]
    download_seconds: Optional[int]
    load_seconds: Optional[int]
    key: Optional[str] = None  # models.<key> in the stack's config


def server_hints(run: Any) -> dict[str, ServerHint]:
    """Per workload name, from the exported capacity plan (``capacity_plan.servers``)."""
    plan = (getattr(run, "outputs", None) or {}).get("capacity_plan") or {}
    hints: dict[str, ServerHint] = {}
    servers = plan.get("servers") if isinstance(plan, dict) else None
    for key, server in (servers or {}).items():
        if not isinstance(server, dict) or not server.get("name"):
            continue
        budget = server.get("budget") or {}
        size = quantity_bytes(server.get("weights", ""))
        # Plans from before workload.name existed name the workload after the server.
        hints[server.get("workload") or server["name"]] = ServerHint(
            weights_gib=round(size / GIB, 1) if size else None,
            download_seconds=_int(budget.get("download_seconds"), 0) if "download_seconds" in budget else None,
            load_seconds=_int(budget.get("load_seconds"), 0) if "load_seconds" in budget else None,
            key=str(key),
        )
    return hints


def gpu_slots(run: Any) -> dict[str, int]:
    """GPU resource -> how many the cluster advertises (nodes x GPUs per node x containers per
    GPU), from the stack config's node pools when the run carries it."""
    pools = getattr(getattr(run, "config", None), "node_pools", None) or {}
    slots: dict[str, int] = {}
    for pool in pools.values() if isinstance(pools, dict) else ():
        resource = getattr(pool, "gpu_resource", None)
        if resource:
            count = 1
            for attribute in ("nodes", "gpus_per_node", "gpu_shares"):
                count *= _int(getattr(pool, attribute, 1) or 1, 1)
            slots[resource] = slots.get(resource, 0) + count
    return slots


# ---------------------------------------------------------------------------------------------
# The analysis.


@dataclass
class _Context:
    entries: list[Entry]
    hints: dict[str, ServerHint]
    old_hints: dict[str, ServerHint]
    slots: dict[str, int]
    options: ProviderOptions
    out: list[Consequence] = field(default_factory=list)

    def add(self, kind: str, severity: Severity, subject: str, message: str) -> None:
        self.out.append(Consequence(kind, severity, subject, message))


def _deleted_namespaces(entries: Iterable[Entry]) -> dict[str, str]:
    """Namespace name -> why this update deletes it (with everything in it)."""
    gone: dict[str, str] = {}
    for e in entries:
        if e.before is None or e.before.kind != "Namespace" or e.action.blocked or e.action.retained:
            continue
        name = e.before.name or ""
        if e.op == "delete":
            gone[name] = f"Namespace {name} is deleted"
        elif e.op == "replace":
            order = "at the end of the update" if e.action.create_first else "before its replacement is created"
            gone[name] = f"Namespace {name} is replaced and the old one deleted {order}"
    return gone


def _protect(ctx: _Context) -> None:
    for e in ctx.entries:
        if e.action.blocked:
            ctx.add("protected", "error", e.subject, f"{e.action.blocked}; unprotect it first or keep it unchanged")


def _resource_label(e: Entry) -> str:
    """A Pulumi resource as an operator finds it in ``pulumi stack``: type::name, under its parent."""
    label = f"{e.type.rsplit(':', 1)[-1]}::{e.name}"
    parent = (e.old or e.new).parent if (e.old or e.new) is not None else ""
    if parent and not _is_root(parent):
        _, _, qualified, name = _urn_parts(parent)
        label += f" (in {qualified.split('$')[-1].rsplit(':', 1)[-1]} {name})"
    return label


def _holder_release(holder: Entry, creator: Entry) -> Optional[str]:
    """Why ``holder``'s old object still exists when ``creator`` creates its object; None if it
    is gone by then."""
    action = holder.action
    if holder is creator:
        if action.op == "replace" and action.retained:
            return "the old object is retained (retainOnDelete), so the delete-first replacement never deletes it"
        if action.op == "replace" and action.create_first:
            return "the replacement is created first and the old object deleted only at the end"
        return None
    owner = _resource_label(holder)
    if action.op in ("same", "update"):
        return f"the object belongs to {owner}, which keeps it"
    if action.retained:
        return f"the object belongs to {owner}, whose delete is skipped (retainOnDelete)"
    if action.op == "delete":
        return f"the object belongs to {owner}, removed from the program and deleted only at the end of the update"
    if action.op == "replace" and action.create_first:
        return f"the object belongs to {owner}, whose old object is deleted only at the end of the update"
    return None


def _collisions(ctx: _Context) -> None:
    holders: dict[ObjectId, list[Entry]] = {}
    for e in ctx.entries:
        if e.before is not None and e.op != "create" and e.before.name:
            holders.setdefault(e.before, []).append(e)
    for e in ctx.entries:
        if e.after is None or e.op not in ("create", "replace") or not e.after.name or e.action.blocked:
            continue
        for holder in holders.get(e.after, []):
            why = _holder_release(holder, e)
            if why is None:
                continue
            if ctx.options.upsert_existing_objects:
                ctx.add("adopts-existing", "info", str(e.after), f"created while {why}; upsertExistingObjects applies over it")
            else:
                verb = "its replacement" if e.op == "replace" else "it"
                ctx.add(
                    "already-exists",
                    "error",
                    str(e.after),
                    f"pulumi up creates {verb} while {why}: AlreadyExists, the update stops there "
                    "(pulumi preview does not show this)",
                )


def _namespace_targets(ctx: _Context, gone: Mapping[str, str]) -> None:
    for e in ctx.entries:
        if e.after is not None and e.op != "delete" and e.after.kind != "Namespace" and e.after.namespace in gone:
            ctx.add("deleted-with-namespace", "error", str(e.after),
                    f"{gone[e.after.namespace]}; this object, kept by the program, goes with it")


@dataclass
class _ClaimFate:
    fate: Literal["kept", "lost", "orphaned"]
    why: str
    source: str  # "pvc" or "template"
    managed_after: bool = False


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


def _pvc_fate(e: Entry) -> _ClaimFate:
    action = e.action
    if e.op in ("same", "update") or action.blocked:
        return _ClaimFate("kept", "", "pvc", managed_after=True)
    if e.op == "delete":
        if action.retained:
            return _ClaimFate("orphaned", "its resource is removed but retained (retainOnDelete)", "pvc")
        return _ClaimFate("lost", "its resource is removed and the claim deleted", "pvc")
    # replace
    if action.create_first:
        if action.retained:
            return _ClaimFate("orphaned", "replaced by a claim of another name or namespace; the old one is retained", "pvc")
        return _ClaimFate("lost", "replaced by a claim of another name or namespace; the old one is deleted at the end", "pvc")
    if action.retained:
        return _ClaimFate("kept", "the delete-first replacement skips the delete (retainOnDelete)", "pvc", managed_after=True)
    return _ClaimFate("lost", f"replaced delete-first ({', '.join(action.replace_paths)}): deleted, then created empty", "pvc")


def _template_claim_fate(e: Entry, old_set: Workload, template: str, ordinal: int, new_set: Optional[Workload]) -> _ClaimFate:
    replaced = e.op == "replace" and not e.action.blocked and not e.action.retained
    if replaced and old_set.when_deleted == "Delete":
        return _ClaimFate("lost", "its StatefulSet is deleted to be replaced and "
                          "persistentVolumeClaimRetentionPolicy.whenDeleted is Delete", "template")
    if new_set is not None and template in new_set.claim_templates and ordinal < new_set.replicas:
        return _ClaimFate("kept", "", "template", managed_after=True)
    if e.op == "delete" and e.action.retained:
        return _ClaimFate("kept", "its StatefulSet is retained and keeps running", "template")
    set_gone = new_set is None
    if set_gone and old_set.when_deleted == "Delete":
        return _ClaimFate("lost", "its StatefulSet goes and persistentVolumeClaimRetentionPolicy.whenDeleted is Delete", "template")
    if not set_gone and ordinal >= new_set.replicas and old_set.when_scaled == "Delete":
        return _ClaimFate("lost", "scaled down with persistentVolumeClaimRetentionPolicy.whenScaled Delete", "template")
    if set_gone:
        why = f"StatefulSet {old_set.namespace}/{old_set.name} goes; whenDeleted is Retain, so its claims stay"
    elif template not in new_set.claim_templates:
        why = f"the claim template {template!r} is gone from the StatefulSet"
    else:
        why = "scaled down; kept (whenScaled Retain) and re-used if it scales up again"
    return _ClaimFate("orphaned", why, "template")


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


def _hint(ctx: _Context, w: Workload) -> ServerHint:
    return ctx.hints.get(w.name) or ctx.old_hints.get(w.name) or ServerHint(None, None, None)


@dataclass
class _Start:
    """How one workload's pods are replaced by this edit."""

    entry: Entry
    workload: Workload
    previous: Optional[Workload]
    how: str
    down: bool
    partial: bool = False


def _starts(ctx: _Context) -> list[_Start]:
    starts: list[_Start] = []
    renames = _apparent_renames(ctx)
    for e in ctx.entries:
        new_w, old_w = workload(e.applied), workload(e.old)
        if new_w is None or e.action.blocked:
            continue
        if e.op == "create":
            previous = renames.get(new_w.name)
            how = f"new workload (apparently {previous.name} renamed, without an alias)" if previous else "new workload"
            starts.append(_Start(e, new_w, previous, how + ": its pods start", down=False))
        elif e.op == "replace":
            if e.action.create_first:
                starts.append(_Start(e, new_w, old_w, "replaced create-first: new pods start beside the old ones, "
                                     "which are deleted at the end", down=False))
            elif e.action.retained:
                continue  # the create fails (AlreadyExists): the old workload keeps running
            else:
                starts.append(_Start(e, new_w, old_w, "replaced delete-first: every pod is deleted, then the new "
                                     "workload starts", down=True))
        elif e.op == "update" and any(p.startswith("spec.template") for p in e.action.changed):
            starts.append(_rollout(e, new_w, old_w))
        elif e.op == "update" and old_w is not None and new_w.replicas > old_w.replicas:
            added = new_w.replicas - old_w.replicas
            starts.append(_Start(e, new_w, old_w, f"scaled up: {added} new pod{'s start' if added > 1 else ' starts'}", down=False))
    return starts


def _rollout(e: Entry, new_w: Workload, old_w: Optional[Workload]) -> _Start:
    if new_w.kind == "Deployment":
        if new_w.strategy == "Recreate":
            return _Start(e, new_w, old_w, "Recreate: every pod stops before the new ones start", down=True)
        return _Start(e, new_w, old_w, "RollingUpdate: a new pod starts before an old one stops", down=False)
    if new_w.strategy == "OnDelete":
        return _Start(e, new_w, old_w, "OnDelete: pods keep the old template until deleted by hand", down=False)
    if new_w.replicas <= 1:
        return _Start(e, new_w, old_w, "rolling update of its only pod", down=True)
    return _Start(e, new_w, old_w, f"rolling update, one pod at a time from the highest ordinal: "
                  f"{new_w.replicas - 1} of {new_w.replicas} keep serving", down=False, partial=True)


@dataclass
class _Claims:
    again: list[ClaimKey]  # new or emptied, in place of a claim the workload had before
    first: list[ClaimKey]  # new, for a place the workload did not have (new workload, new replica)
    unfamiliar: list[ClaimKey]  # existing, but not mounted by this workload before

    @property
    def fresh(self) -> list[ClaimKey]:
        return self.again + self.first


def _fresh_claims(start: _Start, fates: Mapping[ClaimKey, _ClaimFate]) -> _Claims:
    previous = start.previous.claim_slots() if start.previous else []
    before_keys = {key for key, _ in previous}
    before_slots = {slot for _, slot in previous}
    result = _Claims([], [], [])
    for key, slot in start.workload.claim_slots():
        fate = fates.get(key)
        if fate is None or fate.fate == "lost":
            (result.again if slot in before_slots else result.first).append(key)
        elif key not in before_keys:
            result.unfamiliar.append(key)
    return result


def _restarts_and_downloads(ctx: _Context, starts: Sequence[_Start], fates: Mapping[ClaimKey, _ClaimFate]) -> None:
    for start in starts:
        w = start.workload
        hint = _hint(ctx, w)
        claims = _fresh_claims(start, fates)
        if start.how.startswith("scaled up"):
            ctx.add("scale-up", "info", w.label, start.how)
        elif start.how.startswith("OnDelete"):
            ctx.add("not-restarted", "warning", w.label, start.how)
        elif start.previous is not None:
            ctx.add("restart", "info", w.label, start.how)
        groups: tuple[tuple[list[ClaimKey], str, Severity], ...] = (
            (claims.again, "downloads again", "warning"),
            (claims.first, "downloads", "info"),
        )
        for keys, verb, severity in groups:
            if keys:
                size = f"{hint.weights_gib * len(keys):g} GiB" if hint.weights_gib else "its weights"
                names = ", ".join(f"{ns}/{name}" for ns, name in keys)
                ctx.add("redownload", severity, w.label, f"{verb} {size}: it mounts claims that are new or emptied "
                        f"by this edit ({names}){_keep_claims(start, hint) if keys is claims.again else ''}")
        if claims.unfamiliar and not claims.fresh:
            names = ", ".join(f"{ns}/{name}" for ns, name in claims.unfamiliar)
            ctx.add("redownload", "info", w.label, f"mounts existing claims it did not mount before ({names}): "
                    "downloads unless they already hold its weights")
        downloads = len(claims.fresh)
        kept = [key for key in w.claims() if key not in claims.fresh]
        before_source = start.previous.weights_source() if start.previous is not None else ()
        if kept and before_source and w.weights_source() != before_source:
            # The claims keep the old weights; the pods need others (another quant, repo or revision).
            size = f"{hint.weights_gib * len(kept):g} GiB" if hint.weights_gib else "its new weights"
            change = f"it now fetches {', '.join(w.weights_source())} (was {', '.join(before_source)})"
            if _only_a_moving_revision(before_source, w.weights_source()):
                # A branch and a commit: offline, nobody knows whether the branch already pointed there.
                ctx.add("redownload", "warning", w.label,
                        f"downloads up to {size}: {change}; nothing if that commit is the one the branch had when the "
                        "claims were filled")
            else:
                ctx.add("redownload", "warning", w.label, f"downloads {size}: {change}; the old weights stay on its claims")
                downloads += 1 if start.partial else len(kept)
                _cache_space(ctx, start, hint)
        if start.down or start.partial:
            _downtime(ctx, start, downloads if not start.partial else min(downloads, 1), hint)


def _only_a_moving_revision(before: Sequence[str], after: Sequence[str]) -> bool:
    """Whether the sources differ only in a revision where one side is a branch or tag."""
    if len(before) != len(after):
        return False
    for old, new in zip(before, after):
        if old == new:
            continue
        old_repo, _, old_rev = old.rpartition("@")
        new_repo, _, new_rev = new.rpartition("@")
        if not old_repo or old_repo != new_repo or (COMMIT_ID.fullmatch(old_rev) and COMMIT_ID.fullmatch(new_rev)):
            return False
    return True


def _cache_space(ctx: _Context, start: _Start, hint: ServerHint) -> None:
    """Nothing removes the old weights: a claim must hold them beside the new ones (and, on the
    shared cache, beside every other server's)."""
    w = start.workload
    old_hint = ctx.old_hints.get(start.previous.name) if start.previous is not None else None
    if hint.weights_gib is None or old_hint is None or old_hint.weights_gib is None:
        return
    places: list[tuple[str, Optional[float], float]] = []
    for template, spec in w.claim_templates.items():
        size = quantity_bytes(((spec.get("resources") or {}).get("requests") or {}).get("storage"))
        places.append((f"each {template}-{w.name}-<i> claim", size, old_hint.weights_gib + hint.weights_gib))
    for claim in w.shared_claims:
        pvc = next((e for e in ctx.entries if e.kind == "PersistentVolumeClaim" and e.applied is not None
                    and (object_id(e.applied) or ObjectId("", "", "", None)).name == claim), None)
        size = quantity_bytes(_get(pvc.applied.inputs, ("spec", "resources", "requests", "storage"))) if pvc else None
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


def _keep_claims(start: _Start, hint: ServerHint) -> str:
    """The fix, when a StatefulSet gets new claims only because its name changed: its claims are
    named after it, and workload.name keeps the old name while the server's name changes."""
    old, new = start.previous, start.workload
    if old is None or new.kind != "StatefulSet" or old.kind != "StatefulSet" or old.name == new.name:
        return ""
    where = f"models.{hint.key}.workload.name" if hint.key else "the server's workload.name"
    return f"; to keep the old claims and their weights, set {where}: {old.name}"


def _apparent_renames(ctx: _Context) -> dict[str, Workload]:
    """New workload name -> removed workload, when a created workload runs the same image with
    the same weights as one this edit removes (a rename without an alias)."""
    removed = [(e, workload(e.old)) for e in ctx.entries if e.op == "delete" and workload(e.old)]
    renames: dict[str, Workload] = {}
    for e in ctx.entries:
        new_w = workload(e.applied)
        if e.op != "create" or new_w is None:
            continue
        for _, old_w in removed:
            if old_w is None:
                continue
            same_image = _images(old_w) == _images(new_w)
            same_weights = _hint(ctx, new_w).weights_gib == ctx.old_hints.get(old_w.name, ServerHint(None, None, None)).weights_gib
            if old_w.kind == new_w.kind and same_image and same_weights and all(r is not old_w for r in renames.values()):
                renames[new_w.name] = old_w
                break
    return renames


def _images(w: Workload) -> tuple[str, ...]:
    return tuple(c.get("image", "") for c in (w.template.get("spec") or {}).get("containers") or [])


def _downtime(ctx: _Context, start: _Start, downloads: int, hint: ServerHint) -> None:
    """``downloads``: how many claims are filled at once; replicas starting together share the
    node's uplink, so their downloads take as long as one after the other (the planner's rate is
    the uplink's)."""
    w = start.workload
    seconds: Optional[int] = None
    basis = ""
    if hint.load_seconds is not None and (not downloads or hint.download_seconds is not None):
        download = (hint.download_seconds or 0) * downloads
        seconds = hint.load_seconds + download
        shared = f" x {downloads} claims over one uplink" if downloads > 1 else ""
        parts = ([f"download {hint.download_seconds} s{shared}"] if downloads else []) + [f"load {hint.load_seconds} s"]
        basis = "capacity plan: " + " + ".join(parts)
    elif w.cold_start is not None and downloads:
        seconds, basis = w.cold_start, f"{COLD_START_ANNOTATION} annotation"
    estimate = f"about {_duration(seconds)} ({basis}; image pull not counted)" if seconds is not None else \
        "for an unknown time (no load estimate for it)"
    if start.partial:
        ctx.add("reduced-capacity", "info", w.label, f"each pod is out {estimate} while the others serve")
    else:
        ctx.add("downtime", "warning", w.label, f"not serving {estimate}: {start.how}")


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def _gpu_waits(ctx: _Context, starts: Sequence[_Start]) -> set[str]:
    """New pods that need a GPU while pods this update removes only later still hold one; the
    labels of the workloads whose pods stay Pending."""
    pending: set[str] = set()
    lingering: list[Workload] = []
    for e in ctx.entries:
        old_w = workload(e.old)
        if old_w is None or e.action.blocked:
            continue
        if e.op == "delete" or (e.op == "replace" and e.action.create_first):
            lingering.append(old_w)
    steady = [w for w in (workload(e.applied) for e in ctx.entries if e.op != "delete") if w is not None]
    for start in starts:
        w = start.workload
        surge = start.how.startswith("RollingUpdate")
        if not (start.entry.op == "create" or (start.entry.op == "replace" and start.entry.action.create_first) or surge):
            continue
        holders = lingering + ([start.previous] if surge and start.previous else [])
        for resource, per_pod in w.gpu.items():
            held = [h for h in holders if h.gpu.get(resource)]
            if not held:
                continue
            needed = sum(s.gpu_total(resource) for s in steady) + sum(h.gpu_total(resource) for h in held)
            slots = ctx.slots.get(resource)
            if slots is not None and needed <= slots:
                continue
            which = "create" if start.entry.op != "update" else "update"
            timeout = w.timeout(which) or "the default 10 min"
            holding = ", ".join(f"{h.label} ({h.gpu_total(resource):g})" for h in held)
            capacity = f"{needed:g} needed of {slots} advertised" if slots is not None else "unless a spare one is free"
            pending.add(w.label)
            ctx.add(
                "gpu-pending",
                "error" if slots is not None else "warning",
                w.label,
                f"its pods request {per_pod:g} {resource} each while pods of {holding} still hold theirs "
                f"({capacity}): they stay Pending; pulumi up waits out the {which} timeout ({timeout}) and fails, "
                "and the old pods are deleted only after success",
            )
    return pending


REFERENCE_KEYS = ("name", "serviceName", "host", "hostname", "service")


def _references(change: Any) -> list[str]:
    """Strings a change writes where objects name a Service: a DNS name anywhere, a bare name
    only under a key that names one. Labels and annotations are not references."""
    found: list[str] = []

    def walk(value: Any, key: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and ("." in value or key in REFERENCE_KEYS):
            found.append(value if key in REFERENCE_KEYS else value.split(":")[0])

    if change.path[:1] != ("metadata",):
        walk(change.new, change.path[-1] if change.path else None)
    return found


def _selects(selector: Mapping[str, Any], w: Workload) -> bool:
    labels = (w.template.get("metadata") or {}).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _redirected_traffic(ctx: _Context, starts: Sequence[_Start], pending: set[str]) -> None:
    """Objects updated in place to point at a Service this update creates: traffic moves there
    while the update runs, before (or whether or not) the pods behind it are ready."""
    ready_when = {s.workload.label: s for s in starts}
    new_services = []
    for e in ctx.entries:
        if e.after is None or e.after.kind != "Service" or e.op not in ("create", "replace"):
            continue
        if e.op == "replace" and not e.action.create_first:
            continue
        selector = (unwrap_secrets(e.applied.inputs).get("spec") or {}).get("selector") or {} if e.applied else {}
        backends = [w for w in (workload(x.applied) for x in ctx.entries) if w and w.namespace == e.after.namespace and _selects(selector, w)]
        new_services.append((e.after, backends))
    for e in ctx.entries:
        if e.op != "update" or e.old is None or e.applied is None:
            continue
        changed = diff_values(unwrap_secrets(e.old.inputs), unwrap_secrets(e.applied.inputs))
        values = [v for c in changed for v in _references(c)]
        for service, backends in new_services:
            dns = f"{service.name}.{service.namespace}."
            if not any(v == service.name or v.startswith(dns) or v == dns[:-1] for v in values):
                continue
            behind = ", ".join(w.label for w in backends) or "no workload"
            never = [w.label for w in backends if w.label in pending]
            if never:
                tail = f"which never becomes ready in this update (its pods stay Pending, see gpu-pending)"
            elif any(w.label in ready_when for w in backends):
                tail = "which is not ready until its pods have started (and downloaded, if they must)"
            else:
                tail = "which this update does not start"
            ctx.add("traffic-to-new-service", "warning", e.subject,
                    f"is updated in place to send traffic to {service}, created in this update and served by "
                    f"{behind}, {tail}; requests to it fail meanwhile")


def _pvc_size(ctx: _Context) -> None:
    for e in ctx.entries:
        if e.op != "update" or e.before is None or e.before.kind != "PersistentVolumeClaim" or e.applied is None or e.old is None:
            continue
        path = ("spec", "resources", "requests", "storage")
        old_size = _get(unwrap_secrets(e.old.inputs), path)
        new_size = _get(unwrap_secrets(e.applied.inputs), path)
        old_b, new_b = quantity_bytes(old_size), quantity_bytes(new_size)
        if old_b is None or new_b is None or old_b == new_b:
            continue
        if new_b < old_b:
            ctx.add("update-rejected", "error", e.subject,
                    f"storage {old_size} -> {new_size}: the API server refuses to shrink a claim; pulumi up fails")
        else:
            storage_class = _get(unwrap_secrets(e.applied.inputs), ("spec", "storageClassName"))
            if storage_class in NON_EXPANDING_CLASSES:
                ctx.add("update-rejected", "error", e.subject,
                        f"storage {old_size} -> {new_size}: {storage_class} volumes cannot grow (its StorageClass has no "
                        "allowVolumeExpansion), so the API server refuses the resize and every pulumi up fails until the "
                        "size is set back")
            else:
                ctx.add("volume-expansion", "warning", e.subject,
                        f"storage {old_size} -> {new_size} in place: only if its StorageClass sets allowVolumeExpansion; "
                        "otherwise the API server refuses it and every pulumi up fails until the size is set back")


# Storage classes whose provisioner cannot expand a volume: rancher's local-path-provisioner
# (node-local folders; it neither enforces nor grows a size) under its usual class names.
NON_EXPANDING_CLASSES = frozenset({"local-path", "local-storage"})


def _get(value: Any, path: Sequence[str]) -> Any:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _secrets(ctx: _Context, restarted: set[tuple[str, str]]) -> None:
    readers: dict[tuple[str, str], list[Workload]] = {}
    for w in (workload(e.applied) for e in ctx.entries if e.op != "delete"):
        if w is not None:
            for name in _secret_names(w.template):
                readers.setdefault((w.namespace, name), []).append(w)
    for e in ctx.entries:
        if e.before is None or e.before.kind != "Secret" or e.op not in ("update", "replace") or e.action.blocked:
            continue
        data_changed = any(p.split(".")[0].split("[")[0] in ("data", "stringData") for p in e.action.changed)
        if e.op == "replace" and not e.action.create_first and not e.action.retained:
            ctx.add("secret-gap", "info", e.subject, "deleted before its replacement is created: for that moment "
                    "pods mounting it cannot start and controllers reading it find it missing")
        if not data_changed or e.after is None:
            continue
        for w in readers.get((e.after.namespace, e.after.name or ""), []):
            if (w.namespace, w.name) not in restarted:
                ctx.add("stale-secret", "warning", w.label, f"reads {e.subject}, whose content changes, but its pods "
                        "do not restart: a process that reads it at start keeps the old value")


def _applied(old: Optional[RegisteredLike], new: Optional[RegisteredLike], action: Action) -> Optional[RegisteredLike]:
    """What the cluster gets: the new inputs with ignored paths reset, except for a replacement,
    which is created from the program's own values (fact 4)."""
    if old is None or new is None or not new.ignore_changes or not new.custom or action.op == "replace":
        return new
    applied = copy.copy(new)
    applied.inputs = apply_ignore_changes(old.inputs, new.inputs, new.ignore_changes)
    return applied


def _missing_volumes(ctx: _Context) -> None:
    """A pod template mounting a volume that neither its volumes nor the StatefulSet's claim
    templates define: the API server takes the workload (it does not check its template's
    volumes), then every pod it makes is refused, and the rollout waits until Pulumi times out."""
    for e in ctx.entries:
        if e.op not in ("create", "update", "replace") or e.applied is None or not e.applied.custom:
            continue
        spec = e.applied.inputs.get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") if isinstance(spec, dict) else None
        if not isinstance(pod, dict):
            continue
        defined = {v.get("name") for v in pod.get("volumes") or []}
        defined |= {(t.get("metadata") or {}).get("name") for t in spec.get("volumeClaimTemplates") or []}
        for container in _all_containers(pod):
            missing = sorted({m.get("name") for m in container.get("volumeMounts") or []} - defined)
            if missing:
                ctx.add("pods-cannot-start", "error", e.subject,
                        f"container {container.get('name')} mounts {', '.join(missing)}, which no volume or claim "
                        "template defines after this update: no pod can be created and the rollout waits until it times out")


def _ignored(ctx: _Context) -> None:
    """Edits that ignoreChanges keeps from the cluster: the config says one thing, the object
    another, and nothing in the preview of ``pulumi up`` shows it."""
    for e in ctx.entries:
        if e.action.ignored and e.op not in ("create", "delete"):
            paths = ", ".join(e.action.ignored[:3]) + (f" (+{len(e.action.ignored) - 3} more)" if len(e.action.ignored) > 3 else "")
            ctx.add("change-ignored", "warning", e.subject, f"{paths} changed in the program but ignored (ignoreChanges): "
                    "the live object keeps its old value; apply the change by hand or migrate it")


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
    ctx = _Context(entries, server_hints(after), server_hints(before), gpu_slots(after) or gpu_slots(before), options)
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
    pending = _gpu_waits(ctx, starts)
    _redirected_traffic(ctx, starts, pending)
    _pvc_size(ctx)
    restarted = {(s.workload.namespace, s.workload.name) for s in starts if not s.how.startswith(("OnDelete", "scaled up"))}
    _secrets(ctx, restarted)
    consequences = sorted(ctx.out, key=lambda c: (SEVERITY_ORDER[c.severity], c.kind, c.subject))
    return ChangeReport(stack=getattr(after, "stack", "") or "", entries=entries, consequences=consequences)
