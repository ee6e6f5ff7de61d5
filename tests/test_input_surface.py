"""What a stack file may say (issue #43): each class a careless user or an attacker tried is refused in one
line naming the field they wrote, and what passes renders objects the API server and the controllers read
as the summary says. Each case is one edit of a shipped stack: (what, stack, edit, the path named, words of
the reason)."""
from __future__ import annotations

import copy

import pytest

from common.errors import CapacityError
from render.output import RenderError
from config import ConfigError
from conftest import plain_values, run_values
from plane import parse_stack
from plane import plan_capacity as plan


def library(values):
    return values["models"]["library"]


def edit(stack: str, change) -> dict:
    values = copy.deepcopy(plain_values(stack))
    change(values)
    return values


def _set(path: str, value):
    def change(values):
        parts = path.split(".")
        target = values
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[parts[-1]] = value
    return change


REFUSED = [
    # 1. preset and argv injection one character over
    ("U+2028 in extra_args", "rtx3090-library", _set("models.library.extra_args", ["--temp", "0.7\u2028load-on-startup = true"]),
     "models.library.extra_args[1]", "LINE SEPARATOR"),
    ("U+0085 in extra_args", "rtx3090-library", _set("models.library.extra_args", ["--temp", "0.7\x85ctx-size = 262144"]),
     "models.library.extra_args[1]", "U+0085"),
    ("a bidirectional override", "rtx3090-library", _set("models.library.extra_args", ["--chat-template-kwargs", "{}\u202e"]),
     "models.library.extra_args[1]", "RIGHT-TO-LEFT OVERRIDE"),
    ("--flag=value", "rtx3090-library", _set("models.library.extra_args", ["--temp=0.5"]),
     "models.library.extra_args[0]", "reads no '=' form"),
    ("a value that is a flag", "rtx3090-library", _set("models.library.extra_args", ["--temp", "--top-k", "40"]),
     "models.library.extra_args[1]", "is not a value for --temp"),
    # 2. annotations by allow-list
    ("a mirror of every request", "rtx3090-library",
     _set("models.library.exposure.annotations", {"nginx.ingress.kubernetes.io/mirror-target": "https://evil.example.org"}),
     "models.library.exposure.annotations.nginx.ingress.kubernetes.io/mirror-target", "copies every request"),
    ("an annotation no list names", "rtx3090-library",
     _set("models.library.exposure.annotations", {"example.org/anything": "x"}),
     "models.library.exposure.annotations.example.org/anything", "not among the annotations a stack may add for traefik"),
    ("a case variant of a refused key", "cpu-cluster",
     _set("models.chat.exposure.annotations", {"Nginx.ingress.kubernetes.io/ssl-redirect": "false"}),
     "models.chat.exposure.annotations", "qualified name"),
    ("a key with a leading space", "rtx3090-library",
     _set("models.library.exposure.annotations", {" gethomepage.dev/name": "x"}),
     "models.library.exposure.annotations", "qualified name"),
    # 3. one Secret, one role
    ("the LAN key is the provider's account key", "rtx3090-library",
     _set("models.library.api_key.from_config", "openrouter_api_key"),
     "models.library.api_key.from_config", "one credential, one role"),
    ("the LAN key is the gateway's master key", "rtx3090-library",
     _set("models.library.api_key.from_config", "gateway_master_key"),
     "models.library.api_key.from_config", "one credential, one role"),
    ("a server's key Secret is the gateway's TLS Secret", "rtx3090-library",
     lambda v: library(v)["api_key"].__setitem__("secret_name", v["gateway"]["tls_secret"]),
     "models.library.api_key.secret_name", "one Secret, one role"),
    ("a Secret key the API server refuses", "rtx3090-library", _set("models.library.api_key.secret_key", "..data"),
     "models.library.api_key.secret_key", "not a Secret key the API server takes"),
    # 4. acknowledgements anyone could forge
    ("a reason of ten spaces", "rtx3090-library",
     lambda v: library(v)["exposure"].update(source_ranges=["0.0.0.0/0"], public_reason=" " * 10),
     "models.library.exposure.public_reason", "does not say why"),
    ("a reason with a forged line", "rtx3090-library",
     lambda v: library(v)["exposure"].update(source_ranges=["0.0.0.0/0"],
                                            public_reason="testing\nLAN clients in 192.168.0.0/16 only"),
     "models.library.exposure.public_reason", "U+000A"),
    ("a load-balancer class with spaces", "rtx3090-library", _set("gateway.load_balancer_class", "my lb class"),
     "gateway.load_balancer_class", "qualified name"),
    ("source_ranges null without a word", "rtx3090-library", _set("models.library.exposure.source_ranges", None),
     "models.library.exposure.source_ranges", "null admits every client"),
    # 7. messages that blamed the wrong thing
    ("a router's memory limit above the node", "rtx3090-library", _set("models.library.resources.memory_limit", "4000Gi"),
     "models.library.resources.memory_limit", "set at most 59Gi"),
    ("max_loaded below the pins", "rtx3090-library", _set("models.library.on_demand.max_loaded", 1),
     "models.library.on_demand.max_loaded", "raise max_loaded above 1 or pin fewer"),
    ("a card with no room", "rtx3090-library", _set("node_pools.rtx3090.vram", "1Gi"),
     "node_pools.rtx3090.vram", "leaves the router no VRAM"),
    ("a huge projector", "rtx3090-library", lambda v: library(v)["on_demand"]["models"]["gemma-3-12b"].update(
        facts={"mmproj": {"weights_mib": 90000, "compute_mib": 100}}),
     "models.library.on_demand.models.gemma-3-12b", "drop its vision projector (facts.mmproj: null)"),
    # Issue #45 item 6, a new user's first hour: values that render and then silently do something else.
    ("a node's arch as uname says it", "rtx3090-library",
     lambda v: v["node_pools"]["rtx3090"].update(node_labels={"kubernetes.io/arch": "x86_64"}),
     "node_pools.rtx3090.node_labels", "x86_64 is amd64"),
    ("a host address as a source range", "rtx3090-library", _set("models.library.exposure.source_ranges", ["192.168.1.10"]),
     "models.library.exposure.source_ranges[0]", "write 192.168.1.10/32 to admit that one host, or its LAN's range such "
                                                   "as 192.168.1.0/24"),
    # Issue #45 item 1: a route whose last tier the retries never reach.
    ("too few retries for three tiers", "strix-halo", lambda v: v["gateway"].setdefault("retry", {}).update(num_retries=3),
     "gateway.retry.num_retries", "its last tier (openrouter) is never tried"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_in_one_line_naming_the_field(case):
    _, stack, change, path, words = case
    with pytest.raises((ConfigError, CapacityError)) as caught:
        plan(parse_stack(edit(stack, change)))
    text = str(caught.value)
    assert "\n" not in text and "Traceback" not in text
    assert path in text and words in text, text
    assert "(and " not in text, "one problem said once, not once per model"


def test_the_memory_limit_a_refusal_suggests_is_one_the_next_render_takes():
    values = edit("rtx3090-library", _set("models.library.resources.memory_limit", "59Gi"))
    assert plan(parse_stack(values)).servers["library"].memory_limit == "59Gi"


def test_what_an_operator_acknowledges_the_summary_repeats_quoted():
    """A public reason and a load-balancer reason pass as one printable line and come back in the reach
    summary quoted, after the words that say whose they are."""
    from render.reach import said

    values = edit("rtx3090-library", lambda v: library(v)["exposure"].update(
        source_ranges=["0.0.0.0/0"], public_reason="a lab box behind the ISP's NAT, for testing"))
    values["gateway"]["load_balancer_class"] = "io.cilium/bgp"
    values["gateway"]["load_balancer_reason"] = "BGP to the home router, LAN only"
    run = run_values(values, secrets={"chat_api_key": "k-1", "gateway_master_key": "m-2", "openrouter_api_key": "o-3"},
                     stack="rtx3090-library")
    from render.manifests import manifests
    from render.reach import reach_lines

    text = "\n".join(reach_lines(list(manifests(run).values()), run.config))
    assert said("a lab box behind the ISP's NAT, for testing") in text
    assert '(load-balancer class io.cilium/bgp: the operator\'s reason: "BGP to the home router, LAN only")' in text


def test_an_internationalised_host_name_is_a_host_name():
    values = edit("rtx3090-library", lambda v: library(v)["exposure"].update(host="llm.xn--p1ai"))
    assert parse_stack(values).models["library"].exposure.host == "llm.xn--p1ai"
    with pytest.raises(ConfigError, match="not a valid internationalised"):
        parse_stack(edit("rtx3090-library", lambda v: library(v)["exposure"].update(host="llm.xn--a")))


def test_a_value_shared_by_two_roles_is_refused_where_the_program_holds_it():
    """With the values Pulumi decrypts (not offline, where every secret reads one placeholder), a provider's
    account key pasted as the router's LAN key is refused, though the two config keys differ."""
    from config.load import _secret_key_problems

    stack = parse_stack(plain_values("rtx3090-library"))
    values = {"chat_api_key": "sk-or-same", "gateway_master_key": "m", "openrouter_api_key": "sk-or-same"}
    problems = _secret_key_problems(stack, values, set(values))
    assert [p for p in problems if "holds the same key" in p[1]], problems
    assert not _secret_key_problems(stack, {**values, "chat_api_key": "lan-key"}, set(values))


@pytest.mark.parametrize("repo, ctx", [("Qwen/Qwen3-32B-GGUF:Q4_K_M", 16384), ("Qwen/Qwen3-14B-GGUF:Q8_0", 32768),
                                       ("Qwen/Qwen3-14B-GGUF:Q4_K_M", 40960), ("ggml-org/Qwen3.6-35B-A3B-GGUF:Q4_K_M", 16384)])
def test_the_gpu_layers_a_refusal_suggests_is_the_most_the_next_render_takes_without_a_warning(tmp_path, repo, ctx):
    """Issue #45 item 6: a model too large for a 12 GiB card was told gpu_layers 33, then refused at 33 and told
    32 (a linear guess). The suggestion is now the most layers the plan itself puts within the card less the
    GiB llama.cpp keeps free: taken, the next render passes with no warning; one more would not."""
    import re

    from test_k3s_defaults import MINIMAL, render

    config = copy.deepcopy(MINIMAL)
    chat = config["inference-plane:models"]["chat"]
    chat.update(hf_repo=repo, ctx_size=ctx)
    with pytest.raises(RenderError) as refused:
        render(tmp_path, config, stack="a")
    (suggested,) = re.findall(r"models\.chat\.gpu_layers: .* set gpu_layers: (\d+) ", str(refused.value))
    chat["gpu_layers"] = int(suggested)
    result = render(tmp_path, config, stack="b")
    assert not [line for line in result.run.logs if "gpu_layers" in line or "GPU 1" in line]
    vram = result.run.outputs["capacity_plan"]["servers"]["chat"]["vram"]
    assert vram["total_gib"] <= 12.0 - 1.0
    chat["gpu_layers"] = int(suggested) + 1
    more = render(tmp_path, config, stack="b")
    assert more.run.outputs["capacity_plan"]["servers"]["chat"]["vram"]["total_gib"] > 12.0 - 1.0


def test_a_renamed_key_says_what_it_is_called_now():
    """Issue #46 item 4: on_demand.downloader_image named one of the three containers its image runs; it is
    programs_image now, and a stack still writing the old key is told the new one in one line, nothing else."""
    values = plain_values("rtx3090-library")
    key = next(k for k, m in values["models"].items() if m.get("on_demand"))
    values["models"][key]["on_demand"]["downloader_image"] = "docker.io/library/python:3.12.11-slim-bookworm"
    with pytest.raises(ConfigError) as refused:
        parse_stack(values)
    assert str(refused.value) == (f"invalid stack config: models.{key}.on_demand.downloader_image: renamed "
                                  "programs_image: the image also "
                                  "runs the admission proxy and the keeper, not only the downloader; rename the key "
                                  "(same value)")
    values["models"][key]["on_demand"]["programs_image"] = values["models"][key]["on_demand"].pop("downloader_image")
    stack = parse_stack(values)
    assert stack.models[key].on_demand.programs_image == "docker.io/library/python:3.12.11-slim-bookworm"
