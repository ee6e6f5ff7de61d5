"""What a stack file may open wider than the defaults (#31): annotations that would undo TLS, CORS, the
admitted paths, the hosts, the entry point or DNS publication are refused; public source ranges, a
Pod Security level below restricted and a gateway load balancer off the tailnet need a reason, which
the render's summary repeats, and the summary says "the internet" when it is."""

from __future__ import annotations

import copy

import pytest
import yaml

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
        "clients on the internet (0.0.0.0/0; a demo for the whole team, keys rotated daily) at https://")


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
    assert "    Pod Security privileged, not restricted: the node exporter shares this namespace" in reach_section(result.summary())


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
