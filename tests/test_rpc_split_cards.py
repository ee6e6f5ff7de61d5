"""A model split over nodes of discrete cards (issue #47 item 2: a CUDA helper): each member's blocks in its card's
VRAM, held to llama.cpp's own report of each CUDA and RPC device (bench/results-rpc-h200.json, the real split on an
H200); the card and the node each member takes in the capacity plan; the rendered pods that ask for them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from common.constants import RPC_HELPER_LABEL
from conftest import TEST_SECRETS, next_larger_quant, plain_values, run_values, serve_quant
from engines.llamacpp_rpc import layers_per_device, output_device

ROOT = Path(__file__).resolve().parent.parent
CARD_GIB = 24.0  # one RTX 3090 a node


def cards_values(weights: str | None = None, link: dict | None = None) -> dict:
    """The dual-3090 stack as two nodes of one RTX 3090 each, its 70B chat model split over both cards."""
    values = copy.deepcopy(plain_values("dual-3090"))
    values["node_pools"]["dual-3090"].update(gpus_per_node=1, nodes=2)
    chat = values["models"]["chat"]
    chat.pop("gpu_layers", None)
    chat.update(gpus=1, image="registry.lan:5000/inference-plane/llama-rpc:b10729-cuda",
                rpc={"helpers": [{"node_pool": "dual-3090"}], "link": link or {"rtt_ms": 0.2, "gbps": 9.4}})
    if weights:
        chat["weights"] = weights
    return values


def run_cards(values: dict):
    return run_values(values, {"chat_api_key": "k" * 32}, stack="cards-split")


@pytest.fixture(scope="module")
def cards_run():
    return run_cards(cards_values())


def deployments(run) -> dict[str, dict]:
    return {r.inputs["metadata"]["name"]: r.inputs for r in run.kubernetes() if r.type.endswith(":Deployment")}


def test_each_card_holds_its_members_blocks_within_the_card_and_the_plan_places_them_apart(cards_run):
    from planning.capacity import GPU_FREE_TARGET_GIB

    plan = cards_run.outputs["capacity_plan"]
    split = plan["servers"]["chat"]["split"]
    members = [*split["helpers"], split["main"]]
    assert [m["vram"]["layers_offloaded"] for m in members] == layers_per_device(80, split["tensor_split"])
    assert sum(m["blocks"] for m in members) == 80 and split["main"]["output"]
    for member in members:
        vram = member["vram"]
        total = vram["weights_gib"] + vram["kv_gib"] + vram["reserve_gib"]
        assert total <= CARD_GIB - GPU_FREE_TARGET_GIB
        # Blocks are shared by each card's room: neither card is left with most of its room unused.
        assert total >= 0.8 * (CARD_GIB - GPU_FREE_TARGET_GIB)
    # The blocks' weights and the output layer are the file's 39.6 GiB less the input embedding (in the main's RAM).
    assert sum(m["vram"]["weights_gib"] for m in members) + split["main"]["memory"]["weights_gib"] == pytest.approx(39.6, rel=0.03)
    # The capacity plan puts the helper's VRAM and the main server's on one card each, on different nodes.
    holders = {name: (node["node"], gpu["gpu"]) for node in plan["nodes"] for gpu in node["gpus"] for name in gpu["workloads"]}
    assert holders["llama-chat"][0] != holders["llama-chat-rpc-0"][0]
    for node in plan["nodes"]:
        for gpu in node["gpus"]:
            assert gpu["planned_gib"] <= gpu["vram_gib"]


def test_the_rendered_pods_ask_for_one_card_each_and_the_main_server_offloads_its_share(cards_run):
    plan = cards_run.outputs["capacity_plan"]["servers"]["chat"]
    objects = deployments(cards_run)
    helper, main = objects["llama-chat-rpc-0"], objects["llama-chat"]
    assert RPC_HELPER_LABEL in helper["spec"]["template"]["metadata"]["labels"]
    for pod in (helper["spec"]["template"]["spec"], main["spec"]["template"]["spec"]):
        resources = pod["containers"][0]["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
        assert pod["runtimeClassName"] == "nvidia"
    args = main["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--n-gpu-layers") + 1] == "999"
    assert args[args.index("--tensor-split") + 1] == ",".join(map(str, plan["split"]["tensor_split"]))
    # The helper's memory is its runtime's host side and the largest tensor it is sent (a block's), not its blocks.
    memory = helper["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert memory == "2Gi"
    cache = next(v for v in helper["spec"]["template"]["spec"]["volumes"] if v["name"] == "tensor-cache")
    assert int(cache["emptyDir"]["sizeLimit"].removesuffix("Gi")) >= plan["split"]["helpers"][0]["vram"]["weights_gib"]


def test_a_split_decodes_slower_than_one_card_holding_it_all_and_slower_over_a_slower_link(cards_run):
    fast = cards_run.outputs["capacity_plan"]["servers"]["chat"]["decode_range_tok_s"]
    slow_run = run_cards(cards_values(link={"rtt_ms": 0.5, "gbps": 1}))
    slow = slow_run.outputs["capacity_plan"]["servers"]["chat"]["decode_range_tok_s"]
    # One RTX 3090 holding all 39.6 GiB at its 936 GB/s could not beat 936 / 42.5 GB = 22 tok/s.
    for name in ("empty", "half", "full"):
        assert fast[name][1] < 936 / 42.5
        assert slow[name][1] < fast[name][1] and slow[name][0] < fast[name][0]


def test_a_model_neither_card_nor_both_can_hold_is_refused_with_the_figures_and_the_fix():
    import pulumi

    with pytest.raises(pulumi.RunError) as caught:
        run_cards(cards_values(weights="60Gi"))
    message = str(caught.value)
    assert "models.chat.rpc.helpers" in message and "add a helper node" in message
    assert "offer 46.0 GiB" in message, message  # two cards of 24 GiB, 1 GiB left free on each


def test_each_cuda_device_of_the_planned_split_meets_llama_cpps_report():
    """The split planner on two card pools, for each split measured on the H200 (llama-server with a
    ggml-rpc-server, the blocks as that run gave them): each device's weights and KV within 2 % of llama.cpp's
    report, its whole (weights, KV, compute) within 5 %."""
    from config.catalog import lookup
    from config.rpc import RpcSplit
    from config.types import ModelServer, NodePool
    from engines.llamacpp_split import split_estimate
    from lab.bench.rpc_error import REPO_SHAPES
    from lab.contract.real_shape import expected_weights_bytes

    record = json.loads((ROOT / "bench" / "results-rpc-h200.json").read_text())
    rows = [r for run in record["runs"] for r in run["rows"] if r.get("kind") == "memory" and r.get("buffers")]
    assert len(rows) == 3
    card = NodePool.model_validate({"memory": "2000Gi", "allocatable": "1900Gi", "vram": "141Gi", "backend": "cuda",
                                    "gpu_resource": "nvidia.com/gpu", "vram_bandwidth_gbs": 4800, "nodes": 2})
    for r in rows:
        repo = next(repo for repo, shape in REPO_SHAPES.items() if shape == r["shape"])
        facts = lookup(repo)
        counts = layers_per_device(facts.layers, [float(x) for x in r["split"].split("/")])
        assert output_device(facts.layers, [float(x) for x in r["split"].split("/")]) == 1
        model = ModelServer.model_validate({
            "role": "chat", "name": "m", "image": "registry.lan:5000/llama-rpc:b10729-cuda", "node_pool": "h200",
            "hf_repo": f"{repo}:{r['quant']}", "weights": f"{expected_weights_bytes(r['shape'], r['quant']) / 2**20:.2f}Mi",
            "ctx_size": r["ctx"], "parallel": 1, "gpus": 1, "resources": {"cpu_request": "1", "cpu_limit": "2"},
            "rpc": RpcSplit.model_validate({"helpers": [{"node_pool": "h200", "layers": counts[0]}],
                                            "main_layers": counts[1]}).model_dump()})
        split, _, _, problems = split_estimate(model, facts, {"h200": card}, "models.m")
        assert not problems and split is not None, problems
        reported = [r["buffers"][next(k for k in r["buffers"] if k.startswith("RPC"))], r["buffers"]["CUDA0"]]
        for member, buffers in zip([*split.helpers, split.main], reported):
            vram = member.vram
            assert vram.layers_offloaded == member.blocks
            assert vram.weights_gib * 1024 == pytest.approx(buffers["model"], rel=0.02), (r["shape"], buffers)
            assert vram.kv_gib * 1024 == pytest.approx(buffers["KV"], rel=0.02), (r["shape"], buffers)
            from engines.llamacpp_memory import CUDA_CONTEXT_MIB, CUDA_POOL_MIB
            pool_mib = CUDA_POOL_MIB if facts.experts_used else 0.0
            compute = vram.reserve_gib * 1024 - CUDA_CONTEXT_MIB - pool_mib
            assert (vram.weights_gib + vram.kv_gib) * 1024 + compute == pytest.approx(
                buffers["model"] + buffers["KV"] + buffers["compute"], rel=0.05)


def test_the_card_split_passes_every_policy_and_the_helper_is_fenced(cards_run):
    """The policy pack on the rendered objects (as make render and the CrossGuard pack run it): nothing refused,
    and the helper's own policy admits the main server's pods alone on its port."""
    from policy.rules import run_rules

    objects = [{"kind": r.type.split(":")[-1], **r.inputs} for r in cards_run.kubernetes()]
    assert run_rules([(o["metadata"]["name"], o) for o in objects], {}) == []
    fence = next(o for o in objects if o["kind"] == "CiliumNetworkPolicy" and o["metadata"]["name"] == "llama-chat-rpc-0-rpc")
    (rule,) = fence["spec"]["ingress"]
    main_labels = deployments(cards_run)["llama-chat"]["spec"]["template"]["metadata"]["labels"]
    (source,) = rule["fromEndpoints"]
    assert all(main_labels.get(k) == v for k, v in source["matchLabels"].items() if not k.startswith("k8s:"))
    assert [p["port"] for p in rule["toPorts"][0]["ports"]] == ["50052"]


def test_on_cards_the_smaller_quant_line_names_one_that_one_card_holds_whole():
    """On 32 GiB cards (an RTX 5090's) at a 4096 context, a smaller quant of the 70B fits one card whole and decodes
    faster than the split: the summary names it, the stack serving it on one card without the split is planned at
    the printed figure, and the next larger quant does not fit that card. On the 24 GiB cards none fits: no line."""
    import re

    from plane import parse_stack, plan_capacity

    def wider(values: dict) -> dict:
        values["node_pools"]["dual-3090"].update(vram="32Gi", vram_bandwidth_gbs=1792)
        values["models"]["chat"]["ctx_size"] = 4096
        return values

    assert not [w for w in plan_capacity(parse_stack(cards_values())).warnings if "smaller quant" in w]
    plan = plan_capacity(parse_stack(wider(cards_values())))
    [line] = [w for w in plan.warnings if "smaller quant on one node" in w]
    found = re.search(r"^models\.chat\.rpc: .*: (\S+) of this model .* decodes ~([\d.]+) tok/s at half context "
                      r"against the split's ([\d.]+)", line)
    quant, alone_half, split_half = found[1], float(found[2]), float(found[3])
    assert split_half == pytest.approx(plan.servers["chat"].decode_predicted_tok_s["half"], abs=0.05)
    assert alone_half > split_half
    one = wider(cards_values())
    chat = one["models"]["chat"]
    del chat["rpc"]
    serve_quant(chat, quant, 39.6)
    chat["gpu_layers"] = 999
    served = plan_capacity(parse_stack(one)).servers["chat"]
    assert served.vram.layers_offloaded == served.vram.layers
    assert served.decode_predicted_tok_s["half"] == pytest.approx(alone_half, abs=0.05)
    serve_quant(chat, next_larger_quant(quant), 39.6)
    with pytest.raises(Exception, match="VRAM"):
        plan_capacity(parse_stack(one))


def test_a_split_that_mixes_cards_and_node_memory_needs_its_blocks_given():
    """Shared by room, a card beside a larger CPU node would hold few blocks and idle: such a split is refused unless
    every member's blocks are given; given, each member holds exactly those."""
    import pulumi

    values = cards_values()
    values["node_pools"]["cpu"] = {"memory": "96Gi", "allocatable": "92Gi", "reserved": "2Gi", "memory_bandwidth_gbs": 60}
    values["models"]["chat"]["rpc"]["helpers"] = [{"node_pool": "cpu", "backend": "cpu",
                                                   "image": "registry.lan:5000/inference-plane/llama-rpc:b10729-cpu"}]
    with pytest.raises(pulumi.RunError) as caught:
        run_cards(values)
    assert "models.chat.rpc" in str(caught.value) and "mix discrete cards" in str(caught.value)
    values["models"]["chat"]["rpc"].update(main_layers=38)
    values["models"]["chat"]["rpc"]["helpers"][0]["layers"] = 42
    split = run_cards(values).outputs["capacity_plan"]["servers"]["chat"]["split"]
    assert split["main"]["vram"]["layers_offloaded"] == 38 and split["helpers"][0]["blocks"] == 42
    assert split["helpers"][0]["vram"] is None and split["helpers"][0]["memory"]["weights_gib"] > 19


def test_a_cuda_helper_needs_a_cache_type_its_card_has_a_kernel_for():
    import pulumi

    values = cards_values()
    values["models"]["chat"].update(cache_type_k="q4_1", cache_type_v="q4_1")
    with pytest.raises(pulumi.RunError, match=r"models\.chat\.cache_type_k.*no flash-attention kernel"):
        run_cards(values)


def test_a_router_beside_a_split_on_its_pool_counts_the_helpers_as_it_counts_servers():
    """rtx3090-library's router on time-sliced cards (two pods a card) beside a 70B split over two more nodes of the
    pool: the router's VRAM budget leaves room for the helper as for any server beside it (the plan assumes a
    time-sliced card may be shared), so here nothing is left and the plan says which servers took it."""
    import pulumi

    values = copy.deepcopy(plain_values("rtx3090-library"))
    values["node_pools"]["rtx3090"].update(nodes=3, gpu_shares=2)
    big = copy.deepcopy(cards_values()["models"]["chat"])
    big.update(node_pool="rtx3090", name="big", ctx_size=8192)
    big["rpc"]["helpers"][0]["node_pool"] = "rtx3090"
    for key in ("exposure", "api_key"):
        big.pop(key, None)
    values["models"]["big"] = big
    secrets = {k: TEST_SECRETS[k] for k in ("gateway_master_key", "openrouter_api_key")} | {"chat_api_key": "k" * 32}
    with pytest.raises(pulumi.RunError) as caught:
        run_values(values, secrets, stack="router-beside-split")
    message = str(caught.value)
    assert "node_pools.rtx3090.vram" in message and "leaves the router no VRAM" in message
    assert "beside big, big-rpc-0" in message, message


def test_the_summary_says_where_the_main_servers_other_blocks_are(cards_run):
    """The capacity table's VRAM cell of a split's main server names its helpers' blocks: 39/80 alone would read as
    a partial offload whose other blocks run from system RAM."""
    from render.output import plan_tables

    server = cards_run.outputs["capacity_plan"]["servers"]["chat"]
    here, helpers = server["split"]["main"]["blocks"], server["split"]["helpers"][0]["blocks"]
    [row] = [line for line in plan_tables(cards_run.outputs["capacity_plan"]) if line.strip().startswith("llama-chat ")]
    assert f"({here}/80 layers, {helpers} on its 1 RPC helper)" in row, row
    assert here + helpers == 80
