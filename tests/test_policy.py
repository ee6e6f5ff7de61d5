"""The policy pack: each policy called directly (never through a PolicyPack), and in the render."""

from __future__ import annotations

import copy

import pytest
import yaml
from pulumi_policy import ResourceValidationArgs, StackValidationArgs, StackValidationPolicy
from pulumi_policy.policy import PolicyResource

from conftest import stack_values
from policy.pack import POLICIES
from render.manifests import manifests
from render.output import RenderError, render_stack

BY_NAME = {p.name: p for p in POLICIES}


def type_of(manifest: dict) -> str:
    api = manifest["apiVersion"]
    return f"kubernetes:{api if '/' in api else 'core/' + api}:{manifest['kind']}"


def resource_violations(policy_name: str, manifest: dict, config: dict | None = None) -> list[str]:
    found: list[str] = []
    args = ResourceValidationArgs(
        resource_type=type_of(manifest),
        props=manifest,
        urn=f"urn:pulumi:test::inference-plane::{type_of(manifest)}::x",
        name=manifest["metadata"]["name"],
        opts=None,
        provider=None,
        config=config or {},
    )
    BY_NAME[policy_name].validate(args, lambda message, urn=None: found.append(message))
    return found


def stack_violations(policy_name: str, objects: list[dict]) -> list[str]:
    found: list[str] = []
    resources = [
        PolicyResource(type_of(m), m, f"urn:x::{m['metadata']['name']}", m["metadata"]["name"], None, None, None, [], {})
        for m in objects
    ]
    BY_NAME[policy_name].validate(StackValidationArgs(resources, config={}), lambda message, urn=None: found.append(message))
    return found


@pytest.fixture(scope="module")
def homelab(homelab_run) -> dict[str, dict]:
    return manifests(homelab_run)


@pytest.fixture(scope="module")
def strix_files(strix_run) -> dict[str, dict]:
    return manifests(strix_run)


def test_pack_entry_point_compiles_without_starting_the_analyzer():
    # Constructing the PolicyPack would start a gRPC server and block: compile it, never run it.
    import py_compile

    from conftest import ROOT

    py_compile.compile(str(ROOT / "policy" / "__main__.py"), doraise=True)
    text = (ROOT / "policy" / "__main__.py").read_text()
    assert "PolicyPack(" in text and "policies=POLICIES" in text


def test_pack_has_every_policy_mandatory():
    assert set(BY_NAME) == {
        "pod-security-restricted", "images-pinned", "model-server-budgets", "narrow-egress", "exposure-lan-only",
        "no-inline-credentials", "default-deny", "embeddings-not-exposed", "gateway-requires-auth",
        "hf-cache-on-weights-volume", "tailnet-name-resolves", "idle-outlasts-request", "no-runtime-installs",
        "router-management-not-exposed", "affinity-keeps-fallback", "rpc-helpers-fenced",
    }
    assert all(p.enforcement_level.value == "mandatory" for p in POLICIES)


@pytest.fixture(scope="module")
def moved_files() -> dict[str, dict]:
    """rtx3090-library with a model moved to a server of its own on the shared card: its `room` init container
    and the router's status publishing (issue #48) under every policy too."""
    from conftest import router_move_configs, run_stack_file
    from render.manifests import manifests

    _, moved, secrets = router_move_configs()
    files = manifests(run_stack_file("rtx3090-library", moved, secrets))
    assert any(c["name"] == "room" for m in files.values() if m["kind"] == "Deployment"
               for c in m["spec"]["template"]["spec"].get("initContainers", []))
    return files


@pytest.mark.parametrize("stack_fixture", ["homelab", "strix_files", "moved_files"])
def test_shipped_stacks_pass_every_policy(request, stack_fixture):
    files = request.getfixturevalue(stack_fixture)
    for policy in POLICIES:
        if isinstance(policy, StackValidationPolicy):
            assert stack_violations(policy.name, list(files.values())) == []
        else:
            for name, manifest in files.items():
                assert resource_violations(policy.name, manifest) == [], (policy.name, name)


def deployment(files):
    return copy.deepcopy(files["deployment_ai_llama-server.yaml"])


def container(manifest):
    return manifest["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: container(d)["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation is not false"),
        (lambda d: container(d)["securityContext"]["capabilities"].update(drop=["NET_RAW"]), "do not drop ALL"),
        (lambda d: d["spec"]["template"]["spec"]["securityContext"].pop("seccompProfile"), "seccompProfile is not RuntimeDefault"),
        (lambda d: d["spec"]["template"]["spec"]["securityContext"].pop("runAsNonRoot"), "runAsNonRoot is not true"),
        (lambda d: container(d)["securityContext"].pop("readOnlyRootFilesystem"), "root filesystem is writable"),
        (lambda d: d["spec"]["template"]["spec"].update(hostNetwork=True), "hostNetwork is set"),
    ],
)
def test_pod_security_restricted(homelab, mutate, expected):
    manifest = deployment(homelab)
    mutate(manifest)
    assert any(expected in v for v in resource_violations("pod-security-restricted", manifest))


def test_writable_root_needs_a_stated_reason(homelab):
    manifest = deployment(homelab)
    container(manifest)["securityContext"]["readOnlyRootFilesystem"] = False
    assert resource_violations("pod-security-restricted", manifest)
    manifest["metadata"]["annotations"]["inference-plane/writable-root"] = "the engine unpacks kernels into /opt"
    assert resource_violations("pod-security-restricted", manifest) == []


def test_init_containers_are_held_to_the_same_standard(strix_files):
    manifest = copy.deepcopy(strix_files["statefulset_shikanime_halogen-flash.yaml"])
    manifest["spec"]["template"]["spec"]["initContainers"][0]["securityContext"].pop("capabilities")
    assert resource_violations("pod-security-restricted", manifest) == ["container prefetch: capabilities do not drop ALL"]


@pytest.mark.parametrize("image", ["ghcr.io/ggml-org/llama.cpp:latest", "ghcr.io/ggml-org/llama.cpp", "llama.cpp:b1"])
def test_images_pinned(homelab, image):
    manifest = deployment(homelab)
    container(manifest)["image"] = image
    assert resource_violations("images-pinned", manifest) == [
        f"container llama-server: image {image!r} is not pinned to a build tag or digest"
    ]


def test_model_server_needs_a_memory_limit(homelab):
    manifest = deployment(homelab)
    container(manifest)["resources"]["limits"].pop("memory")
    assert resource_violations("model-server-budgets", manifest) == ["container llama-server: no memory limit"]


def test_startup_budget_must_outlast_the_download(homelab):
    manifest = deployment(homelab)
    container(manifest)["startupProbe"]["failureThreshold"] = 60
    (message,) = resource_violations("model-server-budgets", manifest)
    assert "startup probe allows 590 s, less than the model's cold start" in message  # 59 periods after the first probe


def test_readiness_must_be_the_real_health_path(homelab):
    manifest = deployment(homelab)
    container(manifest)["readinessProbe"]["httpGet"]["path"] = "/v1/models"
    messages = resource_violations("model-server-budgets", manifest)
    assert "readiness probes /v1/models, not the engine's health path /health" in messages
    assert "llama.cpp's readiness is /health: 503 until the model is resident" in messages


def test_world_egress_needs_a_waiver(homelab):
    policy = copy.deepcopy(homelab["ciliumnetworkpolicy_ai_default-deny-ingress.yaml"])
    policy["spec"]["egress"].append({"toEntities": ["world"]})
    (message,) = resource_violations("narrow-egress", policy)
    assert message.startswith("egress to world")
    policy["metadata"]["annotations"] = {"inference-plane/world-egress": "CDN hosts change weekly"}
    assert resource_violations("narrow-egress", policy) == []


def test_ingress_must_use_tls_and_stay_off_public_dns(homelab):
    ingress = copy.deepcopy(homelab["ingress_ai_llama-server.yaml"])
    ingress["metadata"]["labels"]["dns.renner.uno/public"] = "true"
    ingress["spec"].pop("tls")
    messages = resource_violations("exposure-lan-only", ingress, {"publicDnsLabels": ["dns.renner.uno/public"]})
    assert "host llm.renner.uno is served without TLS" in messages
    assert "carries the public-DNS label dns.renner.uno/public: the record would be published on the internet" in messages


def test_no_load_balancer_or_node_port_services(homelab):
    service = copy.deepcopy(homelab["service_ai_llama-server.yaml"])
    service["spec"]["type"] = "NodePort"
    assert resource_violations("exposure-lan-only", service) == [
        "Service type NodePort: only the gateway's tailnet listener may face out"
    ]


def test_gateway_load_balancer_needs_its_tailnet_class(strix_files):
    proxy = copy.deepcopy(strix_files["envoyproxy_shikanime_inference-proxy.yaml"])
    proxy["spec"]["provider"]["kubernetes"]["envoyService"].pop("loadBalancerClass")
    assert resource_violations("exposure-lan-only", proxy) == [
        "the gateway's LoadBalancer has no loadBalancerClass and no inference-plane/load-balancer reason: it could get "
        "a public address"
    ]
    # Off the tailnet with the reason the config gave (gateway.load_balancer_reason): accepted.
    proxy["metadata"]["annotations"] = {"inference-plane/load-balancer": "k3s ServiceLB on the home LAN"}
    assert resource_violations("exposure-lan-only", proxy) == []


def test_no_inline_credentials(homelab):
    manifest = deployment(homelab)
    container(manifest)["env"].append({"name": "HF_TOKEN", "value": "hf_abcdefgh"})
    container(manifest)["args"] += ["--api-key", "k"]
    messages = resource_violations("no-inline-credentials", manifest)
    assert "container llama-server: HF_TOKEN is a literal; take it from a Secret" in messages
    assert "container llama-server: a credential on the command line; use a file from a Secret" in messages


def test_every_namespace_needs_default_deny(homelab):
    objects = [m for n, m in homelab.items() if m["kind"] != "CiliumNetworkPolicy"]
    assert stack_violations("default-deny", objects) == [
        "namespace ai has no default-deny policy selecting every pod in both directions"
    ]


def test_embedding_server_behind_an_ingress(homelab):
    """Only the exact embeddings path may reach it, and only behind its API key: a chat path would get
    fluent nonsense (the seed's lesson), a keyless server anyone's traffic."""
    objects = list(copy.deepcopy(homelab).values())
    ingress = next(m for m in objects if m["kind"] == "Ingress")
    path = ingress["spec"]["rules"][0]["http"]["paths"][0]
    path["backend"]["service"]["name"] = "llama-embed"
    assert stack_violations("embeddings-not-exposed", objects) == [
        "Ingress llama-server sends / to the embedding server llama-embed"
    ]
    path.update(path="/v1/embeddings", pathType="Exact")
    # homelab's embedding server takes no key.
    assert stack_violations("embeddings-not-exposed", objects) == [
        "Ingress llama-server exposes the embedding server llama-embed, which takes no API key"
    ]
    embed = next(m for m in objects if m["kind"] == "Deployment" and m["metadata"]["name"] == "llama-embed")
    embed["spec"]["template"]["spec"]["volumes"].append({"name": "api-key", "secret": {"secretName": "k"}})
    assert stack_violations("embeddings-not-exposed", objects) == []
    path["pathType"] = "Prefix"  # /v1/embeddings/anything would reach it too
    assert stack_violations("embeddings-not-exposed", objects) == [
        "Ingress llama-server sends /v1/embeddings to the embedding server llama-embed"
    ]


def test_a_routers_ingress_passes_only_its_inference_and_listing_paths():
    """POST /models downloads any Hub repo into the router's pod and /models/load, /models/unload answer any
    key holder (contract-tested): an Ingress to a router routing more is a violation."""
    from render.offline import run_stack

    objects = list(copy.deepcopy(manifests(run_stack("rtx3090-library"))).values())
    assert stack_violations("router-management-not-exposed", objects) == []
    ingress = next(m for m in objects if m["kind"] == "Ingress")
    paths = ingress["spec"]["rules"][0]["http"]["paths"]
    assert {p["path"] for p in paths} >= {"/v1/chat/completions", "/v1/models"} and "/models" not in {p["path"] for p in paths}
    paths.append({**paths[0], "path": "/models"})
    paths.append({**paths[0], "path": "/", "pathType": "Prefix"})
    assert stack_violations("router-management-not-exposed", objects) == [
        "Ingress llama-library sends Exact /models to the router llama-library, whose model management any key holder "
        "could then call",
        "Ingress llama-library sends Prefix / to the router llama-library, whose model management any key holder could "
        "then call",
    ]


def test_embedding_model_on_ai_routes_needs_its_guard(strix_files):
    objects = [m for n, m in strix_files.items() if "embedding-guard" not in n]
    (message,) = stack_violations("embeddings-not-exposed", objects)
    assert "rule qwen-qwen3-embedding-8b reaches an embedding server without a guard" in message


def test_plain_route_to_the_embedding_server_only_on_embeddings_paths(strix_files):
    objects = list(copy.deepcopy(strix_files).values())
    route = next(m for m in objects if m["kind"] == "HTTPRoute" and m["metadata"]["name"] == "inference-llamacpp-embeddings")
    route["spec"]["rules"][0]["matches"][0]["path"]["value"] = "/llama-cpp/"
    (message,) = stack_violations("embeddings-not-exposed", objects)
    assert "sends /llama-cpp/ to the embedding server" in message


def test_gateway_without_api_keys_or_required_mtls(strix_files):
    objects = [m for m in strix_files.values() if m["kind"] not in ("SecurityPolicy", "ClientTrafficPolicy")]
    assert stack_violations("gateway-requires-auth", objects) == [
        "Gateway inference admits requests without an API key (no apiKeyAuth SecurityPolicy on it)",
        "Gateway inference must require a client certificate (mTLS) but no ClientTrafficPolicy verifies one",
    ]


def test_render_fails_on_a_policy_violation_and_writes_nothing(tmp_path):
    """llama.cpp's extra_args refuse such a flag at validation; another engine's own args are its own, so
    the policy is what stops a credential on its command line."""
    values = stack_values("strix-halo")
    values["models"]["flash"]["openai"]["args"] += ["--hf-token", "hf_do_not_do_this"]
    config = {f"inference-plane:{k}": v for k, v in values.items()}
    (tmp_path / "Pulumi.leaky.yaml").write_text(yaml.safe_dump({"config": config}))
    with pytest.raises(RenderError, match=r"policy no-inline-credentials violated by statefulset_shikanime_halogen-flash.yaml: "
                                          r"container halogen-flash: a credential on the command line"):
        render_stack("leaky", tmp_path / "out", project_dir=tmp_path)
    assert not (tmp_path / "out").exists()


def _engine_pod(files: dict) -> dict:
    return files["statefulset_shikanime_halogen-flash.yaml"]["spec"]["template"]["spec"]


def test_prefetch_and_engine_share_the_hf_cache_on_the_weights_claim(strix_files):
    manifest = strix_files["statefulset_shikanime_halogen-flash.yaml"]
    pod = _engine_pod(strix_files)
    from policy.rules import hf_hub_cache
    env = {c["name"]: {e["name"]: e["value"] for e in c["env"]} for c in [*pod["initContainers"], *pod["containers"]]}
    caches = {name: hf_hub_cache(values) for name, values in env.items()}
    assert set(caches.values()) == {"/home/engine/.cache/huggingface/hub"}
    claims = {t["metadata"]["name"] for t in manifest["spec"]["volumeClaimTemplates"]}
    for container in [*pod["initContainers"], *pod["containers"]]:
        (mount,) = [m for m in container["volumeMounts"] if caches[container["name"]].startswith(m["mountPath"] + "/")]
        assert mount["name"] in claims
    assert resource_violations("hf-cache-on-weights-volume", manifest) == []


def test_the_old_shape_prefetch_and_engine_in_different_caches_is_caught(strix_files):
    """The first landing: the engine had XDG_CACHE_HOME=/tmp/cache and no HF_HOME, so it looked in
    /tmp/cache/huggingface/hub (scratch) while the prefetch wrote under $HOME/.cache (the claim)."""
    manifest = copy.deepcopy(strix_files["statefulset_shikanime_halogen-flash.yaml"])
    for container in [*_engine_pod({"statefulset_shikanime_halogen-flash.yaml": manifest})["initContainers"],
                      *_engine_pod({"statefulset_shikanime_halogen-flash.yaml": manifest})["containers"]]:
        container["env"] = [e for e in container["env"] if e["name"] != "HF_HOME"]
    found = resource_violations("hf-cache-on-weights-volume", manifest)
    assert "container halogen-flash uses the Hugging Face cache at /tmp/cache/huggingface/hub (volume scratch, not a claim)" in found[0]
    assert "containers disagree on the Hugging Face cache" in found[-1]


def test_tailnet_device_is_named_after_the_listener(strix_files):
    (gateway,) = [m for m in strix_files.values() if m["kind"] == "Gateway"]
    (proxy,) = [m for m in strix_files.values() if m["kind"] == "EnvoyProxy"]
    assert gateway["spec"]["infrastructure"]["parametersRef"]["name"] == proxy["metadata"]["name"]
    service = proxy["spec"]["provider"]["kubernetes"]["envoyService"]
    (listener,) = gateway["spec"]["listeners"]
    assert service["loadBalancerClass"] == "tailscale"
    assert service["annotations"]["tailscale.com/hostname"] == listener["hostname"].split(".")[0] == "inference"
    assert stack_violations("tailnet-name-resolves", [gateway, proxy]) == []


def test_the_old_shape_gateway_without_a_device_name_is_caught(strix_files):
    (gateway,) = [m for m in strix_files.values() if m["kind"] == "Gateway"]
    proxy = copy.deepcopy(next(m for m in strix_files.values() if m["kind"] == "EnvoyProxy"))
    del proxy["spec"]["provider"]["kubernetes"]["envoyService"]["annotations"]
    (message,) = stack_violations("tailnet-name-resolves", [gateway, proxy])
    assert "has no tailscale.com/hostname annotation; set tailscale.com/hostname: inference" in message


def test_llamacpp_bypass_credential_overwrites_the_clients_authorization(strix_files):
    (route,) = [m for m in strix_files.values() if m["kind"] == "HTTPRoute" and m["metadata"]["name"].endswith("-llamacpp-embeddings")]
    (ref,) = [f["extensionRef"]["name"] for f in route["spec"]["rules"][0]["filters"] if f["type"] == "ExtensionRef"]
    (flt,) = [m for m in strix_files.values() if m["kind"] == "HTTPRouteFilter" and m["metadata"]["name"] == ref]
    assert flt["spec"]["credentialInjection"]["overwrite"] is True
    assert "header" not in flt["spec"]["credentialInjection"]  # Authorization: what llama.cpp reads first


def test_embeddings_route_idles_no_sooner_than_its_request_timeout(strix_files):
    objects = list(strix_files.values())
    (route,) = [m for m in objects if m["kind"] == "HTTPRoute" and m["metadata"]["name"] == "inference-llamacpp-embeddings"]
    (btp,) = [m for m in objects if m["kind"] == "BackendTrafficPolicy"
              and m["spec"]["targetRefs"][0] == {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "inference-llamacpp-embeddings"}]
    assert btp["spec"]["timeout"]["http"]["streamIdleTimeout"] == route["spec"]["rules"][0]["timeouts"]["request"] == "600s"
    assert stack_violations("idle-outlasts-request", objects) == []


def test_the_old_shape_600s_route_under_a_300s_listener_idle_is_caught(strix_files):
    objects = [m for m in strix_files.values() if not (
        m["kind"] == "BackendTrafficPolicy" and m["spec"]["targetRefs"][0]["name"] == "inference-llamacpp-embeddings")]
    (message,) = stack_violations("idle-outlasts-request", objects)
    assert message.startswith("HTTPRoute inference-llamacpp-embeddings: request timeout 600s but streams idle out after 300s")


def test_the_old_shape_ai_routes_under_the_listeners_idle_limit_are_caught(strix_files):
    """Before: no idle limit on the AI routes' policy (the listener's 300 s applied to completions that
    are silent until done) and a 300 s per-try idle on every rule (a re-run on the next tier)."""
    objects = copy.deepcopy(list(strix_files.values()))
    for m in objects:
        if m["kind"] == "BackendTrafficPolicy" and m["spec"]["targetRefs"][0]["name"] == "inference-routes-1":
            del m["spec"]["timeout"]
    messages = stack_violations("idle-outlasts-request", objects)
    assert any(x.startswith("AIGatewayRoute inference-routes-1: completions may take unbounded time but the listener "
                            "ends a silent stream after 300s") for x in messages)
    objects = copy.deepcopy(list(strix_files.values()))
    for m in objects:
        if m["kind"] == "AIGatewayRoute" and m["metadata"]["name"] == "inference-routes-1":
            m["spec"]["rules"][0]["streamIdleTimeout"] = "300s"
    (message,) = stack_violations("idle-outlasts-request", objects)
    assert "streamIdleTimeout 300s is a per-try idle limit" in message
    objects = copy.deepcopy(list(strix_files.values()))
    for m in objects:
        if m["kind"] == "AIGatewayRoute":
            for rule in m["spec"]["rules"]:
                rule.pop("timeouts")
    assert any("AI Gateway cuts every request at 60 s" in x for x in stack_violations("idle-outlasts-request", objects))


def test_the_old_shape_prefetch_that_pip_installs_at_start_is_caught(strix_files):
    """The first landing's prefetch installed huggingface_hub from PyPI at every pod start."""
    manifest = copy.deepcopy(strix_files["statefulset_shikanime_halogen-flash.yaml"])
    assert resource_violations("no-runtime-installs", manifest) == []
    (init,) = manifest["spec"]["template"]["spec"]["initContainers"]
    init["command"] = ["sh", "-c", 'pip install --quiet --no-cache-dir --user "huggingface_hub[hf_xet]==0.35.3" && '
                       'exec "$PYTHONUSERBASE/bin/hf" download "$HF_REPO"']
    (found,) = resource_violations("no-runtime-installs", manifest)
    assert found.startswith("container prefetch runs `pip install` at start")


def test_a_hash_on_a_rule_with_a_fallback_is_a_violation(strix_files):
    """What strix-halo shipped before: the route-wide hash took every rule's fallback (envoy#9042)."""
    objects = list(copy.deepcopy(strix_files).values())
    assert stack_violations("affinity-keeps-fallback", objects) == []
    policy = next(m for m in objects if m["kind"] == "BackendTrafficPolicy" and m["metadata"]["name"] == "inference-routes-1")
    policy["spec"]["loadBalancer"] = {"type": "ConsistentHash", "consistentHash": {"type": "Headers",
                                                                                   "headers": [{"name": "x-sks-session-id"}]}}
    found = stack_violations("affinity-keeps-fallback", objects)
    assert found and all("whose fallback (priorities [0, 1" in message for message in found)
