"""Upgrading a stack that is already up: the release before stable component names (commit
0dec461, registrations recorded in tests/fixtures) against this program, through the change
preview. Every resource is found again (by URN or alias); nothing is replaced or deleted, and only
the new objects listed are created."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from changes import preview
from changes.provider import options_from_config
from conftest import ROOT
from render.offline import Registered, run_program, stack_config

FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "registrations-0dec461.json").read_text())

# What this release changes in place on purpose (docs/day-2.md; issue notes): the embedding server's CORS
# flag, the metrics token beside the API key, the AI routes' idle limits, PyPI out of the egress
# and of the prefetch, the NotReady alert's wait for parallel downloads, what each Secret key holds
# (an annotation), the exposed endpoint's source ranges (homelab's Ingress names a new Middleware),
# a 5 s readiness timeout (every server's pod template).
EXPECTED_UPDATES = {
    "homelab": {("Deployment", "llama-embed"), ("Deployment", "llama-server"), ("Secret", "llama-server-api-key"),
                ("Ingress", "llama-server")},
    "strix-halo": {
        ("AIGatewayRoute", "inference-routes-1"), ("AIGatewayRoute", "inference-embedding-routes-1"),
        ("BackendTrafficPolicy", "inference-routes-1"), ("BackendTrafficPolicy", "inference-embedding-routes-1"),
        ("CiliumNetworkPolicy", "default-deny-ingress"), ("Deployment", "llama-cpp"), ("Secret", "llama-cpp-api-key"),
        ("StatefulSet", "halogen-flash"), ("VMRule", "inference-plane"), ("VMServiceScrape", "llama-cpp"),
        ("VMServiceScrape", "halogen-flash"), ("SecurityPolicy", "inference-api-keys"),
        ("Secret", "inference-api-keys"), ("Secret", "inference-llamacpp-credential"), ("Secret", "llama-cpp-provider-key"),
        ("Secret", "nous-provider-key"), ("Secret", "openrouter-provider-key"), ("Secret", "z-ai-provider-key"),
    },
}
# New objects, created beside the running ones (nothing waits on them): the Grafana dashboard of a stack
# with observability among them.
EXPECTED_CREATES = {"homelab": {("Middleware", "llama-server-sources")},
                    # The prefetch's downloader is a file of its own ConfigMap now (issue #42), no longer argv.
                    "strix-halo": {("ConfigMap", "inference-plane-dashboard"), ("ConfigMap", "halogen-flash-programs")}}


def this_release(stack: str):
    """This program on the stack file, with the secret values the fixture was recorded with (a real
    `pulumi up` decrypts real keys; the offline placeholder would change the key fingerprint)."""
    config, secret_keys = stack_config(stack)
    for key in secret_keys:
        config[key] = "upgrade-test-key-" + key.split(":")[1]
    return run_program(config, secret_keys, stack=stack)


def previous_release(stack: str, config) -> SimpleNamespace:
    fields = set(Registered.__dataclass_fields__)
    resources = [Registered(**{k: v for k, v in r.items() if k in fields}) for r in FIXTURE[stack]["resources"]]
    return SimpleNamespace(stack=stack, resources=resources, outputs=FIXTURE[stack]["outputs"], config=config,
                           logs=[], secret_outputs=set())


@pytest.mark.parametrize("stack", ["homelab", "strix-halo"])
def test_upgrading_from_the_previous_release_replaces_nothing(stack):
    after = this_release(stack)
    before = previous_release(stack, after.config)
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    report = preview(before, after, options_from_config(config))
    assert {e.op for e in report.changed()} <= {"update", "create"}
    assert {(e.kind, e.after.name) for e in report.changed() if e.op == "update"} == EXPECTED_UPDATES[stack]
    assert {(e.kind, e.after.name) for e in report.changed() if e.op == "create"} == EXPECTED_CREATES[stack]
    assert report.errors == [] and report.of_kind("redownload") == [] and report.of_kind("claim-orphaned") == []
    # The renamed components are found through their aliases, children included.
    for kind, name in [("Namespace", after.config.namespace.name), ("PersistentVolumeClaim", after.config.model_cache.claim_name),
                       *[(m.workload.kind, m.name) for m in after.config.models.values()]]:
        assert report.entry(kind, name).via_alias, (kind, name)
