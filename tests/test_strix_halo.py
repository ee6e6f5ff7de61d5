"""The strix-halo stack: the engine StatefulSet, monitoring, and the seed's points one by one.

Seed 002 is prose, so each point it makes (node type, ~116 GiB per node, :8731, x-sks-session-id,
HalogenFlashDown, Q6_K, request timeout 0s, 600 s embeddings) is a check here.
"""

from __future__ import annotations

import pulumi
import pytest

from components.pod import HF_CACHE
from conftest import run_strix


def engine(run):
    return run.one("StatefulSet", "halogen-flash")


def pod(run):
    return engine(run).inputs["spec"]["template"]["spec"]


def test_one_engine_per_node_on_the_strix_halo_nodes(strix_run):
    spec = engine(strix_run).inputs["spec"]
    assert spec["replicas"] == 2
    assert spec["podManagementPolicy"] == "Parallel"
    (term,) = pod(strix_run)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod(strix_run)["nodeSelector"] == {"node.kubernetes.io/instance-type": "minisforum-ms-s1"}


def test_weights_are_prefetched_into_a_claim_per_replica(strix_run):
    spec = engine(strix_run).inputs["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "local-path"
    assert claim["spec"]["resources"]["requests"]["storage"] == "256Gi"
    (init,) = pod(strix_run)["initContainers"]
    (container,) = pod(strix_run)["containers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["HF_REPO"] == "peonist/qwen38-flash-next-w4b"
    init_mount = next(m for m in init["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    engine_mount = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    # The default Hugging Face cache path ($HOME/.cache/huggingface) for both containers.
    assert init_mount["mountPath"] == engine_mount["mountPath"] == HF_CACHE
    engine_env = {e["name"]: e["value"] for e in container["env"]}
    assert HF_CACHE == engine_env["HOME"] + "/.cache/huggingface"
    assert engine_env["HF_HUB_OFFLINE"] == "1"  # the engine never downloads
    assert init["resources"]["limits"]["memory"] and init["resources"]["requests"]["cpu"]


def test_memory_is_pinned_and_the_vpa_only_manages_cpu(strix_run):
    (container,) = pod(strix_run)["containers"]
    assert container["resources"]["requests"]["memory"] == "80Gi"
    (vpa,) = strix_run.find("VerticalPodAutoscaler")
    spec = vpa.inputs["spec"]
    assert spec["targetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "halogen-flash"}
    (policy,) = spec["resourcePolicy"]["containerPolicies"]
    assert policy["controlledResources"] == ["cpu"] and policy["containerName"] == container["name"]


def test_amd_gpu_for_a_non_root_container(strix_run):
    (container,) = pod(strix_run)["containers"]
    assert container["resources"]["limits"]["amd.com/gpu"] == "1"
    security = pod(strix_run)["securityContext"]
    assert security["runAsNonRoot"] is True and security["supplementalGroups"] == [44, 992]


def test_headless_service_on_8731_and_a_disruption_budget(strix_run):
    service = strix_run.one("Service", "halogen-flash")
    assert service.inputs["spec"]["clusterIP"] == "None"
    assert service.inputs["spec"]["ports"][0]["port"] == 8731
    assert engine(strix_run).inputs["spec"]["serviceName"] == "halogen-flash"
    assert service.urn in engine(strix_run).dependencies
    (pdb,) = strix_run.find("PodDisruptionBudget")
    assert pdb.inputs["spec"]["maxUnavailable"] == 1
    assert pdb.inputs["spec"]["selector"]["matchLabels"] == engine(strix_run).inputs["spec"]["selector"]["matchLabels"]


def test_pulumi_waits_for_the_prefetch_too(strix_run):
    config = strix_run.config
    wait = int(engine(strix_run).custom_timeouts["create"].rstrip("s"))
    download = 115.5 * 1024 / config.startup.download_mib_per_s
    assert wait > download + config.startup.image_pull_seconds
    probe = pod(strix_run)["containers"][0]["startupProbe"]
    # The startup probe starts with the engine, after the prefetch: it covers the load only.
    assert probe["periodSeconds"] * (probe["failureThreshold"] - 1) < download


def test_embeddings_server_is_llamacpp_on_the_cpu_beside_the_engine(strix_run):
    """The ROCm device plugin gives each node's one GPU to one container: the engine's replica."""
    deployment = strix_run.one("Deployment", "llama-cpp")
    assert deployment.inputs["spec"]["replicas"] == 1
    container = deployment.inputs["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--hf-repo") + 1].lower().startswith("qwen/qwen3-embedding-8b")
    assert args[args.index("--hf-repo") + 1].endswith(":Q6_K")
    assert args[args.index("--n-gpu-layers") + 1] == "0"
    assert "--embeddings" in args
    assert "amd.com/gpu" not in container["resources"]["limits"]
    assert ":server-b" in container["image"]  # the CPU build, not server-vulkan


def test_gpu_pods_fit_what_the_device_plugin_advertises(strix_run, strix):
    """Two one-GPU nodes, exclusive devices: at most one GPU container per node, so every pod schedules."""
    pool = strix["node_pools"]["ms-s1"]
    gpu_pods = 0
    for workload in [*strix_run.find("Deployment"), *strix_run.find("StatefulSet")]:
        spec = workload.inputs["spec"]
        wants = any("amd.com/gpu" in c["resources"]["limits"] for c in spec["template"]["spec"]["containers"])
        gpu_pods += spec["replicas"] if wants else 0
    assert gpu_pods == 2 <= pool["nodes"] * pool["gpu_shares"] and pool["gpu_shares"] == 1


def test_the_old_shape_two_pods_on_one_amd_gpu_is_refused(strix):
    strix["node_pools"]["ms-s1"]["gpu_shares"] = 2
    with pytest.raises(pulumi.RunError, match=r"node_pools.ms-s1.gpu_shares: amd.com/gpu's device plugin gives each GPU "
                                              r"to one container only; set gpu_shares: 1"):
        run_strix(strix)


def test_routing_table_is_the_seeds(strix_run):
    table = {
        r["matches"][0]["headers"][0]["value"]: [b["name"] for b in r["backendRefs"]]
        for route in strix_run.find("AIGatewayRoute") for r in route.inputs["spec"]["rules"]
    }
    assert table == {
        "qwen/qwen3.8-flash": ["halogen", "nous", "openrouter"],
        "z-ai/glm-5.3-flash": ["z-ai", "nous"],
        "qwen/qwen3-embedding-8b": ["llama-cpp", "nous", "openrouter"],
        ".*": ["openrouter"],
    }


def test_engine_scraped_every_minute_and_alerted_when_down(strix_run):
    (scrape,) = [s for s in strix_run.find("VMServiceScrape") if s.inputs["metadata"]["name"] == "halogen-flash"]
    (endpoint,) = scrape.inputs["spec"]["endpoints"]
    # Ready endpoints only (a starting pod answers 503 on /metrics: not a server down).
    assert endpoint == {"port": "http", "path": "/metrics", "interval": "60s", "relabelConfigs": [
        {"action": "drop", "sourceLabels": ["__meta_kubernetes_endpoint_ready"], "regex": "false"}]}
    assert scrape.inputs["spec"]["discoveryRole"] == "endpoints"
    assert scrape.inputs["spec"]["selector"]["matchLabels"] == engine(strix_run).inputs["spec"]["selector"]["matchLabels"]
    (rule_set,) = strix_run.find("VMRule")
    rules = {r["alert"]: r for g in rule_set.inputs["spec"]["groups"] for r in g["rules"]}
    assert 'service="halogen-flash"' in rules["HalogenFlashDown"]["expr"]
    assert "llamacpp:requests_deferred" in rules["LlamaCppQueuing"]["expr"]
    assert "FallbackHalogenActive" in rules
    not_ready = rules["HalogenFlashNotReady"]
    wait_minutes = int(engine(strix_run).custom_timeouts["create"].rstrip("s")) / 60
    assert int(not_ready["for"].rstrip("m")) >= wait_minutes


def test_llamacpp_metrics_are_scraped_too(strix_run):
    (scrape,) = [s for s in strix_run.find("VMServiceScrape") if s.inputs["metadata"]["name"] == "llama-cpp"]
    args = strix_run.one("Deployment", "llama-cpp").inputs["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--metrics" in args and scrape.inputs["spec"]["endpoints"][0]["path"] == "/metrics"


def test_plan_fits_with_the_seeds_headroom(strix_run):
    plan = strix_run.outputs["capacity_plan"]
    flash = plan["servers"]["flash"]
    assert flash["estimate"]["total_gib"] <= 80
    assert all(node["offers_gib"] <= 116 for node in plan["nodes"])
    placed = [n["workloads"] for n in plan["nodes"]]
    assert all("halogen-flash" in w for w in placed)  # one on each node
    assert plan["nodes"][0]["free_gib"] >= 0 and plan["nodes"][1]["free_gib"] >= 0


def test_two_seventy_gib_engines_on_one_node_are_refused(strix):
    # A plugin that shares (set explicitly), so that only memory decides.
    strix["node_pools"]["ms-s1"].update(nodes=1, gpu_shares=3, gpu_sharing="shared-dev-num")
    strix["models"]["flash"]["workload"]["one_per_node"] = False
    strix["models"]["flash"]["resources"].update(memory_request="70Gi", memory_limit="80Gi")
    with pytest.raises(pulumi.RunError) as caught:
        run_strix(strix)
    message = str(caught.value)
    assert "node_pools.ms-s1: node 1 of 1 would hold" in message
    assert message.count("halogen-flash 74.8 GiB") == 2 and "offers 112.0 GiB" in message


def test_more_replicas_than_nodes_with_one_per_node(strix):
    strix["models"]["flash"]["workload"]["replicas"] = 3
    with pytest.raises(pulumi.RunError, match=r"models.flash.workload.replicas: 3 replicas, one per node, but node pool ms-s1 has 2"):
        run_strix(strix)


def _fallback_alerts(run) -> dict:
    rules = [r for rule in run.find("VMRule") for g in rule.inputs["spec"]["groups"] for r in g["rules"]]
    return {r["labels"]["model"]: r for r in rules if r["alert"].startswith("Fallback")}


def test_fallback_alerts_match_what_the_gateway_emits(strix_run):
    """AI Gateway sets gen_ai_provider_name to the schema (openai) for every tier here, so alerts key
    on gen_ai_request_model: the name each backend was sent (its modelNameOverride)."""
    alerts = _fallback_alerts(strix_run)
    assert set(alerts) == {"qwen/qwen3.8-flash", "qwen/qwen3-embedding-8b"}
    sent_to_local = {"qwen/qwen3.8-flash": "qwen38-flash-next-w4b", "qwen/qwen3-embedding-8b": "qwen3-embedding-8b-local"}
    for model, alert in alerts.items():
        assert "gen_ai_provider_name" not in alert["expr"]
        assert f'gen_ai_original_model="{model}", gen_ai_request_model!="{sent_to_local[model]}"' in alert["expr"]
    assert alerts["qwen/qwen3-embedding-8b"]["annotations"]["summary"] == (
        "qwen/qwen3-embedding-8b is not served by llama-cpp: requests fall back to nous (remote), openrouter (remote)")


def test_a_local_tier_sent_the_same_name_as_a_remote_one_is_refused(strix):
    route = next(r for r in strix["gateway"]["routes"] if r.get("kind") == "embedding")
    route["backends"][0] = {"tier": "llama-cpp"}  # the first landing: the public name, as openrouter gets
    with pytest.raises(pulumi.RunError, match=r"gateway.routes.2.backends.0.model: tier llama-cpp is sent "
                                              r"'qwen/qwen3-embedding-8b', as tier openrouter is, so the fallback alert cannot tell them apart; "
                                              r"give the local tier a distinct model name"):
        run_strix(strix)


def test_a_kept_workload_name_names_everything_that_watches_the_workload():
    """workload.name: the StatefulSet, its claim template, the VPA's target and the NotReady alert's
    series keep the old name; the Service, the pods' label and the gateway's backend take the new one."""
    from conftest import STRIX_SECRETS, run_values, strix_values

    values = strix_values()
    values["models"]["flash"]["name"] = "flash-engine"
    values["models"]["flash"]["workload"]["name"] = "halogen-flash"
    run = run_values(values, secrets=STRIX_SECRETS, stack="strix-halo")
    spec = engine(run).inputs["spec"]
    assert spec["serviceName"] == "flash-engine"
    service = run.one("Service", "flash-engine")
    assert service.inputs["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    # The claim template is the one the StatefulSet was created with (nothing for ignoreChanges to
    # hold back); the controller writes the selector's labels on the claims it makes anyway.
    (claim,) = spec["volumeClaimTemplates"]
    (original,) = engine(run_values(strix_values(), secrets=STRIX_SECRETS, stack="strix-halo")).inputs["spec"]["volumeClaimTemplates"]
    assert claim == original
    (vpa,) = run.find("VerticalPodAutoscaler")
    assert vpa.inputs["spec"]["targetRef"]["name"] == "halogen-flash"
    (rule,) = run.find("VMRule")
    exprs = [r["expr"] for group in rule.inputs["spec"]["groups"] for r in group["rules"]]
    assert any('statefulset="halogen-flash"' in e for e in exprs)
    assert not any('statefulset="flash-engine"' in e for e in exprs)
    backends = [b for b in run.find("Backend") if "flash-engine" in str(b.inputs["spec"])]
    assert backends, "the gateway's backend follows the Service's new name"


def test_two_servers_cannot_share_a_workload_name():
    from conftest import STRIX_SECRETS, run_values, strix_values

    values = strix_values()
    values["models"]["embed"].setdefault("workload", {})["name"] = "halogen-flash"
    with pytest.raises(pulumi.RunError, match=r"models\.embed\.workload\.name: 'halogen-flash' is already the workload of models\.flash"):
        run_values(values, secrets=STRIX_SECRETS, stack="strix-halo")
