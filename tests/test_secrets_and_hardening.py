"""Secrets end to end, and the hardening every stack gets beyond the seeds."""

from __future__ import annotations

import json

import pytest

from conftest import HOMELAB_SECRETS, STRIX_SECRETS
from render.manifests import SECRET_TEXT, dump, manifests
from render.output import plan_tables


@pytest.fixture(params=["homelab_run", "strix_run"])
def stack(request):
    secrets = HOMELAB_SECRETS if request.param == "homelab_run" else STRIX_SECRETS
    return request.getfixturevalue(request.param), secrets


def test_no_secret_value_in_any_file_output_or_log(stack):
    run, secrets = stack
    files = manifests(run)
    texts = [dump(m) for m in files.values()]
    texts.append(json.dumps(run.outputs["capacity_plan"]))
    texts.append("\n".join(plan_tables(run.outputs["capacity_plan"])))
    texts.append(repr({k: v for k, v in run.outputs.items() if k not in run.secret_outputs}))
    texts.extend(run.logs)
    for value in secrets.values():
        assert all(value not in text for text in texts)
    # Every Secret the program makes carries placeholders only, and says so.
    rendered_secrets = [m for m in files.values() if m["kind"] == "Secret"]
    assert rendered_secrets
    for secret in rendered_secrets:
        assert set(secret["stringData"].values()) == {SECRET_TEXT}


def test_outputs_holding_keys_are_secret(strix_run):
    assert "client_api_keys" in strix_run.secret_outputs
    assert set(strix_run.outputs["client_api_keys"]) == {"shikanime", "ci"}


def workloads(run):
    return [r.inputs for r in run.kubernetes() if r.inputs["kind"] in ("Deployment", "StatefulSet")]


def test_every_container_has_requests_and_limits(stack):
    run, _ = stack
    checked = 0
    for workload in workloads(run):
        spec = workload["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"])
            checked += 1
    assert checked >= 2


def test_no_workload_gets_an_api_token(stack):
    run, _ = stack
    assert all(w["spec"]["template"]["spec"]["automountServiceAccountToken"] is False for w in workloads(run))


def test_namespace_enforces_restricted(stack):
    run, _ = stack
    (namespace,) = run.find("Namespace")
    assert namespace.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_replicated_workloads_have_a_disruption_budget(stack):
    run, _ = stack
    budgets = {json.dumps(p.inputs["spec"]["selector"], sort_keys=True) for p in run.find("PodDisruptionBudget")}
    for workload in workloads(run):
        if workload["spec"]["replicas"] > 1:
            assert json.dumps(workload["spec"]["selector"], sort_keys=True) in budgets


def test_llama_servers_reachable_from_outside_take_a_key(stack):
    run, _ = stack
    reached = {i.inputs["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] for i in run.find("Ingress")}
    for backend in run.find("Backend"):
        host = backend.inputs["spec"]["endpoints"][0]["fqdn"]["hostname"]
        if host.endswith(".svc.cluster.local"):
            reached.add(host.split(".")[0])
    checked = 0
    for workload in workloads(run):
        container = workload["spec"]["template"]["spec"]["containers"][0]
        if "llama.cpp" in container["image"] and workload["metadata"]["name"] in reached:
            assert "--api-key-file" in container["args"]
            checked += 1
    assert checked == 1
