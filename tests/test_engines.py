"""Adding an engine is one module implementing engines.base.Engine and one registration: shown with
a minimal engine defined here, which the config, the plan, the components and the render serve
without any other change."""

from __future__ import annotations

import copy
from typing import Optional

import pytest

import engines
from config import ConfigError
from conftest import homelab_plain_values, plain_values, run_values
from engines.base import Engine, Problem
from plane import parse_stack, plan_capacity
from config.gpus import BACKEND_OVERHEAD
from planning.memory import Estimate, MemoryEstimate

GIB = 2**30


class Minimal(Engine):
    """A server that takes only a port and loads the weights it was given: 1.25 x weights in memory."""

    name = "minimal"
    config_name = "minimal"
    component_types = {"chat": "OpenAIServer", "embedding": "OpenAIServer"}

    def config_problems(self, model, path, pool) -> list[Problem]:
        return [] if model.weights else [(f"{path}.weights", "required for engine minimal")]

    def estimate(self, model, pool, path):
        if pool.discrete():
            raise AssertionError("not on a discrete GPU in this test")
        backend = model.backend_on(pool)
        memory = MemoryEstimate(weights_gib=8.0, kv_gib=2.0, recurrent_gib=0.0,
                                overhead_gib=8.0 * BACKEND_OVERHEAD[backend], host_caches_gib=0.0)
        return Estimate(memory=memory, vram=None, weights="8Gi", read_per_token=None, decode_predicted_tok_s=None), []

    def args(self, model, plan=None) -> list[str]:
        return ["--listen", f"0.0.0.0:{model.port}"]

    def env(self, model) -> list[dict]:
        return [{"name": "MINIMAL_MODE", "value": "serve"}]

    def health_path(self, model) -> str:
        return "/ready"

    def metrics_path(self, model) -> Optional[str]:
        return None

    def served_model(self, model, public_name) -> Optional[str]:
        return "minimal-model"


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "minimal", Minimal())


def _values() -> dict:
    values = copy.deepcopy(homelab_plain_values())
    # The chat server becomes the minimal engine: its llama.cpp-only settings removed.
    chat = values["models"]["chat"]
    values["models"]["chat"] = {
        "role": "chat", "name": "minimal", "engine": "minimal", "image": "registry.example/minimal:v1.0",
        "node_pool": chat["node_pool"], "weights": "8Gi", "port": 9000, "backend": "vulkan", "webui": False,
        "resources": {"cpu_request": "2", "cpu_limit": "4"},
    }
    return values


def test_an_unregistered_engine_is_refused_with_the_registered_ones():
    with pytest.raises(ConfigError, match=r"models\.chat\.engine: 'minimal' is no engine this program runs; one of llamacpp, openai"):
        parse_stack(_values())


def test_a_registered_engine_is_planned_by_its_own_memory_model(registered):
    plan = plan_capacity(parse_stack(_values()))
    chat = plan.servers["chat"]
    assert chat.estimate.total_gib == pytest.approx(8.0 + 2.0 + 8.0 * BACKEND_OVERHEAD["vulkan"])
    assert chat.weights == "8Gi" and chat.decode_bound_tok_s is None


def test_a_registered_engine_renders_as_it_describes_itself(registered):
    run = run_values(_values())
    (deployment,) = [r for r in run.resources if r.type == "kubernetes:apps/v1:Deployment" and r.inputs["metadata"]["name"] == "minimal"]
    (container,) = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["--listen", "0.0.0.0:9000"]
    assert {"name": "MINIMAL_MODE", "value": "serve"} in container["env"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    # No credentials: nothing mounts an API key, and no llama.cpp cache variable is set.
    assert all(m["name"] != "api-key" for m in container["volumeMounts"])
    assert all(e["name"] != "LLAMA_CACHE" for e in container["env"])
    # Registered as the component type the engine names.
    assert any(r.type == "inference-plane:index:OpenAIServer" and r.name == "chat" for r in run.resources)


def test_another_engines_settings_block_is_refused_by_one_rule():
    """No engine lists the others' blocks: a block on a server of another engine is refused generically."""
    values = copy.deepcopy(homelab_plain_values())
    values["models"]["chat"]["engine"] = "openai"
    values["models"]["chat"]["on_demand"] = {"models": {"a": {"hf_repo": "Qwen/Qwen3-8B-GGUF:Q4_K_M"},
                                                        "b": {"hf_repo": "Qwen/Qwen3-14B-GGUF:Q4_K_M"}}}
    with pytest.raises(ConfigError, match=r"models\.chat\.on_demand: engine openai does not read an on_demand block; "
                                          r"remove it, or set engine: llamacpp"):
        parse_stack(values)


def test_the_router_is_an_engine_selected_by_its_block():
    """engine llamacpp with an on_demand block runs the router engine; without it, the single-model one."""
    stack = parse_stack(plain_values("rtx3090-library"))
    (router,) = [m for m in stack.models.values() if m.engine == "llamacpp"]
    assert engines.engine_of(router).name == "llamacpp-router"
    assert engines.engine_of(router.as_single(next(iter(router.on_demand.models)))).name == "llamacpp"
