"""Where llama.cpp puts a model on discrete GPUs, planned as it does it: -ngl's output layer first,
experts kept in system RAM (--n-cpu-moe) on a 12 GiB card, a 70B split over two cards, and
llama.cpp's own 1 GiB free per GPU. Expected figures are computed here from the model's published
shape (config.json), not read back from the plan."""

from __future__ import annotations

import copy

import pytest

from common.errors import CapacityError, ConfigError
from conftest import plain_values, run_values
from plane import parse_stack, plan_capacity

GIB = 2**30
# Qwen3-30B-A3B (config.json): 48 blocks, hidden 2048, 128 experts of 3 x 2048 x 768, 8 used.
QWEN3_30B = dict(params=30.5e9, layers=48, hidden=2048, vocab=151936, experts=128 * 3 * 2048 * 768 * 48, used=8 / 128)
LLAMA_70B = dict(params=70.6e9, layers=80, hidden=8192, vocab=128256)


def values(stack: str) -> dict:
    return copy.deepcopy(plain_values(stack))


def args_of(run, name: str) -> list[str]:
    (deployment,) = [r for r in run.resources if r.type == "kubernetes:apps/v1:Deployment" and r.inputs["metadata"]["name"] == name]
    return deployment.inputs["spec"]["template"]["spec"]["containers"][0]["args"]


def qwen_parts(weights_gib: float) -> tuple[float, float, float]:
    """(embedding, dense per block, experts per block) in GiB at the file's bytes per parameter."""
    per_param = weights_gib / QWEN3_30B["params"]
    embedding = QWEN3_30B["vocab"] * QWEN3_30B["hidden"] * per_param
    experts = QWEN3_30B["experts"] / QWEN3_30B["layers"] * per_param
    block = (weights_gib - 2 * embedding) / QWEN3_30B["layers"]
    return embedding, block - experts, experts


# --- experts in system RAM -------------------------------------------------------------------------


def test_a_30b_moe_on_a_12_gib_card_keeps_28_blocks_of_experts_in_ram():
    stack = values("rtx3060")
    plan = plan_capacity(parse_stack(stack))
    chat = plan.servers["chat"]
    embedding, dense, experts = qwen_parts(17.3)
    # On the card: every block's attention and shared weights, the experts of blocks 28..47, the
    # output layer; the KV cache (q8_0: 34 bytes per 32 values) of all 48 blocks; the CUDA runtime (620 MiB,
    # 100 more of pool for a mixture of experts) and the compute buffer: the 32k f16 mask (32 MiB), attention
    # (the F16 copy of the q8_0 cache, 32768 x 4 x 128 x 2 x 2 bytes = 64 MiB, and 512 x 2048 x 16 bytes) over
    # the experts' FFN (512 x 12 x (8 x 768 + 2048) = 48 MiB), and the copy of experts kept in RAM (0.86 of a
    # block's experts).
    kv = 48 * 4 * 128 * 2 * (34 / 32) * 32768 / GIB
    reserve = (620 + 100 + 32 + 64 + 16) / 1024 + 0.86 * experts
    expected_vram = 48 * dense + 20 * experts + embedding + kv + reserve
    # rel 1e-4: the catalog gives the experts to 0.01B (28.99), config.json to the parameter.
    assert chat.vram.total_gib == pytest.approx(expected_vram, rel=1e-4)
    assert chat.vram.experts_in_ram == 28 and chat.vram.layers_offloaded == 48
    # In system RAM: the input embedding and the experts of blocks 0..27.
    assert chat.estimate.weights_gib == pytest.approx(embedding + 28 * experts, rel=1e-4)
    # llama.cpp's 1 GiB stays free on the 12 GiB card.
    (gpu,) = plan.nodes[0].gpus
    assert 12 - gpu.planned_gib >= 1.0 and plan.warnings == []
    # Decode reads every dense part and 8 of 128 experts per block, from where each lives.
    vram_read = (48 * dense + 20 * experts * QWEN3_30B["used"] + embedding) * GIB
    ram_read = 28 * experts * QWEN3_30B["used"] * GIB
    # rel 2%: the plan takes the experts' read share from the card's rounded 3.3B active (6.2%), this
    # test from the router's 8 of 128 (6.25%).
    assert chat.decode_bound_tok_s == pytest.approx(1 / (vram_read / 360e9 + ram_read / 45e9), rel=0.02)


def test_experts_in_ram_are_rendered_as_llama_cpp_s_n_cpu_moe():
    run = run_values(values("rtx3060"), secrets={"chat_api_key": "k"}, stack="rtx3060")
    args = args_of(run, "llama-chat")
    assert args[args.index("--n-cpu-moe") + 1] == "28"
    assert "--n-cpu-moe" not in args_of(run, "llama-embed")


def test_fewer_blocks_of_experts_in_ram_overflow_the_card_and_the_refusal_names_the_setting():
    stack = values("rtx3060")
    stack["models"]["chat"]["cpu_moe_layers"] = 10
    with pytest.raises(CapacityError) as caught:
        plan_capacity(parse_stack(stack))
    ((path, message),) = caught.value.problems
    assert path == "models.chat.gpu_layers" and "cpu_moe_layers" in message and "experts of 10 in RAM" in message


def test_without_expert_offload_the_moe_does_not_fit_12_gib():
    stack = values("rtx3060")
    del stack["models"]["chat"]["cpu_moe_layers"]
    with pytest.raises(CapacityError, match=r"models\.chat\.gpu_layers: needs 1[0-9]\.[0-9] GiB of VRAM"):
        plan_capacity(parse_stack(stack))


def test_expert_offload_needs_the_experts_size():
    stack = values("rtx3060")
    # Over the catalog's entry, which has it: an explicit null unsets it.
    stack["models"]["chat"]["facts"] = {"params_b": 30.5, "active_params_b": 3.3, "layers": 48, "kv_heads": 4, "head_dim": 128,
                                        "expert_params_b": None}
    with pytest.raises(CapacityError, match=r"models\.chat\.facts\.expert_params_b: cpu_moe_layers keeps experts in RAM"):
        plan_capacity(parse_stack(stack))


@pytest.mark.parametrize("flag", ["--n-cpu-moe", "-ncmoe", "--cpu-moe", "-ot", "--override-tensor"])
def test_placement_flags_the_plan_cannot_see_are_refused(flag):
    stack = values("rtx3060")
    stack["models"]["chat"]["extra_args"] = [flag, "30"]
    with pytest.raises(ConfigError, match=r"models\.chat\.extra_args\[0\]"):
        parse_stack(stack)


def test_experts_in_ram_need_a_discrete_card():
    stack = values("homelab")
    stack["models"]["chat"]["cpu_moe_layers"] = 10
    with pytest.raises(ConfigError, match=r"models\.chat\.cpu_moe_layers: keeps experts in system RAM beside a discrete GPU"):
        parse_stack(stack)


# --- -ngl: the output layer first ------------------------------------------------------------------


@pytest.mark.parametrize("ngl, blocks, output", [(1, 0, True), (20, 19, True), (48, 47, True), (49, 48, True), (99, 48, True)])
def test_ngl_offloads_the_output_layer_and_then_n_minus_1_blocks(ngl, blocks, output):
    stack = values("rtx3060")
    chat = stack["models"]["chat"]
    chat.update(gpu_layers=ngl, cpu_moe_layers=None)
    plan = plan_capacity(parse_stack(stack)) if blocks <= 20 else None
    embedding, dense, experts = qwen_parts(17.3)
    if plan is None:  # more than fits the card: read the refusal's figure instead
        with pytest.raises(CapacityError) as caught:
            plan_capacity(parse_stack(stack))
        ((_, message),) = caught.value.problems
        assert f"{blocks}/48 layers" in message
        return
    vram = plan.servers["chat"].vram
    assert vram.layers_offloaded == blocks
    assert vram.weights_gib == pytest.approx(blocks * (dense + experts) + (embedding if output else 0), rel=1e-4)


# --- several GPUs ---------------------------------------------------------------------------------


def test_a_70b_over_two_24_gib_cards_plans_each_card_and_requests_both():
    stack = values("dual-3090")
    plan = plan_capacity(parse_stack(stack))
    chat = plan.servers["chat"]
    per_param = 39.6 / LLAMA_70B["params"]
    embedding = LLAMA_70B["vocab"] * LLAMA_70B["hidden"] * per_param
    blocks = 39.6 - 2 * embedding
    kv = 80 * 8 * 128 * 2 * (34 / 32) * 16384 / GIB
    # Each card: half the blocks and their KV, the CUDA runtime (620 MiB) and the compute buffer: the 16k f16
    # mask (16 MiB) and the FFN, 512 x 12 x (28672 + 8192) bytes = 216 MiB, larger than attention (the F16
    # copy of the q8_0 cache, 64 MiB, and 512 x 8192 x 16 bytes); the output layer on the last card.
    reserve = (620 + 16 + 216) / 1024
    assert chat.vram.gpus == 2
    assert chat.vram.total_gib == pytest.approx(blocks / 2 + embedding + kv / 2 + reserve, rel=1e-6)
    (node,) = plan.nodes
    assert [g.workloads for g in node.gpus] == [(("llama-chat", chat.vram.total_gib),)] * 2
    assert all(24 - g.planned_gib >= 1.0 for g in node.gpus) and plan.warnings == []
    # In system RAM only the input embedding of the weights.
    assert chat.estimate.weights_gib == pytest.approx(embedding, rel=1e-6)
    run = run_values(stack, secrets={"chat_api_key": "k"}, stack="dual-3090")
    args = args_of(run, "llama-chat")
    assert args[args.index("--split-mode") + 1] == "layer" and args[args.index("--tensor-split") + 1] == "1,1"
    (deployment,) = [r for r in run.resources if r.type == "kubernetes:apps/v1:Deployment" and r.inputs["metadata"]["name"] == "llama-chat"]
    resources = deployment.inputs["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "2"


def test_a_server_too_big_for_one_card_on_a_two_card_node_is_told_gpus_2():
    """Not "offload layers to RAM" first: the node's second card is the fix, with each card's share."""
    stack = values("dual-3090")
    stack["models"]["chat"]["gpus"] = 1
    with pytest.raises(CapacityError, match=r"models\.chat\.gpus: needs 4\d\.\d GiB of VRAM .* but one GPU of node pool "
                       r"dual-3090 has 24\.0 GiB; its nodes have 2: set gpus: 2 \(split by layer, 2\d\.\d GiB on each card\)"):
        plan_capacity(parse_stack(stack))
    # With one card per node, the layers-to-RAM fix stays.
    stack["node_pools"]["dual-3090"]["gpus_per_node"] = 1
    with pytest.raises(CapacityError, match=r"models\.chat\.gpu_layers: .* set gpu_layers: \d+"):
        plan_capacity(parse_stack(stack))


def test_two_cards_for_one_replica_on_a_one_card_node_is_refused():
    stack = values("dual-3090")
    stack["node_pools"]["dual-3090"]["gpus_per_node"] = 1
    with pytest.raises(ConfigError, match=r"models\.chat\.gpus: 2 GPUs per replica, but node pool dual-3090 has 1 per node"):
        parse_stack(stack)


def test_two_cards_on_a_time_sliced_pool_is_refused():
    """NVIDIA's time-slicing hands out replicas of a card: a request for 2 can be two slices of one GPU."""
    stack = values("dual-3090")
    stack["node_pools"]["dual-3090"]["gpu_shares"] = 2
    with pytest.raises(ConfigError, match=r"models\.chat\.gpus: node pool dual-3090 shares each GPU"):
        parse_stack(stack)


def test_a_second_two_card_replica_finds_no_free_cards():
    stack = values("dual-3090")
    stack["models"]["chat"]["workload"] = {"replicas": 2}
    with pytest.raises(ConfigError) as caught:
        plan_capacity(parse_stack(stack))
    assert ("node_pools.dual-3090.gpu_shares", "model server pods (chat) request 4 nvidia.com/gpu, but the pool offers 2; "
            "a server split over several cards cannot share them: add cards or nodes (nodes), or fewer replicas"
            ) in caught.value.problems


@pytest.mark.parametrize("stack_name, pool, advice", [
    ("homelab", "iris-xe", "raise the device plugin's -shared-dev-num and gpu_shares"),
    ("rtx3060", "rtx3060", "give the NVIDIA device plugin time-slicing replicas and set gpu_shares to them"),
])
def test_too_few_gpus_names_the_way_out_of_the_pools_device_plugin(stack_name, pool, advice):
    stack = values(stack_name)
    stack["node_pools"][pool]["gpu_shares"] = 1
    for model in stack["models"].values():
        if model.get("node_pool") == pool:
            model["gpu_layers"] = 99
            model.pop("backend", None)
            model["image"] = stack["models"]["chat"]["image"]
            model["workload"] = {**model.get("workload", {}), "replicas": 1}
    with pytest.raises(ConfigError) as caught:
        plan_capacity(parse_stack(stack))
    (problem,) = [p for p in caught.value.problems if p[0] == f"node_pools.{pool}.gpu_shares"]
    assert problem[1].endswith(advice)


# --- llama.cpp's free-memory target ----------------------------------------------------------------


def test_a_card_planned_within_1_gib_of_its_size_is_warned_about():
    stack = values("rtx4090")
    assert plan_capacity(parse_stack(stack)).warnings == []  # 22.9 of 24.0 GiB: the shipped stack keeps 1 GiB
    stack["models"]["chat"]["ctx_size"] = 65536  # +0.33 GiB of q8_0 KV
    plan = plan_capacity(parse_stack(stack))
    (gpu,) = plan.nodes[0].gpus
    assert 23.0 < gpu.planned_gib <= 24.0
    (warning,) = plan.warnings
    assert warning.startswith(f"node_pools.rtx4090.vram: GPU 1 of node 1 is planned to {gpu.planned_gib:.1f} of 24.0 GiB")
    assert "keeps 1 GiB free per GPU" in warning


# --- decode prediction ----------------------------------------------------------------------------


def test_the_homelab_prediction_meets_the_seeds_measurement():
    """Seed 000: Qwen3.6-35B-A3B at 11.59 t/s (llama-bench tg128, empty context) on the Iris Xe. In
    sample: the intel-igpu profile's MoE block cost was solved from it (docs/capacity-planning.md)."""
    chat = plan_capacity(parse_stack(values("homelab"))).servers["chat"]
    predicted = chat.decode_predicted_tok_s
    assert predicted["empty"] == pytest.approx(11.59, rel=0.15)
    # Slower as the context fills, and never above the bound.
    assert predicted["empty"] > predicted["half"] > predicted["full"]
    assert predicted["empty"] <= chat.decode_bound_tok_s


def test_a_pool_without_a_measured_profile_gets_no_prediction():
    stack = values("homelab")
    del stack["node_pools"]["iris-xe"]["decode_profile"]  # Vulkan: no default profile
    chat = plan_capacity(parse_stack(stack)).servers["chat"]
    assert chat.decode_predicted_tok_s is None and chat.decode_bound_tok_s is not None


def test_experts_in_ram_are_predicted_slower_than_all_on_the_card():
    """rtx3060: the experts of 28 blocks read from 45 GB/s system RAM, the rest from the card."""
    stack = values("rtx3060")
    offloaded = plan_capacity(parse_stack(stack)).servers["chat"].decode_predicted_tok_s["empty"]
    stack["node_pools"]["rtx3060"]["vram"] = "24Gi"
    stack["models"]["chat"]["cpu_moe_layers"] = None
    on_card = plan_capacity(parse_stack(stack)).servers["chat"].decode_predicted_tok_s["empty"]
    assert offloaded < on_card / 2


def test_a_facts_block_changes_single_fields_of_the_catalog_entry():
    """#34 item 3: to run gpt-oss-120b with experts in RAM one field is enough (the catalog's others kept); an
    explicit null unsets an optional one; a repo not in the catalog needs the whole set, each missing field named."""
    from config.catalog import lookup

    stack = values("rtx3060")
    stack["models"]["chat"]["facts"] = {"expert_params_b": 27.0}
    facts = parse_stack(stack).models["chat"].facts
    catalog = lookup("ggml-org/Qwen3-30B-A3B-GGUF")
    assert facts.expert_params_b == 27.0
    assert facts.model_dump(exclude={"expert_params_b"}) == catalog.model_dump(exclude={"expert_params_b"})
    stack["models"]["chat"]["facts"] = {"vocab_size": None}
    assert parse_stack(stack).models["chat"].facts.vocab_size is None
    stack["models"]["chat"]["hf_repo"] = "someone/Not-In-The-Catalog-GGUF:Q4_K_M"
    stack["models"]["chat"]["facts"] = {"params_b": 30.5}
    with pytest.raises(ConfigError, match=r"models\.chat\.facts\.layers: required"):
        parse_stack(stack)
    # gpt-oss carries its experts' size, so cpu_moe_layers plans without a facts block.
    gpt = lookup("ggml-org/gpt-oss-120b-GGUF")
    assert gpt.expert_params_b == pytest.approx(36 * 128 * 3 * 2880 * 2880 / 1e9, abs=0.01)
    assert lookup("ggml-org/gpt-oss-20b-GGUF").expert_params_b == pytest.approx(24 * 32 * 3 * 2880 * 2880 / 1e9, abs=0.01)
