"""Every error the offline render can print is one line naming the file or config path and the fix.

The first cases are examples the fuzzer once found (kept here, not in a local database)."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config import ConfigError
from plane import parse_stack
from conftest import homelab_plain_values
from render.output import RenderError, render_stack


def write_stack(folder, values) -> None:
    config = {f"inference-plane:{k}": v for k, v in values.items()}
    (folder / "Pulumi.t.yaml").write_text(yaml.safe_dump({"config": config}))


def render_error(folder) -> str:
    with pytest.raises(RenderError) as caught:
        render_stack("t", folder / "out", project_dir=folder)
    assert not (folder / "out").exists()
    return str(caught.value)


def test_a_label_key_with_a_newline_is_shown_escaped_on_one_line():
    values = homelab_plain_values()
    values["cluster"]["ingress"]["pod_labels"] = {"\n": "x"}
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    assert str(caught.value) == (
        "invalid stack config: cluster.ingress.pod_labels: \\n='x' is not a valid Kubernetes label")


def test_a_lone_surrogate_in_a_value_names_file_line_and_column(tmp_path):
    values = homelab_plain_values()
    values["namespace"]["name"] = "\ud800"
    write_stack(tmp_path, values)
    line = next(i for i, text in enumerate((tmp_path / "Pulumi.t.yaml").read_text().splitlines(), 1)
                if "\\uD800" in text or "\\ud800" in text)
    message = render_error(tmp_path)
    assert message.startswith(f"Pulumi.t.yaml:{line}:")
    assert "invalid YAML" in message and "\n" not in message


@pytest.mark.parametrize("text, where, hint", [
    ("config:\n  inference-plane:namespace\n    name: ai\n", "Pulumi.t.yaml:3:9:", "mapping values are not allowed"),
    ("config:\n\tinference-plane:namespace: {}\n", "Pulumi.t.yaml:2:1:", "indent with spaces, not tabs"),
    ("- just\n- a list\n", "Pulumi.t.yaml:", "expected a mapping with a `config:` mapping"),
])
def test_yaml_mistakes_are_one_line_with_line_and_column(tmp_path, text, where, hint):
    (tmp_path / "Pulumi.t.yaml").write_text(text)
    message = render_error(tmp_path)
    assert message.startswith(where) and hint in message and "\n" not in message


@pytest.mark.parametrize("loc, typo, suggestion", [
    ((), "model", "models"),
    (("cluster",), "ingres", "ingress"),
    (("models", "chat"), "ctx_sze", "ctx_size"),
    (("node_pools", "iris-xe"), "alocatable", "allocatable"),
])
def test_unknown_keys_are_named_unknown_with_the_nearest_valid_key(loc, typo, suggestion):
    values = homelab_plain_values()
    parent = values
    for part in loc:
        parent = parent[part]
    if suggestion in parent:
        parent[typo] = parent.pop(suggestion)
    else:
        parent[typo] = 1
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    assert f"{'.'.join((*loc, typo))}: unknown key; did you mean {suggestion}?" in str(caught.value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=30), st.text(max_size=30))
def test_any_key_or_value_gives_one_printable_line(key, value):
    values = copy.deepcopy(homelab_plain_values())
    values["cluster"]["ingress"]["pod_labels"] = {key: value}
    values["namespace"][key or "x"] = value
    try:
        parse_stack(values)
    except ConfigError as error:
        text = str(error)
        assert text.isprintable() and text.startswith("invalid stack config: ")


def test_a_quant_typo_is_refused_offline_with_the_file_types_it_is_near(tmp_path):
    """`Q4_K_N` names no llama.cpp file type: llama.cpp would find no file for it an hour into the pod's
    start (with weights given, nothing else would notice). Repackagers' variants (_L, _XL) still pass."""
    values = homelab_plain_values()
    repo = values["models"]["chat"]["hf_repo"].rsplit(":", 1)[0]
    values["models"]["chat"]["hf_repo"] = repo + ":Q4_K_N"
    write_stack(tmp_path, values)
    assert render_error(tmp_path) == (
        "Pulumi.t.yaml: invalid stack config: models.chat.hf_repo: quant 'Q4_K_N' is not one of llama.cpp's file types; "
        f"did you mean Q4_K_M or Q4_K_S? (the repo's file names show its quants) (got '{repo}:Q4_K_N')")
    for tag in ("Q4_K_XL", "Q6_K_L", "q4_k_m", "MXFP4", "IQ4_XS"):
        values["models"]["chat"]["hf_repo"] = f"{repo}:{tag}"
        assert parse_stack(values).models["chat"].hf_repo.endswith(tag)


def test_a_repo_typo_is_told_the_catalog_repo_it_is_near():
    from common.errors import CapacityError
    from plane import plan_capacity

    values = homelab_plain_values()
    values["models"]["chat"]["hf_repo"] = "Qwen/Qwen3-8B-GUFF:Q4_K_M"
    values["models"]["chat"].pop("facts", None)
    with pytest.raises((ConfigError, CapacityError)) as caught:
        plan_capacity(parse_stack(values))
    assert "models.chat.facts: no architecture facts for Qwen/Qwen3-8B-GUFF; did you mean Qwen/Qwen3-8B-GGUF" in str(caught.value)


def test_a_key_indented_one_level_off_is_named_as_an_indentation_slip():
    """Valid YAML with a key one level too deep or too shallow: the line says where the key belongs."""
    values = homelab_plain_values()
    values["models"]["chat"]["resources"]["ctx_size"] = 8192
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    assert str(caught.value) == ("invalid stack config: models.chat.resources.ctx_size: unknown key here, but models.chat "
                                 "takes ctx_size: an indentation slip? move it one level out")
    values = homelab_plain_values()
    values["models"]["chat"]["cpu_limit"] = "4"
    with pytest.raises(ConfigError) as caught:
        parse_stack(values)
    assert str(caught.value) == ("invalid stack config: models.chat.cpu_limit: unknown key here, but "
                                 "models.chat.resources takes cpu_limit: an indentation slip? move it under resources")
