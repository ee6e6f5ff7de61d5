"""A stack that says nothing about its cluster gets k3s as it installs (kube-router's NetworkPolicy,
Traefik in kube-system, local-path, ServiceLB, no monitoring), and the render says who may reach each
server and from where, read back from the rendered objects (render/reach.py)."""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import ROOT
from config.types import ClusterConfig
from render.manifests import manifests
from render.output import RenderError, render_stack
from render.reach import reach_lines

# What a newcomer writes for one k3s box with a 12 GiB card: no cluster section at all.
MINIMAL = {
    "kubernetes:enableSecretMutable": "true",
    "inference-plane:node_pools": {"rtx3060": {
        "gpu_resource": "nvidia.com/gpu", "vram": "12Gi", "runtime_class": "nvidia", "memory": "64Gi",
        "allocatable": "62Gi", "reserved": "2Gi", "backend": "cuda"}},
    "inference-plane:model_cache": {"size": "30Gi"},
    "inference-plane:models": {
        "chat": {"role": "chat", "name": "llama-chat", "hf_repo": "Qwen/Qwen3-8B-GGUF:Q4_K_M",
                 "image": "ghcr.io/ggml-org/llama.cpp:server-cuda-b10731", "node_pool": "rtx3060", "gpu_layers": 99,
                 "ctx_size": 16384, "resources": {"cpu_request": "2", "cpu_limit": "8"},
                 "exposure": {"host": "llm.lan.example.org", "tls_secret": "llama-chat-tls"},
                 "api_key": {"secret_name": "llama-chat-api-key", "from_config": "chat_api_key"}},
        "embed": {"role": "embedding", "name": "llama-embed", "hf_repo": "Qwen/Qwen3-Embedding-0.6B-GGUF:Q8_0",
                  "image": "ghcr.io/ggml-org/llama.cpp:server-b10731", "backend": "cpu", "node_pool": "rtx3060",
                  "gpu_layers": 0, "threads": 2,
                  "ctx_size": 4096, "resources": {"cpu_request": "250m", "cpu_limit": "2"}},
    },
    "inference-plane:chat_api_key": {"secure": "v1:cGxhY2Vob2xkZXI6IHNldCB3aXRoIHB1bHVtaSBjb25maWc="},
}


def render(tmp_path, config: dict, stack: str = "mybox"):
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return render_stack(stack, tmp_path / "out", project_dir=tmp_path)


def only(result, kind: str) -> dict:
    (found,) = [m for m in result.files.values() if m["kind"] == kind]
    return found


def test_a_stack_with_no_cluster_section_renders_for_k3s(tmp_path):
    result = render(tmp_path, MINIMAL)
    kinds = {m["kind"] for m in result.files.values()}
    assert "CiliumNetworkPolicy" not in kinds and "VMServiceScrape" not in kinds
    policy = only(result, "NetworkPolicy")["spec"]
    # k3s' Traefik (kube-system, app.kubernetes.io/name=traefik) is let in; no storage daemons are reached.
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "traefik"}}} in policy["ingress"][0]["from"]
    assert not any(peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                   in ("rook-ceph", "monitoring") for rule in policy["egress"] for peer in rule.get("to", []))
    claim = only(result, "PersistentVolumeClaim")["spec"]
    assert claim["storageClassName"] == "local-path" and claim["accessModes"] == ["ReadWriteOnce"]
    ingress = only(result, "Ingress")
    assert ingress["spec"]["ingressClassName"] == "traefik"
    # Plain NetworkPolicy cannot name the hub: the internet on 443, the reason on the policy, said in the summary.
    (world,) = [rule for rule in policy["egress"] if any("ipBlock" in peer for peer in rule["to"])]
    assert world["ports"] == [{"port": 443, "protocol": "TCP"}]
    summary = result.summary()
    assert "egress: namespace ai: internet egress to any public address on 443" in summary
    assert "warning" not in summary


def reach_section(summary: str) -> list[str]:
    lines = summary.splitlines()
    start = next(i for i, line in enumerate(lines) if "who may reach each server" in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("  egress:"))
    return lines[start:end]


def test_the_summary_says_who_may_reach_each_server_and_from_where(tmp_path):
    summary = reach_section(render(tmp_path, MINIMAL).summary())
    (header,) = [line for line in summary if "who may reach each server" in line]
    assert header == ("  who may reach each server (the policy of namespace ai admits only pods of ai; "
                      "app.kubernetes.io/name=traefik pods in kube-system; everything else is denied):")
    (chat,) = [line for line in summary if line.startswith("    llama-chat ")]
    assert chat.split(None, 1)[1] == (
        "LAN clients in 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7 (as the controller sees "
        "client addresses: its Service needs externalTrafficPolicy: Local, PREREQUISITES.md) at "
        "https://llm.lan.example.org through traefik pods in kube-system; API key required")
    (embed,) = [line for line in summary if line.startswith("    llama-embed ")]
    assert embed.split(None, 1)[1] == "in-cluster only (no Ingress, no gateway route); no API key"


def test_a_policy_that_keeps_the_controller_out_is_shown_blocked(tmp_path):
    """The mistake the summary is for: the controller runs where the policy does not admit it (the old
    default namespace `ingress` on k3s). Read from the objects, so a policy edited by hand shows it too."""
    result = render(tmp_path, MINIMAL)
    objects = copy.deepcopy(list(result.files.values()))
    (policy,) = [m for m in objects if m["kind"] == "NetworkPolicy"]
    for source in policy["spec"]["ingress"][0]["from"]:
        if "namespaceSelector" in source:
            source["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] = "ingress"
    lines = reach_lines(objects, result.run.config)
    (chat,) = [line for line in lines if line.startswith("    llama-chat ")]
    assert "through traefik pods in kube-system - BLOCKED: the policy does not admit them; fix cluster.ingress" in chat
    assert "BLOCKED" not in "\n".join(reach_lines(list(result.files.values()), result.run.config))


def test_the_gateway_routes_are_read_back_to_the_server_they_reach():
    from conftest import run_stack_file, stack_file_config
    from test_router_gateway import SECRETS

    run = run_stack_file("rtx3090-library", stack_file_config("rtx3090-library"), SECRETS)
    objects = list(manifests(run).values())
    lines = reach_lines(objects, run.config)
    (library,) = [line for line in lines if line.startswith("    llama-library ")]
    routed = [r["model"] for r in stack_file_config("rtx3090-library")["inference-plane:gateway"]["routes"]]
    assert f"gateway clients at https://ai.lan.example.org:8443 for {', '.join(routed)} (the cluster's default load balancer" in library
    # The policy without the gateway's Envoy pods: the route is shown blocked (other peers, such as the
    # namespace's own pods, do not count: they are not where Envoy runs).
    (policy,) = [m for m in objects if m["kind"] == "NetworkPolicy"]
    policy["spec"]["ingress"][0]["from"] = [
        peer for peer in policy["spec"]["ingress"][0]["from"]
        if peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") != "envoy-gateway-system"]
    (blocked,) = [line for line in reach_lines(objects, run.config) if line.startswith("    llama-library ")]
    assert ("for " + ", ".join(routed) + " - BLOCKED: the policy does not admit the gateway's Envoy pods in "
            "envoy-gateway-system") in blocked


def test_the_k3s_defaults_are_written_once_on_the_config_types():
    cluster = ClusterConfig()
    assert (cluster.cni, cluster.ingress.namespace, cluster.monitoring, cluster.storage) == (
        "networkpolicy", "kube-system", None, None)
    assert "k3s" in ClusterConfig.__doc__ and (ROOT / "docs" / "configuration.md").read_text().count("k3s") >= 1


def test_an_embedding_server_exposed_on_request_gets_its_embeddings_path_only_behind_its_key(tmp_path):
    """A notes app on the LAN may reach the embedding server: opt-in, with an API key, and through an
    Ingress that routes the exact embeddings path alone (a chat request never reaches the model)."""
    config = copy.deepcopy(MINIMAL)
    embed = config["inference-plane:models"]["embed"]
    embed["exposure"] = {"host": "embed.lan.example.org", "tls_secret": "llama-embed-tls"}
    embed["api_key"] = {"secret_name": "llama-embed-api-key", "from_config": "embed_api_key"}
    config["inference-plane:embed_api_key"] = dict(config["inference-plane:chat_api_key"])
    result = render(tmp_path, config)
    (ingress,) = [m for m in result.files.values() if m["kind"] == "Ingress" and m["metadata"]["name"] == "llama-embed"]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "embed.lan.example.org"
    assert rule["http"]["paths"] == [{"path": "/v1/embeddings", "pathType": "Exact",
                                      "backend": {"service": {"name": "llama-embed", "port": {"number": 8080}}}}]
    assert ingress["metadata"]["labels"]["app.kubernetes.io/component"] == "embeddings"
    # The same source allowlist as a chat server's.
    (middleware,) = [m for m in result.files.values() if m["kind"] == "Middleware" and m["metadata"]["name"] == "llama-embed-sources"]
    assert ingress["metadata"]["annotations"]["traefik.ingress.kubernetes.io/router.middlewares"] == "ai-llama-embed-sources@kubernetescrd"
    assert "10.0.0.0/8" in middleware["spec"]["ipAllowList"]["sourceRange"]
    (line,) = [line for line in reach_section(result.summary()) if line.startswith("    llama-embed ")]
    assert "at https://embed.lan.example.org through traefik pods in kube-system" in line and line.endswith("API key required")


def with_clients(cni: str = "networkpolicy", **model_changes) -> dict:
    config = copy.deepcopy(MINIMAL)
    config["inference-plane:cluster"] = {"cni": cni}
    chat = config["inference-plane:models"]["chat"]
    chat["in_cluster_clients"] = [{"namespace": "rag", "pod_labels": {"app": "notes"}}, {"namespace": "agents"}]
    chat.update(model_changes)
    return config


def test_in_cluster_clients_reach_their_server_alone_on_its_port(tmp_path):
    """A RAG app in another namespace calls the chat server: a second policy, added to the namespace's
    default deny (policies add up), selects the chat server's pods alone, on the port its Service targets."""
    result = render(tmp_path, with_clients())
    objects = list(result.files.values())
    policies = {m["metadata"]["name"]: m for m in objects if m["kind"] == "NetworkPolicy"}
    clients = policies["llama-chat-clients"]
    (service,) = [m for m in objects if m["kind"] == "Service" and m["metadata"]["name"] == "llama-chat"]
    (deployment,) = [m for m in objects if m["kind"] in ("Deployment", "StatefulSet") and m["metadata"]["name"] == "llama-chat"]
    (embed,) = [m for m in objects if m["kind"] in ("Deployment", "StatefulSet") and m["metadata"]["name"] == "llama-embed"]
    selector = clients["spec"]["podSelector"]["matchLabels"]
    assert selector == service["spec"]["selector"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert not selector.items() <= embed["spec"]["template"]["metadata"]["labels"].items()
    assert clients["metadata"]["namespace"] == "ai" and clients["spec"]["policyTypes"] == ["Ingress"]
    # The port is the pod's port the Service's targetPort names (a NetworkPolicy sees the pod port, after DNAT).
    (port,) = service["spec"]["ports"]
    named = {p["name"]: p["containerPort"] for c in deployment["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}
    (rule,) = clients["spec"]["ingress"]
    assert rule["ports"] == [{"port": named[port["targetPort"]], "protocol": "TCP"}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rag"}},
         "podSelector": {"matchLabels": {"app": "notes"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}},
    ]
    # The namespace's default deny still admits neither (the clients are the chat server's alone).
    deny = policies["default-deny"] if "default-deny" in policies else next(
        p for name, p in policies.items() if name != "llama-chat-clients")
    assert deny["spec"]["podSelector"] == {}
    assert not any(peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                   in ("rag", "agents") for r in deny["spec"]["ingress"] for peer in r.get("from", []))
    summary = reach_section(result.summary())
    (chat,) = [line for line in summary if line.startswith("    llama-chat ")]
    assert "; in-cluster clients from app=notes pods in rag; pods in agents; API key required" in chat
    (embed_line,) = [line for line in summary if line.startswith("    llama-embed ")]
    assert "rag" not in embed_line and "agents" not in embed_line
    header = next(line for line in summary if "who may reach each server" in line)
    assert "rag" not in header and "agents" not in header


def test_in_cluster_clients_under_cilium_select_the_servers_endpoints(tmp_path):
    result = render(tmp_path, with_clients("cilium"))
    objects = list(result.files.values())
    (clients,) = [m for m in objects if m["kind"] == "CiliumNetworkPolicy" and m["metadata"]["name"] == "llama-chat-clients"]
    (service,) = [m for m in objects if m["kind"] == "Service" and m["metadata"]["name"] == "llama-chat"]
    assert clients["spec"]["endpointSelector"] == {"matchLabels": service["spec"]["selector"]}
    (rule,) = clients["spec"]["ingress"]
    assert rule["toPorts"] == [{"ports": [{"port": str(service["spec"]["ports"][0]["port"]), "protocol": "TCP"}]}]
    assert rule["fromEndpoints"] == [
        {"matchLabels": {"k8s:io.kubernetes.pod.namespace": "rag", "app": "notes"}},
        {"matchLabels": {"k8s:io.kubernetes.pod.namespace": "agents"}},
    ]
    (chat,) = [line for line in reach_section(result.summary()) if line.startswith("    llama-chat ")]
    assert "in-cluster clients from app=notes pods in rag; pods in agents" in chat


@pytest.mark.parametrize("change, says", [
    ({"api_key": None}, "models.chat.in_cluster_clients: pods of other namespaces reach the server: add api_key"),
    ({"in_cluster_clients": [{"namespace": "rag"}, {"namespace": "rag", "pod_labels": {"app": "x"}}]},
     "models.chat.in_cluster_clients: a namespace is listed twice"),
])
def test_in_cluster_clients_need_a_key_and_each_namespace_once(tmp_path, change, says):
    config = with_clients()
    chat = config["inference-plane:models"]["chat"]
    chat.update(change)
    if chat.get("api_key") is None:
        chat.pop("api_key")
        chat.pop("exposure")
    with pytest.raises(RenderError) as raised:
        render(tmp_path, config)
    assert says in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_the_cilium_egress_line_says_the_nodes_are_reachable_on_every_port(tmp_path):
    """The seed's egress to the host and remote-node entities (kubelet, Ceph mons on the host network) has no
    port list, so Cilium admits every port of every node's addresses: the summary says so (issue #45 item 5)."""
    result = render(tmp_path, with_clients("cilium"))
    (policy,) = [m for m in result.files.values() if m["kind"] == "CiliumNetworkPolicy"
                 and m["spec"]["endpointSelector"] == {}]
    (nodes,) = [rule for rule in policy["spec"]["egress"] if "toEntities" in rule]
    assert {"host", "remote-node"} <= set(nodes["toEntities"]) and "toPorts" not in nodes
    (line,) = [line for line in result.summary().splitlines() if line.startswith("  egress:")]
    assert line.endswith("; and every node's own addresses on any port (Cilium host and remote-node entities)")
    assert "only to huggingface.co" in line
