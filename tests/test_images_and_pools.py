"""Images that cannot drive the pool's cards, builds older than the tested one, pools told apart by
labels (k3s labels every node instance-type k3s), replicas racing on one shared cache, and a fact
several servers share said once."""

from __future__ import annotations

import copy

import pytest

from config import ConfigError
from conftest import plain_values, run_values
from plane import parse_stack


def values(stack: str) -> dict:
    return copy.deepcopy(plain_values(stack))


@pytest.mark.parametrize("variant, vendor", [("rocm", "amd.com"), ("intel", "gpu.intel.com")])
def test_an_image_for_another_vendors_cards_is_refused(variant, vendor):
    stack = values("rtx4090")
    del stack["node_pools"]["rtx4090"]["backend"]
    stack["models"]["chat"]["image"] = f"ghcr.io/ggml-org/llama.cpp:server-{variant}-b10731"
    with pytest.raises(ConfigError) as caught:
        parse_stack(stack)
    ((path, message),) = caught.value.problems
    assert path == "models.chat.image" and f"drives {vendor} GPUs" in message and "nvidia.com/gpu" in message


def test_vulkan_runs_on_any_vendors_card():
    stack = values("rtx4090")
    del stack["node_pools"]["rtx4090"]["backend"]
    for model in stack["models"].values():
        model["image"] = "ghcr.io/ggml-org/llama.cpp:server-vulkan-b10731"
    assert parse_stack(stack).models["chat"].backend_on(parse_stack(stack).node_pools["rtx4090"]) == "vulkan"


@pytest.mark.parametrize("tag, refused", [("server-cuda-b9000", True), ("server-cuda-b10728", True),
                                          ("server-cuda-b10729", False), ("server-cuda-b10731", False),
                                          ("server-cuda-b11434", False)])
def test_a_build_older_than_the_tested_one_is_refused(tag, refused):
    stack = values("rtx4090")
    stack["models"]["chat"]["image"] = f"ghcr.io/ggml-org/llama.cpp:{tag}"
    if not refused:
        parse_stack(stack)
        return
    with pytest.raises(ConfigError, match=r"models\.chat\.image: llama\.cpp b[0-9]+ is older than b10729"):
        parse_stack(stack)


def test_a_pool_is_placed_by_its_own_labels():
    stack = values("rtx4090")
    stack["node_pools"]["rtx4090"]["node_labels"] = {"inference-plane/pool": "gpu"}
    stack["node_pools"]["rtx4090"]["instance_type"] = "k3s"
    run = run_values(stack, secrets={k: f"{k}-value" for k in ("chat_api_key", "embed_api_key", "gateway_master_key",
                                                                       "openrouter_api_key")})
    selectors = [r.inputs["spec"]["template"]["spec"].get("nodeSelector") for r in run.resources
                 if r.type == "kubernetes:apps/v1:Deployment"]
    assert selectors == [{"inference-plane/pool": "gpu", "node.kubernetes.io/instance-type": "k3s"}] * 2


def test_llama_cpp_statefulset_replicas_on_the_shared_cache_are_refused():
    """Its downloader takes no lock between processes (common/download.cpp): two replicas starting
    on an empty shared cache write the same file at once, whatever the workload kind."""
    stack = values("homelab")
    stack["models"]["chat"]["workload"] = {"kind": "StatefulSet", "replicas": 2}
    with pytest.raises(ConfigError, match=r"models\.chat\.workload\.replicas: llama\.cpp replicas on the shared cache"):
        parse_stack(stack)


def test_a_problem_several_servers_share_is_said_once():
    stack = values("rtx4090")
    for model in stack["models"].values():
        model["image"] = "ghcr.io/ggml-org/llama.cpp:server-rocm-b10731"
    with pytest.raises(ConfigError) as caught:
        parse_stack(stack)
    lines = [f"{p}: {m}" for p, m in caught.value.problems]
    assert len(lines) == len(set(lines))
    assert str(caught.value).count("is llama.cpp's rocm build") == 1
