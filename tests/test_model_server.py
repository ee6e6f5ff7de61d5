"""LlamaServer and EmbedServer in isolation: what each would apply, and how the pieces fit."""

from __future__ import annotations

import copy

import pytest

from plane import plan_capacity as plan
from plane import parse_stack
from components.embed_server import EmbedServer
from components.llama_server import LlamaServer
from components.model_server import ModelServerArgs
from conftest import run_values
from engines import server_builds
from render.offline import run_program


def build(values: dict, key: str, api_key_value: str | None = None):
    stack = parse_stack(values)
    model = stack.models[key]
    args = ModelServerArgs(
        model=model,
        namespace=stack.namespace.name,
        node_pool=stack.node_pools[model.node_pool],
        cache=stack.model_cache,
        cluster=stack.cluster,
        plan=(capacity := plan(stack)).servers[key],
        build=server_builds(stack, capacity)[key],
        api_key_value=api_key_value or ("test-key" if model.api_key and model.api_key.from_config else None),
    )
    component = EmbedServer if model.role == "embedding" else LlamaServer
    run = run_program({}, program=lambda: {"server": component(model.name, args)})
    return stack, model, run


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} appears {args.count(name)} times in {args}"
    return args[args.index(name) + 1]


def container_of(run, name):
    return run.one("Deployment", name).inputs["spec"]["template"]["spec"]["containers"][0]


def test_chat_flags_follow_the_typed_settings(homelab_values):
    homelab_values["models"]["chat"].update(ctx_size=8192, threads=3, ubatch_size=512, gpu_layers=20)
    _, model, run = build(homelab_values, "chat")
    args = container_of(run, model.name)["args"]
    assert flag(args, "--hf-repo") == model.hf_repo
    assert flag(args, "--ctx-size") == "8192"
    assert flag(args, "--threads") == "3"
    assert flag(args, "--ubatch-size") == "512"
    assert flag(args, "--n-gpu-layers") == "20"
    assert flag(args, "--cors-origins") == "localhost"
    assert flag(args, "--host") == "0.0.0.0"
    assert "--metrics" in args
    assert "--embeddings" not in args and "--no-ui" not in args
    # Exposed through an Ingress, so the homelab chat server takes a key from a file.
    assert flag(args, "--api-key-file").startswith("/run/secrets/")
    assert not any(a == "--api-key" for a in args)  # never the key itself on the command line


def test_no_key_flag_for_a_server_nothing_outside_reaches(homelab_values):
    del homelab_values["models"]["chat"]["exposure"]
    del homelab_values["models"]["chat"]["api_key"]
    _, model, run = build(homelab_values, "chat")
    assert not any(a.startswith("--api-key") for a in container_of(run, model.name)["args"])


def test_port_flag_matches_the_container_port(homelab_values):
    homelab_values["models"]["chat"]["port"] = 8731
    _, model, run = build(homelab_values, "chat")
    container = container_of(run, model.name)
    (port,) = container["ports"]
    assert flag(container["args"], "--port") == str(int(port["containerPort"])) == "8731"


def test_embed_flags(homelab_values):
    _, model, run = build(homelab_values, "embed")
    args = container_of(run, model.name)["args"]
    assert "--embeddings" in args and "--no-ui" in args
    # In-cluster only, and still not readable by a page on another origin.
    assert flag(args, "--cors-origins") == "localhost"
    assert flag(args, "--ctx-size") == str(model.ctx_size)


def test_optional_flags_are_left_out(homelab_values):
    homelab_values["models"]["embed"].update(ubatch_size=None, metrics=False)
    _, model, run = build(homelab_values, "embed")
    args = container_of(run, model.name)["args"]
    assert "--ubatch-size" not in args and "--metrics" not in args


def test_extra_args_come_last(homelab_values):
    homelab_values["models"]["chat"]["extra_args"] = ["--jinja", "--reasoning-budget", "0"]
    _, model, run = build(homelab_values, "chat")
    assert container_of(run, model.name)["args"][-3:] == ["--jinja", "--reasoning-budget", "0"]


def test_probes_use_health_on_the_named_port(homelab_values):
    _, model, run = build(homelab_values, "chat")
    container = container_of(run, model.name)
    port_names = {p["name"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert container[probe]["httpGet"]["port"] in port_names


def test_startup_budget_outlasts_a_cold_download(homelab_values):
    stack, model, run = build(homelab_values, "chat")
    probe = container_of(run, model.name)["startupProbe"]
    allowed = probe["periodSeconds"] * (probe["failureThreshold"] - 1)
    weights_mib = 19.8 * 1024
    download = weights_mib / stack.startup.download_mib_per_s
    load = weights_mib / stack.startup.load_mib_per_s
    assert download + load <= allowed < download + load + probe["periodSeconds"]


def test_startup_budget_grows_with_the_model(homelab_values):
    homelab_values["models"]["chat"]["weights"] = "80Gi"
    homelab_values["model_cache"]["size"] = "100Gi"
    homelab_values["node_pools"]["iris-xe"].update(memory="256Gi", allocatable="250Gi")
    homelab_values["models"]["chat"]["resources"]["accepted_risk"] = "budget arithmetic only, not deployed"
    _, model, run_big = build(homelab_values, "chat")
    homelab_values["models"]["chat"]["weights"] = "20Gi"  # near the 35B's 19.6 GiB (a size far below is refused)
    _, _, run_small = build(homelab_values, "chat")
    big = container_of(run_big, model.name)["startupProbe"]["failureThreshold"]
    small = container_of(run_small, model.name)["startupProbe"]["failureThreshold"]
    assert big > small
    assert big / small == pytest.approx(4, rel=0.05)


def test_faster_rates_than_the_defaults_change_no_pod_and_no_wait(homelab_values):
    """The defaults' pace is a floor: a faster uplink or disk leaves the probe (part of the pod)
    as it was, and Pulumi still waits as long as the probe allows."""
    _, model, run_default = build(homelab_values, "chat")
    homelab_values["startup"] = {"download_mib_per_s": 80, "load_mib_per_s": 2000}
    stack, _, run_fast = build(homelab_values, "chat")
    default, fast = (run.one("Deployment", model.name) for run in (run_default, run_fast))
    assert default.inputs["spec"]["template"] == fast.inputs["spec"]["template"]
    probe = container_of(run_fast, model.name)["startupProbe"]
    weights_mib = 19.8 * 1024
    window = probe["periodSeconds"] * (probe["failureThreshold"] - 1)
    assert weights_mib / 8.5 + weights_mib / 200 <= window < weights_mib / 8.5 + weights_mib / 200 + probe["periodSeconds"]
    assert fast.custom_timeouts == default.custom_timeouts
    assert int(fast.custom_timeouts["create"].rstrip("s")) >= window + stack.startup.image_pull_seconds
    # The annotation the policies check is the stack's own estimate.
    estimate = int(fast.inputs["metadata"]["annotations"]["inference-plane/cold-start-seconds"])
    assert estimate == pytest.approx(weights_mib / 80 + weights_mib / 2000, abs=2)


def test_small_model_gets_the_minimum_budget(homelab_values):
    stack, model, run = build(homelab_values, "embed")
    probe = container_of(run, model.name)["startupProbe"]
    assert probe["periodSeconds"] * (probe["failureThreshold"] - 1) == stack.startup.min_seconds


def test_pulumi_and_kubernetes_wait_out_the_whole_budget(homelab_values):
    stack, model, run = build(homelab_values, "chat")
    deployment = run.one("Deployment", model.name)
    probe = container_of(run, model.name)["startupProbe"]
    startup = probe["periodSeconds"] * (probe["failureThreshold"] - 1)
    for op in ("create", "update"):
        wait = deployment.custom_timeouts[op]
        assert wait.endswith("s")
        # Pulumi's own default is 10 minutes; the image pull comes before the startup clock.
        assert int(wait[:-1]) >= startup + stack.startup.image_pull_seconds > 600
    assert deployment.inputs["spec"]["progressDeadlineSeconds"] >= startup


def test_security_context(homelab_values):
    _, model, run = build(homelab_values, "chat")
    pod = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    # With a read-only root, /tmp (and the XDG cache under it) is a volume.
    volumes = {v["name"]: v for v in pod["volumes"]}
    (tmp,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in volumes[tmp["name"]]
    assert {"name": "XDG_CACHE_HOME", "value": "/tmp/cache"} in pod["containers"][0]["env"]
    assert pod["automountServiceAccountToken"] is False
    assert "nodeSelector" not in pod


def test_node_pool_places_and_grants_device_groups(homelab_values):
    homelab_values["node_pools"]["iris-xe"].update(instance_type="minisforum-ms-s1", supplemental_groups=[44, 992])
    _, model, run = build(homelab_values, "chat")
    pod = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "minisforum-ms-s1"}
    assert pod["securityContext"]["supplementalGroups"] == [44, 992]


def test_resources_and_gpu_come_from_config(homelab_values):
    homelab_values["node_pools"]["iris-xe"]["gpu_resource"] = "gpu.intel.com/xe"
    stack, model, run = build(homelab_values, "chat")
    resources = container_of(run, model.name)["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "24Gi", "gpu.intel.com/xe": "1"}
    assert resources["limits"] == {"cpu": "6", "memory": "32Gi", "gpu.intel.com/xe": "1"}


def test_cpu_only_server_requests_no_gpu(homelab_values):
    homelab_values["models"]["chat"]["gpu_layers"] = 0
    _, model, run = build(homelab_values, "chat")
    resources = container_of(run, model.name)["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_cache_volume_is_where_llama_cache_points(homelab_values):
    homelab_values["model_cache"]["mount_path"] = "/var/cache/models"
    stack, model, run = build(homelab_values, "chat")
    pod = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {"name": "LLAMA_CACHE", "value": "/var/cache/models"} in container["env"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/cache/models"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == stack.model_cache.claim_name


def test_selectors_match_pods_and_service_targets_the_container(homelab_values):
    _, model, run = build(homelab_values, "chat")
    spec = run.one("Deployment", model.name).inputs["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["strategy"] == {"type": "Recreate"} and spec["replicas"] == 1
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    service = run.one("Service", model.name).inputs["spec"]
    assert service["type"] == "ClusterIP"
    assert service["selector"].items() <= pod_labels.items()
    container_ports = {p["name"]: p["containerPort"] for p in spec["template"]["spec"]["containers"][0]["ports"]}
    for port in service["ports"]:
        assert port["targetPort"] in container_ports
        assert port["port"] == container_ports[port["targetPort"]]


def test_ingress_routes_to_the_service_with_tls(homelab_values):
    stack, model, run = build(homelab_values, "chat")
    service = run.one("Service", model.name).inputs
    ingress = run.one("Ingress", model.name).inputs
    assert ingress["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt-cluster",
                                                  "traefik.ingress.kubernetes.io/router.middlewares": "ai-llama-server-sources@kubernetescrd"}
    assert ingress["spec"]["ingressClassName"] == stack.cluster.ingress.class_name
    (rule,) = ingress["spec"]["rules"]
    (tls,) = ingress["spec"]["tls"]
    assert tls == {"hosts": [rule["host"]], "secretName": "llama-server-tls"}
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    assert stack.cluster.public_dns_label not in ingress["metadata"].get("labels", {})


def test_await_order_survives_a_cold_start(homelab_values):
    _, model, run = build(homelab_values, "chat")
    deployment = run.one("Deployment", model.name)
    service = run.one("Service", model.name)
    ingress = run.one("Ingress", model.name)
    assert deployment.urn in service.dependencies
    assert service.urn in ingress.dependencies


def test_unexposed_chat_server_has_no_ingress(homelab_values):
    del homelab_values["models"]["chat"]["exposure"]
    _, _, run = build(homelab_values, "chat")
    assert run.find("Ingress") == []


def test_embed_server_is_cluster_internal(homelab_values):
    _, model, run = build(homelab_values, "embed")
    assert run.find("Ingress") == []
    assert run.one("Service", model.name).inputs["spec"]["type"] == "ClusterIP"
    assert run.one("Deployment", model.name).inputs["metadata"]["labels"]["app.kubernetes.io/component"] == "embeddings"


def test_embed_server_refuses_keyless_exposure_even_past_the_config_check(homelab_values):
    stack = parse_stack(homelab_values)
    chat = stack.models["chat"]
    exposed_embedding = stack.models["embed"].model_copy(update={"exposure": chat.exposure})
    args = ModelServerArgs(
        model=exposed_embedding,
        namespace="ai",
        node_pool=stack.node_pools["iris-xe"],
        cache=stack.model_cache,
        cluster=stack.cluster,
        plan=(capacity := plan(stack)).servers["embed"],
        build=server_builds(stack, capacity)["embed"],
    )
    assert exposed_embedding.api_key is None  # homelab's embedding server takes no key
    with pytest.raises(ValueError, match="an exposed embedding server needs an API key"):
        run_program({}, program=lambda: {"s": EmbedServer("e", args)})
    with pytest.raises(ValueError, match="serves role 'chat'"):
        run_program({}, program=lambda: {"s": LlamaServer("e", args)})


def test_api_key_secret_is_mounted_and_passed_as_a_file(homelab_values):
    homelab_values["models"]["chat"]["api_key"] = {
        "secret_name": "llama-api-key",
        "secret_key": "keys",
        "from_config": "chat_api_key",
    }
    _, model, run = build(homelab_values, "chat", api_key_value="k-123")
    secret = run.one("Secret", "llama-api-key")
    # The whole stringData travels as a Pulumi secret (the SDK's secret marker wraps it).
    assert secret.inputs["stringData"]["4dabf18193072939515e22adb298388d"]
    # The key file, and its first key alone for the metrics scrape (the same key here: one line).
    assert secret.inputs["stringData"]["value"] == {"keys": "k-123", "metrics-token": "k-123"}
    pod = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]
    container = pod["containers"][0]
    key_file = flag(container["args"], "--api-key-file")
    (mount,) = [m for m in container["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True and key_file.endswith("/keys")
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "llama-api-key"
    assert secret.urn in run.one("Deployment", model.name).dependencies


def test_existing_api_key_secret_is_referenced_not_created(homelab_values):
    homelab_values["models"]["chat"]["api_key"] = {"secret_name": "made-elsewhere"}
    _, model, run = build(homelab_values, "chat")
    assert run.find("Secret") == []
    pod = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]
    assert {"name": "api-key", "secret": {"secretName": "made-elsewhere", "defaultMode": 0o440}} in pod["volumes"]


def test_component_tokens_and_parents(homelab_values):
    _, model, run = build(homelab_values, "chat")
    (component,) = [r for r in run.resources if not r.custom]
    assert component.type == "inference-plane:index:LlamaServer"
    for resource in run.kubernetes():
        assert resource.parent == component.urn
        assert resource.name.startswith(model.name)


def test_rotating_the_api_key_restarts_the_server(homelab_values):
    """llama.cpp reads --api-key-file once: a new key must change the pod template (a rollout)."""
    from components.pod import KEY_FINGERPRINT_ANNOTATION, key_fingerprint

    def template_annotation(key: str) -> str:
        run = run_values(copy.deepcopy(homelab_values), secrets={"llama_api_key": key})
        deployment = run.one("Deployment", "llama-server").inputs
        return deployment["spec"]["template"]["metadata"]["annotations"][KEY_FINGERPRINT_ANNOTATION]

    old, new = template_annotation("key-one-4e2a"), template_annotation("key-two-9b1c")
    assert old == key_fingerprint("key-one-4e2a") and new == key_fingerprint("key-two-9b1c") and old != new
    assert "key-one" not in old and len(old) == 16


def test_the_offline_render_does_not_pretend_to_fingerprint_a_key(tmp_path):
    """Offline every secret is the same placeholder: its fingerprint would mean nothing."""
    from render.output import render_stack

    result = render_stack("homelab", tmp_path / "out")
    (chat,) = [m for m in result.files.values() if m["kind"] == "Deployment" and m["metadata"]["name"] == "llama-server"]
    assert chat["spec"]["template"]["metadata"]["annotations"]["inference-plane/api-key-fingerprint"] == "offline-render"


def test_explicit_slots_share_one_kv_pool_so_one_request_can_use_the_whole_context(homelab_values):
    homelab_values["models"]["chat"]["parallel"] = 2
    _, model, run = build(homelab_values, "chat")
    args = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]["containers"][0]["args"]
    # llama.cpp unifies the pool itself only when --parallel is auto (tests/test_llama_contract.py).
    assert args[args.index("--parallel") + 1] == "2" and "--kv-unified" in args
    homelab_values["models"]["chat"].pop("parallel", None)
    _, model, run = build(homelab_values, "chat")
    args = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--parallel" not in args and "--kv-unified" not in args


@pytest.mark.parametrize("ubatch, batch", [(1024, None), (2048, None), (4096, "4096"), (8192, "8192")])
def test_a_micro_batch_above_the_default_batch_raises_the_batch_with_it(homelab_values, ubatch, batch):
    """llama.cpp clamps --ubatch-size to --batch-size (default 2048): a larger micro-batch alone
    would silently run at 2048."""
    homelab_values["models"]["embed"]["ubatch_size"] = ubatch
    homelab_values["models"]["embed"]["ctx_size"] = max(ubatch, homelab_values["models"]["embed"]["ctx_size"])
    _, model, run = build(homelab_values, "embed")
    args = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--ubatch-size") + 1] == str(ubatch)
    assert (args[args.index("--batch-size") + 1] if "--batch-size" in args else None) == batch
