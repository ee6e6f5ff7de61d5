"""The kubectl path of a rendered folder, in the order it works: PREREQUISITES.md lists what the
cluster must already run (read from the manifests), SECRETS.md says namespace, then Secrets, then the
folder, written for the stack at hand; and a newcomer without Pulumi is told how to render anyway."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import STACKS
from render.output import PREREQUISITES_FILE, SECRETS_FILE, RenderError, render_stack
from render.prerequisites import CORE_GROUPS, schema_releases


@pytest.fixture(scope="module", params=STACKS)
def rendered(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("render") / request.param
    return request.param, render_stack(request.param, out)


def test_every_prerequisite_the_manifests_name_is_listed(rendered):
    stack, result = rendered
    text = (result.out / PREREQUISITES_FILE).read_text()
    releases = schema_releases()
    objects = list(result.files.values())
    groups = {m["apiVersion"].rsplit("/", 1)[0] for m in objects if "/" in m["apiVersion"]} - CORE_GROUPS
    for group in groups:
        assert f"- CRDs of {group} (" in text and f"checked against {releases[group]}" in text
    named = set()
    for m in objects:
        spec = m.get("spec") or {}
        if m["kind"] == "PersistentVolumeClaim":
            named.add(f"StorageClass {spec['storageClassName']}")
        for template in spec.get("volumeClaimTemplates") or []:
            named.add(f"StorageClass {template['spec']['storageClassName']}")
        if m["kind"] == "Ingress":
            named.add(f"IngressClass {spec['ingressClassName']}")
        pod = (spec.get("template") or {}).get("spec") or {}
        if pod.get("runtimeClassName"):
            named.add(f"RuntimeClass {pod['runtimeClassName']}")
        for container in pod.get("containers") or []:
            named |= {f"{r} on the nodes" for r in (container.get("resources") or {}).get("limits", {}) if "/" in r}
        if m["kind"] == "Certificate":
            named.add(f"{spec['issuerRef']['kind']} {spec['issuerRef']['name']}")
    for what in named:
        assert f"- {what}" in text, what
    # The summary names each of them too.
    assert all(what in result.summary() for what in named)


def test_a_gateway_class_the_folder_does_not_create_is_a_prerequisite(tmp_path):
    from conftest import ROOT

    config = yaml.safe_load((ROOT / "Pulumi.rtx3090-library.yaml").read_text())
    created = render_stack("rtx3090-library", tmp_path / "created")
    assert "- GatewayClass" not in (created.out / PREREQUISITES_FILE).read_text()
    config["config"]["inference-plane:gateway"]["create_class"] = False
    (tmp_path / "Pulumi.rtx3090-library.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = render_stack("rtx3090-library", tmp_path / "out", project_dir=tmp_path)
    assert "- GatewayClass envoy-ai-gateway: for Gateway inference" in (result.out / PREREQUISITES_FILE).read_text()


def test_the_kubectl_path_is_namespace_then_secrets_then_the_folder(rendered):
    stack, result = rendered
    secrets = [m for m in result.files.values() if m["kind"] == "Secret"]
    assert secrets, f"{stack}: every shipped stack has a Secret to create (an API key)"
    text = (result.out / SECRETS_FILE).read_text()
    steps = re.findall(r"^([1-4])\. (.*)$", text, re.M)
    assert [n for n, _ in steps] == ["1", "2", "3", "4"]
    assert PREREQUISITES_FILE in steps[0][1] and steps[3][1] == "Everything else: `kubectl apply -k .`"
    (namespace_file,) = re.findall(r"kubectl apply -f (\S+)`", steps[1][1])
    namespace = yaml.safe_load((result.out / namespace_file).read_text())
    assert namespace["kind"] == "Namespace"
    # Every Secret goes into a namespace created in step 2, by a command for this stack's own Secret.
    commands = re.findall(r"kubectl -n (\S+) create secret generic (\S+) (.*)", text)
    assert sorted(name for _, name, _ in commands) == sorted(m["metadata"]["name"] for m in secrets)
    assert {ns for ns, _, _ in commands} == {namespace["metadata"]["name"]}
    (example,) = re.findall(r"printf %s '<value>' > \./(\S+)`", text)
    files = {f.split("=./", 1)[1] for _, _, sources in commands for f in sources.split()}
    assert example in files
    # The folder's kustomization applies the namespace again (harmless) and every other manifest.
    kustomization = yaml.safe_load((result.out / "kustomization.yaml").read_text())
    assert namespace_file in kustomization["resources"]


def test_a_missing_secret_says_how_to_render_without_pulumi_and_that_advice_works(tmp_path):
    from conftest import ROOT

    text = (ROOT / "Pulumi.rtx3060.yaml").read_text()
    block = "  inference-plane:chat_api_key:\n    secure: v1:cGxhY2Vob2xkZXI6IHNldCB3aXRoIHB1bHVtaSBjb25maWc=\n"
    assert block in text
    (tmp_path / "Pulumi.rtx3060.yaml").write_text(text.replace(block, ""))
    with pytest.raises(RenderError) as refused:
        render_stack("rtx3060", tmp_path / "out", project_dir=tmp_path)
    message = str(refused.value)
    advice = re.search(r"add `(inference-plane:chat_api_key): \{secure: (v1:placeholder)\}` under config:", message)
    assert advice and "pulumi config set --secret chat_api_key" in message
    (tmp_path / "Pulumi.rtx3060.yaml").write_text(
        text.replace(block, f"  {advice.group(1)}: {{secure: {advice.group(2)}}}\n"))
    result = render_stack("rtx3060", tmp_path / "out", project_dir=tmp_path)
    assert "llama-chat-api-key" in (result.out / SECRETS_FILE).read_text()


def test_the_library_stack_needs_exactly_these(tmp_path):
    """A fixed list, written from what the stack deploys (the walk above could share a blind spot with
    the code): the gateway's three CRD groups and cert-manager's, Traefik's Middleware, the CA issuer,
    the class, runtime class and storage class it names, the LAN load balancer its gateway's Service takes
    (k3s ServiceLB, MetalLB), the card; and the pods its policy lets in."""
    result = render_stack("rtx3090-library", tmp_path / "out")
    text = (result.out / PREREQUISITES_FILE).read_text()
    listed = text.split("How those components must be set up", 1)[0]
    items = [line[2:].split(" (")[0].split(":")[0] for line in listed.splitlines() if line.startswith("- ")]
    assert items == [
        "CRDs of aigateway.envoyproxy.io", "CRDs of cert-manager.io", "CRDs of gateway.envoyproxy.io",
        "CRDs of gateway.networking.k8s.io", "CRDs of traefik.io", "ClusterIssuer lan-ca", "IngressClass traefik",
        "RuntimeClass nvidia", "StorageClass local-path", "a LoadBalancer controller", "nvidia.com/gpu on the nodes"]
    commands = [line.strip() for line in text.splitlines() if line.startswith("    kubectl ")]
    assert commands == [
        "kubectl get pods -n kube-system -l app.kubernetes.io/name=traefik",
        "kubectl get pods -n envoy-gateway-system -l app.kubernetes.io/name=envoy,gateway.envoyproxy.io/owning-gateway-name=inference"]


def _steps(tmp_path, stack: str) -> str:
    result = render_stack(stack, tmp_path / stack)
    text = (result.out / PREREQUISITES_FILE).read_text()
    return text.split("How those components must be set up", 1)[1].split("The network policy lets in", 1)[0]


@pytest.mark.parametrize("stack", ["homelab", "rtx4090", "rtx3090-library", "strix-halo"])
def test_each_component_setting_the_stack_depends_on_is_written_with_its_check(tmp_path, stack):
    """What the objects cannot show but the stack needs (issue #45 item 2): the Gateway API CRDs where a gateway
    renders, the device plugin's sharing where a pool's servers share a GPU (with the number), externalTrafficPolicy
    where the summary promises a LAN allow-list, the driver and toolkit order for CUDA, the observability
    selectors; each with the command that checks it."""
    from plane import parse_stack

    from conftest import plain_values

    config = parse_stack(plain_values(stack))
    steps = _steps(tmp_path, stack)
    items = [line for line in steps.splitlines() if line.startswith("- ")]
    checks = [line for line in steps.splitlines() if line.startswith("  check: `")]
    assert items and len(items) == len(checks)
    assert ("Gateway API v1.5.1 CRDs, experimental channel" in steps) == (config.gateway is not None)
    for key, pool in config.node_pools.items():
        shared = pool.gpu_resource is not None and pool.gpu_shares > 1
        assert (f"node pool {key}: {pool.gpu_shares} containers share one GPU" in steps) == shared
        if shared and pool.sharing() == "time-slicing":
            assert f"replicas: {pool.gpu_shares}" in steps
        elif shared:
            assert f"-shared-dev-num {pool.gpu_shares}" in steps
    allow_list = any(m.exposure is not None and m.exposure.source_ranges for m in config.models.values())
    assert ("externalTrafficPolicy: Local" in steps) == (allow_list and config.cluster.ingress.kind in ("traefik", "ingress-nginx"))
