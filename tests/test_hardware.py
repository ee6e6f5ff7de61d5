"""Beyond the two seed clusters: discrete GPUs with their own VRAM, CPU-only clusters, backends
checked against images, and ingress that fits the controller. Expected figures are computed here
from the model's facts, not read back from the plan."""

from __future__ import annotations

import math

import re

import pytest

from common.errors import CapacityError, ConfigError
from plane import parse_stack
from conftest import CPU_SECRETS, RTX_SECRETS, plain_values, run_values
from plane import plan_capacity
from common.quantity import GIB, MIB

# Llama 3.1/3.3 70B (config.json: 80 layers, 8 KV heads, head_dim 128, 70.6B parameters).
# The widths are unset (explicit nulls over the catalog's entry, which has them): the arithmetic of a model
# known only by its layers, each layer an equal share of the weights, the GPU reserve the stated margin.
NO_WIDTHS = {"embedding_length": None, "vocab_size": None, "feed_forward_length": None}
LLAMA_70B = {"params_b": 70.6, "layers": 80, "kv_heads": 8, "head_dim": 128, **NO_WIDTHS}
# Qwen3-32B (config.json: 64 layers, 8 KV heads, head_dim 128, 32.8B parameters).
QWEN3_32B = {"params_b": 32.8, "layers": 64, "kv_heads": 8, "head_dim": 128, **NO_WIDTHS}


def rtx() -> dict:
    return plain_values("rtx4090")


def cpu() -> dict:
    return plain_values("cpu-cluster")


def kv_gib(facts: dict, ctx: int, bytes_k: float = 2.0, bytes_v: float = 2.0) -> float:
    tokens = math.ceil(ctx / 256) * 256
    layers = facts.get("full_attention_layers") or facts["layers"]
    return layers * facts["kv_heads"] * facts["head_dim"] * (bytes_k + bytes_v) * tokens / GIB


# --- discrete GPUs --------------------------------------------------------------------------------


def test_rtx4090_chat_lives_in_vram_and_the_pod_reserves_only_what_stays_in_ram():
    stack = parse_stack(rtx())
    plan = plan_capacity(stack)
    chat = plan.servers["chat"]
    # Qwen3.6-35B-A3B: 40 layers all offloaded; KV for its 10 attention layers at 32k in q8_0;
    # 63 MiB of DeltaNet state per slot, 2 slots; the CUDA runtime (620 MiB, and 100 MiB of pool for a
    # mixture of experts) and the compute buffer at the 512 micro-batch: the 32k f16 mask (32 MiB) and
    # attention's F16 copy of the q8_0 cache (32768 x 2 x 256 x 2 bytes, K and V: 64 MiB) beside 16 bytes
    # per token per hidden column (16 MiB), larger than the experts' FFN (512 x 12 x (8 x 512 + 2048)).
    kv = kv_gib({"layers": 40, "full_attention_layers": 10, "kv_heads": 2, "head_dim": 256}, 32768, 34 / 32, 34 / 32)
    # The input embedding (248320 x 2048 at the file's bytes per parameter) stays in system RAM.
    embedding = 248320 * 2048 * 19.8 / 34.66e9
    reserve = (620 + 100 + 32 + 64 + 16) / 1024
    expected_vram = 19.8 - embedding + kv + 2 * 63 * MIB / GIB + reserve
    assert chat.vram.layers_offloaded == chat.vram.layers == 40
    assert chat.vram.total_gib == pytest.approx(expected_vram, abs=1e-6)
    # System RAM: of the weights only the input embedding, the 4 GiB prompt cache and 8 checkpoints x
    # 2 slots of recurrent state, and the runtime's host share; the request is that, not the weights.
    assert chat.estimate.weights_gib == pytest.approx(embedding, abs=1e-6) and chat.estimate.kv_gib == 0
    assert chat.estimate.host_caches_gib == pytest.approx(4 + 8 * 2 * 63 / 1024, abs=1e-6)
    assert chat.memory_request == chat.memory_limit == f"{math.ceil(chat.estimate.total_gib * 1.1)}Gi"
    assert float(chat.memory_limit.removesuffix("Gi")) < 10


def test_rtx4090_sums_both_servers_on_the_one_card():
    plan = plan_capacity(parse_stack(rtx()))
    (node,) = plan.nodes
    (gpu,) = node.gpus
    assert dict(gpu.workloads) == pytest.approx(
        {"llama-chat": plan.servers["chat"].vram.total_gib, "llama-embed": plan.servers["embed"].vram.total_gib}
    )
    assert gpu.planned_gib <= gpu.vram_gib == 24.0


def test_rtx4090_rendered_pods_get_the_gpu_and_the_nvidia_runtime():
    run = run_values(rtx(), secrets=RTX_SECRETS, stack="rtx4090")
    for name in ("llama-chat", "llama-embed"):
        pod = run.one("Deployment", name).inputs["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["runtimeClassName"] == "nvidia"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert container["image"].startswith("ghcr.io/ggml-org/llama.cpp:server-cuda-")
    chat_args = run.one("Deployment", "llama-chat").inputs["spec"]["template"]["spec"]["containers"][0]["args"]
    assert chat_args[chat_args.index("--cache-type-k") + 1] == "q8_0"
    assert chat_args[chat_args.index("--cache-type-v") + 1] == "q8_0"
    assert chat_args[chat_args.index("--n-gpu-layers") + 1] == "99"


def test_a_70b_that_cannot_fit_a_24_gib_card_is_refused_with_the_layers_that_fit():
    values = rtx()
    chat = values["models"]["chat"]
    chat.update(hf_repo="bartowski/Llama-3.3-70B-Instruct-GGUF:Q4_K_M", facts=LLAMA_70B, weights="39.6Gi",
                ctx_size=8192, parallel=1, ctx_checkpoints=0, cache_type_k=None, cache_type_v=None)
    del values["models"]["embed"]
    values["gateway"]["routes"] = values["gateway"]["routes"][:1]
    values["gateway"]["tiers"].pop("local-embed")
    with pytest.raises(CapacityError) as caught:
        plan_capacity(parse_stack(values))
    ((path, message),) = caught.value.problems
    assert path == "models.chat.gpu_layers"
    (suggested,) = re.findall(r"but one GPU of node pool rtx4090 has 24\.0 GiB; set gpu_layers: (\d+) ", message)
    assert "smaller quant" in message and "ctx_size" in message and "q8_0" in message
    # Taking the advice fits with llama.cpp's 1 GiB left free: -ngl N offloads the output layer and N-1 blocks
    # (src/llama-model.cpp), the rest planned in system RAM; one layer more would eat into that margin.
    chat["gpu_layers"] = int(suggested)
    plan = plan_capacity(parse_stack(values))
    server = plan.servers["chat"]
    assert server.vram.total_gib <= 24 - 1.0 and server.vram.layers_offloaded == int(suggested) - 1
    assert plan.warnings == []
    blocks = int(suggested) - 1
    assert server.estimate.weights_gib == pytest.approx(39.6 * (80 - blocks) / 80, abs=1e-6)
    # Decode bound: the card's share at 1008 GB/s, the rest at 70 GB/s, one after the other (the
    # stack's weights, 39.6 GiB, read once per token).
    per_token = 39.6 * 2**30
    seconds = (blocks / 80) * per_token / 1008e9 + (1 - blocks / 80) * per_token / 70e9
    assert server.decode_bound_tok_s == pytest.approx(1 / seconds, rel=1e-9)
    chat["gpu_layers"] = int(suggested) + 1
    assert plan_capacity(parse_stack(values)).servers["chat"].vram.total_gib > 24 - 1.0
    # The linear guess it replaced lands within a layer or two, which is why it looked right and then refused
    # its own advice.
    per_layer = (39.6 + kv_gib(LLAMA_70B, 8192)) / 80
    assert abs(int(suggested) - (int((24 - 1.0) / per_layer) + 1)) <= 2


def test_a_32b_with_a_64k_context_is_refused_on_a_24_gib_card():
    values = rtx()
    values["models"]["chat"].update(hf_repo="Qwen/Qwen3-32B-GGUF:Q4_K_M", facts=QWEN3_32B, ctx_size=65536,
                                    cache_type_k=None, cache_type_v=None, weights=None, ctx_checkpoints=0)
    with pytest.raises(CapacityError) as caught:
        plan_capacity(parse_stack(values))
    (problem,) = [m for p, m in caught.value.problems if p == "models.chat.gpu_layers"]
    needed = 32.8e9 * 4.85 / 8 / GIB + kv_gib(QWEN3_32B, 65536) + 1.0
    assert f"needs {needed:.1f} GiB of VRAM" in problem


def test_two_pods_time_sharing_a_card_are_refused_when_together_they_do_not_fit():
    values = rtx()
    values["models"]["embed"].update(hf_repo="Qwen/Qwen3-Embedding-8B-GGUF:Q6_K", weights="5.8Gi")
    with pytest.raises(CapacityError, match=r"node_pools\.rtx4090\.vram: GPU 1 of node 1 would hold .* \(llama-chat "
                       r"[0-9.]+ GiB, llama-embed [0-9.]+ GiB\) but has 24\.0 GiB"):
        plan_capacity(parse_stack(values))


def test_a_cuda_image_with_a_vulkan_backend_is_refused():
    values = rtx()
    values["node_pools"]["rtx4090"]["backend"] = "vulkan"
    with pytest.raises(ConfigError, match=r"node_pools\.rtx4090\.backend: vulkan, but the image .*server-cuda-b10731 is "
                       r"llama\.cpp's cuda build"):
        parse_stack(values)


def test_the_backend_is_read_from_the_image_when_unset():
    values = cpu()
    stack = parse_stack(values)
    pool = stack.node_pools["minipc"]
    assert pool.backend is None and stack.models["chat"].backend_on(pool) == "cpu"
    values = rtx()
    del values["node_pools"]["rtx4090"]["backend"]
    assert parse_stack(values).models["chat"].backend_on(parse_stack(values).node_pools["rtx4090"]) == "cuda"


def test_an_image_that_names_no_backend_needs_one():
    values = plain_values("strix-halo")
    del values["node_pools"]["ms-s1"]["backend"]
    with pytest.raises(ConfigError, match=r"models\.flash\.backend: the image ghcr\.io/peonist/halogen-flash-server:v1\.4\.2 "
                       r"does not say which backend"):
        parse_stack(values)


def test_gpu_layers_on_a_cpu_image_are_refused():
    values = cpu()
    values["models"]["chat"]["gpu_layers"] = 99
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    # One problem, the real one: not "name the GPU resource" on a pool that has none to name.
    assert caught.value.problems == [("models.chat.gpu_layers", "99 layers to offload, but the image is a CPU build "
                                      "(the server ignores the flag); set gpu_layers: 0")]


def test_quantized_kv_cache_needs_head_dims_its_blocks_divide():
    values = rtx()
    values["models"]["chat"]["facts"] = {"params_b": 35, "active_params_b": 3, "layers": 40, "full_attention_layers": 10,
                                         "kv_heads": 2, "head_dim": 80, "recurrent_state_mib": 63}
    with pytest.raises(CapacityError, match=r"models\.chat\.cache_type_k: q8_0 stores the cache in blocks of 32 values"):
        plan_capacity(parse_stack(values))


# --- CPU-only clusters, ingress -----------------------------------------------------------------


def test_cpu_cluster_requests_no_gpu_and_threads_fit_the_cpu_limit():
    run = run_values(cpu(), secrets=CPU_SECRETS, stack="cpu-cluster")
    stack = parse_stack(cpu())
    for key, model in stack.models.items():
        container = run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]["containers"][0]
        limits = container["resources"]["limits"]
        assert set(limits) == {"cpu", "memory"}
        threads = int(container["args"][container["args"].index("--threads") + 1])
        assert threads <= float(limits["cpu"])
        assert "runtimeClassName" not in run.one("Deployment", model.name).inputs["spec"]["template"]["spec"]
    assert run.find("CiliumNetworkPolicy") == [] and len(run.find("NetworkPolicy")) == 1


def test_more_threads_than_the_cpu_limit_is_refused():
    values = cpu()
    values["models"]["chat"].update(threads=16, resources={"cpu_request": "1", "cpu_limit": "2"})
    with pytest.raises(ConfigError, match=r"models\.chat\.threads: 16 threads on a CPU limit of 2: .* set threads: 2"):
        parse_stack(values)


def test_ingress_nginx_gets_what_long_streams_need():
    run = run_values(cpu(), secrets=CPU_SECRETS, stack="cpu-cluster")
    annotations = run.one("Ingress", "llama-chat").inputs["metadata"]["annotations"]
    nginx = "nginx.ingress.kubernetes.io"
    # exposure.timeout_seconds is 1800 in this stack; the body limit is the 64Mi default, in nginx's units.
    assert annotations[f"{nginx}/proxy-read-timeout"] == annotations[f"{nginx}/proxy-send-timeout"] == "1800"
    assert annotations[f"{nginx}/proxy-body-size"] == "64m"
    assert annotations[f"{nginx}/proxy-buffering"] == annotations[f"{nginx}/proxy-request-buffering"] == "off"
    assert run.one("Ingress", "llama-chat").inputs["spec"]["ingressClassName"] == "nginx"


def test_a_traefik_ingress_admits_only_the_source_ranges_through_its_middleware():
    """Traefik refers to a CRD middleware as <namespace>-<name>@kubernetescrd: the annotation must
    name the Middleware the program creates, in the Ingress's own namespace."""
    run = run_values(rtx(), secrets=RTX_SECRETS, stack="rtx4090")
    ingress = run.one("Ingress", "llama-chat").inputs["metadata"]
    assert set(ingress["annotations"]) == {"cert-manager.io/cluster-issuer", "traefik.ingress.kubernetes.io/router.middlewares"}
    (middleware,) = run.find("Middleware")
    meta = middleware.inputs["metadata"]
    assert ingress["annotations"]["traefik.ingress.kubernetes.io/router.middlewares"] == \
        f"{ingress['namespace']}-{meta['name']}@kubernetescrd"
    assert meta["namespace"] == ingress["namespace"]
    ranges = middleware.inputs["spec"]["ipAllowList"]["sourceRange"]
    assert "192.168.0.0/16" in ranges and "0.0.0.0/0" not in ranges and "100.64.0.0/10" in ranges


def test_ingress_nginx_admits_only_the_source_ranges():
    values = cpu()
    values["models"]["chat"]["exposure"]["source_ranges"] = ["192.168.1.0/24"]
    run = run_values(values, secrets=CPU_SECRETS, stack="cpu-cluster")
    annotations = run.one("Ingress", "llama-chat").inputs["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/whitelist-source-range"] == "192.168.1.0/24"
    assert run.find("Middleware") == []
    values["models"]["chat"]["exposure"]["source_ranges"] = ["192.168.1.1/24"]
    with pytest.raises(ConfigError, match=r"source_ranges\[0\]|source_ranges\.0"):
        parse_stack(values)
    values["models"]["chat"]["exposure"]["source_ranges"] = None
    with pytest.raises(ConfigError, match=r"source_ranges: null admits every client the ingress controller serves"):
        parse_stack(values)  # without a word: the API key would be the only guard (issue #43 item 4)
    values["models"]["chat"]["exposure"]["public_reason"] = "the LAN's firewall admits only the office range"
    run = run_values(values, secrets=CPU_SECRETS, stack="cpu-cluster")
    assert "nginx.ingress.kubernetes.io/whitelist-source-range" not in run.one("Ingress", "llama-chat").inputs["metadata"]["annotations"]


def test_source_ranges_need_a_controller_the_program_knows():
    values = cpu()
    values["cluster"]["ingress"]["kind"] = "other"
    with pytest.raises(ConfigError, match=r"models\.chat\.exposure\.source_ranges: the program can restrict sources only"):
        parse_stack(values)
    values["models"]["chat"]["exposure"]["source_ranges"] = None
    values["models"]["chat"]["exposure"]["public_reason"] = "restricted in the controller's own configuration"
    parse_stack(values)


def chat_ingress_annotations(values: dict, secrets: dict, stack: str) -> dict:
    return run_values(values, secrets=secrets, stack=stack).one("Ingress", "llama-chat").inputs["metadata"]["annotations"]


def test_user_annotations_are_kept_and_may_not_contradict_the_programs():
    values = cpu()
    values["models"]["chat"]["exposure"]["annotations"] = {"nginx.ingress.kubernetes.io/limit-rps": "5"}
    annotations = chat_ingress_annotations(values, CPU_SECRETS, "cpu-cluster")
    assert annotations["nginx.ingress.kubernetes.io/limit-rps"] == "5"
    values["models"]["chat"]["exposure"]["annotations"] = {"nginx.ingress.kubernetes.io/proxy-read-timeout": "60"}
    with pytest.raises(ConfigError, match=r"models\.chat\.exposure\.annotations\.nginx\.ingress\.kubernetes\.io/"
                       r"proxy-read-timeout: the program sets '1800' here"):
        parse_stack(values)


def test_a_user_annotation_may_not_replace_the_certificate_issuer():
    values = rtx()
    values["models"]["chat"]["exposure"]["annotations"] = {"cert-manager.io/cluster-issuer": "letsencrypt-prod"}
    with pytest.raises(ConfigError, match=r"exposure\.annotations\.cert-manager\.io/cluster-issuer: the program sets "
                       r"'tailnet-ca' here \(from cluster\.cert_manager_issuer"):
        parse_stack(values)


def test_a_cluster_without_an_ingress_controller():
    values = cpu()
    values["cluster"]["ingress"] = None
    with pytest.raises(ConfigError, match=r"models\.chat\.exposure: the cluster has no ingress controller"):
        parse_stack(values)
    del values["models"]["chat"]["exposure"]
    run = run_values(values, secrets=CPU_SECRETS, stack="cpu-cluster")
    assert run.find("Ingress") == []
    (policy,) = run.find("NetworkPolicy")
    namespaces = [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for rule in policy.inputs["spec"]["ingress"] for peer in rule["from"] if "namespaceSelector" in peer]
    assert "ingress-nginx" not in namespaces and "monitoring" in namespaces


def test_a_wrong_type_for_a_section_names_no_python_class():
    values = cpu()
    values["cluster"]["ingress"] = 5
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    assert str(caught.value) == ("invalid stack config: cluster.ingress: expected a mapping of settings "
                                 "(key: value lines under ingress), or null")


def test_llamacpp_replicas_on_the_shared_cache_are_refused():
    values = cpu()
    values["models"]["chat"]["workload"] = {"replicas": 2}
    with pytest.raises(ConfigError, match=r"models\.chat\.workload\.replicas: llama\.cpp replicas on the shared cache"):
        parse_stack(values)


def test_sliding_window_layers_hold_a_window_per_slot_not_the_context():
    """Gemma 3 27B: 10 global layers keep the whole context; the 52 sliding-window layers keep 1024
    tokens per slot plus one micro-batch (llama-server leaves --swa-full off)."""
    from config.catalog import catalog

    values = rtx()
    chat = values["models"]["chat"]
    chat.update(hf_repo="ggml-org/gemma-3-27b-it-GGUF:Q4_K_M", weights="15.4Gi", ctx_size=32768, parallel=4,
                cache_type_k=None, cache_type_v=None, ctx_checkpoints=0)
    facts = catalog()["ggml-org/gemma-3-27b-it-GGUF"]
    assert (facts.full_attention_layers, facts.sliding_window, facts.sliding_window_layers) == (10, 1024, 52)
    plan = plan_capacity(parse_stack({**values, "models": {"chat": chat}, "gateway": None}))
    per_token_layer = 16 * 128 * 4  # KV heads x head dim x (2 bytes K + 2 bytes V)
    expected = (10 * per_token_layer * 32768 + 52 * per_token_layer * 4608) / GIB  # 4 x 1024 + 512 = 4608 cells
    assert plan.servers["chat"].vram.kv_gib == pytest.approx(expected, rel=1e-9)


def test_the_allowlist_cannot_be_widened_through_an_annotation():
    """ingress-nginx reads allowlist-source-range before whitelist-source-range: a user value
    under either name would replace exposure.source_ranges."""
    values = cpu()
    for name in ("allowlist-source-range", "whitelist-source-range"):
        values["models"]["chat"]["exposure"]["annotations"] = {f"nginx.ingress.kubernetes.io/{name}": "0.0.0.0/0"}
        with pytest.raises(ConfigError, match=rf"exposure\.annotations\.nginx\.ingress\.kubernetes\.io/{name}: who may "
                           r"connect is exposure\.source_ranges"):
            parse_stack(values)


def test_a_users_traefik_middlewares_run_after_the_source_check():
    values = rtx()
    values["models"]["chat"]["exposure"]["annotations"] = {"traefik.ingress.kubernetes.io/router.middlewares": "auth-sso@kubernetescrd"}
    annotations = chat_ingress_annotations(values, RTX_SECRETS, "rtx4090")
    assert annotations["traefik.ingress.kubernetes.io/router.middlewares"] == \
        "llm-llama-chat-sources@kubernetescrd,auth-sso@kubernetescrd"


@pytest.mark.parametrize("backend, image, vram, profile, predicted", [
    # A discrete Radeon on ROCm: its own class (the RX 7900 XTX's published 167.11 t/s on llama-2-7b Q4_0
    # is the point the profile was fitted to), never the Strix Halo APU's.
    ("rocm", "ghcr.io/ggml-org/llama.cpp:server-rocm-b10731", "24Gi", "amd-discrete-rocm", True),
    # Vulkan runs on too many kinds of GPU to guess: no number unless the pool names its class.
    ("vulkan", "ghcr.io/ggml-org/llama.cpp:server-vulkan-b10731", "24Gi", None, False),
])
def test_the_decode_profile_is_the_cards_own_class_or_none(backend, image, vram, profile, predicted):
    from engines.llamacpp_speed import DEFAULT_PROFILE, PROFILES

    values = rtx()
    pool = values["node_pools"]["rtx4090"]
    pool.update(backend=backend, gpu_resource="amd.com/gpu" if backend == "rocm" else "gpu.intel.com/xe",
                vram=vram, vram_bandwidth_gbs=960, runtime_class=None, gpu_shares=1)
    values["models"] = {"chat": values["models"]["chat"]}
    values["gateway"] = None
    for model in values["models"].values():
        model["image"] = image
    plan = plan_capacity(parse_stack(values))
    chat = plan.servers["chat"]
    assert (chat.decode_predicted_tok_s is not None) == predicted
    assert DEFAULT_PROFILE.get((backend, True)) == profile and DEFAULT_PROFILE.get(("rocm", False)) == "amd-apu"
    if profile is not None:
        # Its fits: llama-2-7b Q4_0 (3.825 GB read per token) at 960 GB/s x the legacy share = the published
        # 167.11 t/s; Llama-3-8B Q4_K_M (4.6 GB read per token, the input embedding aside) x the K-quant share =
        # the published 105.75 (llama.cpp PR #26284).
        assert 960e9 * PROFILES[profile].share["legacy"] / 3.825e9 == pytest.approx(167.11, rel=0.01)
        assert 960e9 * PROFILES[profile].share["kquant"] / 4.6e9 == pytest.approx(105.75, rel=0.02)
