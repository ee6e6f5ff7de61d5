"""Models on demand: the router's residency limit is planned from memory (planning/residency.py)
and rendered as --models-max; the preset ConfigMap holds each model's single-model flags."""

from __future__ import annotations

import itertools

import json
from pathlib import Path

import copy

import pulumi
import pytest

from common.quantity import gib
from conftest import plain_values, run_stack_file, stack_file_config
from render.manifests import manifests

STACK = "rtx3090-library"
SECRETS = {"chat_api_key": "library-key-5e1d", "gateway_master_key": "master-0d9e", "openrouter_api_key": "or-key-2a44"}


def config() -> dict:
    return stack_file_config(STACK)


def library(c: dict) -> dict:
    return c["inference-plane:models"]["library"]


def rendered(c: dict):
    run = run_stack_file(STACK, c, SECRETS)
    files = list(manifests(run).values())
    (deployment,) = [m for m in files if m["kind"] == "Deployment"]
    (config_map,) = [m for m in files if m["kind"] == "ConfigMap"]
    return run, deployment, config_map


def test_the_rendered_limit_is_the_largest_count_any_set_of_which_fits_the_card():
    """No model is assumed resident (b10729 has no pin; its LRU evicts the model loaded at start
    first): every set of `limit` models the router can reach fits the card and the pod's RAM."""
    run, deployment, _ = rendered(config())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    limit = int(args[args.index("--models-max") + 1])
    plan = run.outputs["capacity_plan"]["servers"]["library"]["residency"]
    card = 24 - 1  # the pool's 24 GiB less llama.cpp's 1 GiB free per GPU
    assert plan["max_loaded"] == limit == 2 and plan["vram_budget_gib"] == card
    models = plan["models"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    memory_limit = float(container["resources"]["limits"]["memory"].removesuffix("Gi"))
    for resident in itertools.combinations(models.values(), limit):
        assert sum(m["vram_gib"] for m in resident) <= card
        assert sum(m["ram_gib"] for m in resident) <= memory_limit
    # ...and one more could not: the limit is the largest safe one.
    assert any(sum(m["vram_gib"] for m in more) > card for more in itertools.combinations(models.values(), limit + 1))
    # The swap cost and the speed of each model are in the plan.
    for m in models.values():
        assert 0 < m["swap_seconds"]["warm"] <= m["swap_seconds"]["cold"] and m["decode_predicted_tok_s"]["half"] > 0


def test_each_preset_section_is_the_single_model_command_line_and_the_router_keeps_the_shared_flags():
    from config.types import ModelServer
    from engines import engine_of

    _, deployment, config_map = rendered(config())
    preset = config_map["data"]["models.ini"]
    fetched = json.loads(config_map["data"]["library.json"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in preset.splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        elif "=" in line and current is not None:
            key, value = (part.strip() for part in line.split("=", 1))
            current[key] = value
    server = ModelServer.model_validate(library(config()))
    assert list(sections) == list(server.on_demand.models)
    for name, keys in sections.items():
        single = engine_of(server.as_single(name)).args(server.as_single(name))
        # The download is the init container's (library.json); the section keeps every other flag.
        assert "hf-repo" not in keys and fetched[name]["hf_repo"] == single[single.index("--hf-repo") + 1]
        assert keys["ctx-size"] == single[single.index("--ctx-size") + 1]
        # The router's flags win over a section's (server-models.cpp:548-552): none is repeated there.
        assert not {"host", "port", "api-key-file", "metrics"} & set(keys)
        assert ("load-on-startup" in keys) == server.on_demand.models[name].pinned
    assert keys_of(container["args"]) >= {"--models-preset", "--models-max", "--api-key-file", "--metrics", "--host", "--port"}
    assert list(fetched) == list(sections)
    # The preset is mounted where the router reads it; a change restarts nothing (the keeper applies it).
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/llama-router"]
    volume = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]][0]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    # The router reads the served preset (the init container and keeper write it on the scratch volume,
    # less any model not fetched), made from this one.
    served = container["args"][container["args"].index("--models-preset") + 1]
    scratch = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "scratch"][0]
    assert served.startswith(scratch + "/")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    init_env = {e["name"]: e["value"] for e in init["env"]}
    assert init_env["SERVED_PRESET"] == served and init_env["PRESET"] == f"{mount['mountPath']}/models.ini"
    assert "subPath" not in mount  # the kubelet updates whole-file mounts in place
    assert not any("digest" in a for a in deployment["spec"]["template"]["metadata"].get("annotations", {}))


def keys_of(args: list[str]) -> set[str]:
    return {a for a in args if a.startswith("--")}


def test_a_limit_above_the_safe_one_is_refused():
    c = config()
    library(c)["on_demand"]["max_loaded"] = 3
    with pytest.raises(pulumi.RunError, match=r"models.library.on_demand.max_loaded: 3 is not safe: qwen3-30b-a3b, "
                       r"qwen3-14b, gemma-3-12b loaded together need .* GiB of RAM and 3\d.\d GiB of VRAM, the router has "
                       r"59.9 GiB of RAM and 23.0 GiB of VRAM; remove it \(planned: 2\)"):
        run_stack_file(STACK, c, SECRETS)


def test_a_model_that_can_never_load_is_refused_by_name():
    c = config()
    del library(c)["on_demand"]["models"]["qwen3-30b-a3b"]["cpu_moe_layers"]
    c["inference-plane:node_pools"]["rtx3090"]["vram"] = "16Gi"
    with pytest.raises(pulumi.RunError, match=r"models.library.on_demand.models.qwen3-30b-a3b: can never be loaded: "
                       r"it needs .* and 18.9 GiB of VRAM .* the router has 59.9 GiB of RAM and 15.0 GiB of VRAM; .*more "
                       r"cpu_moe_layers"):
        run_stack_file(STACK, c, SECRETS)


def test_more_pinned_models_than_may_be_resident_are_refused():
    """Each is loaded at start; past the limit the router would evict the first again."""
    c = config()
    for name in ("qwen3-14b", "qwen3-30b-a3b"):
        library(c)["on_demand"]["models"][name]["pinned"] = True
    with pytest.raises(pulumi.RunError, match=r"models.library.on_demand.models: 3 models are pinned \(loaded at start: "
                       r"qwen3-8b, qwen3-14b, qwen3-30b-a3b\) but only 2 may be resident at once; pin at most 2"):
        run_stack_file(STACK, c, SECRETS)


def test_a_router_setting_hf_repo_or_running_embeddings_is_refused():
    c = config()
    library(c)["hf_repo"] = "Qwen/Qwen3-8B-GGUF:Q4_K_M"
    with pytest.raises(pulumi.RunError, match=r"models.library.hf_repo: a server with on_demand models loads them by name"):
        run_stack_file(STACK, c, SECRETS)


def test_more_room_allows_more_resident_models():
    c = config()
    pool = c["inference-plane:node_pools"]["rtx3090"]
    pool["vram"] = "48Gi"
    run, deployment, _ = rendered(c)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert int(args[args.index("--models-max") + 1]) > 2
    assert run.outputs["capacity_plan"]["servers"]["library"]["residency"]["vram_budget_gib"] == 47


def test_the_fill_of_a_full_resident_set_is_said_from_every_set_the_router_can_reach():
    """Worst, typical and best share of the VRAM budget over every set of max_loaded models (counted here
    by enumeration); the best is within the budget, and the render's summary says the same figures."""
    run, _, _ = rendered(config())
    plan = run.outputs["capacity_plan"]["servers"]["library"]["residency"]
    budget, limit = plan["vram_budget_gib"], plan["max_loaded"]
    shares = [sum(m["vram_gib"] for m in s) / budget for s in itertools.combinations(plan["models"].values(), limit)]
    assert plan["fill"]["worst"] == pytest.approx(min(shares), abs=0.01)
    assert plan["fill"]["typical"] == pytest.approx(sum(shares) / len(shares), abs=0.01)
    assert plan["fill"]["best"] == pytest.approx(max(shares), abs=0.01) and max(shares) <= 1
    from render.output import residency_lines

    (line, *rows) = residency_lines(run.outputs["capacity_plan"]["servers"]["library"])
    assert (f"any {limit} of 5 resident" in line and f"holds {min(shares):.0%}-{max(shares):.0%} of the 23.0 GiB VRAM "
            f"budget (typical {sum(shares) / len(shares):.0%})" in line)
    assert [r.split()[0] for r in rows[1:]] == list(plan["models"])


def test_a_vision_projector_is_counted_where_llama_cpp_loads_it():
    """gemma-3-12b ships an mmproj that llama.cpp loads beside it, on the GPU when the model offloads:
    its weights and its compute buffer (flash attention on CUDA; the larger buffer where not known) are in
    the VRAM figure, the download grows by the file, and the plan says the model is multimodal."""
    from engines import engine_of
    from planning.catalog import facts_for
    from plane import parse_stack

    stack = parse_stack(plain_values(STACK))
    server = stack.models["library"]
    pool = stack.node_pools[server.node_pool]
    gemma = server.as_single("gemma-3-12b")
    facts = facts_for(gemma)
    text_only = gemma.model_copy(update={"facts": facts.model_copy(update={"mmproj": None})})
    engine = engine_of(gemma)
    with_projector, _ = engine.estimate(gemma, pool, "p")
    without, _ = engine.estimate(text_only, pool, "p")
    assert with_projector.multimodal and not without.multimodal
    assert with_projector.vram.total_gib - without.vram.total_gib == pytest.approx((814.6 + 121.25) / 1024, abs=1e-6)
    assert with_projector.memory.total_gib == pytest.approx(without.memory.total_gib)
    assert gib(with_projector.weights) - gib(without.weights) == pytest.approx(814.6 / 1024, abs=0.1)
    vulkan = pool.model_copy(update={"vram": None, "gpu_resource": "gpu.intel.com/i915", "backend": "vulkan"})
    on_igpu, _ = engine.estimate(gemma.model_copy(update={"image": "ghcr.io/ggml-org/llama.cpp:server-vulkan-b10731"}), vulkan, "p")
    plain, _ = engine.estimate(text_only.model_copy(update={"image": "ghcr.io/ggml-org/llama.cpp:server-vulkan-b10731"}), vulkan, "p")
    assert on_igpu.memory.total_gib - plain.memory.total_gib == pytest.approx((814.6 + 1132.0) / 1024, abs=1e-6)
    run, _, _ = rendered(config())
    models = run.outputs["capacity_plan"]["servers"]["library"]["residency"]["models"]
    assert {name for name, m in models.items() if m["multimodal"]} == {"gemma-3-12b"}


SOAK = json.loads((Path(__file__).resolve().parent.parent / "bench" / "results-router-soak-h200.json").read_text())


def test_the_plan_matches_what_the_real_router_did_on_a_gpu():
    """Against the recorded soak of the real router (bench/results-router-soak-h200.json, make router-soak):
    every model's VRAM within 10 % of what its child held, the projector counted; every warm swap within
    20 % of the measured median; the cold load, at the middle of the run's disk rate, within 25 %."""
    run, _, _ = rendered(config())
    models = run.outputs["capacity_plan"]["servers"]["library"]["residency"]["models"]
    for name, measured in SOAK["child_vram_gib"].items():
        assert models[name]["vram_gib"] == pytest.approx(measured, rel=0.10), name
    for name, measured in SOAK["warm_swap_median_s"].items():
        assert models[name]["swap_seconds"]["warm"] == pytest.approx(measured, rel=0.20), name
    # The disk's rate is known only roughly (0.9-1.1 GiB/s): the cold check is at its middle, within 25 %.
    for rate in [sum(SOAK["disk_gib_per_s"]) / 2]:
        c = config()
        c["inference-plane:startup"] = {**c.get("inference-plane:startup", {}), "load_mib_per_s": rate * 1024}
        at_rate = rendered(c)[0].outputs["capacity_plan"]["servers"]["library"]["residency"]["models"]
        for name, measured in SOAK["cold_load_s"].items():
            assert at_rate[name]["swap_seconds"]["cold"] == pytest.approx(measured, rel=0.25), (name, rate)
    assert SOAK["peak_vram_gib"] <= SOAK["vram_budget_gib"] and SOAK["failed_loads"] == 0
