"""InferenceGateway: every emitted kind, and every reference between the objects resolves."""

from __future__ import annotations

import copy

import pulumi
import pytest

from common.errors import ConfigError
from components.gateway import GENERATIVE_PATHS, derived_client_key
from components.gateway_routes import MAX_RULES_PER_ROUTE
from conftest import STRIX_SECRETS, run_strix, strix_values
from render.manifests import dump, manifests


def objects(run, kind):
    return [r.inputs for r in run.find(kind)]


def names(run, kind):
    return {o["metadata"]["name"] for o in objects(run, kind)}


def only(run, kind):
    (found,) = objects(run, kind)
    return found


def secret_value(inputs: dict) -> dict:
    """A Secret's stringData as the program set it; asserts it travels as a Pulumi secret."""
    data = inputs["stringData"]
    assert "4dabf18193072939515e22adb298388d" in data, "Secret data must be a Pulumi secret"
    return data["value"]


def test_every_backend_ref_resolves(strix_run):
    ai_backends = names(strix_run, "AIServiceBackend")
    for route in objects(strix_run, "AIGatewayRoute"):
        for rule in route["spec"]["rules"]:
            for ref in rule["backendRefs"]:
                assert ref["name"] in ai_backends
    backends = names(strix_run, "Backend")
    for ai in objects(strix_run, "AIServiceBackend"):
        ref = ai["spec"]["backendRef"]
        assert (ref["group"], ref["kind"]) == ("gateway.envoyproxy.io", "Backend") and ref["name"] in backends
        assert ai["spec"]["schema"]["name"] == "OpenAI"


def test_every_policy_targets_an_object_that_exists(strix_run):
    gateways = names(strix_run, "Gateway")
    ai_routes = names(strix_run, "AIGatewayRoute")
    targets = {
        ("Gateway", n) for n in gateways
    } | {("HTTPRoute", n) for n in ai_routes} | {("HTTPRoute", n) for n in names(strix_run, "HTTPRoute")} | {("Backend", n) for n in names(strix_run, "Backend")} | {
        ("AIServiceBackend", n) for n in names(strix_run, "AIServiceBackend")
    }
    policies = ["ClientTrafficPolicy", "SecurityPolicy", "BackendTrafficPolicy", "BackendTLSPolicy", "BackendSecurityPolicy"]
    checked = 0
    for kind in policies:
        for policy in objects(strix_run, kind):
            for ref in policy["spec"]["targetRefs"]:
                # A BackendTrafficPolicy targets the HTTPRoute the controller generates from the
                # AIGatewayRoute of the same name.
                assert (ref["kind"], ref["name"]) in targets, f"{kind} {policy['metadata']['name']} -> {ref}"
                checked += 1
    assert checked >= 9


def test_every_secret_referenced_is_emitted_or_user_supplied(strix_run):
    config = strix_values()["gateway"]
    emitted = names(strix_run, "Secret")
    # Made by cert-manager from the emitted Certificate; the client CA is the user's (docs/gateway.md).
    certificate = only(strix_run, "Certificate")
    user_supplied = {config["client_ca_secret"]}
    referenced = set()
    for bsp in objects(strix_run, "BackendSecurityPolicy"):
        referenced.add(bsp["spec"]["apiKey"]["secretRef"]["name"])
    for policy in objects(strix_run, "SecurityPolicy"):
        referenced |= {ref["name"] for ref in policy["spec"]["apiKeyAuth"]["credentialRefs"]}
    for ctp in objects(strix_run, "ClientTrafficPolicy"):
        referenced |= {ref["name"] for ref in ctp["spec"]["tls"]["clientValidation"]["caCertificateRefs"]}
    gateway = only(strix_run, "Gateway")
    listener_secrets = {r["name"] for l in gateway["spec"]["listeners"] for r in l["tls"]["certificateRefs"]}
    assert listener_secrets == {certificate["spec"]["secretName"]}
    assert referenced <= emitted | user_supplied
    assert referenced - emitted == user_supplied


def test_gateway_class_proxy_and_listener(strix_run):
    gateway = only(strix_run, "Gateway")
    assert gateway["spec"]["gatewayClassName"] in names(strix_run, "GatewayClass")
    assert gateway["spec"]["infrastructure"]["parametersRef"]["name"] in names(strix_run, "EnvoyProxy")
    (listener,) = gateway["spec"]["listeners"]
    assert listener["protocol"] == "HTTPS" and listener["tls"]["mode"] == "Terminate"
    assert listener["hostname"] == only(strix_run, "Certificate")["spec"]["dnsNames"][0]
    service = only(strix_run, "EnvoyProxy")["spec"]["provider"]["kubernetes"]["envoyService"]
    assert service == {"type": "LoadBalancer", "loadBalancerClass": "tailscale",
                       "annotations": {"tailscale.com/hostname": listener["hostname"].split(".")[0]}}


def test_no_service_is_exposed_outside_the_gateway(strix_run):
    for service in objects(strix_run, "Service"):
        assert service["spec"]["type"] == "ClusterIP"
    assert strix_run.find("Ingress") == []


def test_client_traffic_policy_carries_mtls_buffer_and_idle_timeout(strix_run):
    ctp = only(strix_run, "ClientTrafficPolicy")["spec"]
    assert ctp["tls"]["clientValidation"]["mode"] == "RequireAndVerify"
    assert ctp["connection"]["bufferLimit"] == "50Mi"
    assert ctp["timeout"]["http"]["streamIdleTimeout"] == "300s"


def test_no_mtls_when_the_stack_has_no_client_ca(strix):
    del strix["gateway"]["client_ca_secret"]
    ctp = only(run_strix(strix), "ClientTrafficPolicy")["spec"]
    assert "tls" not in ctp and ctp["connection"]["bufferLimit"] == "50Mi"


def test_api_keys_one_per_client_stripped_before_upstream(strix_run):
    policy = only(strix_run, "SecurityPolicy")["spec"]["apiKeyAuth"]
    assert policy["sanitize"] is True
    assert policy["extractFrom"] == [{"headers": ["x-api-key", "authorization"]}]
    (secret,) = [s for s in objects(strix_run, "Secret") if s["metadata"]["name"] == "inference-api-keys"]
    keys = secret_value(secret)
    assert set(keys) == {"shikanime", "ci"}
    assert keys["ci"] == derived_client_key(STRIX_SECRETS["gateway_master_key"], "ci")
    assert len(set(keys.values())) == len(keys)
    assert "client_api_keys" in strix_run.secret_outputs


def test_provider_keys_reach_only_their_provider(strix_run):
    client_keys = set(secret_value(next(s for s in objects(strix_run, "Secret") if s["metadata"]["name"] == "inference-api-keys")).values())
    # Remote providers get theirs; the local llama.cpp tier gets its own server's --api-key.
    expected = {"nous": "nous_api_key", "openrouter": "openrouter_api_key", "z-ai": "zai_api_key",
                "llama-cpp": "llamacpp_api_key"}
    for bsp in objects(strix_run, "BackendSecurityPolicy"):
        (target,) = bsp["spec"]["targetRefs"]
        secret_name = bsp["spec"]["apiKey"]["secretRef"]["name"]
        (secret,) = [s for s in objects(strix_run, "Secret") if s["metadata"]["name"] == secret_name]
        value = secret_value(secret)
        assert value == {"apiKey": STRIX_SECRETS[expected[target["name"]]]}
        assert not set(value.values()) & client_keys
    # The engine tier (not llama.cpp) has no key policy at all.
    assert {b["spec"]["targetRefs"][0]["name"] for b in objects(strix_run, "BackendSecurityPolicy")} == set(expected)


def test_remote_tiers_use_tls_to_the_providers_host(strix_run):
    backends = {b["metadata"]["name"]: b for b in objects(strix_run, "Backend")}
    for policy in objects(strix_run, "BackendTLSPolicy"):
        (target,) = policy["spec"]["targetRefs"]
        endpoint = backends[target["name"]]["spec"]["endpoints"][0]["fqdn"]
        assert endpoint["port"] == 443
        assert policy["spec"]["validation"] == {"wellKnownCACertificates": "System", "hostname": endpoint["hostname"]}


def test_local_tiers_resolve_to_the_engines_service(strix_run):
    services = {s["metadata"]["name"]: s for s in objects(strix_run, "Service")}
    backends = {b["metadata"]["name"]: b for b in objects(strix_run, "Backend")}
    fqdn = backends["halogen"]["spec"]["endpoints"][0]["fqdn"]
    service = services["halogen-flash"]
    assert fqdn == {"hostname": "halogen-flash.shikanime.svc.cluster.local", "port": service["spec"]["ports"][0]["port"]}
    assert service["spec"]["clusterIP"] == "None"  # headless: every ready engine pod


def ai_route(run, name: str) -> dict:
    (route,) = [r for r in objects(run, "AIGatewayRoute") if r["metadata"]["name"] == name]
    return route


def traffic_policy(run, name: str) -> dict:
    """The BackendTrafficPolicy of this name (a route's is named after it; its rules' affinity, <route>-affinity)."""
    (btp,) = [p for p in objects(run, "BackendTrafficPolicy") if p["metadata"]["name"] == name]
    return btp["spec"]


def test_routing_table_priorities_and_overrides(strix_run):
    rules = ai_route(strix_run, "inference-routes-1")["spec"]["rules"]
    table = {r["matches"][0]["headers"][0]["value"]: r["backendRefs"] for r in rules}
    flash = table["qwen/qwen3.8-flash"]
    assert [(b["name"], b["priority"]) for b in flash] == [("halogen", 0), ("nous", 1), ("openrouter", 2)]
    assert flash[0]["modelNameOverride"] == "qwen38-flash-next-w4b"
    for rule in rules:
        # No per-try idle limit on the rules: it would re-run a long non-streamed completion elsewhere.
        assert rule["timeouts"] == {"request": "0s"} and "streamIdleTimeout" not in rule
    # The route's idle limit outlasts the longest completion, not the listener's 300 s.
    assert traffic_policy(strix_run, "inference-routes-1")["timeout"] == {"http": {"streamIdleTimeout": "1800s"}}
    exact = [r for r in rules if r["matches"][0]["headers"][0]["type"] == "Exact"]
    assert rules[-1]["name"] == "catch-all" and rules[-1]["matches"][0]["headers"][0] == {
        "type": "RegularExpression", "name": "x-ai-eg-model", "value": ".*"
    }
    assert len(exact) == len(rules) - 1


def test_traffic_policy_keeps_every_fallback_and_tries_each_replica(strix_run):
    btp = traffic_policy(strix_run, "inference-routes-1")
    # No hash on a rule with a fallback: a hash balancer ignores the retry's priority step (envoy#9042).
    assert "loadBalancer" not in btp
    # Both of flash's replicas are tried before a prompt leaves the cluster.
    assert btp["retry"]["numAttemptsPerPriority"] == 2
    assert btp["retry"]["numRetries"] >= 3  # two local replicas, then a remote tier
    assert "retriable-status-codes" in btp["retry"]["retryOn"]["triggers"]
    assert {503, 429} <= set(btp["retry"]["retryOn"]["httpStatusCodes"])
    assert "timeout" not in btp["retry"].get("perRetry", {})  # would cut long generations


def test_session_affinity_only_on_rules_with_no_fallback_to_skip():
    """A rule served by one local tier with two replicas keeps a conversation on one replica: a policy of
    its own targets that rule by name (sectionName), repeating the route's retry and idle limit (a rule's
    policy replaces the route's there); the rules with fallbacks keep the plain route policy."""
    from conftest import run_strix, strix_values

    values = strix_values()
    (flash,) = [r for r in values["gateway"]["routes"] if r["model"] == "qwen/qwen3.8-flash"]
    flash["backends"] = [{"tier": "halogen"}]
    run = run_strix(values)
    route = traffic_policy(run, "inference-routes-1")
    affinity = traffic_policy(run, "inference-routes-1-affinity")
    (ai_route,) = [r for r in objects(run, "AIGatewayRoute") if r["metadata"]["name"] == "inference-routes-1"]
    names = [rule["name"] for rule in ai_route["spec"]["rules"]]
    (target,) = affinity["targetRefs"]
    assert target["kind"] == "HTTPRoute" and target["name"] == "inference-routes-1" and target["sectionName"] in names
    (hashed,) = [rule for rule in ai_route["spec"]["rules"] if rule["name"] == target["sectionName"]]
    assert [ref["name"] for ref in hashed["backendRefs"]] == ["halogen"]
    assert affinity["loadBalancer"]["consistentHash"] == {"type": "Headers", "headers": [{"name": "x-sks-session-id"}]}
    assert affinity["retry"] == route["retry"] and affinity["timeout"] == route["timeout"]
    assert "loadBalancer" not in route
    # The vendored Envoy Gateway schema takes a rule-level target.
    from render.manifests import manifests
    from render.validate import validate

    (name, manifest), = [(n, m) for n, m in manifests(run).items() if m["metadata"]["name"] == "inference-routes-1-affinity"]
    validate(name, manifest, run.config.cluster.kubernetes_version)


def local_replicas_behind(run, route: dict) -> list[int]:
    """Follow each rule's backends to the workloads behind them: AIServiceBackend -> Backend ->
    Service FQDN -> the Deployment/StatefulSet whose pods that Service selects."""
    ai = {b["metadata"]["name"]: b for b in objects(run, "AIServiceBackend")}
    backends = {b["metadata"]["name"]: b for b in objects(run, "Backend")}
    services = {s["metadata"]["name"]: s for s in objects(run, "Service")}
    workloads = objects(run, "Deployment") + objects(run, "StatefulSet")
    found = []
    for rule in route["spec"]["rules"]:
        for ref in rule["backendRefs"]:
            backend = backends[ai[ref["name"]]["spec"]["backendRef"]["name"]]
            host = backend["spec"]["endpoints"][0]["fqdn"]["hostname"]
            service = services.get(host.split(".")[0]) if host.endswith(".svc.cluster.local") else None
            if service is None:
                continue  # a remote provider
            selector = service["spec"]["selector"]
            (workload,) = [w for w in workloads
                           if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
            found.append(workload["spec"].get("replicas", 1))
    return found


@pytest.mark.parametrize("stack", ["strix-halo", "rtx4090"])
def test_a_failed_local_replica_is_retried_locally_before_the_next_tier(stack):
    """Across objects: every AI route's retry tries each replica of its local servers before the
    next priority, and hashes sessions only where there is more than one replica to choose from
    (a hash balancer ignores the retry's priority step, envoyproxy/envoy#9042: a single local replica
    behind a hash would never hand a failed request to the remote tier while it is listed)."""
    from conftest import run_stack_file, stack_file_config, RTX_SECRETS
    run = strix_run_cached() if stack == "strix-halo" else run_stack_file(stack, stack_file_config(stack), RTX_SECRETS)
    routes = [r for r in objects(run, "AIGatewayRoute")]
    assert routes
    for route in routes:
        replicas = local_replicas_behind(run, route)
        btp = traffic_policy(run, route["metadata"]["name"])
        most = max(replicas, default=1)
        assert btp["retry"]["numAttemptsPerPriority"] == most
        assert "loadBalancer" not in btp  # affinity only per rule, where no fallback is skipped
        assert "circuitBreaker" not in btp  # its overflow 503 is never retried: no spill, only errors
    if stack == "rtx4090":
        # One card: a failure on it goes straight to OpenRouter (priority 1), no hash in the way.
        chat = traffic_policy(run, "inference-routes-1")
        assert chat["retry"]["numAttemptsPerPriority"] == 1 and "loadBalancer" not in chat


def strix_run_cached():
    return run_strix()


def test_fewer_attempts_than_local_replicas_is_refused(strix):
    strix["gateway"]["retry"] = {"attempts_per_priority": 1}
    with pytest.raises(pulumi.RunError, match=r"gateway.retry.attempts_per_priority: 1 sends a request that failed on "
                       r"one of the 2 local replicas of 'qwen/qwen3.8-flash' to the next tier .*set it to 2"):
        run_strix(strix)


def test_embeddings_never_fail_over_on_a_rejected_request(strix_run):
    """Embedding rules have their own route and retry: a 500 from llama.cpp (input longer than its
    micro-batch) or any 4xx stays an error instead of sending the document to a remote tier."""
    embedding_models = {r["model"] for r in strix_values()["gateway"]["routes"] if r.get("kind") == "embedding"}
    route = ai_route(strix_run, "inference-embedding-routes-1")
    assert {r["matches"][0]["headers"][0]["value"] for r in route["spec"]["rules"]} == embedding_models
    chat_rules = ai_route(strix_run, "inference-routes-1")["spec"]["rules"]
    assert not embedding_models & {r["matches"][0]["headers"][0]["value"] for r in chat_rules}
    retry = traffic_policy(strix_run, "inference-embedding-routes-1")["retry"]
    assert set(retry["retryOn"]["httpStatusCodes"]) == {502, 503, 504}
    assert 500 in traffic_policy(strix_run, "inference-routes-1")["retry"]["retryOn"]["httpStatusCodes"]


def test_a_retried_500_on_embeddings_is_refused(strix):
    strix["gateway"]["retry"] = {"embedding_status_codes": [500, 503]}
    with pytest.raises(pulumi.RunError, match=r"gateway.retry.embedding_status_codes\[0\]: Input should be greater than or equal to 502"):
        run_strix(strix)


def test_more_than_fifteen_rules_split_across_routes(strix):
    for i in range(20):
        strix["gateway"]["routes"].append({"model": f"acme/model-{i}", "backends": [{"tier": "openrouter"}]})
    run = run_strix(strix)
    routes = sorted((r for r in objects(run, "AIGatewayRoute") if "-routes-" in r["metadata"]["name"]
                     and "embedding" not in r["metadata"]["name"]), key=lambda r: r["metadata"]["name"])
    chat = len([r for r in strix["gateway"]["routes"] if r.get("kind", "chat") == "chat"])
    assert [len(r["spec"]["rules"]) for r in routes] == [MAX_RULES_PER_ROUTE, chat + 1 - MAX_RULES_PER_ROUTE]
    assert routes[-1]["spec"]["rules"][-1]["name"] == "catch-all"
    assert all(rule["name"] != "catch-all" for rule in routes[0]["spec"]["rules"])
    btp_targets = {p["spec"]["targetRefs"][0]["name"] for p in objects(run, "BackendTrafficPolicy")}
    assert btp_targets == {r["metadata"]["name"] for r in objects(run, "AIGatewayRoute")} | {"inference-llamacpp-embeddings"}
    for route in routes:
        rule_names = [rule["name"] for rule in route["spec"]["rules"]]
        assert len(rule_names) == len(set(rule_names))


def test_embedding_model_is_refused_on_generative_paths(strix_run):
    (guard_filter,) = [f for f in objects(strix_run, "HTTPRouteFilter") if "directResponse" in f["spec"]]
    assert guard_filter["spec"]["directResponse"]["statusCode"] == 400
    (guard,) = [r for r in objects(strix_run, "HTTPRoute") if r["metadata"]["name"] == "inference-embedding-guard"]
    (rule,) = guard["spec"]["rules"]
    assert {m["path"]["value"] for m in rule["matches"]} == set(GENERATIVE_PATHS)
    assert {m["headers"][0]["value"] for m in rule["matches"]} == {"qwen/qwen3-embedding-8b"}
    assert rule["filters"][0]["extensionRef"]["name"] == guard_filter["metadata"]["name"]
    assert "backendRefs" not in rule


def test_llamacpp_embeddings_path_has_its_own_timeout(strix_run):
    (route,) = [r for r in objects(strix_run, "HTTPRoute") if r["metadata"]["name"] == "inference-llamacpp-embeddings"]
    (rule,) = route["spec"]["rules"]
    assert rule["timeouts"] == {"request": "600s"}
    (backend,) = rule["backendRefs"]
    service = next(s for s in objects(strix_run, "Service") if s["metadata"]["name"] == backend["name"])
    assert backend["port"] == service["spec"]["ports"][0]["port"]
    assert rule["filters"][0]["urlRewrite"]["path"]["replacePrefixMatch"] == "/v1/embeddings"
    # The client's gateway key is stripped; llama.cpp's own key is injected from a Secret.
    injected = rule["filters"][1]["extensionRef"]["name"]
    (credential_filter,) = [f for f in objects(strix_run, "HTTPRouteFilter") if f["metadata"]["name"] == injected]
    secret_name = credential_filter["spec"]["credentialInjection"]["credential"]["valueRef"]["name"]
    (secret,) = [s for s in objects(strix_run, "Secret") if s["metadata"]["name"] == secret_name]
    assert secret_value(secret) == {"credential": "Bearer " + STRIX_SECRETS["llamacpp_api_key"]}


def test_namespace_lets_the_gateway_in(strix_run):
    (policy,) = objects(strix_run, "CiliumNetworkPolicy")
    assert {
        "fromEndpoints": [
            {
                "matchLabels": {
                    "k8s:io.kubernetes.pod.namespace": "envoy-gateway-system",
                    "app.kubernetes.io/name": "envoy",
                    "gateway.envoyproxy.io/owning-gateway-name": "inference",
                }
            }
        ]
    } in policy["spec"]["ingress"]


def test_no_secret_value_in_rendered_manifests_or_plain_outputs(strix_run):
    text = "".join(dump(m) for m in manifests(strix_run).values())
    plain = repr({k: v for k, v in strix_run.outputs.items() if k not in strix_run.secret_outputs})
    for value in [*STRIX_SECRETS.values(), derived_client_key(STRIX_SECRETS["gateway_master_key"], "ci")]:
        assert value not in text and value not in plain


def bad(strix, mutate, match):
    mutate(strix)
    with pytest.raises(pulumi.RunError, match=match):
        run_strix(strix)


def test_two_clients_with_the_same_key_config(strix):
    def mutate(s):
        s["gateway"]["clients"] = {"a": {"key_config": "shared_key"}, "b": {"key_config": "shared_key"}}

    with pytest.raises(pulumi.RunError, match=r"gateway.clients.b.key_config: shared_key is already the key of client a"):
        mutate(strix)
        run_strix(strix, secrets={"shared_key": "k"})


def test_two_clients_with_equal_key_values(strix):
    strix["gateway"]["clients"] = {"a": {"key_config": "key_a"}, "b": {"key_config": "key_b"}}
    with pytest.raises(pulumi.RunError, match=r"gateway.clients.b.key_config: key_b holds the same key as gateway.clients.a.key_config \(gateway client a's key\)"):
        run_strix(strix, secrets={"key_a": "same", "key_b": "same"})


def test_route_to_an_unknown_tier(strix):
    bad(strix, lambda s: s["gateway"]["routes"][0]["backends"].append({"tier": "anthropic"}),
        r"gateway.routes\[0\].backends\[3\].tier: no tier 'anthropic'")


def test_fallback_tier_without_a_provider_key(strix):
    bad(strix, lambda s: s["gateway"]["tiers"]["nous"]["remote"].pop("api_key_config"),
        r"gateway.tiers.nous.remote.api_key_config: a remote tier needs its provider key")


def test_embedding_model_on_a_chat_route(strix):
    bad(strix, lambda s: s["gateway"]["routes"][2].pop("kind"),
        r"gateway.routes\[2\].backends\[0\].tier: llama-cpp serves an embedding model; a chat route")


def test_embedding_tier_cannot_catch_all(strix):
    bad(strix, lambda s: s["gateway"]["catch_all"].insert(0, "llama-cpp"),
        r"gateway.catch_all\[0\]: llama-cpp serves an embedding model")


def test_tier_must_be_local_or_remote(strix):
    bad(strix, lambda s: s["gateway"]["tiers"]["halogen"].update(remote={"host": "x.example.org", "api_key_config": "k"}),
        r"gateway.tiers.halogen: set exactly one of local")


def test_duplicate_public_model(strix):
    bad(strix, lambda s: s["gateway"]["routes"].append(copy.deepcopy(s["gateway"]["routes"][0])),
        r"gateway.routes\[3\].model: 'qwen/qwen3.8-flash' is already routed by gateway.routes\[0\]")


def test_client_without_any_key_source(strix):
    bad(strix, lambda s: s["gateway"].pop("master_key_config"),
        r"gateway.clients.shikanime.key_config: set it, or gateway.master_key_config")


def test_derived_keys_are_stable_and_distinct():
    assert derived_client_key("m", "a") == derived_client_key("m", "a")
    assert derived_client_key("m", "a") != derived_client_key("m", "b")
    assert derived_client_key("m", "a") != derived_client_key("n", "a")
    assert derived_client_key("m", "a").startswith("sk-infer-")


def test_gateway_fronted_llama_server_needs_a_key_from_config(strix):
    strix["models"]["embed"]["api_key"] = {"secret_name": "made-elsewhere"}
    with pytest.raises(pulumi.RunError, match=r"models.embed.api_key.from_config: the gateway must send this server's key"):
        run_strix(strix)


def test_gateway_fronted_llama_server_without_any_key(strix):
    del strix["models"]["embed"]["api_key"]
    with pytest.raises(pulumi.RunError, match=r"models.embed.api_key: required: the gateway reaches this server"):
        run_strix(strix)


def test_clients_with_their_own_secure_keys_render_offline(tmp_path, strix):
    """Offline every `secure:` value reads the same placeholder; that is not two equal keys."""
    import yaml

    from render.output import render_stack

    strix["gateway"]["clients"] = {"a": {"key_config": "key_a"}, "b": {"key_config": "key_b"}}
    config = {f"inference-plane:{k}": v for k, v in strix.items()}
    for key in [*STRIX_SECRETS, "key_a", "key_b"]:
        config[f"inference-plane:{key}"] = {"secure": "v1:bm90LWRlY3J5cHRhYmxl"}
    (tmp_path / "Pulumi.two.yaml").write_text(yaml.safe_dump({"config": config}))
    result = render_stack("two", tmp_path / "out", project_dir=tmp_path)
    assert set(result.run.outputs["client_api_keys"]) == {"a", "b"}


def test_gateway_does_not_wait_for_the_model_servers(strix_run):
    """The gateway names Services by DNS name; ordering it after an hour-long engine rollout only delays it."""
    servers = {r.urn for r in strix_run.resources if r.type.endswith(("StatefulSet", "Deployment", "OpenAIServer", "EmbedServer", "LlamaServer"))}
    gateway_parts = [r for r in strix_run.resources if r.type.startswith("kubernetes:") and
                     r.inputs.get("apiVersion", "").split("/")[0] in ("gateway.networking.k8s.io", "gateway.envoyproxy.io", "aigateway.envoyproxy.io")]
    # depends_on on the component is recorded on the component; the engine applies it to its children.
    (component,) = [r for r in strix_run.resources if r.type.endswith(":InferenceGateway")]
    assert servers and len(gateway_parts) >= 10
    assert not servers & set(component.dependencies)
    for resource in gateway_parts:
        assert not servers & set(resource.dependencies), resource.name


def test_what_secrets_md_says_each_key_holds_is_what_the_program_puts_there(strix_run, tmp_path):
    """A GitOps user creates the Secrets by hand from SECRETS.md: each relation it states between
    keys (first line of the key file, 'Bearer ' + the llama.cpp key) holds for the values the
    program itself writes under `pulumi up` (a two-line key file, as while rotating)."""
    from components.meta import VALUE_NOTES_ANNOTATION
    from conftest import STRIX_SECRETS, run_strix
    from render.output import secrets_to_create, supplied_secrets

    run = run_strix(secrets={**STRIX_SECRETS, "llamacpp_api_key": "old-key-1\nnew-key-2"})
    secrets = {s.inputs["metadata"]["name"]: s.inputs for s in run.find("Secret")}
    value = {name: secret_value(inputs) for name, inputs in secrets.items()}
    notes = {name: dict(line.split(": ", 1) for line in inputs["metadata"]["annotations"][VALUE_NOTES_ANNOTATION].splitlines())
             for name, inputs in secrets.items()}
    assert notes["llama-cpp-api-key"]["metrics-token"] == "the first line of api-keys (the metrics scrape's bearer token)"
    assert value["llama-cpp-api-key"]["metrics-token"] == "old-key-1"
    first_line = "the first line of api-keys in Secret llama-cpp-api-key (models.embed's llama.cpp key)"
    assert notes["llama-cpp-provider-key"]["apiKey"] == first_line
    assert value["llama-cpp-provider-key"]["apiKey"] == "old-key-1"
    assert notes["inference-llamacpp-credential"]["credential"] == "'Bearer ' followed by " + first_line
    assert value["inference-llamacpp-credential"]["credential"] == "Bearer old-key-1"
    assert notes["nous-provider-key"]["apiKey"] == "the provider's API key (config nous_api_key)"
    assert value["nous-provider-key"]["apiKey"] == STRIX_SECRETS["nous_api_key"]
    # Every key of every Secret is described, and the file lists the CA the gateway refers to.
    for name, inputs in secrets.items():
        assert set(notes[name]) == set(value[name]), name
    text = secrets_to_create("strix-halo", [r.inputs for r in strix_run.find("Secret")], supplied_secrets(strix_run))
    assert "`inference-client-ca` in namespace `shikanime` (key: ca.crt)" in text
    assert "  - `metrics-token`: the first line of api-keys" in text


def test_two_stacks_claiming_one_tailnet_device_are_refused(tmp_path):
    """Tailscale names a second device with a taken name `<name>-1` (KB 1098): its listener and
    certificate would no longer match. The project's stacks are compared with each other."""
    from config.gateway import GatewayConfig
    from config.load import PROJECT_DIR, tailnet_name_problems

    gateway = {"hostname": "inference.tail0a1b2c.ts.net", "tls_secret": "t", "clients": {"me": {}},
               "master_key_config": "k", "tiers": {"r": {"remote": {"host": "openrouter.ai", "api_key_config": "o"}}},
               "catch_all": ["r"]}
    for stack in ("one", "two"):
        (tmp_path / f"Pulumi.{stack}.yaml").write_text(
            "config:\n  inference-plane:gateway:\n    hostname: inference.tail0a1b2c.ts.net\n")
    mine = GatewayConfig.model_validate(gateway)
    (problem,) = tailnet_name_problems(mine, "one", tmp_path)
    assert problem == ("gateway.hostname", "inference.tail0a1b2c.ts.net is also the gateway of stack two "
                       "(Pulumi.two.yaml): on one tailnet the second device to join becomes inference-1, which "
                       "matches neither its listener nor its certificate; give each stack a name of its own, e.g. "
                       "inference-one.tail0a1b2c.ts.net")
    # Another load-balancer class claims no tailnet device; a run that is no stack of the project is not compared.
    (tmp_path / "Pulumi.two.yaml").write_text("config:\n  inference-plane:gateway:\n    hostname: "
                                              "inference.tail0a1b2c.ts.net\n    load_balancer_class: metallb\n")
    assert tailnet_name_problems(mine, "one", tmp_path) == []
    assert tailnet_name_problems(mine, "test", tmp_path) == []
    # The shipped stacks: no two on the example tailnet share a device.
    from conftest import STACKS
    for stack in STACKS:
        values = __import__("conftest").stack_values(stack)
        if "gateway" in values:
            assert tailnet_name_problems(GatewayConfig.model_validate(values["gateway"]), stack, PROJECT_DIR) == []


@pytest.mark.parametrize("solver, host, fragment", [
    ("http01", "chat.home.example.org", "letsencrypt-cluster (http01) cannot issue for chat.home.example.org "
     "(models.chat.exposure.host): Let's Encrypt must fetch a token from it over the internet"),
    ("dns01", "llm.home.arpa", "letsencrypt-cluster (dns01) cannot issue for llm.home.arpa (models.chat.exposure.host): "
     "no public zone of yours holds *.home.arpa; use a CA issuer"),
])
def test_an_issuer_that_cannot_prove_a_lan_name_is_refused(solver, host, fragment):
    from conftest import CPU_SECRETS, run_stack_file, stack_file_config
    config = stack_file_config("cpu-cluster")
    cluster = config["inference-plane:cluster"]
    cluster["issuer_solver"] = solver
    config["inference-plane:models"]["chat"]["exposure"]["host"] = host
    config["inference-plane:models"]["chat"]["cors_origins"] = f"https://{host}"
    with pytest.raises(pulumi.RunError, match=r"cluster.issuer_solver: " + __import__("re").escape(fragment)):
        run_stack_file("cpu-cluster", config, CPU_SECRETS)
    # A CA issuer proves any name.
    cluster["issuer_solver"] = "ca"
    run = run_stack_file("cpu-cluster", config, CPU_SECRETS)
    (ingress,) = [r.inputs for r in run.find("Ingress")]
    assert ingress["spec"]["tls"][0]["hosts"] == [host]


def envoy_api_key(extract_from: list[dict], headers: dict[str, str]) -> str | None:
    """The key Envoy's api_key_auth filter takes from a request (Envoy 1.38, source/extensions/filters/
    http/api_key_auth/api_key_auth.cc: KeySources in order, the first non-empty one wins, a header's
    leading "Bearer " is stripped); what the rendered extractFrom makes of a client's headers."""
    for source in extract_from:
        for name in source.get("headers", []):
            value = headers.get(name.lower())
            if value:
                return value[len("Bearer "):] if value.startswith("Bearer ") else value
    return None


def test_clients_authenticate_as_openai_clients_do_or_with_x_api_key(strix_run):
    """OpenAI SDKs and most chat apps can only send `Authorization: Bearer <key>`; both forms reach a
    client's key through the rendered policy, x-api-key first when both are sent."""
    policy = only(strix_run, "SecurityPolicy")["spec"]["apiKeyAuth"]
    (secret,) = [s for s in objects(strix_run, "Secret") if s["metadata"]["name"] == "inference-api-keys"]
    keys = secret_value(secret)
    key = keys["ci"]
    assert envoy_api_key(policy["extractFrom"], {"authorization": f"Bearer {key}"}) == key
    assert envoy_api_key(policy["extractFrom"], {"x-api-key": key}) == key
    assert envoy_api_key(policy["extractFrom"], {"x-api-key": key, "authorization": "Bearer sk-dummy"}) == key
    assert envoy_api_key(policy["extractFrom"], {}) is None
    # Envoy reads x-api-key before Authorization, llama.cpp and the proxy the reverse (issue #45 item 5): no
    # disagreement reaches a server, because the filter strips every key source it reads, the one it judged
    # and the other (api_key_auth.cc KeySources::removeKey, run when forwarding.hide_credentials, which is
    # what Envoy Gateway's sanitize sets), and each tier's key comes from its own BackendSecurityPolicy.
    forwarded = envoy_forwarded(policy, "ci", {"x-api-key": key, "authorization": "Bearer sk-other", "accept": "*/*"})
    assert forwarded == {"accept": "*/*", policy["forwardClientIDHeader"]: "ci"}


def envoy_forwarded(policy: dict, client: str, headers: dict[str, str]) -> dict[str, str]:
    """The request headers Envoy forwards once its api_key_auth filter admitted ``client`` (api_key_auth.cc:
    the client's id set in forwarding.header, then, with hide_credentials, every key source's header removed)."""
    out = dict(headers)
    out[policy["forwardClientIDHeader"].lower()] = client
    if policy.get("sanitize"):
        for source in policy["extractFrom"]:
            for name in source.get("headers", []):
                out.pop(name.lower(), None)
    return out


def envoy_priorities_tried(attempts: int, per_priority: int, priorities: int) -> set[int]:
    """The priorities Envoy tries, as its previous_priorities retry priority (update_frequency = attempts per
    priority) walks them: every update_frequency attempts the priorities already tried leave the load."""
    return {min(i // per_priority, priorities - 1) for i in range(attempts)}


@pytest.mark.parametrize("stack", ["strix-halo", "rtx3090-library", "rtx4090"])
def test_every_rule_reaches_every_tier(stack):
    """Read across the rendered objects as Envoy Gateway applies them: each AIGatewayRoute rule's tiers (its
    backendRefs' priorities) and the BackendTrafficPolicy that targets its HTTPRoute (or that rule by name): the
    attempts it allows (numRetries + 1), taken numAttemptsPerPriority at a time, reach its last tier (issue #45
    item 1: strix-halo's flash model never reached its third)."""
    from render.manifests import manifests
    from render.offline import run_stack

    files = list(manifests(run_stack(stack)).values())
    routes = [m for m in files if m["kind"] == "AIGatewayRoute"]
    policies = [m for m in files if m["kind"] == "BackendTrafficPolicy"]
    checked = 0
    for route in routes:
        for rule in route["spec"]["rules"]:
            name = route["metadata"]["name"]
            mine = [p for p in policies if any(t["name"] == name and t.get("sectionName") == rule.get("name")
                                               for t in p["spec"]["targetRefs"])]
            mine = mine or [p for p in policies if any(t["name"] == name and "sectionName" not in t
                                                        for t in p["spec"]["targetRefs"])]
            (policy,) = mine
            retry = policy["spec"]["retry"]
            priorities = len({ref.get("priority", 0) for ref in rule["backendRefs"]})
            tried = envoy_priorities_tried(retry["numRetries"] + 1, retry["numAttemptsPerPriority"], priorities)
            assert tried == set(range(priorities)), (stack, rule.get("name"), retry, priorities)
            checked += 1
    assert checked > 0


def test_too_few_retries_for_a_routes_tiers_are_refused():
    from conftest import strix_values
    from plane import parse_stack

    values = strix_values()
    values["gateway"].setdefault("retry", {})["num_retries"] = 3
    with pytest.raises(ConfigError, match=r"gateway\.retry\.num_retries: 3 gives route '.*' 4 attempts at 2 per tier: its "
                                          r"last tier \(openrouter\) is never tried; .* set it to 4"):
        parse_stack(values)
