"""Models on demand: which models may be resident together is planned from memory (planning/residency.py)
and held at run time by the admission proxy, which reads the plan's own figures and budget from the
ConfigMap (the router loads and evicts nothing itself); the preset holds each model's single-model flags."""

from __future__ import annotations

import itertools

import json
from pathlib import Path


import pulumi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    (config_map,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-files")]
    return run, deployment, config_map


def reachable_sets(models: dict, budget: float, ram_limit: float, cap=None) -> list[tuple[str, ...]]:
    """Every set of model names that can be resident, counted here from the plan's figures: the pinned
    models and any others whose VRAM fits the budget and RAM (with the router's 0.25 GiB) the limit."""
    pinned = tuple(n for n, m in models.items() if m["pinned"])
    others = [n for n in models if n not in pinned]
    found = []
    for count in range(len(others) + 1):
        for extra in itertools.combinations(others, count):
            names = pinned + extra
            if (sum(models[n]["vram_gib"] for n in names) <= budget
                    and sum(models[n]["ram_gib"] for n in names) + 0.25 <= ram_limit and (cap is None or len(names) <= cap)):
                found.append(names)
    return found


def test_the_proxy_holds_the_router_to_the_plan_and_every_set_it_can_reach_fits():
    """The router neither evicts nor loads on its own (no count, no autoload) and listens only on the
    loopback; the admission proxy, on the port the Service targets, reads the plan's own figures and budget
    from the ConfigMap; every set it can admit holds the pinned model and fits the card and the pod's memory
    limit, and the fullest need not be a count: three of the five fit together."""
    run, deployment, config_map = rendered(config())
    pod = deployment["spec"]["template"]["spec"]
    router, proxy = pod["containers"][0], next(c for c in pod["containers"] if c["name"] == "admission")
    args = router["args"]
    assert args[args.index("--models-max") + 1] == "0" and "--no-models-autoload" in args
    assert args[args.index("--host") + 1] == "127.0.0.1" and "ports" not in router
    router_port = int(args[args.index("--port") + 1])
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["ROUTER_URL"] == f"http://127.0.0.1:{router_port}"
    assert proxy["ports"] == [{"name": "http", "containerPort": int(env["LISTEN_PORT"]), "protocol": "TCP"}]
    (service,) = [m for m in manifests(run).values() if m["kind"] == "Service"]
    assert service["spec"]["ports"][0]["targetPort"] in ("http", int(env["LISTEN_PORT"]))
    folder, file_name = env["ADMISSION_PLAN_FILE"].rsplit("/", 1)
    assert any(m["mountPath"] == folder for m in proxy["volumeMounts"])
    admission = json.loads(config_map["data"][file_name])
    plan = run.outputs["capacity_plan"]["servers"]["library"]["residency"]
    card = 24 - 1  # the pool's 24 GiB less llama.cpp's 1 GiB free per GPU
    memory_limit = gib(router["resources"]["limits"]["memory"])
    assert admission["vram_budget_gib"] == plan["vram_budget_gib"] == card
    assert admission["ram_budget_gib"] == plan["ram_budget_gib"] and admission["host_gib"] == 0.25
    assert {n: (m["vram_gib"], m["ram_gib"], m["pinned"]) for n, m in admission["models"].items()} == {
        n: (m["vram_gib"], m["ram_gib"], m["pinned"]) for n, m in plan["models"].items()}
    # What the proxy admits (its own budget, whole GiB) is held by the pod's limit: every such set fits it.
    admitted = [s for s in reachable_sets(plan["models"], card, admission["ram_budget_gib"])
                if all(plan["models"][n]["pinned"] <= (n in s) for n in plan["models"])]
    assert admitted and all(sum(plan["models"][n]["ram_gib"] for n in s) + 0.25 <= memory_limit for s in admitted)
    assert all("qwen3-8b" in s for s in admitted)
    assert max(len(s) for s in admitted) == plan["most_resident"] == 3
    # The pod's limit is the budget the proxy admits within (whole GiB), not the largest set of today's library:
    # a library edit within the card changes no pod template (issue #48).
    assert memory_limit == int(admission["ram_budget_gib"])
    for m in plan["models"].values():
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
        # A pin is the proxy's (admission.json), never a preset line: moving it must not change a section.
        assert "load-on-startup" not in keys
        assert json.loads(config_map["data"]["admission.json"])["models"][name]["pinned"] == server.on_demand.models[name].pinned
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


def test_max_loaded_caps_the_sets_the_proxy_can_reach():
    c = config()
    library(c)["on_demand"]["max_loaded"] = 2
    run, _, config_map = rendered(c)
    plan = run.outputs["capacity_plan"]["servers"]["library"]["residency"]
    assert plan["max_loaded"] == plan["most_resident"] == 2
    assert json.loads(config_map["data"]["admission.json"])["max_loaded"] == 2


def test_a_model_that_can_never_load_is_refused_by_name():
    c = config()
    del library(c)["on_demand"]["models"]["qwen3-30b-a3b"]["cpu_moe_layers"]
    c["inference-plane:node_pools"]["rtx3090"]["vram"] = "16Gi"
    library(c)["on_demand"]["models"]["qwen3-8b"]["pinned"] = False
    with pytest.raises(pulumi.RunError, match=r"models.library.on_demand.models.qwen3-30b-a3b: can never be loaded: "
                       r"it needs .* and 18.9 GiB of VRAM .* the router has 59.9 GiB of RAM and 15.0 GiB of VRAM; .*more "
                       r"cpu_moe_layers"):
        run_stack_file(STACK, c, SECRETS)


def test_pinned_models_that_do_not_fit_together_or_leave_no_room_are_refused():
    """A pinned model is kept (the proxy never unloads it): the pinned ones must fit together, and every
    other model beside them; more pinned than max_loaded is refused too."""
    # The figure said is the sum of the three models' own (each held to a real card elsewhere).
    planned = rendered(config())[0].outputs["capacity_plan"]["servers"]["library"]["residency"]["models"]
    together = sum(planned[name]["vram_gib"] for name in ("qwen3-8b", "qwen3-14b", "qwen3-30b-a3b"))
    assert together > 23.0
    c = config()
    for name in ("qwen3-14b", "qwen3-30b-a3b"):
        library(c)["on_demand"]["models"][name]["pinned"] = True
    with pytest.raises(pulumi.RunError, match=r"models.library.on_demand.models: the pinned models qwen3-8b, qwen3-14b, "
                       r"qwen3-30b-a3b \(loaded at start and kept\) need .* GiB of RAM and "
                       rf"{together:.1f} GiB of VRAM together, the "
                       r"router has 59.9 GiB of RAM and 23.0 GiB of VRAM; pin fewer"):
        run_stack_file(STACK, c, SECRETS)
    c = config()
    library(c)["on_demand"]["models"]["qwen3-14b"]["pinned"] = True
    with pytest.raises(pulumi.RunError, match=r"models.library.on_demand.models.qwen3-30b-a3b: can never be loaded beside "
                       r"the pinned qwen3-8b, qwen3-14b: .*pin fewer models, or remove it"):
        run_stack_file(STACK, c, SECRETS)
    c = config()
    library(c)["on_demand"]["models"]["llama-3.1-8b"]["pinned"] = True
    library(c)["on_demand"]["max_loaded"] = 1
    with pytest.raises(pulumi.RunError, match=r"models.library.on_demand.models: 2 models are pinned \(loaded at start and "
                       r"kept: qwen3-8b, llama-3.1-8b\) but max_loaded is 1; pin at most 1 or raise max_loaded"):
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
    run, _, _ = rendered(c)
    plan = run.outputs["capacity_plan"]["servers"]["library"]["residency"]
    assert plan["vram_budget_gib"] == 47 and plan["most_resident"] == 5


def test_the_fill_of_a_full_resident_set_is_said_from_every_set_the_proxy_can_reach():
    """Worst, typical and best share of the VRAM budget over every full set (one beside which no other
    model fits: where the next request unloads one), counted here by enumeration; the best is within the
    budget, and the render's summary says the same figures."""
    run, deployment, _ = rendered(config())
    plan = run.outputs["capacity_plan"]["servers"]["library"]["residency"]
    budget, models = plan["vram_budget_gib"], plan["models"]
    limit = gib(deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])
    sets = reachable_sets(models, budget, limit)
    full = [s for s in sets if not any(set(s) | {n} == set(t) for t in sets for n in models if n not in s)]
    shares = [sum(models[n]["vram_gib"] for n in s) / budget for s in full]
    assert plan["fill"]["worst"] == pytest.approx(min(shares), abs=0.01)
    assert plan["fill"]["typical"] == pytest.approx(sum(shares) / len(shares), abs=0.01)
    assert plan["fill"]["best"] == pytest.approx(max(shares), abs=0.01) and max(shares) <= 1
    # The goal for the shipped library: a full set typically uses at least 85 % of the card.
    assert plan["fill"]["typical"] >= 0.85
    from render.output import residency_lines

    (line, *rows) = residency_lines(run.outputs["capacity_plan"]["servers"]["library"])
    assert ("up to 3 of 5 at once" in line and "never qwen3-8b (pinned)" in line
            and f"holds {min(shares):.0%}-{max(shares):.0%} of the budget (typical {sum(shares) / len(shares):.0%})" in line)
    assert [r.split()[0] for r in rows[1:]] == list(models)


def test_a_vision_projector_is_counted_where_llama_cpp_loads_it():
    """gemma-3-12b ships an mmproj that llama.cpp loads beside it, on the GPU when the model offloads:
    its weights and its compute buffer (flash attention on CUDA; the larger buffer where not known) are in
    the VRAM figure, the download grows by the file, and the plan says the model is multimodal."""
    from engines import engine_of
    from config.catalog import facts_for
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


ADMITTED = json.loads((Path(__file__).resolve().parent.parent / "bench" / "results-router-soak-h200-admission.json").read_text())


def test_the_admission_proxy_held_the_real_router_to_the_plan_on_a_gpu():
    """The recorded soak through the admission proxy (bench/results-router-soak-h200-admission.json, make
    router-soak on an H200): the plan it ran is today's; every request answered 200, the card's peak within
    the budget, every resident set below its planned sum, the pinned model resident from its load to the
    end, three models resident at once (the count plan allowed two), and the router evicted nothing itself."""
    run, _, _ = rendered(config())
    plan = run.outputs["capacity_plan"]["servers"]["library"]["residency"]
    assert {n: m["vram_gib"] for n, m in ADMITTED["plan"]["models"].items()} == {n: m["vram_gib"] for n, m in plan["models"].items()}
    assert ADMITTED["requests"]["sent"] >= 150 and ADMITTED["requests"]["answered_200"] == ADMITTED["requests"]["sent"]
    assert ADMITTED["gpu"]["peak_over_baseline_gib"] <= plan["vram_budget_gib"]
    assert all(s["peak_gib"] <= s["planned_vram_gib"] for s in ADMITTED["resident_sets"])
    assert ADMITTED["most_running_seen"] == plan["most_resident"] == 3 and ADMITTED["evictions"] == []
    loaded = [statuses for _, statuses in ADMITTED["status_changes"] if statuses["qwen3-8b"] == "loaded"]
    first = next(i for i, (_, st) in enumerate(ADMITTED["status_changes"]) if st["qwen3-8b"] == "loaded")
    assert len(loaded) == len(ADMITTED["status_changes"]) - first, "the pinned model was unloaded"


def test_the_picture_draws_each_full_resident_set_with_each_models_share(tmp_path):
    """plan.svg: one bar per full set the proxy can reach (the same sets the test above counts), each
    model's rectangle its planned VRAM, the set's total within the dashed budget."""
    import xml.etree.ElementTree as ET

    from render.output import render_stack

    render_stack(STACK, tmp_path / "out")
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())["servers"]["library"]["residency"]
    svg = ET.parse(tmp_path / "out" / "plan.svg").getroot()
    rects = [r.attrib for r in svg.iter("{http://www.w3.org/2000/svg}rect") if "data-set" in r.attrib]
    rows: dict[str, dict] = {}
    for r in rects:
        row = rows.setdefault(r["data-set"], {"models": [], "budget": None})
        if r.get("data-part") == "budget":
            row["budget"] = float(r["data-gib"])
        else:
            row["models"].append((r["data-model"], float(r["data-gib"])))
    assert [[name for name, _ in row["models"]] for row in rows.values()] == plan["full_sets"]
    for row in rows.values():
        assert row["budget"] == pytest.approx(plan["vram_budget_gib"])
        assert all(gib == pytest.approx(plan["models"][name]["vram_gib"], abs=1e-3) for name, gib in row["models"])
        assert sum(gib for _, gib in row["models"]) <= row["budget"]
    # Every model is in some full set, and the pinned one in all.
    assert {n for s in plan["full_sets"] for n in s} == set(plan["models"])
    assert all("qwen3-8b" in s for s in plan["full_sets"])


def _brute_force(residency):
    """Every subset, the way the plan used to count them: the reference the walk is held to."""
    from incluster.fit import fits

    models = residency.models
    pinned = tuple(m for m in models if m.pinned)
    others = [m for m in models if not m.pinned]
    sets = [pinned + extra for count in range(len(others) + 1) for extra in itertools.combinations(others, count)
            if fits(residency.budget, [(m.vram_gib, m.ram_gib) for m in pinned + extra])]
    full = [s for s in sets if not any(fits(residency.budget, [(m.vram_gib, m.ram_gib) for m in s + (m,)])
                                       for m in models if m not in s)]
    return sets, full


def _library(figures, cap, on_card: bool, budget: float):
    """A residency of drawn models: (VRAM, RAM, pinned) each, on a card of ``budget`` or a CPU router."""
    from planning.residency import Residency, ResidentModel

    models = tuple(ResidentModel(name=f"m{i}", pinned=pinned and i == 0, ram_gib=round(ram, 2),
                                 vram_gib=round(vram, 2) if on_card else 0.0, weights_gib=1.0, swap_seconds={},
                                 decode_predicted_tok_s=None, estimate=None, vram=None)
                   for i, (vram, ram, pinned) in enumerate(figures))
    return Residency(cap=cap, ram_budget_gib=budget if not on_card else 60.0,
                     vram_budget_gib=budget if on_card else None, models=models)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 14), st.floats(0.2, 12), st.booleans()), min_size=1, max_size=9),
       st.sampled_from([None, 1, 2, 3]), st.booleans(), st.floats(6, 40))
def test_the_walk_finds_what_every_subset_would(figures, cap, on_card, budget):
    """The plan walks only the sets memory allows (a library of a hundred models plans in well under a second:
    `make bench`); on any small library its figures are those of enumerating every subset."""
    residency = _library(figures, cap, on_card, budget)
    sets, full = _brute_force(residency)
    if not sets:
        return
    assert residency.most_resident == max(len(s) for s in sets)
    assert sum(m.ram_gib for m in residency.worst()) == pytest.approx(max(sum(m.ram_gib for m in s) for s in sets))
    assert sum(m.vram_gib for m in residency.worst_vram()) == pytest.approx(max(sum(m.vram_gib for m in s) for s in sets))
    assert residency._walk.full_count == len(full)
    shares = [residency.share(s) for s in full]
    assert residency.fill() == pytest.approx({"worst": min(shares), "typical": sum(shares) / len(shares), "best": max(shares)})
    listed = {tuple(sorted(m.name for m in s)) for s in residency.full()}
    assert listed <= {tuple(sorted(m.name for m in s)) for s in full}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 14), st.floats(0.2, 12), st.booleans()), min_size=1, max_size=9),
       st.sampled_from([None, 2, 3]), st.booleans(), st.floats(6, 40))
def test_the_bounds_of_a_library_too_large_to_walk_hold_every_set(figures, cap, on_card, budget):
    """Past the sets a plan walks, the plan holds bounds: never fewer models than any set holds, never less
    RAM or VRAM than any set's (the pod's limit is sized on them)."""
    from planning.residency import _bounds

    residency = _library(figures, cap, on_card, budget)
    sets, _ = _brute_force(residency)
    if not sets:
        return
    bounds = _bounds(residency)
    assert bounds.most >= max(len(s) for s in sets)
    assert sum(m.ram_gib for m in bounds.worst_ram) >= max(sum(m.ram_gib for m in s) for s in sets) - 1e-9
    assert sum(m.vram_gib for m in bounds.worst_vram) >= max(sum(m.vram_gib for m in s) for s in sets) - 1e-9
