"""lab/bench/router_soak.py without a GPU or llama.cpp: what it reads from the rendered stacks, the traffic it
sends, and how it turns samples into figures (the soak itself runs on a GPU: make router-soak)."""

from __future__ import annotations




from lab.bench.router_soak import router_specs, shape_of, traffic
from lab.bench.soak_report import loads, resident_sets, swaps
from lab.bench.soak_watch import Result

PLAN = {"vram_budget_gib": 23.0, "models": {"a": {"vram_gib": 6.0, "swap_seconds": {"warm": 4, "cold": 4}},
                                            "b": {"vram_gib": 10.0, "swap_seconds": {"warm": 6, "cold": 9}},
                                            "c": {"vram_gib": 12.0, "swap_seconds": {"warm": 12, "cold": 20}}}}


def test_every_shipped_router_is_found_with_its_rendered_flags_preset_and_plan():
    specs = router_specs()
    assert [(s["stack"], s["key"]) for s in specs] == [("rtx3090-library", "library")]
    (spec,) = specs
    # It neither evicts nor loads itself; the proxy runs from its programs ConfigMap.
    assert spec["args"][spec["args"].index("--models-max") + 1] == "0" and "--no-models-autoload" in spec["args"]
    assert spec["proxy"]["command"][-1].endswith("/admission_proxy.py")
    assert "class Residency" in spec["programs"]["data"]["admission.py"]
    assert spec["admission"]["models"].keys() == spec["residency"]["models"].keys()
    assert spec["residency"]["most_resident"] == 3
    assert set(spec["library"]) == set(spec["residency"]["models"])
    assert all(f"[{name}]" in spec["models_ini"] for name in spec["library"])
    assert spec["env"]["LLAMA_ARG_MODELS_DIR"]
    from lab.contract.real_shape import PRESETS
    try:
        import lab.contract.real_shape_mmproj as mm
        text = set(getattr(mm, "TEXT", {}))
    except ImportError:
        text = set()
    for name, entry in spec["library"].items():
        shape, quant, _ = shape_of(name, entry)
        assert shape in PRESETS or shape in text, (name, entry)
        assert quant
    assert shape_of("g", "ggml-org/gemma-3-12b-it-GGUF:Q4_K_M") == ("gemma-3-12b", "Q4_K_M", "gemma-3-12b")
    assert shape_of("g", {"hf_repo": "ggml-org/gemma-3-12b-it-GGUF:Q4_K_M", "mmproj": False})[2] is None
    assert shape_of("qwen3-8b", {"hf_repo": "Qwen/Qwen3-8B-GGUF:Q4_K_M", "mmproj": False}) == ("qwen3-8b", "Q4_K_M", None)


def test_the_traffic_is_seeded_and_mixes_sequential_concurrent_and_cancelled_requests():
    names = ["a", "b", "c", "d", "e"]
    steps = traffic(names, limit=2, requests=200, seed=30, locality=0.6, burst_every=12, burst=3, cancels=6)
    assert steps == traffic(names, limit=2, requests=200, seed=30, locality=0.6, burst_every=12, burst=3, cancels=6)
    assert steps != traffic(names, limit=2, requests=200, seed=31, locality=0.6, burst_every=12, burst=3, cancels=6)
    assert sum(len(models) for _, models in steps) >= 200
    kinds = [kind for kind, _ in steps]
    assert kinds.count("cancel") == 6 and kinds.count("burst") >= 10
    assert {m for _, models in steps for m in models} == set(names)


def test_a_resident_sets_peak_counts_only_samples_where_the_set_was_settled():
    statuses = [(0.0, {"a": "loaded", "b": "unloaded", "c": "unloaded"}),
                (0.8, {"a": "loaded", "b": "unloaded", "c": "unloaded"}),
                (1.0, {"a": "loaded", "b": "loading", "c": "unloaded"}),
                (2.0, {"a": "loaded", "b": "loaded", "c": "unloaded"}),
                (3.0, {"a": "loaded", "b": "loaded", "c": "unloaded"})]
    card = [(0.5, 1000 + 6 * 1024), (1.5, 1000 + 30 * 1024), (2.5, 1000 + 15 * 1024)]
    rows = resident_sets(card, statuses, baseline=1000, plan=PLAN)
    assert rows == [{"models": ["a"], "peak_gib": 6.0, "planned_vram_gib": 6.0, "over_plan_gib": 0.0},
                    {"models": ["a", "b"], "peak_gib": 15.0, "planned_vram_gib": 16.0, "over_plan_gib": -1.0}]


def test_loads_and_swaps_come_from_the_states_and_the_first_tokens():
    statuses = [(10.0, {"a": "unloaded"}), (10.2, {"a": "loading"}), (12.2, {"a": "loaded"}),
                (20.0, {"a": "unloaded failed:1"})]
    found = loads(statuses, t0=10.0)
    assert found[0] == {"model": "a", "at_s": 0.2, "seconds": 2.0}
    assert found[1]["failed"] == "unloaded failed:1"
    swap = Result(1, "a", "sequential", True, 8, status=200, first_token_s=3.0, resident_before=["b"])
    warm = Result(2, "a", "sequential", True, 8, status=200, first_token_s=0.05, resident_before=["a", "b"])
    row = swaps([swap, warm], [{"model": "a", "warm": {"first_token_s": 2.5}, "cold": {"first_token_s": 8.0}}], PLAN)["a"]
    assert row["swaps"] == 1 and row["swap_median_s"] == 3.0 and row["resident_first_token_median_s"] == 0.05
    assert row["swap_median_plan_ratio"] == 1.33 and row["swap_median_plan_off"] is True
    assert row["cold_empty_card_plan_ratio"] == 0.5 and row["cold_empty_card_plan_off"] is True


def test_a_child_force_killed_on_eviction_is_a_forced_stop_not_a_failed_load():
    from lab.bench.soak_report import verdict
    out = {"gpu": {"within_budget": True}, "most_running_seen": 2, "child_exits": [{"at_s": 75.0, "model": "c", "status": 1}],
           "loads": [{"model": "c", "at_s": 75.1, "failed": "unloaded failed:1"}, {"model": "b", "at_s": 90.0, "failed": "unloaded failed:1"}],
           "log_trouble": [[74.9, "W srv operator(): force-killing model instance name=c after 10 seconds timeout"]],
           "requests": {"failures": [{"why": "proxy error (eviction race)"}]}, "swaps": {}}
    v = verdict(out, limit=2)
    assert (v["forced_stops"], v["failed_loads"], v["failures"]) == (1, 1, 1)
    assert v["failures_by_why"] == {"proxy error (eviction race)": 1} and v["never_more_running_than_limit"]
