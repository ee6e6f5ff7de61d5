"""What the actions mean for the running servers: the context the analysis fills, how each
workload's pods are replaced, and the consequences for objects, GPUs, traffic and secrets (claims:
claims.py; downloads and downtime: downloads.py; the facts they rest on: preview.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from common.constants import METRICS_TOKEN_KEY

from .pairing import _is_root, _urn_parts
from .provider import ObjectId, ProviderOptions, diff_values, unwrap_secrets
from .report import Consequence, Entry, Severity
from .workloads import ServerHint, WorkloadObject, _all_containers, _secret_names, workload


@dataclass
class _Context:
    entries: list[Entry]
    hints: dict[str, ServerHint]
    old_hints: dict[str, ServerHint]
    slots: dict[str, int]
    options: ProviderOptions
    out: list[Consequence] = field(default_factory=list)
    library: dict = field(default_factory=dict)  # router server -> its models' effects (library.py)
    cards: dict = field(default_factory=dict)  # (pool, node, gpu) -> CardPlan, after the edit
    old_cards: dict = field(default_factory=dict)  # and before

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


def _hint(ctx: _Context, w: WorkloadObject) -> ServerHint:
    return ctx.hints.get(w.name) or ctx.old_hints.get(w.name) or ServerHint(None, None, None)


@dataclass
class _Start:
    """How one workload's pods are replaced by this edit."""

    entry: Entry
    workload: WorkloadObject
    previous: Optional[WorkloadObject]
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


def _rollout(e: Entry, new_w: WorkloadObject, old_w: Optional[WorkloadObject]) -> _Start:
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


def _apparent_renames(ctx: _Context) -> dict[str, WorkloadObject]:
    """New workload name -> removed workload, when a created workload runs the same image with
    the same weights as one this edit removes (a rename without an alias)."""
    removed = [(e, workload(e.old)) for e in ctx.entries if e.op == "delete" and workload(e.old)]
    renames: dict[str, WorkloadObject] = {}
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


def _images(w: WorkloadObject) -> tuple[str, ...]:
    return tuple(c.get("image", "") for c in (w.template.get("spec") or {}).get("containers") or [])


def _gpu_waits(ctx: _Context, starts: Sequence[_Start]) -> set[str]:
    """New pods that need a GPU while pods this update removes only later still hold one; the
    labels of the workloads whose pods stay Pending."""
    pending: set[str] = set()
    lingering: list[WorkloadObject] = []
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


def _selects(selector: Mapping[str, Any], w: WorkloadObject) -> bool:
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
                tail = "which never becomes ready in this update (its pods stay Pending, see gpu-pending)"
            elif any(w.label in ready_when for w in backends):
                tail = "which is not ready until its pods have started (and downloaded, if they must)"
            else:
                tail = "which this update does not start"
            ctx.add("traffic-to-new-service", "warning", e.subject,
                    f"is updated in place to send traffic to {service}, created in this update and served by "
                    f"{behind}, {tail}; requests to it fail meanwhile")


def _secrets(ctx: _Context, restarted: set[tuple[str, str]]) -> None:
    readers: dict[tuple[str, str], list[WorkloadObject]] = {}
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
        _key_rotation(ctx, e)
        for w in readers.get((e.after.namespace, e.after.name or ""), []):
            if (w.namespace, w.name) not in restarted:
                ctx.add("stale-secret", "warning", w.label, f"reads {e.subject}, whose content changes, but its pods "
                        "do not restart: a process that reads it at start keeps the old value")


def _string_data(entry_side: Any) -> Mapping[str, Any]:
    inputs = unwrap_secrets(getattr(entry_side, "inputs", None) or {})
    return inputs.get("stringData") or {}


def _key_rotation(ctx: _Context, e: Entry) -> None:
    """An API key replaced outright: from the restart on, clients still sending the old key get 401.
    Not said for a step of the two-key rotation (the old key stays a line of the new key file)."""
    before, after = _string_data(e.old), _string_data(e.applied)
    old_key = before.get(METRICS_TOKEN_KEY)
    if not isinstance(old_key, str) or METRICS_TOKEN_KEY not in after:
        return
    files = [v for k, v in after.items() if k != METRICS_TOKEN_KEY and isinstance(v, str)]
    if any(old_key in (line.strip() for line in text.splitlines()) for text in files):
        return
    ctx.add("old-key-refused", "warning", e.subject,
            "the old API key stops working when the server restarts: clients (the gateway's copy is updated with it) "
            "still sending it get 401. To rotate without that: set the secret to the old key and the new one on "
            "two lines (pulumi config set --secret <key> \"$(printf '%s\\n%s' OLD NEW)\"), pulumi up, move the "
            "clients to the new key, then set the new key alone and pulumi up again")


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
