"""ModelCache: one shared claim for the weights, kept when the stack lets go of it."""

from __future__ import annotations

from plane import parse_stack
from components.model_cache import ModelCache, ModelCacheArgs
from conftest import homelab_plain_values
from render.offline import run_program


def build(values: dict):
    stack = parse_stack(values)
    args = ModelCacheArgs(cache=stack.model_cache, namespace=stack.namespace.name)
    return run_program({}, program=lambda: {"cache": ModelCache(stack.model_cache.claim_name, args)})


def test_claim_is_shared_read_write_many_and_retained():
    run = build(homelab_plain_values())
    claim = run.one("PersistentVolumeClaim", "llama-server-models")
    spec = claim.inputs["spec"]
    assert spec == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "ceph-filesystem",
        "resources": {"requests": {"storage": "40Gi"}},
    }
    # Pulumi keeps it on destroy; Flux keeps it when the Kustomization is retired.
    assert claim.retain_on_delete is True
    assert claim.inputs["metadata"]["annotations"] == {"kustomize.toolkit.fluxcd.io/prune": "disabled"}
    assert claim.protect is False


def test_protect_refuses_destroy_when_asked():
    values = homelab_plain_values()
    values["model_cache"]["protect"] = True
    claim = build(values).one("PersistentVolumeClaim", "llama-server-models")
    assert claim.protect is True and claim.retain_on_delete is True


def test_both_servers_mount_the_one_claim(homelab_run):
    claims = set()
    for deployment in homelab_run.find("Deployment"):
        volumes = deployment.inputs["spec"]["template"]["spec"]["volumes"]
        claims |= {v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v}
    assert claims == {"llama-server-models"}
    assert len(homelab_run.find("PersistentVolumeClaim")) == 1
