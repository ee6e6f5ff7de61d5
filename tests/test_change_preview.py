"""Change preview: the provider's rules on synthetic registrations, then the real program on the
shipped stacks with one edit applied to their config."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from changes.preview import preview
from changes.__main__ import main as cli
from changes.provider import (
    ProviderOptions,
    apply_ignore_changes,
    decide,
    format_path,
    parse_path,
    path_contains,
)
from conftest import run_stack_file, stack_file_config
from render.offline import ProgramRun, Registered

ROOT = Path(__file__).resolve().parent.parent
STACK_URN = "urn:pulumi:test::inference-plane::pulumi:pulumi:Stack::inference-plane-test"
COMPONENT = "inference-plane:index:LlamaServer"


# ---------------------------------------------------------------------------------------------
# Synthetic registrations, URNs built the way the offline engine builds them.


def component(name: str, type_: str = COMPONENT, **opts: Any) -> Registered:
    urn = f"urn:pulumi:test::inference-plane::pulumi:pulumi:Stack${type_}::{name}"
    return Registered(type=type_, name=name, urn=urn, parent=STACK_URN, custom=False, inputs={}, **opts)


def k8s(
    kind: str,
    name: str,
    namespace: Optional[str] = "ai",
    api: str = "v1",
    resource: Optional[str] = None,
    parent: Optional[Registered] = None,
    **fields: Any,
) -> Registered:
    """A Kubernetes resource; ``resource`` is the Pulumi resource name (default: the object's)."""
    parent = parent or component("server")
    group_version = api if "/" in api else f"core/{api}"
    type_ = f"kubernetes:{group_version}:{kind}"
    resource = resource or name
    opts = {k: fields.pop(k) for k in list(fields) if k in OPTION_FIELDS}
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    metadata.update(fields.pop("metadata", {}))
    inputs = {"apiVersion": api, "kind": kind, "metadata": metadata, **fields}
    urn = f"urn:pulumi:test::inference-plane::{parent.type}${type_}::{resource}"
    return Registered(type=type_, name=resource, urn=urn, parent=parent.urn, custom=True, inputs=inputs, **opts)


OPTION_FIELDS = {
    "retain_on_delete", "protect", "delete_before_replace", "ignore_changes", "replace_on_changes", "aliases",
    "custom_timeouts",
}


def edited(resource: Registered, path: str, value: Any = None, delete: bool = False) -> Registered:
    """A copy with one input changed (dotted path; list indices as numbers)."""
    copy_ = copy.deepcopy(resource)
    node: Any = copy_.inputs
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    if delete:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return copy_


def with_options(resource: Registered, **opts: Any) -> Registered:
    copy_ = copy.deepcopy(resource)
    for key, value in opts.items():
        setattr(copy_, key, value)
    return copy_


def deployment(name: str = "llama-server", gpu: Optional[str] = None, claim: Optional[str] = "models", **extra: Any) -> Registered:
    limits = {"memory": "8Gi", **({gpu: "1"} if gpu else {})}
    pod = {
        "containers": [{"name": name, "image": "ghcr.io/ggml-org/llama.cpp:server-b1", "resources": {"limits": limits}}],
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}] if claim else [],
    }
    spec = {
        "replicas": 1,
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
        "template": {"metadata": {"labels": {"app.kubernetes.io/name": name}}, "spec": pod},
    }
    return k8s("Deployment", name, api="apps/v1", spec=spec, **extra)


def statefulset(name: str = "engine", replicas: int = 2, size: str = "256Gi", when_deleted: str = "Retain", **extra: Any) -> Registered:
    spec = {
        "replicas": replicas,
        "serviceName": name,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": name}},
            "spec": {"containers": [{"name": name, "image": "ghcr.io/x/engine:v1",
                                     "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        },
        "volumeClaimTemplates": [
            {"metadata": {"name": "weights"},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                      "resources": {"requests": {"storage": size}}}}
        ],
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": when_deleted, "whenScaled": "Retain"},
    }
    return k8s("StatefulSet", name, api="apps/v1", spec=spec, **extra)


def claim(name: str = "models", storage_class: str = "ceph-filesystem", size: str = "40Gi", **extra: Any) -> Registered:
    spec = {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class, "resources": {"requests": {"storage": size}}}
    return k8s("PersistentVolumeClaim", name, spec=spec, **extra)


def secret(name: str = "api-key", value: str = "k1", **extra: Any) -> Registered:
    wrapped = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": {"key": value}}
    return k8s("Secret", name, type="Opaque", stringData=wrapped, **extra)


def namespace(name: str = "ai", **extra: Any) -> Registered:
    return k8s("Namespace", name, namespace=None, resource=name, parent=component(name, "inference-plane:index:AINamespace"), **extra)


def run_of(*resources: Registered) -> Any:
    return ProgramRun(stack="test", resources=list(resources), outputs={}, secret_outputs=set())


# ---------------------------------------------------------------------------------------------
# Paths.


def test_property_paths_parse_and_print_back():
    path = parse_path('metadata.annotations["inference-plane/cold-start-seconds"]')
    assert path == ("metadata", "annotations", "inference-plane/cold-start-seconds")
    assert format_path(("spec", "containers", 0, "args", 3)) == "spec.containers[0].args[3]"
    assert parse_path("spec.containers[*].image") == ("spec", "containers", "*", "image")
    assert path_contains(parse_path("spec.containers[*]"), ("spec", "containers", 2, "image"))
    assert not path_contains(parse_path("spec.selector"), ("spec", "template"))


# ---------------------------------------------------------------------------------------------
# The provider's replacement rules.


def test_deployment_pod_template_change_is_an_update_in_place():
    old = deployment()
    action = decide(old, edited(old, "spec.template.spec.containers.0.image", "ghcr.io/ggml-org/llama.cpp:server-b2"))
    assert action.op == "update"
    assert action.changed == ("spec.template.spec.containers[0].image",)


def test_deployment_selector_change_replaces_delete_first_under_the_same_name():
    old = deployment()
    action = decide(old, edited(old, "spec.selector.matchLabels", {"app.kubernetes.io/name": "x"}))
    assert action.op == "replace" and action.create_first is False
    assert action.replace_paths == ('spec.selector.matchLabels["app.kubernetes.io/name"]',)


def test_renamed_object_is_replaced_create_first():
    old = deployment()
    action = decide(old, edited(old, "metadata.name", "qwen-chat"))
    assert action.op == "replace" and action.create_first is True
    assert action.replace_paths == ("metadata.name",)


def test_moved_namespace_is_replaced_create_first():
    old = claim()
    action = decide(old, edited(old, "metadata.namespace", "llm"))
    assert (action.op, action.create_first, action.replace_paths) == ("replace", True, ("metadata.namespace",))


def test_delete_before_replace_option_overrides_the_provider():
    old = deployment()
    renamed = with_options(edited(old, "metadata.name", "qwen-chat"), delete_before_replace=True)
    action = decide(old, renamed)
    assert action.op == "replace" and action.create_first is False


@pytest.mark.parametrize(
    "path, value, shown",
    [
        ("spec.volumeClaimTemplates.0.spec.resources.requests.storage", "300Gi",
         "spec.volumeClaimTemplates[0].spec.resources.requests.storage"),
        ("spec.serviceName", "other", "spec.serviceName"),
        ("spec.podManagementPolicy", "OrderedReady", "spec.podManagementPolicy"),
    ],
)
def test_statefulset_immutable_fields_replace_delete_first(path, value, shown):
    old = statefulset()
    action = decide(old, edited(old, path, value))
    assert action.op == "replace" and action.create_first is False
    assert action.replace_paths == (shown,)


def test_statefulset_replicas_and_template_update_in_place():
    old = statefulset()
    assert decide(old, edited(old, "spec.replicas", 3)).op == "update"
    assert decide(old, edited(old, "spec.template.spec.containers.0.image", "ghcr.io/x/engine:v2")).op == "update"


def test_secret_data_change_replaces_because_secrets_are_immutable_by_default():
    old = secret(value="k1")
    new = secret(value="k2")
    action = decide(old, new)
    assert action.op == "replace" and action.create_first is False
    assert action.replace_paths == ("stringData.key",)
    # With enableSecretMutable the same change is an update; an immutable Secret still replaces.
    assert decide(old, new, ProviderOptions(enable_secret_mutable=True)).op == "update"
    immutable_old, immutable_new = edited(old, "immutable", True), edited(new, "immutable", True)
    assert decide(immutable_old, immutable_new, ProviderOptions(enable_secret_mutable=True)).op == "replace"


def test_configmap_data_replaces_unless_mutable():
    old = k8s("ConfigMap", "conf", data={"a": "1"})
    new = edited(old, "data.a", "2")
    assert decide(old, new).op == "replace"
    assert decide(old, new, ProviderOptions(enable_configmap_mutable=True)).op == "update"


def test_claim_class_replaces_but_size_updates_in_place():
    old = claim()
    assert decide(old, edited(old, "spec.storageClassName", "ceph-block")).op == "replace"
    assert decide(old, edited(old, "spec.accessModes", ["ReadWriteOnce"])).op == "replace"
    assert decide(old, edited(old, "spec.resources.requests.storage", "80Gi")).op == "update"


def test_service_cluster_ip_replaces_type_does_not():
    old = k8s("Service", "svc", spec={"type": "ClusterIP", "clusterIP": "None", "ports": [{"port": 80}]})
    assert decide(old, edited(old, "spec.clusterIP", "10.0.0.5")).op == "replace"
    assert decide(old, edited(old, "spec.type", "LoadBalancer")).op == "update"


def test_ingress_custom_resources_and_v1_disruption_budgets_update_in_place():
    ingress = k8s("Ingress", "chat", api="networking.k8s.io/v1", spec={"rules": [{"host": "a.example"}]})
    assert decide(ingress, edited(ingress, "spec.rules.0.host", "b.example")).op == "update"
    route = k8s("HTTPRoute", "r", api="gateway.networking.k8s.io/v1", spec={"hostnames": ["a"]})
    assert decide(route, edited(route, "spec.hostnames", ["b"])).op == "update"
    pdb = k8s("PodDisruptionBudget", "p", api="policy/v1", spec={"maxUnavailable": 1})
    assert decide(pdb, edited(pdb, "spec.maxUnavailable", 2)).op == "update"
    old_pdb = k8s("PodDisruptionBudget", "p", api="policy/v1beta1", spec={"maxUnavailable": 1})
    assert decide(old_pdb, edited(old_pdb, "spec.maxUnavailable", 2)).op == "replace"


def test_an_added_value_that_holds_a_force_new_field_replaces():
    old = edited(statefulset(), "spec.volumeClaimTemplates", delete=True)
    assert decide(old, statefulset()).op == "replace"


def test_numbers_compare_by_value_and_unchanged_objects_are_same():
    old = edited(deployment(), "spec.replicas", 1)
    assert decide(old, edited(old, "spec.replicas", 1.0)).op == "same"


def test_autonamed_object_is_replaced_create_first():
    old = edited(claim(), "metadata.name", delete=True)
    action = decide(old, edited(old, "spec.storageClassName", "ceph-block"))
    assert action.op == "replace" and action.create_first is True


def test_ignore_changes_keeps_the_old_value():
    old = deployment()
    changed = edited(old, "spec.template.spec.containers.0.image", "ghcr.io/ggml-org/llama.cpp:server-b2")
    ignored = with_options(changed, ignore_changes=["spec.template.spec.containers[0].image"])
    action = decide(old, ignored)
    assert action.op == "same" and action.ignored == ("spec.template.spec.containers[0].image",)
    # An ignored selector change no longer forces the replacement.
    reselected = with_options(edited(old, "spec.selector.matchLabels", {"x": "y"}), ignore_changes=["spec.selector"])
    assert decide(old, reselected).op == "same"
    # A wildcard ignores every element.
    assert apply_ignore_changes({"a": [1, 2]}, {"a": [3, 4]}, ["a[*]"]) == {"a": [1, 2]}


def test_ignore_changes_follows_the_engines_path_rules_for_added_and_removed_elements():
    """pulumi's PropertyPath.reset: an element only one side has is a path error, and the
    program's value stays (so an added claim template is not silently dropped)."""
    added = apply_ignore_changes({"spec": {}}, {"spec": {"t": [{"n": 1}]}}, ["spec.t[0]"])
    assert added == {"spec": {"t": [{"n": 1}]}}
    removed = apply_ignore_changes({"spec": {"t": [{"n": 1}]}}, {"spec": {}}, ["spec.t[0]"])
    assert removed == {"spec": {}}
    assert apply_ignore_changes({"spec": {"t": [{"n": 1}]}}, {"spec": {"t": [{"n": 2}]}}, ["spec.t[0]"]) == {"spec": {"t": [{"n": 1}]}}
    # A leaf key that old lacks is removed from new; deeper, a key only new has is left alone.
    assert apply_ignore_changes({"a": {}}, {"a": {"b": 1}}, ["a.b"]) == {"a": {}}
    assert apply_ignore_changes({}, {"a": {"b": {"c": 1}}}, ["a.b.c"]) == {"a": {"b": {"c": 1}}}


def test_a_replacement_takes_the_programs_values_even_where_changes_are_ignored():
    old = statefulset()
    new = edited(edited(old, "spec.volumeClaimTemplates.0.spec.resources.requests.storage", "300Gi"), "spec.serviceName", "renamed")
    new = with_options(new, ignore_changes=["spec.volumeClaimTemplates[0]"])
    report = preview(run_of(old), run_of(new))
    (entry,) = report.find("StatefulSet")
    assert entry.op == "replace" and entry.action.ignored == ()
    assert entry.applied.inputs["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "300Gi"
    assert report.of_kind("change-ignored") == []
    (kept,) = report.of_kind("claim-template-ignored")
    assert "weights-engine-0, weights-engine-1 are re-used as they are" in kept.message


def test_a_template_mounting_a_volume_nothing_defines_is_an_error():
    old = statefulset()
    new = edited(old, "spec.template.spec.containers.0.volumeMounts", [{"name": "models", "mountPath": "/models"}])
    report = preview(run_of(old), run_of(new))
    (error,) = report.of_kind("pods-cannot-start")
    assert error.severity == "error" and "mounts models" in error.message


def test_replace_on_changes_replaces_create_first_even_under_the_same_name():
    old = deployment()
    new = with_options(edited(old, "spec.replicas", 2), replace_on_changes=["spec.replicas"])
    action = decide(old, new)
    assert (action.op, action.create_first, action.replace_paths) == ("replace", True, ("spec.replicas",))


def test_protect_blocks_replace_and_delete_but_not_an_unprotecting_replace():
    old = with_options(claim(), protect=True)
    new = edited(old, "spec.storageClassName", "ceph-block")
    assert "protected" in (decide(old, new).blocked or "")
    assert decide(old, with_options(new, protect=False)).blocked is None
    assert "refuses to delete" in (decide(old, None).blocked or "")


def test_retain_on_delete_is_recorded_on_delete_and_replace():
    old = with_options(claim(), retain_on_delete=True)
    assert decide(old, None).retained is True
    assert decide(old, edited(old, "spec.storageClassName", "x")).retained is True


# ---------------------------------------------------------------------------------------------
# Pairing, collisions, claims, waits.


def test_alias_pairs_a_renamed_resource_instead_of_delete_and_create():
    old = deployment()
    new = k8s("Deployment", "llama-server", api="apps/v1", resource="chat", spec=old.inputs["spec"],
              aliases=[{"name": "llama-server"}])
    report = preview(run_of(old), run_of(new))
    (entry,) = report.entries
    assert entry.op == "same" and entry.via_alias and entry.old_urn == old.urn


def test_children_follow_an_aliased_parent_with_their_name_prefix_rewritten():
    old_parent = component("llama-server")
    old_child = k8s("Service", "svc", resource="llama-server-svc", parent=old_parent, spec={"type": "ClusterIP"})
    new_parent = component("qwen-chat", aliases=[{"name": "llama-server"}])
    new_child = k8s("Service", "svc", resource="qwen-chat-svc", parent=new_parent, spec={"type": "ClusterIP"})
    report = preview(run_of(old_parent, old_child), run_of(new_parent, new_child))
    assert {(e.name, e.op, e.via_alias) for e in report.entries} == {("qwen-chat", "same", True), ("qwen-chat-svc", "same", True)}


def test_alias_by_urn_and_without_parent():
    old = deployment()
    by_urn = k8s("Deployment", "llama-server", api="apps/v1", resource="chat", spec=old.inputs["spec"],
                 aliases=[{"urn": old.urn}])
    assert [e.op for e in preview(run_of(old), run_of(by_urn)).entries] == ["same"]
    top_level = Registered(type=old.type, name="llama-server", urn="urn:pulumi:test::inference-plane::pulumi:pulumi:Stack$"
                           f"{old.type}::llama-server", parent=STACK_URN, custom=True, inputs=old.inputs)
    moved = with_options(old, aliases=[{"no_parent": True}])
    report = preview(run_of(top_level), run_of(component("server"), moved))
    entry = report.entry("Deployment", "llama-server")
    assert entry.op == "same" and entry.via_alias and entry.old_urn == top_level.urn


def test_alias_urns_are_built_as_the_recorded_ones(homelab_base):
    from changes.pairing import _UrnBuilder, _urn_parts

    builder = _UrnBuilder(homelab_base.resources)
    for r in homelab_base.resources:
        stack, project, _, _ = _urn_parts(r.urn)
        assert builder.make(stack, project, r.parent, r.type, r.name) == r.urn


def test_without_an_alias_a_rename_is_delete_and_create():
    old = deployment()
    new = k8s("Deployment", "llama-server", api="apps/v1", resource="chat", spec=old.inputs["spec"])
    report = preview(run_of(old), run_of(new))
    assert sorted(e.op for e in report.entries) == ["create", "delete"]
    # Same object name, new resource: created while the old one is still there.
    (collision,) = report.of_kind("already-exists")
    assert collision.subject == "Deployment ai/llama-server" and collision.severity == "error"


def test_retained_claim_replaced_delete_first_collides_with_itself():
    old = claim(retain_on_delete=True)
    report = preview(run_of(old), run_of(edited(old, "spec.storageClassName", "ceph-block")))
    entry = report.entry("PersistentVolumeClaim", "models")
    assert entry.action.label == "replace (delete-first)" and entry.action.retained
    (collision,) = report.of_kind("already-exists")
    assert collision.subject == "PersistentVolumeClaim ai/models" and "retainOnDelete" in collision.message
    assert not report.of_kind("claim-lost")


def test_claim_replaced_without_retain_is_lost_and_its_readers_download_again():
    old_claim, server = claim(), deployment()
    report = preview(run_of(old_claim, server), run_of(edited(old_claim, "spec.storageClassName", "x"), server))
    assert [c.subject for c in report.of_kind("claim-lost")] == ["PersistentVolumeClaim ai/models"]
    assert not report.of_kind("already-exists")


def test_namespace_delete_takes_retained_claims_with_it():
    ns, kept = namespace("ai"), claim(retain_on_delete=True)
    report = preview(run_of(ns, kept), run_of())
    (lost,) = report.of_kind("claim-lost")
    assert lost.subject == "PersistentVolumeClaim ai/models" and "Namespace ai" in lost.message


def test_protected_resource_blocks_the_update():
    old = with_options(claim(), protect=True)
    report = preview(run_of(old), run_of())
    (blocked,) = report.of_kind("protected")
    assert blocked.severity == "error" and blocked.subject == "PersistentVolumeClaim ai/models"


def test_renamed_statefulset_orphans_its_claims_and_downloads_again():
    old = statefulset("engine")
    new = statefulset("engine-2", resource="engine-2")
    report = preview(run_of(old), run_of(new))
    assert [c.subject for c in report.of_kind("claim-orphaned")] == [
        "PersistentVolumeClaim ai/weights-engine-0", "PersistentVolumeClaim ai/weights-engine-1"]
    (download,) = report.of_kind("redownload")
    assert download.subject == "StatefulSet ai/engine-2" and "weights-engine-2-0" in download.message
    (pending,) = report.of_kind("gpu-pending")
    assert pending.subject == "StatefulSet ai/engine-2"


def test_statefulset_claims_with_delete_policy_are_lost_with_it():
    report = preview(run_of(statefulset(when_deleted="Delete")), run_of())
    assert len(report.of_kind("claim-lost")) == 2


def test_statefulset_replaced_with_delete_policy_loses_its_claims_and_downloads_again():
    old = statefulset(when_deleted="Delete")
    report = preview(run_of(old), run_of(edited(old, "spec.serviceName", "other")))
    assert len(report.of_kind("claim-lost")) == 2
    (download,) = report.of_kind("redownload")
    assert download.message.startswith("downloads again")


def test_statefulset_claim_template_change_keeps_the_existing_claims_as_they_are():
    old = statefulset(size="256Gi")
    report = preview(run_of(old), run_of(statefulset(size="300Gi")))
    assert report.entry("StatefulSet", "engine").action.label == "replace (delete-first)"
    (ignored,) = report.of_kind("claim-template-ignored")
    assert "weights-engine-0, weights-engine-1" in ignored.message
    assert not report.of_kind("redownload") and not report.of_kind("claim-lost")
    (down,) = report.of_kind("downtime")
    assert down.subject == "StatefulSet ai/engine"


def test_gpu_pod_started_beside_the_one_holding_the_gpu_stays_pending():
    old = deployment(gpu="gpu.intel.com/i915")
    report = preview(run_of(old), run_of(edited(old, "metadata.name", "qwen-chat")))
    (pending,) = report.of_kind("gpu-pending")
    assert pending.subject == "Deployment ai/qwen-chat" and "gpu.intel.com/i915" in pending.message


def test_scaling_a_statefulset_up_downloads_for_the_new_replica_only():
    old = statefulset(replicas=2)
    report = preview(run_of(old), run_of(edited(old, "spec.replicas", 3)))
    (download,) = report.of_kind("redownload")
    assert download.severity == "info" and download.message.startswith("downloads its weights")
    assert "ai/weights-engine-2" in download.message and "engine-1" not in download.message
    assert [c.kind for c in report.consequences] == ["redownload", "scale-up"]


def test_scaling_down_orphans_the_extra_claims():
    old = statefulset(replicas=2)
    report = preview(run_of(old), run_of(edited(old, "spec.replicas", 1)))
    (orphan,) = report.of_kind("claim-orphaned")
    assert orphan.subject == "PersistentVolumeClaim ai/weights-engine-1" and "scaled down" in orphan.message


def test_object_updated_to_point_at_a_new_service_is_reported():
    engine_set = statefulset("engine")
    backend = k8s("Backend", "local", api="gateway.envoyproxy.io/v1alpha1",
                  spec={"endpoints": [{"fqdn": {"hostname": "engine.ai.svc.cluster.local", "port": 8731}}]})
    renamed_set = statefulset("engine-2", resource="engine-2")
    service = k8s("Service", "engine-2", resource="engine-2-svc",
                  spec={"clusterIP": "None", "selector": {"app.kubernetes.io/name": "engine-2"}})
    pointed = edited(backend, "spec.endpoints.0.fqdn.hostname", "engine-2.ai.svc.cluster.local")
    report = preview(run_of(engine_set, backend), run_of(renamed_set, service, pointed))
    (moved,) = report.of_kind("traffic-to-new-service")
    assert moved.subject == "Backend ai/local" and "never becomes ready" in moved.message


def test_shrinking_a_claim_is_refused():
    old = claim(size="40Gi")
    report = preview(run_of(old), run_of(edited(old, "spec.resources.requests.storage", "20Gi")))
    assert report.entry("PersistentVolumeClaim", "models").op == "update"
    assert [c.kind for c in report.errors] == ["update-rejected"]


# ---------------------------------------------------------------------------------------------
# The real program on the shipped stacks.

P = "inference-plane:"




def edit(stack: str, path: str, value: Any) -> Any:
    mapping = copy.deepcopy(stack_file_config(stack))
    keys = path.split(".")
    node = mapping[P + keys[0]]
    for key in keys[1:-1]:
        node = node[key]
    node[keys[-1]] = value
    return run_stack_file(stack, mapping)


@pytest.fixture(scope="module")
def homelab_base() -> Any:
    return run_stack_file("homelab", stack_file_config("homelab"))


@pytest.fixture(scope="module")
def strix_base() -> Any:
    return run_stack_file("strix-halo", stack_file_config("strix-halo"))


def changed(report: Any) -> set[tuple[str, str, str]]:
    return {(e.kind, e.object_name or e.name, e.action.label) for e in report.changed() if e.kubernetes}


def test_homelab_embed_context_is_an_update_and_a_restart_without_a_download(homelab_base):
    report = preview(homelab_base, edit("homelab", "models.embed.ctx_size", 4096))
    assert changed(report) == {("Deployment", "llama-embed", "update")}
    entry = report.entry("Deployment", "llama-embed")
    assert any(p.startswith("spec.template.spec.containers[0].args") for p in entry.action.changed)
    assert [(c.kind, c.subject) for c in report.consequences if c.kind in ("restart", "downtime")] == [
        ("downtime", "Deployment ai/llama-embed"), ("restart", "Deployment ai/llama-embed")]
    assert "Recreate" in report.of_kind("restart")[0].message
    assert not report.of_kind("redownload") and not report.errors


def test_homelab_ingress_host_is_an_ingress_update_and_nothing_else(homelab_base):
    report = preview(homelab_base, edit("homelab", "models.chat.exposure.host", "chat.renner.uno"))
    assert changed(report) == {("Ingress", "llama-server", "update")}
    assert report.entry("Ingress", "llama-server").action.changed == ("spec.rules[0].host", "spec.tls[0].hosts[0]")
    assert report.consequences == []


def test_homelab_cache_growth_is_an_expansion_in_place(homelab_base):
    report = preview(homelab_base, edit("homelab", "model_cache.size", "80Gi"))
    assert changed(report) == {("PersistentVolumeClaim", "llama-server-models", "update")}
    (expansion,) = report.consequences
    assert expansion.kind == "volume-expansion" and expansion.severity == "warning"
    assert "allowVolumeExpansion" in expansion.message


def test_homelab_key_rotation_replaces_the_secret_and_restarts_its_server(homelab_base):
    rotated = run_stack_file("homelab", stack_file_config("homelab"), secrets={"llama_api_key": "rotated-key-5c1d"})
    report = preview(homelab_base, rotated)
    assert changed(report) == {
        ("Secret", "llama-server-api-key", "replace (delete-first)"),
        ("Deployment", "llama-server", "update"),
    }
    assert report.entry("Deployment", "llama-server").action.changed == (
        "spec.template.metadata.annotations.inference-plane/api-key-fingerprint",)
    assert {c.kind for c in report.consequences} == {"restart", "downtime", "secret-gap", "old-key-refused"}
    assert not report.of_kind("stale-secret")


def test_strix_embed_context_restarts_the_embedder_only(strix_base):
    report = preview(strix_base, edit("strix-halo", "models.embed.ctx_size", 4096))
    assert {(k, n) for k, n, _ in changed(report)} == {("Deployment", "llama-cpp")}
    assert report.entry("Deployment", "llama-cpp").op == "update"
    assert [c.subject for c in report.of_kind("restart")] == ["Deployment shikanime/llama-cpp"]
    assert not report.of_kind("redownload") and not report.errors
    assert report.entry("StatefulSet", "halogen-flash").op == "same"


def test_report_text_has_one_line_per_changed_object(homelab_base):
    report = preview(homelab_base, edit("homelab", "models.embed.ctx_size", 4096))
    lines = report.text().splitlines()
    unchanged = sum(1 for e in report.entries if e.kubernetes and e.op == "same")
    assert lines[0] == f"homelab: 1 update, 0 replace, 0 create, 0 delete, {unchanged} unchanged"
    assert lines[1].split()[:3] == ["update", "Deployment", "ai/llama-embed"]
    assert lines[2] == "consequences:" and len(lines) == 5


# ---------------------------------------------------------------------------------------------
# The command line.


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args],
                   check=True, capture_output=True)


@pytest.fixture
def stack_repo(tmp_path: Path) -> Path:
    for stack in ("homelab",):
        (tmp_path / f"Pulumi.{stack}.yaml").write_text((ROOT / f"Pulumi.{stack}.yaml").read_text())
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    return tmp_path


def test_cli_compares_the_stack_at_a_ref_with_the_working_tree(stack_repo, capsys):
    path = stack_repo / "Pulumi.homelab.yaml"
    path.write_text(path.read_text().replace("ctx_size: 2048", "ctx_size: 4096"))
    assert cli(["homelab", "--base", "HEAD", "--project-dir", str(stack_repo)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("homelab: 1 update, 0 replace, 0 create, 0 delete, ")
    assert "restart                Deployment ai/llama-embed" in out


def test_cli_treats_a_changed_ciphertext_as_a_rotation(stack_repo, tmp_path, capsys):
    before = stack_repo / "Pulumi.homelab.yaml"
    after = tmp_path / "after.yaml"
    after.write_text(before.read_text().replace("secure: v1:cGxh", "secure: v1:ZGlm"))
    assert cli(["homelab", "--before-file", str(before), "--after-file", str(after)]) == 0
    out = capsys.readouterr().out
    # The stack sets kubernetes:enableSecretMutable: the Secret is updated in place, never missing.
    assert "update                  Secret ai/llama-server-api-key" in out
    assert "replace" not in out.split("\n", 1)[1].split("(secrets")[0].replace("0 replace", "")
    assert "(secrets treated as rotated: inference-plane:llama_api_key)" in out


def test_cli_on_a_new_uncommitted_stack_file_shows_everything_created(stack_repo, capsys):
    """`make diff` on a stack file just written (make new-stack) and not committed: nothing existed
    before it, so every object is created and its downloads are listed; not git's error."""
    (stack_repo / "Pulumi.mybox.yaml").write_text((ROOT / "Pulumi.rtx3060.yaml").read_text())
    assert cli(["mybox", "--base", "HEAD", "--project-dir", str(stack_repo)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Pulumi.mybox.yaml is not in HEAD (a new stack, not committed yet): everything is created"
    counts = lines[1].split(": ", 1)[1]
    assert counts.startswith("0 update, 0 replace, ") and counts.endswith(" create, 0 delete, 0 unchanged")
    assert "  create                  Deployment ai/llama-chat" in lines
    # A stack that exists in neither the ref nor the folder is still refused (below).


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nostack", "--base", "HEAD"], "changes nostack: no stack 'nostack'"),
        (["homelab", "--base", "no-such-ref"], "changes homelab: cannot read Pulumi.homelab.yaml at 'no-such-ref'"),
        (["homelab"], "changes homelab: give --base"),
    ],
)
def test_cli_refuses_bad_input_with_one_line_and_status_2(stack_repo, capsys, argv, message):
    assert cli(argv + ["--project-dir", str(stack_repo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_cli_runs_as_a_module(stack_repo):
    done = subprocess.run([sys.executable, "-m", "changes", "homelab", "--base", "HEAD", "--project-dir", str(stack_repo)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("homelab: 0 update, 0 replace")
    assert "consequences: none" in done.stdout


def test_an_ignored_edit_is_reported_as_not_applied():
    old = with_options(claim(), ignore_changes=["spec.storageClassName"])
    report = preview(run_of(old), run_of(edited(old, "spec.storageClassName", "ceph-block")))
    assert report.entry("PersistentVolumeClaim", "models").op == "same"
    (ignored,) = report.of_kind("change-ignored")
    assert ignored.subject == "PersistentVolumeClaim ai/models" and ignored.message.startswith("spec.storageClassName")
    assert not report.of_kind("already-exists")


def test_changed_container_args_are_shown_per_flag(homelab_base):
    """An operator reads `--ctx-size 2048 -> 1024` rather than list positions; a new value that
    another flag already has (1024 is also chat's --ubatch-size; 4 its --threads) still shows."""
    from changes.report import _arg_changes, _entry_line

    report = preview(homelab_base, edit("homelab", "models.embed.ctx_size", 1024))
    line = _entry_line(report.entry("Deployment", "llama-embed"))
    assert "containers[0].args: --ctx-size 2048 -> 1024" in line
    chat = preview(homelab_base, edit("homelab", "models.chat.cache_ram_mib", 4))
    assert "containers[0].args: --cache-ram 1024 -> 4" in _entry_line(chat.entry("Deployment", "llama-server"))
    assert _arg_changes(["--a", "1", "--metrics"], ["--a", "1", "--b", "-1"]) == "removed --metrics; added --b -1"
    assert _arg_changes(["--x=1", "serve"], ["--x", "2", "run"]) == "--x 1 -> 2; arguments serve -> run"
    assert _arg_changes(["--a", "1", "--b"], ["--b", "--a", "1"]) == "same flags, another order"


def test_cli_runs_the_after_config_with_the_history_the_before_one_leaves(tmp_path, capsys):
    """As pulumi up does: the edited stack sees the last update's history. Moving qwen3-14b back from a server of
    its own into rtx3090-library's library in one update is refused there (the router may not take qwen14's
    memory while its pods still hold it), so `make diff` says so in one line and exits 2, not a plan pulumi up
    would refuse."""
    import yaml

    from conftest import router_move_configs

    base, with_server, _ = router_move_configs()
    stack_file = yaml.safe_load((ROOT / "Pulumi.rtx3090-library.yaml").read_text())
    before, after = tmp_path / "before.yaml", tmp_path / "after.yaml"
    before.write_text(yaml.safe_dump({**stack_file, "config": with_server}))
    after.write_text(yaml.safe_dump({**stack_file, "config": base}))
    assert cli(["rtx3090-library", "--before-file", str(before), "--after-file", str(after)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("changes rtx3090-library: the after config does not run: ") and "qwen14 (removed in this " \
        "update" in err and len(err.strip().splitlines()) == 1
