"""Capacity planning: the memory arithmetic, placement, and what the program refuses."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import CapacityError
from planning.capacity import _place, decode_bound_tok_s
from engines import engine_of
from plane import plan_capacity as plan
from config.catalog import facts_for
from config.gpus import BACKEND_OVERHEAD
from engines.llamacpp_memory import llamacpp_estimate as estimate_memory
from plane import parse_stack
from config.types import ModelFacts
from conftest import homelab_plain_values, run_values
from render.output import render_stack

HOMELAB = parse_stack(homelab_plain_values())
CHAT = HOMELAB.models["chat"]
FACTS = ModelFacts(params_b=35, active_params_b=3, layers=40, full_attention_layers=10, kv_heads=2, head_dim=256,
                   recurrent_state_mib=63)

contexts = st.integers(min_value=256, max_value=262144)
slot_counts = st.integers(min_value=1, max_value=16)
weights = st.floats(min_value=0.1, max_value=120).map(lambda g: f"{g:.2f}Gi")
backends = st.sampled_from(sorted(BACKEND_OVERHEAD))


def total(model, facts=FACTS, backend="vulkan") -> float:
    return estimate_memory(model, facts, backend).total_gib


@given(contexts, contexts, backends)
def test_estimate_grows_with_context(a, b, backend):
    small, large = sorted((a, b))
    assert total(CHAT.model_copy(update={"ctx_size": small}), backend=backend) <= total(
        CHAT.model_copy(update={"ctx_size": large}), backend=backend
    )


@given(slot_counts, slot_counts)
def test_estimate_grows_with_slots(a, b):
    few, many = sorted((a, b))
    low = total(CHAT.model_copy(update={"parallel": few}))
    high = total(CHAT.model_copy(update={"parallel": many}))
    # A hybrid model's recurrent state and checkpoints are per slot: strictly more when more slots.
    assert low < high if few < many else low == high


@given(weights, weights, backends)
def test_estimate_grows_with_weights(a, b, backend):
    small, large = sorted((a, b), key=lambda w: float(w[:-2]))
    assert total(CHAT.model_copy(update={"weights": small}), backend=backend) <= total(
        CHAT.model_copy(update={"weights": large}), backend=backend
    )


def test_kv_cache_counts_only_full_attention_layers():
    hybrid = estimate_memory(CHAT, FACTS, "vulkan").kv_gib
    dense = estimate_memory(CHAT, FACTS.model_copy(update={"full_attention_layers": None}), "vulkan").kv_gib
    # 10 of 40 layers: a quarter of what a dense model of the same shape would need.
    assert dense == pytest.approx(4 * hybrid)
    # 10 layers x 2 KV heads x 256 x (K+V) x 2 bytes = 20 KiB per token; 16384 tokens = 320 MiB.
    assert hybrid * 1024 == pytest.approx(320)


def test_vulkan_overhead_is_the_seeds_measurement():
    assert 1 + BACKEND_OVERHEAD["vulkan"] == pytest.approx(7.54 / 5.2)


def test_default_host_caches_are_counted_in_full():
    capped = estimate_memory(CHAT, FACTS, "vulkan").host_caches_gib
    defaults = estimate_memory(CHAT.model_copy(update={"cache_ram_mib": None, "ctx_checkpoints": None}), FACTS, "vulkan")
    # 8 GiB prompt cache + 32 checkpoints x 4 slots x 63 MiB.
    assert defaults.host_caches_gib == pytest.approx(8 + 32 * 4 * 63 / 1024)
    assert defaults.host_caches_gib > capped


def test_decode_bound_matches_the_seeds_measurements():
    pool = HOMELAB.node_pools["iris-xe"]

    def read(model):
        return engine_of(model).estimate(model, pool, "models.chat")[0].read_per_token

    moe = decode_bound_tok_s(CHAT, read(CHAT.model_copy(update={"facts": FACTS})), pool)
    # An upper bound: the MoE measured 11.59 tok/s, reading ~1.85 GB/token of 53.9 GB/s.
    assert moe >= 11.59
    assert 53.9 / moe == pytest.approx(1.85, rel=0.03)
    dense_facts = FACTS.model_copy(update={"params_b": 27, "active_params_b": None})
    # A dense 27B of the same quant: its own size (params x bits), not the MoE's download size.
    dense_chat = CHAT.model_copy(update={"weights": None, "facts": dense_facts})
    dense = decode_bound_tok_s(dense_chat, read(dense_chat), pool)
    # A dense 27B reads ~16.5 GB/token and measured 3.3 tok/s: bandwidth-bound, so near the bound.
    assert dense == pytest.approx(3.3, rel=0.05)


def test_homelab_fits_the_seeds_headroom():
    result = plan(HOMELAB)
    chat = result.servers["chat"]
    assert chat.memory_request == "24Gi" and chat.memory_limit == "32Gi"
    assert chat.estimate.total_gib <= 32
    assert result.servers["embed"].estimate.total_gib <= 4
    assert result.fits()


@st.composite
def one_node_stacks(draw):
    values = homelab_plain_values()
    values["node_pools"]["iris-xe"]["allocatable"] = f"{draw(st.integers(8, 200))}Gi"
    values["node_pools"]["iris-xe"]["reserved"] = f"{draw(st.integers(0, 7))}Gi"  # below allocatable (else refused)
    for key in ("chat", "embed"):
        values["models"][key]["ctx_size"] = draw(st.sampled_from([2048, 8192, 16384, 65536]))
        values["models"][key]["resources"]["memory_request"] = None
        values["models"][key]["resources"]["memory_limit"] = None
    # The 35B's file is 19.6 GiB by its facts; a size far below that is refused (engines/llamacpp.py size_problems).
    values["models"]["chat"]["weights"] = f"{draw(st.integers(15, 80))}Gi"
    values["model_cache"]["size"] = "100Gi"  # memory is under test here; the cache check has its bad stacks
    return parse_stack(values)


@settings(max_examples=60, deadline=None)
@given(one_node_stacks())
def test_plan_fits_exactly_when_the_node_sum_is_within_budget(stack):
    pool = stack.node_pools["iris-xe"]
    budget = (int(pool.allocatable[:-2]) - int(pool.reserved[:-2]))
    # Derived limits: 10% above the estimate, in whole GiB; derived request = limit.
    needs = []
    for model in stack.models.values():
        est = total(model, facts=facts_for(model))
        needs.append(max(1, -(-est * 1.1 // 1)))
    try:
        result = plan(stack)
    except CapacityError as error:
        assert sum(needs) > budget, error
        assert "node_pools.iris-xe: node 1 of 1" in str(error)
    else:
        assert sum(needs) <= budget
        assert result.fits()


@given(st.integers(1, 4), st.integers(1, 4), st.floats(1, 100))
def test_more_replicas_never_lower_the_per_node_need(nodes, replicas, need):
    stack = HOMELAB.model_copy(
        update={"node_pools": {"iris-xe": HOMELAB.node_pools["iris-xe"].model_copy(update={"nodes": nodes})}}
    )
    base = plan(HOMELAB).servers["chat"]
    server = dataclasses.replace(base, replicas=replicas, estimate=dataclasses.replace(
        base.estimate, weights_gib=need, kv_gib=0, recurrent_gib=0, overhead_gib=0, host_caches_gib=0),
        memory_request="1Gi")
    fewer, _ = _place(stack, {"chat": server})
    more, _ = _place(stack, {"chat": dataclasses.replace(server, replicas=replicas + 1)})
    assert max(n.planned_gib for n in more) >= max(n.planned_gib for n in fewer)
    assert sum(n.planned_gib for n in more) == pytest.approx(sum(n.planned_gib for n in fewer) + need)


def test_a_context_that_no_longer_fits_is_refused(homelab_values):
    homelab_values["models"]["chat"]["ctx_size"] = 131072
    with pytest.raises(pulumi.RunError) as caught:
        run_values(homelab_values)
    message = str(caught.value)
    assert "models.chat.resources.memory_limit: 32Gi is below the estimate of 33.4 GiB" in message
    assert "KV 2.50" in message and "lower ctx_size" in message


def test_accepted_risk_lets_a_tight_limit_through(homelab_values):
    homelab_values["models"]["chat"]["ctx_size"] = 131072
    homelab_values["models"]["chat"]["resources"]["accepted_risk"] = "long contexts are rare; prompt cache evicts"
    run = run_values(homelab_values)
    assert run.outputs["capacity_plan"]["servers"]["chat"]["estimate"]["total_gib"] > 32


def test_two_big_engines_on_one_node_are_refused(homelab_values):
    homelab_values["node_pools"]["iris-xe"].update(memory="128Gi", allocatable="116Gi", reserved="0Gi")
    for key in ("chat", "embed"):
        homelab_values["models"][key].update(weights="45Gi", webui=False)
        homelab_values["models"][key]["resources"].update(memory_request="70Gi", memory_limit="80Gi")
    homelab_values["models"]["embed"]["facts"] = FACTS.model_dump()
    homelab_values["models"]["embed"]["hf_repo"] = "acme/Big-GGUF:Q4_K_M"
    with pytest.raises(pulumi.RunError) as caught:
        run_values(homelab_values)
    message = str(caught.value)
    assert "node_pools.iris-xe: node 1 of 1 would hold" in message
    assert "offers 116.0 GiB" in message and "llama-server 70.0 GiB" in message
    # The embedding server holds more than its request: its estimate counts, not the request.
    assert "llama-embed 73.4 GiB" in message


def test_derived_memory_when_config_gives_none(homelab_values):
    homelab_values["models"]["chat"]["resources"].update(memory_request=None, memory_limit=None)
    run = run_values(homelab_values)
    container = run.one("Deployment", "llama-server").inputs["spec"]["template"]["spec"]["containers"][0]
    estimate = run.outputs["capacity_plan"]["servers"]["chat"]["estimate"]["total_gib"]
    limit = int(container["resources"]["limits"]["memory"].removesuffix("Gi"))
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"]
    assert estimate * 1.1 <= limit < estimate * 1.1 + 1


def test_weights_are_derived_from_parameters_and_quant(homelab_values):
    del homelab_values["models"]["chat"]["weights"]
    run = run_values(homelab_values)
    server = run.outputs["capacity_plan"]["servers"]["chat"]
    # 34.66e9 parameters x 4.85 bits / 8 = 21.0 GB = 19.57 GiB; the real-shape file llama.cpp loads
    # (tests/test_memory_oracle.py) holds 19.70 GiB.
    assert server["estimate"]["weights_gib"] == pytest.approx(34.66e9 * 4.85 / 8 / 2**30, abs=0.01)
    assert server["weights"] == "19.6Gi"


def test_unknown_model_needs_its_facts(homelab_values):
    homelab_values["models"]["chat"]["hf_repo"] = "acme/Mystery-GGUF:Q4_K_M"
    with pytest.raises(pulumi.RunError, match=r"models.chat.facts: no architecture facts for acme/Mystery-GGUF"):
        run_values(homelab_values)
    homelab_values["models"]["chat"]["facts"] = FACTS.model_dump()
    assert run_values(homelab_values).outputs["capacity_plan"]["nodes"][0]["free_gib"] > 0


def test_plan_is_a_stack_output_and_written_beside_the_manifests(tmp_path, homelab_run):
    result = render_stack("homelab", tmp_path / "out")
    written = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert written == homelab_run.outputs["capacity_plan"]
    assert "capacity_plan" not in homelab_run.secret_outputs
    assert written["nodes"][0]["offers_gib"] == 54.0
    assert "plan.json" not in (tmp_path / "out" / "kustomization.yaml").read_text()
    assert "iris-xe/1" in result.summary() and "decode <=" in result.summary()


def test_mean_pooling_embedder_with_a_micro_batch_below_its_context_is_refused(homelab_values):
    embed = next(k for k, m in homelab_values["models"].items() if m.get("role") == "embedding")
    homelab_values["models"][embed]["facts"] = {"params_b": 0.6, "layers": 28, "kv_heads": 8, "head_dim": 128,
                                                "pooling": "mean"}
    homelab_values["models"][embed].pop("ubatch_size", None)
    ctx = homelab_values["models"][embed]["ctx_size"]
    with pytest.raises(CapacityError, match=rf"models.{embed}.ubatch_size: mean pooling .* inputs over 512 tokens "
                                            rf"would be refused although ctx_size is {ctx}; set ubatch_size: {ctx}"):
        plan(parse_stack(homelab_values))
    homelab_values["models"][embed]["ubatch_size"] = ctx
    plan(parse_stack(homelab_values))


def test_a_request_below_the_estimate_is_warned_about(homelab_values):
    """The seed's chat server asks for 24Gi and uses ~31 GiB: allowed, but the kubelet evicts pods
    above their request first, so the render says so; a request at the estimate says nothing."""
    from conftest import run_values

    run = run_values(homelab_values)
    (warning,) = [line for line in run.logs if "memory_request" in line]
    assert warning.startswith("models.chat.resources.memory_request 24Gi is below the estimate of")
    homelab_values["models"]["chat"]["resources"]["memory_request"] = None
    assert [line for line in run_values(homelab_values).logs if "memory_request" in line] == []


def test_quantities_are_parsed_once_where_they_are_made(monkeypatch):
    """Config quantities are parsed at validation (config/values.py makes each a Quantity) and the plan's
    own when it makes them: planning every shipped stack parses no quantity string handed to it."""
    import sys

    import common.quantity as quantity
    from conftest import STACKS, plain_values

    stacks = [parse_stack(plain_values(stack)) for stack in STACKS]
    assert isinstance(HOMELAB.node_pools["iris-xe"].allocatable, quantity.Quantity)
    original = quantity._parse
    reparsed: list[str] = []

    def parse(text):
        if sys._getframe(1).f_code.co_name != "__new__":
            reparsed.append(text)
        return original(text)

    monkeypatch.setattr(quantity, "_parse", parse)
    for stack in stacks:
        plan(stack)
    assert reparsed == []


def test_a_chat_server_slower_than_people_read_is_said_so():
    """Issue #45 item 6: a predicted 1 tok/s came with no word that it is too slow to chat with. A dense 32B
    model on cpu-cluster's DDR5 nodes: the warning carries the plan's own figures and its measured-CPU range."""
    from conftest import CPU_SECRETS, run_stack_file, stack_file_config
    from planning.capacity import USABLE_DECODE_TOK_S

    config = stack_file_config("cpu-cluster")
    chat = config["inference-plane:models"]["chat"]
    chat["hf_repo"] = "Qwen/Qwen3-32B-GGUF:Q4_K_M"
    chat.pop("weights")
    run = run_stack_file("cpu-cluster", config, CPU_SECRETS)
    server = run.outputs["capacity_plan"]["servers"]["chat"]
    predicted, high = server["decode_predicted_tok_s"], server["decode_range_tok_s"]["half"][1]
    assert predicted["half"] < USABLE_DECODE_TOK_S
    (note,) = [line for line in run.logs if "slower than people read" in line]
    assert note.startswith(f"models.chat: decode is predicted at {predicted['half']:.1f} tok/s at half context "
                           f"({predicted['full']:.1f} full), up to {high:.1f} (this node's CPU not measured, make host-profile)")
    assert noted_slow(run) == predicted_slow(run) == {("chat", None)}


def predicted_slow(run) -> set[tuple[str, str | None]]:
    """The chat servers and library models whose plan predicts a half-context decode under the line."""
    from planning.capacity import USABLE_DECODE_TOK_S

    slow = set()
    for key, server in run.outputs["capacity_plan"]["servers"].items():
        if run.config.models[key].role == "embedding":
            continue
        models = ({name: m.get("decode_predicted_tok_s") for name, m in server["residency"]["models"].items()}
                  if server.get("residency") else {None: server.get("decode_predicted_tok_s")})
        slow |= {(key, name) for name, p in models.items() if p and p["half"] < USABLE_DECODE_TOK_S}
    return slow


def noted_slow(run) -> set[tuple[str, str | None]]:
    import re
    found = set()
    for line in run.logs:
        if "slower than people read" in line:
            m = re.match(r"models\.([\w-]+)(?: \(library model ([^)]+)\))?: decode is predicted", line)
            found.add((m.group(1), m.group(2)))
    return found


@pytest.mark.parametrize("stack", __import__("conftest").STACKS)
def test_the_slow_note_names_exactly_the_chat_models_predicted_below_reading_speed(tmp_path, stack):
    """Across the shipped stacks' plans, servers and library models alike: a note for each chat model whose
    predicted half-context decode is under the line, and none for any other."""
    from render.output import render_stack

    run = render_stack(stack, tmp_path / "out").run
    assert noted_slow(run) == predicted_slow(run)
