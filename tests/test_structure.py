"""The redesign's promises: one home per engine, documented config, one error format, names that
survive the move to stable component names, and invariants checked before anything is registered."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
from pydantic import BaseModel

from common.errors import SHOWN_PROBLEMS, CapacityError, ConfigError
from plane import parse_stack
from config.types import StackConfig
from config.values import Strict
from conftest import ROOT, homelab_plain_values, run_values, stack_values
from engines import engine_of
from plane import plan_capacity


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    found, queue = [], [root]
    while queue:
        model = queue.pop()
        if model in found:
            continue
        found.append(model)
        for field in model.model_fields.values():
            text = repr(field.annotation)
            for candidate in Strict.__subclasses__():
                if candidate.__name__ in text:
                    queue.append(candidate)
    return found


def test_every_config_field_says_what_it_is_for():
    models = _models(StackConfig)
    assert len(models) >= 20  # every model reachable from the stack, not just the top
    undocumented = [f"{m.__name__}.{n}" for m in models for n, f in m.model_fields.items() if not (f.description or "").strip()]
    assert undocumented == []


def test_readme_reference_matches_the_types():
    result = subprocess.run([sys.executable, "tools/config_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    readme = (ROOT / "README.md").read_text()
    # The generated reference names the fields with their descriptions, e.g. the lesson on ubatch.
    assert "| `ubatch_size` |" in readme and "| `embedding_status_codes` |" in readme


def test_readme_check_fails_when_a_description_changes(tmp_path, monkeypatch):
    import tools.config_docs as docs

    stale = docs.with_reference((ROOT / "README.md").read_text()).replace("--threads.", "the thread count")
    readme = tmp_path / "README.md"
    readme.write_text(stale)
    monkeypatch.setattr(docs, "README", readme)
    assert docs.main(["--check"]) == 1


def test_a_llamacpp_model_with_an_openai_block_is_refused():
    values = homelab_plain_values()
    values["models"]["chat"]["openai"] = {"served_model": "x", "resident_memory": "20Gi"}
    with pytest.raises(ConfigError, match=r"models\.chat\.openai: engine llamacpp does not read an openai block"):
        parse_stack(values)


def test_an_openai_engine_with_llamacpp_settings_is_refused():
    values = copy.deepcopy(stack_values("strix-halo"))
    values = {k: v for k, v in values.items() if not (isinstance(v, dict) and "secure" in v)}
    values["models"]["flash"]["hf_repo"] = "org/Model-GGUF:Q4_K_M"
    values["models"]["flash"]["ctx_checkpoints"] = 4
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    paths = [path for path, _ in caught.value.problems]
    assert "models.flash.hf_repo" in paths and "models.flash.ctx_checkpoints" in paths


def test_each_engine_answers_for_its_own_models():
    homelab = parse_stack(homelab_plain_values())
    chat = homelab.models["chat"]
    assert engine_of(chat).name == "llamacpp"
    assert engine_of(chat).health_path(chat) == "/health"
    assert "--hf-repo" in engine_of(chat).args(chat)
    strix = {k: v for k, v in stack_values("strix-halo").items() if not (isinstance(v, dict) and "secure" in v)}
    flash = parse_stack(strix).models["flash"]
    assert engine_of(flash).name == "openai"
    assert engine_of(flash).args(flash) == flash.openai.args
    assert engine_of(flash).served_model(flash, "qwen/qwen3.8-flash") == "qwen38-flash-next-w4b"


def test_capacity_and_config_errors_share_one_capped_format():
    values = homelab_plain_values()
    for key in ("chat", "embed"):
        values["models"][key]["resources"]["memory_limit"] = "1Gi"
        values["models"][key]["resources"]["memory_request"] = "1Gi"
    values["models"]["chat"]["resources"]["memory_limit"] = "1Gi"
    extra = copy.deepcopy(values["models"]["embed"])
    for index in range(3):
        values["models"][f"more{index}"] = {**extra, "name": f"more-{index}"}
    values["node_pools"]["iris-xe"]["gpu_shares"] = 8
    with pytest.raises(CapacityError) as caught:
        plan_capacity(parse_stack(values))
    message = str(caught.value)
    assert len(caught.value.problems) == 5
    assert message.startswith("capacity plan does not fit: models.chat.resources.memory_limit: 1Gi is below")
    assert message.count("; models.") == SHOWN_PROBLEMS - 1
    assert message.endswith(f"(and {5 - SHOWN_PROBLEMS} more)")
    assert "\n" not in message


def test_components_keep_the_names_stacks_already_up_know_them_by():
    """Components are named by config key or role; the Pulumi names they had before (the model's
    name, the namespace's, the claim's, the gateway's) are aliases, so no resource is replaced."""
    run = run_values(homelab_plain_values())
    components = {r.name: r for r in run.resources if not r.custom}
    assert components["chat"].aliases == [{"name": "llama-server"}]
    assert components["embed"].aliases == [{"name": "llama-embed"}]
    assert components["namespace"].aliases == [{"name": "ai"}]
    assert components["model-cache"].aliases == [{"name": "llama-server-models"}]
    # Children keep their names relative to the component, so the engine derives their old URNs.
    children = {r.name for r in run.resources if r.custom and "LlamaServer" in r.urn}
    assert children == {"chat", "chat-svc", "chat-api-key", "chat-ingress", "chat-sources"}


def test_invariants_are_errors_not_asserts():
    """`python -O` drops asserts; the program's own checks must survive it."""
    offenders = []
    for folder in ("common", "config", "engines", "planning", "components", "render", "policy", "changes"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip().startswith("assert "):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []
