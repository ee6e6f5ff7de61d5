"""The pulumi-kubernetes provider's and the Pulumi engine's rules for one resource's change, as data.

For one resource's registration before an edit and after it, :func:`decide` answers what
``pulumi up`` does with it: nothing, an update in place, a replacement (create-first or
delete-first, and the field paths that force it), a create or a delete, and whether the engine
refuses (``protect``) or skips the delete (``retainOnDelete``).

Facts carried over (not code), each with where it is established. ``pk8s`` is
github.com/pulumi/pulumi-kubernetes at commit 94977969d64112b04e19945818a7d5d5f38f631d (the
rules below are unchanged since tag v4.32.0, a03ff6ba; this project pins the 4.34 SDK, whose
provider has the same Diff). ``pulumi`` is github.com/pulumi/pulumi at commit
1b5949891b3cefcb9974752b24a5ecef0acc86c8.

1. Replacement fields (pk8s provider/pkg/provider/diff.go, ``forceNewProperties``/``forceNew``):
   ``metadata.name`` and ``metadata.namespace`` for every kind; per (group, version, kind) the
   table :data:`FORCE_NEW` (Deployment/DaemonSet ``spec.selector``; StatefulSet
   ``spec.selector``, ``spec.serviceName``, ``spec.podManagementPolicy``,
   ``spec.revisionHistoryLimit``, ``spec.volumeClaimTemplates``; PersistentVolumeClaim
   ``spec.accessModes``/``spec.storageClassName``/``spec.selector``/``spec.volumeName`` but not
   ``spec.resources``; Service ``spec.clusterIP`` but not ``spec.type``; policy/v1beta1 PDB
   ``spec``, policy/v1 none; Ingress, Namespace and custom resources: only name/namespace).
   Secrets: ``type``, ``stringData`` and ``data`` force a replacement unless the provider runs
   with ``enableSecretMutable`` (default false) and the Secret is not ``immutable``; ConfigMaps
   likewise for ``data``/``binaryData`` with ``enableConfigMapMutable`` (default false)
   (diff.go ``forceNewProperties``; defaults in provider/pkg/provider/provider.go, the
   ``enableSecretMutable``/``enableConfigMapMutable`` closures, "Default to false").
2. A changed path forces replacement when the change's JSON-patch slice contains one of those
   paths (pk8s provider/pkg/provider/provider.go ``addPatchValueToDiff`` with
   provider/pkg/openapi/match.go ``PatchPropertiesChanged``): a change at or below a force-new
   path, or an added value that contains one.
3. The provider itself asks for delete-before-replace exactly when it replaces a named (not
   autonamed) object whose new name and namespace equal the old ones (pk8s provider.go ``Diff``,
   "Delete before replacement if we are forced to replace the old object, and the new version of
   that object MUST have the same name"). A renamed or re-namespaced object is created first.
   The ``deleteBeforeReplace`` resource option overrides the provider either way (pulumi
   pkg/resource/deploy/step_generator.go, "The user can override the provider's decision");
   the recorded registration holds only the option's value, so False reads as "not set".
   ``replaceOnChanges`` turns changes into replacements in the engine after the provider's Diff
   (step_generator.go ``applyReplaceOnChanges``), so such a replacement of a same-named object
   is create-first unless the option says otherwise.
4. ``ignoreChanges``: the engine resets each listed path in the new inputs to its old value
   before diffing (step_generator.go ``processIgnoreChanges``) and the provider drops diff paths
   under them (pk8s provider.go ``Diff``, "Remove any ignored changes"); ``*`` matches any key
   or index (pulumi sdk/go/common/resource/properties_path.go ``Contains``). A path that meets an
   element only one side has (an added claim template, say) is a path error: the program's value
   stays, and its change counts (properties_path.go ``reset``). A replacement is created from the
   program's values, ignored paths included: the engine re-runs Check on the goal's properties
   before the replacement (step_generator.go, "If we are going to perform a replacement, we need
   to recompute the default values").
5. ``protect``: replacing a resource that is protected before and after fails the update
   (step_generator.go, "unable to replace resource ... marked for protection"); deleting a
   protected resource fails (pulumi pkg/resource/deploy/step.go ``DeleteStep.Apply``).
6. ``retainOnDelete``: the delete step, also the one of a replacement, is a no-op for a resource
   whose state is retained (step.go ``DeleteStep.Apply``, "Deleting a 'drop on delete' is a
   no-op"); the object stays in the cluster, unmanaged.
7. Create-before-delete is the engine's default: the old object of a create-first replacement
   is deleted after everything else has been created and updated (step_generator.go,
   "CreateBeforeDelete: the default mode first creates a new instance ... finally after all of
   that, deletes the old resource"); removed resources are deleted at the end too.
8. A create of an object that already exists fails with AlreadyExists unless the provider runs
   with ``upsertExistingObjects`` (default false) (pk8s provider/pkg/await/await.go ``Creation``,
   "The resource already exists in the cluster"; provider.go ``upsertExistingObjects``). During
   ``pulumi preview`` the provider swallows that error (provider.go ``Create``:
   ``serverSideApplyMode && IsAlreadyExists`` -> ``failedPreview``), so only ``pulumi up`` shows it.
9. Aliases: the engine looks an old resource up by URN first, then by each alias; an alias spec
   fills unset parts (name, type, parent) from the resource itself, and a child of an aliased
   parent also answers to its URN under the parent's old URN, with the parent's old name put in
   place of a name prefix equal to the parent's new name (step_generator.go
   ``collapseAliasToUrn``, ``inheritedChildAlias``, ``generateAliases``, ``getOldResource``).
10. When the provider cannot tell whether a kind is namespaced (a custom resource without its
    CRD) it assumes namespaced; a namespaced object without a namespace is in ``default``
    (pk8s provider.go ``Diff``, ``canonicalNamespace``).
"""

from __future__ import annotations

import copy

import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Optional, Sequence, Union

from render.offline import Registered

Segment = Union[str, int]
Path = tuple[Segment, ...]
Op = Literal["same", "update", "replace", "create", "delete"]

# How the Pulumi SDK marks a secret value on the wire: {SECRET_SIG: <sig>, "value": ...}.
SECRET_SIG = "4dabf18193072939515e22adb298388d"
WILDCARD = "*"


# What the preview reads of a registration: the offline runner's record of it.
RegisteredLike = Registered


@dataclass(frozen=True)
class ProviderOptions:
    """The provider settings the rules depend on, at their defaults (fact 1 and 8)."""

    enable_secret_mutable: bool = False
    enable_configmap_mutable: bool = False
    upsert_existing_objects: bool = False


DEFAULT_OPTIONS = ProviderOptions()


def options_from_config(config: Mapping[str, Any]) -> ProviderOptions:
    """The default provider's options as a stack file sets them (``kubernetes:enableSecretMutable``...)."""

    def flag(name: str) -> bool:
        return str(config.get(f"kubernetes:{name}", "false")).lower() == "true"

    return ProviderOptions(
        enable_secret_mutable=flag("enableSecretMutable"),
        enable_configmap_mutable=flag("enableConfigMapMutable"),
        upsert_existing_objects=flag("upsertExistingObjects"),
    )

# ---------------------------------------------------------------------------------------------
# The force-new table (fact 1), as dotted paths; "[*]" is any list element.

IDENTITY_PATHS = ("metadata.name", "metadata.namespace")
_SELECTOR = ("spec.selector",)
_WORKLOAD_SELECTOR = _SELECTOR
_STATEFULSET = (
    "spec.podManagementPolicy",
    "spec.revisionHistoryLimit",
    "spec.selector",
    "spec.serviceName",
    "spec.volumeClaimTemplates",
)
_CONTAINER_FIELDS = (
    "args", "command", "env", "image", "imagePullPolicy", "lifecycle", "livenessProbe", "ports",
    "readinessProbe", "resources", "securityContext", "stdin", "stdinOnce", "terminationMessagePath",
    "terminationMessagePolicy", "tty", "volumeDevices", "volumeMounts", "workingDir",
)
_POD = (
    "spec.affinity", "spec.automountServiceAccountToken", "spec.dnsConfig", "spec.dnsPolicy",
    "spec.enableServiceLinks", "spec.hostAliases", "spec.hostIPC", "spec.hostNetwork", "spec.hostPID",
    "spec.hostname", "spec.imagePullSecrets", "spec.nodeName", "spec.nodeSelector", "spec.overhead",
    "spec.preemptionPolicy", "spec.priority", "spec.priorityClassName", "spec.readinessGates",
    "spec.restartPolicy", "spec.runtimeClassName", "spec.schedulerName", "spec.securityContext",
    "spec.serviceAccount", "spec.serviceAccountName", "spec.shareProcessNamespace", "spec.subdomain",
    "spec.terminationGracePeriodSeconds", "spec.volumes",
) + tuple(f"spec.{c}[*].{f}" for c in ("containers", "initContainers") for f in _CONTAINER_FIELDS)
_PERSISTENT_VOLUME_SOURCES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "csi", "fc", "flexVolume",
    "flocker", "gcePersistentDisk", "glusterfs", "hostPath", "iscsi", "local", "nfs",
    "photonPersistentDisk", "portworxVolume", "quobyte", "rbd", "scaleIO", "storageos", "vsphereVolume",
)
_CORE_V1: dict[str, tuple[str, ...]] = {
    "PersistentVolume": tuple(f"spec.{s}" for s in _PERSISTENT_VOLUME_SOURCES),
    "PersistentVolumeClaim": ("spec.accessModes", "spec.selector", "spec.storageClassName", "spec.volumeName"),
    "Pod": _POD,
    "ResourceQuota": ("spec.scopes",),
    # Only reached when Secrets are mutable (enableSecretMutable and not immutable).
    "Secret": ("type",),
    "Service": ("spec.clusterIP",),
}
_ROLE_BINDING = ("roleRef",)
_JOB = ("spec.completions", "spec.parallelism", "spec.selector", "spec.template")

# group -> version -> kind -> paths. The core group is listed as "" and as "core".
FORCE_NEW: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {
    "apps": {
        # .spec.selector replaces Deployments/DaemonSets only after v1beta1.
        "v1beta1": {"StatefulSet": _STATEFULSET},
        "v1beta2": {"DaemonSet": _WORKLOAD_SELECTOR, "Deployment": _WORKLOAD_SELECTOR, "StatefulSet": _STATEFULSET},
        "v1": {"DaemonSet": _WORKLOAD_SELECTOR, "Deployment": _WORKLOAD_SELECTOR, "StatefulSet": _STATEFULSET},
    },
    "": {"v1": _CORE_V1},
    "core": {"v1": _CORE_V1},
    "policy": {"v1beta1": {"PodDisruptionBudget": ("spec",)}},
    "rbac.authorization.k8s.io": {
        v: {"ClusterRoleBinding": _ROLE_BINDING, "RoleBinding": _ROLE_BINDING} for v in ("v1alpha1", "v1beta1", "v1")
    },
    "storage.k8s.io": {"v1": {"StorageClass": ("parameters", "provisioner")}},
    "batch": {v: {"Job": _JOB} for v in ("v1beta1", "v1", "v2alpha1")},
}
SECRET_DATA_PATHS = ("type", "stringData", "data")
CONFIGMAP_DATA_PATHS = ("binaryData", "data")

# Kinds that live outside namespaces (the provider asks the API server; this is the offline
# stand-in). Anything else, custom resources included, is namespaced (fact 10).
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "APIService", "CSIDriver", "CSINode", "CertificateSigningRequest", "ClusterIssuer", "ClusterRole",
        "ClusterRoleBinding", "CustomResourceDefinition", "GatewayClass", "IngressClass",
        "MutatingWebhookConfiguration", "Namespace", "Node", "PersistentVolume", "PriorityClass",
        "RuntimeClass", "StorageClass", "ValidatingAdmissionPolicy", "ValidatingWebhookConfiguration",
        "VolumeAttachment",
    }
)

# ---------------------------------------------------------------------------------------------
# Property paths.

_PATH_TOKEN = re.compile(r'\.?([^.\[\]"]+)|\["((?:[^"\\]|\\.)*)"\]|\[(\d+|\*)\]')


def parse_path(text: str) -> Path:
    """A Pulumi property path (``spec.template.spec.containers[0].image``,
    ``metadata.annotations["a.b/c"]``, ``spec.*``) as segments; ``[*]`` and ``*`` are wildcards."""
    text = text.lstrip(".")
    segments: list[Segment] = []
    position = 0
    while position < len(text):
        match = _PATH_TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"not a property path: {text!r}")
        plain, quoted, index = match.groups()
        if plain is not None:
            segments.append(plain)
        elif quoted is not None:
            segments.append(quoted.replace('\\"', '"'))
        else:
            segments.append(WILDCARD if index == WILDCARD else int(index))
        position = match.end()
    return tuple(segments)


def format_path(path: Path) -> str:
    text = ""
    for segment in path:
        if isinstance(segment, int):
            text += f"[{segment}]"
        elif re.search(r'[."\[\]]', segment):
            text += '["' + segment.replace('"', '\\"') + '"]'
        else:
            text += f".{segment}" if text else segment
    return text


def path_contains(prefix: Path, path: Path) -> bool:
    """Pulumi's ``PropertyPath.Contains``: ``prefix`` equals or encloses ``path``; ``*`` matches
    any key or index at its level."""
    if len(path) < len(prefix):
        return False
    return all(p == WILDCARD or p == q for p, q in zip(prefix, path))


def _lookup(value: Any, path: Path) -> tuple[bool, Any]:
    for segment in path:
        if isinstance(value, dict) and isinstance(segment, str) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and isinstance(segment, int) and 0 <= segment < len(value):
            value = value[segment]
        else:
            return False, None
    return True, value


def _has_path(value: Any, path: Path) -> bool:
    """Whether ``value`` holds ``path`` (wildcards included), as jsonpath finds it in a patch."""
    if not path:
        return True
    head, rest = path[0], path[1:]
    if head == WILDCARD:
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return any(_has_path(child, rest) for child in children)
    found, child = _lookup(value, (head,))
    return found and _has_path(child, rest)


# ---------------------------------------------------------------------------------------------
# Values and diffs.


def unwrap_secrets(value: Any) -> Any:
    """Wire values as plain values: a secret compares by what it holds."""
    if isinstance(value, dict):
        if SECRET_SIG in value and "value" in value:
            return unwrap_secrets(value["value"])
        return {k: unwrap_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(v) for v in value]
    return value


def _equal_scalars(a: Any, b: Any) -> bool:
    numeric = (int, float)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


_MISSING = object()


@dataclass(frozen=True)
class Change:
    """One changed property: added (old missing), deleted (new missing) or updated."""

    path: Path
    old: Any = None
    new: Any = None
    kind: Literal["add", "delete", "update"] = "update"

    @property
    def text(self) -> str:
        return format_path(self.path)


def diff_values(old: Any, new: Any, path: Path = ()) -> list[Change]:
    """Changed properties, maps by key and lists by index, as the provider's detailed diff has them."""
    if old is _MISSING and new is _MISSING:
        return []
    if old is _MISSING:
        return [Change(path, None, new, "add")]
    if new is _MISSING:
        return [Change(path, old, None, "delete")]
    if isinstance(old, dict) and isinstance(new, dict):
        changes: list[Change] = []
        for key in sorted(set(old) | set(new), key=str):
            changes += diff_values(old.get(key, _MISSING), new.get(key, _MISSING), path + (key,))
        return changes
    if isinstance(old, list) and isinstance(new, list):
        changes = []
        for i in range(max(len(old), len(new))):
            changes += diff_values(old[i] if i < len(old) else _MISSING, new[i] if i < len(new) else _MISSING, path + (i,))
        return changes
    if isinstance(old, (dict, list)) or isinstance(new, (dict, list)):
        return [Change(path, old, new, "update")]
    return [] if _equal_scalars(old, new) else [Change(path, old, new, "update")]


def _reset(old: Any, new: Any, path: Path) -> bool:
    """Set ``path`` in ``new`` (in place) back to its value in ``old``: a port of pulumi's
    ``PropertyPath.reset`` (sdk/go/common/resource/properties_path.go). False is its "path
    error": an element added or removed on the way (an array index only one side has, a key only
    old has); the engine then leaves ``new`` as the program wrote it for that path (only an info
    line, step_generator.go ``processIgnoreChanges``). A missing ``old`` value is None."""
    if not path:
        return False
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        if head < 0:
            return False
        old_list, new_list = isinstance(old, list), isinstance(new, list)
        if not rest:
            if not old_list and not new_list:
                return True
            if not old_list or not new_list:
                return False
            if head >= len(old) and head >= len(new):
                return True
            if head >= len(old) or head >= len(new):
                return False
            new[head] = copy.deepcopy(old[head])
            return True
        if not old_list or not new_list:
            return not old_list and not new_list
        if head >= len(old) or head >= len(new):
            return False
        return _reset(old[head], new[head], rest)
    if head == WILDCARD:
        if not rest:
            if isinstance(new, dict):
                if isinstance(old, dict):
                    for key in list(new):
                        if key not in old:
                            del new[key]
                    new.update(copy.deepcopy(old))
                return True
            if isinstance(new, list):
                if isinstance(old, list):
                    for i in range(min(len(old), len(new))):
                        new[i] = copy.deepcopy(old[i])
                    return len(old) == len(new)
                return True
            return False
        if isinstance(old, dict) and isinstance(new, dict):
            for key in old:
                if key not in new or not _reset(old[key], new[key], rest):
                    return False
            return True
        if isinstance(old, list) and isinstance(new, list):
            for i in range(min(len(old), len(new))):
                if not _reset(old[i], new[i], rest):
                    return False
            return len(old) == len(new)
        return False
    if not rest:
        if isinstance(old, dict) and head in old:
            if not isinstance(new, dict):
                return False
            new[head] = copy.deepcopy(old[head])
        elif isinstance(new, dict):
            new.pop(head, None)
        return True
    if not isinstance(old, dict) or not isinstance(new, dict):
        return not isinstance(old, dict) and not isinstance(new, dict)
    has_old, has_new = head in old, head in new
    if has_old and not has_new:
        return False
    if not has_old and not has_new:
        return True
    return _reset(old.get(head), new[head], rest)


def apply_ignore_changes(old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any], ignore: Iterable[str]) -> dict:
    """The new inputs with every ignored path holding its old value (fact 4); a path that meets an
    added or removed element keeps the program's value."""
    result = copy.deepcopy(dict(new_inputs))
    for text in ignore:
        _reset(old_inputs, result, parse_path(text))
    return result


# ---------------------------------------------------------------------------------------------
# Kubernetes identity.


def group_version(inputs: Mapping[str, Any]) -> tuple[str, str]:
    api_version = str(inputs.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    return group, version


def kind_of(resource: RegisteredLike) -> str:
    kind = resource.inputs.get("kind") if resource.inputs else None
    return str(kind) if kind else resource.type.rsplit(":", 1)[-1]


def is_namespaced(kind: str) -> bool:
    return kind not in CLUSTER_SCOPED_KINDS


@dataclass(frozen=True)
class ObjectId:
    """A Kubernetes object's identity: two objects with the same one cannot exist at once.
    ``name`` is None for an autonamed object (the provider picks ``<resource name>-<suffix>``)."""

    group: str
    kind: str
    namespace: str
    name: Optional[str]

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name or '<autonamed>'}"


def object_id(resource: RegisteredLike) -> Optional[ObjectId]:
    """The identity of a Kubernetes resource's object, or None for anything else."""
    if not (resource.custom and resource.type.startswith("kubernetes:")):
        return None
    inputs = resource.inputs or {}
    kind = kind_of(resource)
    meta = inputs.get("metadata") or {}
    namespace = (meta.get("namespace") or "default") if is_namespaced(kind) else ""
    name = meta.get("name") or None
    return ObjectId(group_version(inputs)[0], kind, str(namespace), name)


def _normalised(inputs: Mapping[str, Any], kind: str) -> dict:
    """Inputs as the provider compares them: secrets unwrapped, the namespace canonical (fact 10)."""
    plain = unwrap_secrets(dict(inputs))
    meta = dict(plain.get("metadata") or {})
    if is_namespaced(kind):
        meta["namespace"] = meta.get("namespace") or "default"
    else:
        meta.pop("namespace", None)
    plain["metadata"] = meta
    return plain


def force_new_paths(inputs: Mapping[str, Any], options: ProviderOptions = DEFAULT_OPTIONS) -> list[Path]:
    """The paths whose change replaces this object (fact 1)."""
    paths = list(IDENTITY_PATHS)
    group, version = group_version(inputs)
    kind = str(inputs.get("kind") or "")
    versions = FORCE_NEW.get(group)
    table = versions.get(version) if versions else None
    if table is not None:
        immutable = bool(inputs.get("immutable"))
        core = group in ("", "core")
        if core and kind == "Secret" and (not options.enable_secret_mutable or immutable):
            paths += SECRET_DATA_PATHS
        elif kind in table:
            paths += table[kind]
        elif core and kind == "ConfigMap" and (not options.enable_configmap_mutable or immutable):
            paths += CONFIGMAP_DATA_PATHS
    return [parse_path(p) for p in paths]


def forces_replacement(change: Change, force_new: Sequence[Path]) -> bool:
    """Whether a change's patch slice contains a force-new path (fact 2)."""
    for force in force_new:
        if path_contains(force, change.path):
            return True
        if len(force) > len(change.path) and path_contains(change.path, force[: len(change.path)]):
            if change.kind != "delete" and _has_path(change.new, force[len(change.path):]):
                return True
    return False


# ---------------------------------------------------------------------------------------------
# The decision.


@dataclass(frozen=True)
class Action:
    """What ``pulumi up`` does with one resource.

    ``create_first`` (replacements only): the new object is created before the old one is
    deleted (at the end of the update). ``replace_paths``: the changed paths that force the
    replacement. ``retained``: the delete (of a delete or of a replacement) is skipped, the old
    object stays. ``blocked``: why the engine refuses this change (``protect``)."""

    op: Op
    changed: tuple[str, ...] = ()
    replace_paths: tuple[str, ...] = ()
    create_first: Optional[bool] = None
    retained: bool = False
    blocked: Optional[str] = None
    ignored: tuple[str, ...] = ()
    why_order: str = ""

    @property
    def label(self) -> str:
        if self.op == "replace":
            return "replace (create-first)" if self.create_first else "replace (delete-first)"
        return self.op


def _named(inputs: Mapping[str, Any]) -> bool:
    return bool((inputs.get("metadata") or {}).get("name"))


def decide(
    old: Optional[RegisteredLike], new: Optional[RegisteredLike], options: ProviderOptions = DEFAULT_OPTIONS
) -> Action:
    """The action for one resource, from its registration before (``old``) and after (``new``)."""
    if old is None and new is None:
        raise ValueError("decide needs the resource before or after the edit")
    if old is None:
        return Action("create")
    if new is None:
        blocked = "protected: pulumi up refuses to delete it" if old.protect else None
        return Action("delete", retained=old.retain_on_delete, blocked=blocked)
    if not (new.custom and old.custom):
        # Components hold no inputs of their own: what changes is their children.
        return Action("same")
    kind = kind_of(new)
    old_inputs = _normalised(old.inputs, kind_of(old))
    raw_new = _normalised(new.inputs, kind)
    new_inputs = apply_ignore_changes(old_inputs, raw_new, new.ignore_changes)
    changes = diff_values(old_inputs, new_inputs)
    ignored = tuple(c.text for c in diff_values(new_inputs, raw_new))
    if not changes:
        return Action("same", ignored=ignored)
    force_new = force_new_paths(new_inputs, options)
    provider_replaces = [c for c in changes if forces_replacement(c, force_new)]
    on_changes = [parse_path(p) for p in new.replace_on_changes]
    option_replaces = [c for c in changes if any(path_contains(p, c.path) for p in on_changes)]
    changed = tuple(c.text for c in changes)
    if not provider_replaces and not option_replaces:
        return Action("update", changed=changed, ignored=ignored)
    old_meta, new_meta = old_inputs["metadata"], new_inputs["metadata"]
    same_identity = old_meta.get("name") == new_meta.get("name") and old_meta.get("namespace") == new_meta.get("namespace")
    provider_dbr = bool(provider_replaces) and _named(new_inputs) and same_identity
    if new.delete_before_replace:
        dbr, why = True, "deleteBeforeReplace option"
    elif provider_dbr:
        dbr, why = True, "same name and namespace: the provider deletes first"
    elif provider_replaces and not same_identity:
        dbr, why = False, "new name or namespace: created before the old one is deleted"
    elif provider_replaces:
        dbr, why = False, "autonamed: the replacement gets a new name"
    else:
        dbr, why = False, "replaceOnChanges: the engine's default, create-first"
    paths = tuple(dict.fromkeys(c.text for c in provider_replaces + option_replaces))
    blocked = "protected: pulumi up refuses to replace it" if (old.protect and new.protect) else None
    # The replacement takes the program's values, ignored paths too (fact 4): nothing stays ignored.
    return Action(
        "replace",
        changed=changed,
        replace_paths=paths,
        create_first=not dbr,
        retained=old.retain_on_delete,
        blocked=blocked,
        why_order=why,
    )
