"""Issue #44 item 2, the planner's half: a server on a discrete card that leaves its KV cache type unset gets an
f16 cache where it fits (faster at depth where measured) and its engine's fallback (llama.cpp: q8_0, half the
bytes) only where f16 does not fit, said in the plan's warnings with what it costs; a stack that sets a type
keeps it, and is refused as before where it does not fit."""

from __future__ import annotations

import copy

import pulumi
import pytest

from conftest import run_stack_file, stack_file_config

PREFIX = "inference-plane:"


def chat_args(run) -> list[str]:
    (deployment,) = [r.inputs for r in run.find("Deployment") if r.inputs["metadata"]["name"] == "llama-chat"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def rtx3060(**chat) -> dict:
    """rtx3060 (Qwen3-30B-A3B beside a 12 GiB card, experts of some blocks in RAM) with the chat server's settings
    replaced: a key given None is left out."""
    config = copy.deepcopy(stack_file_config("rtx3060"))
    server = config[PREFIX + "models"]["chat"]
    for key, value in chat.items():
        server.pop(key, None)
        if value is not None:
            server[key] = value
    return config


def secrets(config: dict) -> dict[str, str]:
    return {k.split(":", 1)[1]: f"{k}-value" for k, v in config.items() if isinstance(v, dict) and "secure" in v}


def test_unset_and_too_large_in_f16_the_planner_runs_q8_0_and_says_why_and_what_it_costs():
    """rtx3060 at 64k: an f16 cache does not fit the 12 GiB card beside its layers, a q8_0 one does."""
    config = rtx3060(cache_type_k=None, cache_type_v=None, ctx_size=65536)
    run = run_stack_file("rtx3060", config, secrets(config))
    args = chat_args(run)
    assert flag(args, "--cache-type-k") == flag(args, "--cache-type-v") == "q8_0"
    (line,) = [l for l in run.logs if "cache_type_k/v unset" in l]
    assert line.startswith("models.chat: cache_type_k/v unset, and an f16 KV cache does not fit (")
    assert "planned and run with q8_0, half the bytes (on an H200 a q8_0 cache decodes 7-52 % slower than f16" in line
    # The same server, planned and rendered, as a stack that sets q8_0 itself.
    explicit = rtx3060(cache_type_k="q8_0", cache_type_v="q8_0", ctx_size=65536)
    set_by_hand = run_stack_file("rtx3060", explicit, secrets(explicit))
    assert args == chat_args(set_by_hand)
    assert run.outputs["capacity_plan"]["servers"]["chat"] == set_by_hand.outputs["capacity_plan"]["servers"]["chat"]


def test_a_type_the_stack_sets_is_kept_and_refused_where_it_does_not_fit():
    config = rtx3060(cache_type_k="f16", cache_type_v="f16", ctx_size=65536)
    with pytest.raises(pulumi.RunError, match=r"capacity plan does not fit: models\.chat"):
        run_stack_file("rtx3060", config, secrets(config))


def test_unset_where_f16_fits_stays_f16_and_says_nothing():
    """rtx4090's chat server with its cache types left out: f16 fits its 24 GiB card, so no flag is written
    (llama.cpp's own f16) and no warning."""
    config = copy.deepcopy(stack_file_config("rtx4090"))
    server = config[PREFIX + "models"]["chat"]
    server.pop("cache_type_k", None)
    server.pop("cache_type_v", None)
    server["ctx_size"] = 8192
    run = run_stack_file("rtx4090", config, secrets(config))
    (deployment,) = [r.inputs for r in run.find("Deployment")
                     if r.inputs["metadata"]["name"] == config[PREFIX + "models"]["chat"]["name"]]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cache-type-k" not in args and not [l for l in run.logs if "cache_type_k/v unset" in l]


def test_a_refusal_not_about_the_card_is_never_met_by_a_smaller_cache():
    """Found by a review: a RAM memory_limit refusal switched an unset cache to q8_0 and was accepted, the warning
    blaming the KV cache. Only a refusal for the card's memory takes the fallback."""
    config = rtx3060(cache_type_k=None, cache_type_v=None, ctx_size=32768, gpu_layers=10, cpu_moe_layers=None)
    config[PREFIX + "models"]["chat"]["resources"]["memory_limit"] = "22Gi"
    with pytest.raises(pulumi.RunError, match=r"models\.chat\.resources\.memory_limit: 22Gi is below the estimate"):
        run_stack_file("rtx3060", config, secrets(config))
