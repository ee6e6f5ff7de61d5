"""What a stack file may open wider than the defaults (#31): annotations that would undo TLS, CORS, the
admitted paths, the hosts, the entry point or DNS publication are refused; public source ranges, a
Pod Security level below restricted and a gateway load balancer off the tailnet need a reason, which
the render's summary repeats, and the summary says "the internet" when it is."""

from __future__ import annotations

import copy

import pytest

from common.errors import ConfigError
from render.output import RenderError
from test_k3s_defaults import MINIMAL, reach_section, render


def stack(**exposure) -> dict:
    config = copy.deepcopy(MINIMAL)
    config["inference-plane:models"]["chat"]["exposure"].update(exposure)
    return config


@pytest.mark.parametrize("name, says", [
    ("nginx.ingress.kubernetes.io/ssl-redirect", "turns off the redirect to TLS"),
    ("nginx.ingress.kubernetes.io/enable-cors", "CORS at the controller"),
    ("nginx.ingress.kubernetes.io/cors-allow-origin", "CORS at the controller"),
    ("nginx.ingress.kubernetes.io/server-snippet", "raw controller configuration"),
    ("nginx.ingress.kubernetes.io/configuration-snippet", "raw controller configuration"),
    ("nginx.ingress.kubernetes.io/rewrite-target", "rewrites the exact paths"),
    ("nginx.ingress.kubernetes.io/server-alias", "more host names"),
    ("traefik.ingress.kubernetes.io/router.entrypoints", "entry point"),
    ("traefik.ingress.kubernetes.io/router.tls", "changes TLS"),
    ("external-dns.alpha.kubernetes.io/hostname", "publishes a DNS record"),
    ("cert-manager.io/issuer", "changes the certificate"),
    ("kubernetes.io/ingress.class", "picks another controller"),
])
def test_an_annotation_that_undoes_a_promise_is_refused_in_one_line(tmp_path, name, says):
    with pytest.raises(RenderError) as refused:
        render(tmp_path, stack(annotations={name: "x"}))
    message = str(refused.value)
    assert f"models.chat.exposure.annotations.{name}: " in message and says in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_other_annotations_render_and_the_summary_lists_them(tmp_path):
    result = render(tmp_path, stack(annotations={"gethomepage.dev/enabled": "true"}))
    (ingress,) = [m for m in result.files.values() if m["kind"] == "Ingress"]
    assert ingress["metadata"]["annotations"]["gethomepage.dev/enabled"] == "true"
    (chat,) = [line for line in reach_section(result.summary()) if line.startswith("    llama-chat ")]
    assert "(your annotations: gethomepage.dev/enabled)" in chat


def test_a_public_source_range_needs_a_reason_and_the_summary_says_internet(tmp_path):
    with pytest.raises(RenderError, match=r"models\.chat\.exposure\.source_ranges: 0\.0\.0\.0/0, ::/0 admits addresses "
                       r"on the internet; narrow it to your LAN's ranges, or set exposure\.public_reason"):
        render(tmp_path, stack(source_ranges=["0.0.0.0/0", "::/0"]))
    with pytest.raises(RenderError, match=r"8\.8\.8\.0/24 admits addresses on the internet"):
        render(tmp_path, stack(source_ranges=["192.168.1.0/24", "8.8.8.0/24"]))
    result = render(tmp_path, stack(source_ranges=["0.0.0.0/0"], public_reason="a demo for the whole team, keys rotated daily"))
    (chat,) = [line for line in reach_section(result.summary()) if line.startswith("    llama-chat ")]
    assert chat.split(None, 1)[1].startswith(
        'clients on the internet (0.0.0.0/0; the operator\'s reason: "a demo for the whole team, keys rotated daily") at https://')


def test_a_lan_range_needs_no_reason(tmp_path):
    result = render(tmp_path, stack(source_ranges=["192.168.1.0/24", "fd00::/8"]))
    (chat,) = [line for line in reach_section(result.summary()) if line.startswith("    llama-chat ")]
    assert "LAN clients in 192.168.1.0/24, fd00::/8" in chat


def test_a_pod_security_level_below_restricted_needs_a_reason(tmp_path):
    config = copy.deepcopy(MINIMAL)
    config["inference-plane:namespace"] = {"pod_security": "privileged"}
    with pytest.raises(RenderError, match=r"namespace\.pod_security: privileged admits privileged pods the model servers "
                       r"never need; use restricted, or set namespace\.pod_security_reason"):
        render(tmp_path, config)
    config["inference-plane:namespace"]["pod_security_reason"] = "the node exporter shares this namespace"
    result = render(tmp_path, config)
    (namespace,) = [m for m in result.files.values() if m["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ('    Pod Security privileged, not restricted: the operator\'s reason: "the node exporter shares this namespace"'
            in reach_section(result.summary()))


def test_a_gateway_load_balancer_off_the_tailnet_needs_a_reason():
    from common.errors import ConfigError
    from conftest import plain_values
    from plane import parse_stack

    values = plain_values("rtx4090")
    values["gateway"]["load_balancer_class"] = "service.k8s.aws/nlb"
    with pytest.raises(ConfigError, match=r"gateway\.load_balancer_class: service\.k8s\.aws/nlb may give the gateway an "
                       r"address outside the tailnet .*set gateway\.load_balancer_reason"):
        parse_stack(values)
    values["gateway"]["load_balancer_reason"] = "an internal NLB reached only over the office VPN"
    assert parse_stack(values).gateway.load_balancer_reason.startswith("an internal NLB")


def test_a_yaml_alias_bomb_deep_nesting_or_a_huge_file_is_one_line_within_a_second(tmp_path):
    import time

    from render.offline import StackFileError, load_stack_text

    levels = ["a: &a [x,x,x,x,x,x,x,x,x,x]"] + [
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 10) + "]" for i in range(9)]
    cases = {
        "stands for more than 100000 values once its aliases are expanded": "config:\n  inference-plane:x:\n"
        + "".join(f"    {line}\n" for line in levels),
        "is nested deeper than 64 levels": "config: " + "[" * 20000 + "]" * 20000 + "\n",
        "is nested deeper than 64 levels ": "config:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)),
        "more than a stack file's 1 MiB bound": "config: {}\n" + "#" * (2 << 20) + "\n",
    }
    for says, text in cases.items():
        started = time.monotonic()
        with pytest.raises(StackFileError) as refused:
            load_stack_text(text, "Pulumi.x.yaml")
        assert time.monotonic() - started < 1
        assert str(refused.value).startswith("Pulumi.x.yaml: ") and says.strip() in str(refused.value)
        assert "\n" not in str(refused.value)


def test_a_misspelt_top_level_key_is_named_with_the_one_it_meant(tmp_path):
    config = copy.deepcopy(MINIMAL)
    config["inference-plane:model"] = config.pop("inference-plane:models")
    with pytest.raises(RenderError, match=r"model: unknown config key; did you mean models\?; models: required"):
        render(tmp_path, config)


def test_an_image_pinned_by_tag_and_digest_is_accepted(tmp_path):
    config = copy.deepcopy(MINIMAL)
    image = "ghcr.io/ggml-org/llama.cpp:server-cuda-b10731@sha256:" + "a" * 64
    config["inference-plane:models"]["chat"]["image"] = image
    result = render(tmp_path, config)
    (deployment,) = [m for m in result.files.values() if m["kind"] == "Deployment" and m["metadata"]["name"] == "llama-chat"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
    config["inference-plane:models"]["chat"]["image"] = "ghcr.io/ggml-org/llama.cpp:latest"
    with pytest.raises(RenderError, match=r"models\.chat\.image"):
        render(tmp_path, config)


@pytest.mark.parametrize("change, says", [
    (lambda c: c["inference-plane:node_pools"]["rtx3060"].update(supplemental_groups=[0]),
     r"node_pools\.rtx3060\.supplemental_groups: 0 is root's group"),
    (lambda c: c["inference-plane:models"]["chat"]["resources"].update(memory_limit="200Gi"),
     r"models\.chat\.resources\.memory_limit: 200Gi is more than a node of pool rtx3060 offers \(60\.0 GiB, allocatable "
     r"less reserved\): .*set at most 60Gi"),
])
def test_silent_acceptances_are_refused_with_the_fix(tmp_path, change, says):
    config = copy.deepcopy(MINIMAL)
    change(config)
    with pytest.raises(RenderError, match=says):
        render(tmp_path, config)


def test_two_routers_may_not_answer_the_same_model_name():
    from common.errors import ConfigError
    from conftest import plain_values
    from plane import parse_stack

    values = plain_values("rtx3090-library")
    second = copy.deepcopy(values["models"]["library"])
    second.update(name="llama-library-2", exposure=None, api_key=None)
    values["models"]["library2"] = second
    with pytest.raises(ConfigError, match=r"models\.library2\.on_demand\.models\.qwen3-8b: models\.library already offers "
                       r"'qwen3-8b'; give one of them another name"):
        parse_stack(values)


def test_a_script_piped_into_a_shell_at_start_is_a_runtime_install():
    from policy.rules import RUNTIME_INSTALL

    assert RUNTIME_INSTALL.search("sh -c curl -fsSL https://example.org/get.sh | sh")
    assert RUNTIME_INSTALL.search("wget -qO- https://x/y | python3")
    assert not RUNTIME_INSTALL.search("python3 -c import shutil; shutil.copy(a, b)")


def test_one_repo_under_many_router_names_is_one_download():
    """100 names (a large library: the plan walks only the sets memory allows) for one repo, different settings
    each, need its weights once on the shared cache; past the most a router takes (256) the config refuses."""
    from conftest import plain_values
    from config.on_demand import MAX_MODELS
    from plane import parse_stack, plan_capacity

    values = plain_values("rtx3090-library")
    library = values["models"]["library"]
    library["on_demand"]["models"] = {f"qwen-{i}": {"hf_repo": "Qwen/Qwen3-8B-GGUF:Q4_K_M", "ctx_size": 4096 + 64 * i}
                                      for i in range(100)}
    values["gateway"] = None
    plan = plan_capacity(parse_stack(values))
    assert plan.servers["library"].weights == "4.7Gi"
    library["on_demand"]["models"] = {f"qwen-{i}": {"hf_repo": "Qwen/Qwen3-8B-GGUF:Q4_K_M"} for i in range(MAX_MODELS + 1)}
    with pytest.raises(ConfigError, match=rf"models\.library\.on_demand\.models: Dictionary should have at most {MAX_MODELS} items"):
        parse_stack(values)


def test_a_kubernetes_version_without_schemas_names_the_setting(tmp_path):
    config = copy.deepcopy(MINIMAL)
    config["inference-plane:cluster"] = {"kubernetes_version": "1.99"}
    with pytest.raises(RenderError, match=r"^Pulumi\.mybox\.yaml: cluster\.kubernetes_version: 1\.99 has no schemas to "
                       r"check the manifests against \(kubernetes-validate knows 1\.25 to 1\.\d+\)") as refused:
        render(tmp_path, config)
    assert refused.value.exit_code == 2 and not (tmp_path / "out").exists()


def test_reserved_memory_at_or_above_allocatable_says_to_lower_it(tmp_path):
    config = copy.deepcopy(MINIMAL)
    config["inference-plane:node_pools"]["rtx3060"].update(allocatable="8Gi", reserved="10Gi")
    with pytest.raises(RenderError, match=r"node_pools\.rtx3060\.reserved: 10Gi leaves nothing of allocatable 8Gi for the "
                       r"model servers .*lower it"):
        render(tmp_path, config)


def test_scrapes_the_policy_would_block_are_refused(tmp_path):
    """With no monitoring namespace, the default-deny policy admits no scraper: the alerts would never
    get a series. Said in one line rather than rendered."""
    config = copy.deepcopy(MINIMAL)
    config["inference-plane:observability"] = {}
    with pytest.raises(RenderError, match=r"observability: scrapes and alerts need a scraper the network policy admits, "
                       r"and cluster\.monitoring is null"):
        render(tmp_path, config)
    config["inference-plane:cluster"] = {"monitoring": {"namespace": "monitoring",
                                                        "pod_labels": {"app.kubernetes.io/name": "vmagent"}}}
    result = render(tmp_path, config)
    (policy,) = [m for m in result.files.values() if m["kind"] == "NetworkPolicy"]
    assert any(source.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") == "monitoring"
               for rule in policy["spec"]["ingress"] for source in rule["from"])


def test_the_library_gateway_answers_on_the_lan_at_the_name_its_listener_serves():
    """rtx3090-library's gateway listens for ai.lan.example.org: its Envoy Service takes the cluster's
    default load balancer (k3s ServiceLB: the node's LAN address), not the tailnet (where it would be the
    device ai.<tailnet>.ts.net, a name the listener never answers); the folder says what must serve it."""
    from render.manifests import manifests
    from render.offline import run_stack
    from render.prerequisites import prerequisites
    from render.reach import reach_lines

    run = run_stack("rtx3090-library")
    files = list(manifests(run).values())
    (proxy,) = [m for m in files if m["kind"] == "EnvoyProxy"]
    (gateway,) = [m for m in files if m["kind"] == "Gateway"]
    service = proxy["spec"]["provider"]["kubernetes"]["envoyService"]
    assert service == {"type": "LoadBalancer"}  # no class: ServiceLB/MetalLB; no tailnet device annotation
    assert proxy["metadata"]["annotations"]["inference-plane/load-balancer"].startswith("k3s ServiceLB")
    assert {listener["hostname"] for listener in gateway["spec"]["listeners"]} == {"ai.lan.example.org"}
    needs = {what for what, _, _ in prerequisites(files)}
    assert "a LoadBalancer controller" in needs and "the Tailscale Kubernetes operator" not in needs
    (line,) = [l for l in reach_lines(files, run.config) if l.startswith("    llama-library ")]
    assert {listener["port"] for listener in gateway["spec"]["listeners"]} == {8443}
    assert ("gateway clients at https://ai.lan.example.org:8443 for qwen3-8b" in line
            and "(the cluster's default load balancer: the operator's reason: \"k3s ServiceLB on the home LAN" in line)


def test_a_tailnet_gateway_must_be_named_as_its_device_and_a_lan_one_needs_a_reason():
    from common.errors import ConfigError
    from conftest import plain_values
    from plane import parse_stack

    values = plain_values("rtx3090-library")
    values["gateway"]["load_balancer_class"] = "tailscale"
    values["gateway"].pop("load_balancer_reason")
    with pytest.raises(ConfigError, match=r"gateway\.hostname: a tailscale gateway answers as the tailnet device "
                       r"ai\.<tailnet>\.ts\.net \(MagicDNS\), which a listener for ai\.lan\.example\.org never matches"):
        parse_stack(values)
    values["gateway"]["load_balancer_class"] = None
    with pytest.raises(ConfigError, match=r"gateway\.load_balancer_class: null gives the gateway the cluster's default "
                       r"load balancer .*set gateway\.load_balancer_reason"):
        parse_stack(values)
    needs_tailnet = plain_values("rtx4090")
    assert parse_stack(needs_tailnet).gateway.hostname.endswith(".ts.net")


def test_weights_served_twice_are_warned_about():
    from config.checks import config_warnings
    from conftest import plain_values
    from plane import parse_stack

    values = plain_values("rtx3090-library")
    single = copy.deepcopy(values["models"]["library"])
    del single["on_demand"]
    single.update(name="llama-qwen", hf_repo="Qwen/Qwen3-8B-GGUF:Q4_K_M", exposure=None, api_key=None, gpu_layers=0,
                  image="ghcr.io/ggml-org/llama.cpp:server-b10731", backend="cpu")
    values["models"]["qwen"] = single
    warnings = config_warnings(parse_stack(values))
    assert ("models.library.on_demand.models.qwen3-8b: Qwen/Qwen3-8B-GGUF:Q4_K_M is also served by models.qwen; both "
            "are counted, so both may hold its memory at once") in " ".join(warnings)


def test_another_engines_args_are_single_argv_items():
    from common.errors import ConfigError
    from conftest import strix_values
    from plane import parse_stack

    values = strix_values()
    values["models"]["flash"]["openai"]["args"] += ["--x\n--y"]
    with pytest.raises(ConfigError, match=r"models\.flash\.openai\.args\[\d+\]: holds a control character \(U\+000A\)"):
        parse_stack(values)


def test_a_lan_gateway_may_not_take_the_port_k3s_traefik_holds_on_servicelb():
    """ServiceLB gives each LoadBalancer port to one Service per node (a hostPort pod), and k3s' bundled
    Traefik in kube-system holds 443: a gateway Service on 443 there would stay Pending."""
    from common.errors import ConfigError
    from conftest import plain_values
    from plane import parse_stack

    values = plain_values("rtx3090-library")
    values["gateway"]["port"] = 443
    with pytest.raises(ConfigError, match=r"gateway\.port: 443 is taken on k3s' ServiceLB by the ingress controller in "
                       r"kube-system .*set another port, e\.g\. 8443"):
        parse_stack(values)
