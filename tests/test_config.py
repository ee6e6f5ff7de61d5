"""The config model: strict, and every rejection names the config path and what to do."""

from __future__ import annotations

import pulumi
import pytest

from config import ConfigError
from plane import parse_stack
from conftest import run_values


def rejection(values: dict) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    return caught.value


def test_homelab_config_is_valid(homelab_values):
    stack = parse_stack(homelab_values)
    assert stack.models["chat"].ctx_size == 16384
    assert stack.models["embed"].role == "embedding"


def test_unknown_nested_key_names_its_path(homelab_values):
    homelab_values["models"]["chat"]["ctx_sise"] = 8192
    error = rejection(homelab_values)
    assert error.problems == [("models.chat.ctx_sise", "unknown key; did you mean ctx_size?")]
    assert "\n" not in str(error)


def test_unknown_top_level_key_is_rejected_by_the_program(homelab_values):
    homelab_values["modles"] = {}
    with pytest.raises(pulumi.RunError, match=r"modles: unknown config key; did you mean models\?"):
        run_values(homelab_values)
    homelab_values["zzzz"] = 1
    with pytest.raises(pulumi.RunError, match=r"zzzz: unknown config key; known keys: cluster, namespace"):
        run_values(homelab_values)


def test_wrong_type_names_path_and_value(homelab_values):
    homelab_values["models"]["chat"]["ctx_size"] = "16k"
    error = rejection(homelab_values)
    assert error.problems[0][0] == "models.chat.ctx_size"
    assert "valid integer" in error.problems[0][1] and "'16k'" in error.problems[0][1]


def test_string_number_is_not_silently_coerced(homelab_values):
    homelab_values["models"]["chat"]["threads"] = "4"
    assert rejection(homelab_values).problems[0][0] == "models.chat.threads"


def test_out_of_range_value(homelab_values):
    homelab_values["models"]["chat"]["gpu_layers"] = -1
    error = rejection(homelab_values)
    assert error.problems[0][0] == "models.chat.gpu_layers"
    assert "greater than or equal to 0" in error.problems[0][1]


def test_missing_required_field(homelab_values):
    del homelab_values["models"]["chat"]["image"]
    assert rejection(homelab_values).problems == [("models.chat.image", "required; set it")]


def test_llamacpp_needs_its_repo(homelab_values):
    del homelab_values["models"]["chat"]["hf_repo"]
    assert rejection(homelab_values).problems == [
        ("models.chat.hf_repo", "required for engine llamacpp (org/Model-GGUF:QUANT)")
    ]


def test_an_embedding_server_is_exposed_only_behind_an_api_key(homelab_values):
    homelab_values["models"]["embed"]["exposure"] = {"host": "embed.renner.uno", "tls_secret": "embed-tls"}
    (path, message), *_ = rejection(homelab_values).problems
    assert path == "models.embed.exposure"
    assert "needs api_key" in message and "remove exposure" in message


def test_embedding_server_must_not_serve_the_webui(homelab_values):
    homelab_values["models"]["embed"]["webui"] = True
    assert rejection(homelab_values).problems[0][0] == "models.embed.webui"


def test_gpu_model_needs_a_gpu_resource_on_its_pool(homelab_values):
    del homelab_values["node_pools"]["iris-xe"]["gpu_resource"]
    (path, message), *_ = rejection(homelab_values).problems
    assert path == "node_pools.iris-xe.gpu_resource"
    assert "models.chat offloads 99 layers" in message and "gpu_layers: 0" in message


def test_cpu_only_model_needs_no_gpu_resource(homelab_values):
    del homelab_values["node_pools"]["iris-xe"]["gpu_resource"]
    for model in homelab_values["models"].values():
        model["gpu_layers"] = 0
    stack = parse_stack(homelab_values)
    assert stack.node_pools["iris-xe"].gpu_resource is None


def test_more_gpu_users_than_shares(homelab_values):
    homelab_values["node_pools"]["iris-xe"]["gpu_shares"] = 1
    (path, message), *_ = rejection(homelab_values).problems
    assert path == "node_pools.iris-xe.gpu_shares"
    assert "model server pods (chat, embed) request 2 " in message and "-shared-dev-num" in message


def test_unknown_node_pool(homelab_values):
    homelab_values["models"]["chat"]["node_pool"] = "strix"
    assert rejection(homelab_values).problems == [("models.chat.node_pool", "no node pool 'strix'; defined: iris-xe")]


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/ggml-org/llama.cpp:latest",
        "ghcr.io/ggml-org/llama.cpp",
        "ghcr.io/ggml-org/llama.cpp:server-vulkan",
        "llama.cpp:server-vulkan-b10731",
    ],
)
def test_image_must_be_pinned(homelab_values, image):
    homelab_values["models"]["chat"]["image"] = image
    (path, message), *_ = rejection(homelab_values).problems
    assert path == "models.chat.image" and "pinned image" in message


def test_digest_pins_an_image(homelab_values):
    homelab_values["models"]["chat"]["image"] = "ghcr.io/ggml-org/llama.cpp@sha256:" + "a" * 64
    assert parse_stack(homelab_values).models["chat"].image.endswith("a" * 64)


def test_duplicate_server_names(homelab_values):
    homelab_values["models"]["embed"]["name"] = "llama-server"
    problems = rejection(homelab_values).problems
    assert ("models.embed.name", "'llama-server' is already the name of models.chat") in problems


def test_generated_flags_cannot_be_passed_again(homelab_values):
    homelab_values["models"]["chat"]["extra_args"] = ["--jinja", "--ctx-size=8192"]
    assert rejection(homelab_values).problems == [
        ("models.chat.extra_args[1]", "--ctx-size=8192 is generated from a typed field; set that field instead")
    ]


def test_memory_request_above_limit(homelab_values):
    homelab_values["models"]["chat"]["resources"]["memory_request"] = "40Gi"
    assert rejection(homelab_values).problems[0] == ("models.chat.resources.memory_request", "is larger than memory_limit")


def test_memory_needs_a_binary_suffix(homelab_values):
    homelab_values["models"]["chat"]["resources"]["memory_limit"] = "32G"
    (path, message), *_ = rejection(homelab_values).problems
    assert path == "models.chat.resources.memory_limit" and "binary suffix" in message


def test_hf_repo_needs_a_quant(homelab_values):
    homelab_values["models"]["chat"]["hf_repo"] = "ggml-org/Qwen3.6-35B-A3B-GGUF"
    assert rejection(homelab_values).problems[0][0] == "models.chat.hf_repo"


def test_api_key_from_config_must_be_a_pulumi_secret(homelab_values):
    homelab_values["models"]["chat"]["api_key"] = {"secret_name": "llama-api-key", "from_config": "chat_api_key"}
    homelab_values["chat_api_key"] = "plain-text-key"
    with pytest.raises(pulumi.RunError, match=r"chat_api_key: holds a credential in plain text; run: pulumi config set --secret"):
        run_values(homelab_values)


def test_api_key_from_config_must_be_set(homelab_values):
    homelab_values["models"]["chat"]["api_key"] = {"secret_name": "llama-api-key", "from_config": "chat_api_key"}
    with pytest.raises(pulumi.RunError, match=r"chat_api_key: not set; run: pulumi config set --secret chat_api_key"):
        run_values(homelab_values)


def test_many_problems_stay_on_one_line(homelab_values):
    for key in ("threads", "ctx_size", "gpu_layers", "port"):
        homelab_values["models"]["chat"][key] = "x"
    error = rejection(homelab_values)
    assert len(error.problems) == 4
    assert "\n" not in str(error) and "(and 1 more)" in str(error)


def test_exposed_llama_server_needs_an_api_key(homelab_values):
    del homelab_values["models"]["chat"]["api_key"]
    (path, message), *_ = rejection(homelab_values).problems
    assert path == "models.chat.api_key"
    assert "its Ingress reaches this server from outside its namespace" in message


@pytest.mark.parametrize("field, value", [("name", "llama-server\n"), ("image", "ghcr.io/ggml-org/llama.cpp:b1\n")])
def test_a_trailing_newline_is_not_a_valid_name(homelab_values, field, value):
    # `$` in a Python regex also matches before a final newline; the checks match the whole value.
    homelab_values["models"]["chat"][field] = value
    assert rejection(homelab_values).problems[0][0] == f"models.chat.{field}"


def test_whole_numbers_from_pulumi_config_set_path_are_quantities(homelab_values):
    """`pulumi config set --path models.chat.resources.cpu_limit 6` writes the number 6."""
    homelab_values["models"]["chat"].setdefault("resources", {}).update(cpu_request=2, cpu_limit=6)
    stack = parse_stack(homelab_values)
    assert (stack.models["chat"].resources.cpu_request, stack.models["chat"].resources.cpu_limit) == ("2", "6")
    homelab_values["models"]["chat"]["resources"]["cpu_limit"] = True
    with pytest.raises(ConfigError, match=r"models.chat.resources.cpu_limit: "):
        parse_stack(homelab_values)


@pytest.mark.parametrize("value, ok", [
    ("localhost", True), ("https://chat.example.org", True), ("http://10.0.0.5:3000", True),
    ("*", False), ("https://a.example.org,https://b.example.org", False), ("chat.example.org", False),
])
def test_cors_origins_is_a_value_the_server_and_browsers_agree_on(homelab_values, value, ok):
    """llama.cpp sends --cors-origins as the Access-Control-Allow-Origin value as it is (localhost
    and * are special): a list is one invalid header value; * lets any page read the answers."""
    homelab_values["models"]["chat"]["cors_origins"] = value
    if ok:
        assert parse_stack(homelab_values).models["chat"].cors_origins == value
    else:
        with pytest.raises(ConfigError, match=r"models\.chat\.cors_origins: .* set localhost or one origin"):
            parse_stack(homelab_values)


@pytest.mark.parametrize("key", ["chat", "embed"])
def test_every_llamacpp_server_says_which_origins_may_call_it(homelab_values, key):
    """Exposed or not: a server with no --cors-origins answers any foreign origin."""
    homelab_values["models"][key]["cors_origins"] = None
    with pytest.raises(ConfigError, match=rf"models\.{key}\.cors_origins: without it llama-server echoes any Origin"):
        parse_stack(homelab_values)


@pytest.mark.parametrize("args, where, says", [
    (["--temp", "0.7\n[evil]"], "models.chat.extra_args[1]", "holds a control character (U+000A)"),
    (["--jinja\nctx-size = 262144"], "models.chat.extra_args[0]", "holds a control character (U+000A)"),
    (["--model-url", "https://example.org/x.gguf"], "models.chat.extra_args[0]", "loads weights the plan does not count"),
    (["--path", "/"], "models.chat.extra_args[0]", "serves files from the container to every key holder"),
    (["--rpc", "10.0.0.5:50052"], "models.chat.extra_args[0]", "offloads layers to another host"),
    (["--mlock"], "models.chat.extra_args[0]", "mlock needs a capability the pod drops"),
    (["--flash-attn", "off"], "models.chat.extra_args[0]", "changes what llama.cpp allocates where"),
    (["--slot-save-path", "/tmp"], "models.chat.extra_args[0]", "writes or changes the server's state"),
    (["--made-up-flag"], "models.chat.extra_args[0]", "is not among the flags extra_args may set"),
    (["0.7"], "models.chat.extra_args[0]", "is not a flag"),
    (["--temp"], "models.chat.extra_args[0]", "takes a value: put it in the next item"),
    (["--jinja=yes"], "models.chat.extra_args[0]", "reads no '=' form"),
])
def test_extra_args_are_a_closed_list_of_single_argv_elements(homelab_values, args, where, says):
    """Only flags that move nothing the plan, the policies or the pod depend on; each item one clean argv
    element (a newline would write lines of its own into a router's preset)."""
    homelab_values["models"]["chat"]["extra_args"] = args
    (problem,) = [p for p in rejection(homelab_values).problems if p[0].startswith("models.chat.extra_args")]
    assert problem[0] == where and says in problem[1]


def test_allowed_extra_args_render_as_given(homelab_values):
    args = ["--jinja", "--temp", "0.6", "-s", "-1", "--reasoning-budget", "0", "--chat-template-kwargs", '{"enable_thinking":false}']
    homelab_values["models"]["chat"]["extra_args"] = args
    assert list(parse_stack(homelab_values).models["chat"].extra_args) == args
