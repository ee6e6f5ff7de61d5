"""Defaults by role (config.types.ROLE_DEFAULTS): an embedding server written without webui and
cache_ram_mib gets no WebUI and no host prompt cache, in its flags and in its memory plan; and a GPU
image on a server that offloads nothing is answered with the CPU image of the same build."""

from __future__ import annotations

import pulumi
import pytest
import yaml

from conftest import ROOT, run_stack_file, stack_file_config
from render.manifests import manifests
from render.output import render_stack

STACK = "rtx3060"
SECRETS = {"chat_api_key": "chat-key-1b7f"}


def embed(config: dict) -> dict:
    return config["inference-plane:models"]["embed"]


def container_args(run, name: str) -> list[str]:
    (workload,) = [m for m in manifests(run).values() if m["kind"] == "Deployment" and m["metadata"]["name"] == name]
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return container["args"]


def test_an_embedding_server_left_to_its_defaults_has_no_webui_and_no_prompt_cache():
    explicit = stack_file_config(STACK)
    assert embed(explicit)["webui"] is False and embed(explicit)["cache_ram_mib"] == 0
    left_out = stack_file_config(STACK)
    del embed(left_out)["webui"], embed(left_out)["cache_ram_mib"]
    before, after = run_stack_file(STACK, explicit, SECRETS), run_stack_file(STACK, left_out, SECRETS)
    args = container_args(after, "llama-embed")
    assert "--no-ui" in args and args[args.index("--cache-ram") + 1] == "0"
    assert args == container_args(before, "llama-embed")
    plan = after.outputs["capacity_plan"]["servers"]["embed"]
    assert plan["estimate"]["host_caches_gib"] == 0
    assert plan == before.outputs["capacity_plan"]["servers"]["embed"]


def test_a_chat_server_keeps_the_webui_and_llama_cpps_prompt_cache():
    config = stack_file_config(STACK)
    chat = config["inference-plane:models"]["chat"]
    del chat["cache_ram_mib"]
    run = run_stack_file(STACK, config, SECRETS)
    args = container_args(run, "llama-chat")
    assert "--no-ui" not in args and "--cache-ram" not in args
    # llama.cpp's own 8 GiB default, counted in full.
    assert run.outputs["capacity_plan"]["servers"]["chat"]["estimate"]["host_caches_gib"] == pytest.approx(8.0)


def test_an_embedding_server_asked_for_the_webui_is_still_refused():
    config = stack_file_config(STACK)
    embed(config)["webui"] = True
    with pytest.raises(pulumi.RunError, match=r"models.embed.webui: an embedding server has no use for the WebUI"):
        run_stack_file(STACK, config, SECRETS)


def render_with(tmp_path, change) -> str:
    config = stack_file_config(STACK)
    change(config)
    (tmp_path / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return render_stack(STACK, tmp_path / "out", project_dir=tmp_path).summary()


def test_a_cuda_image_that_offloads_nothing_is_answered_with_the_cpu_image(tmp_path):
    def cuda_embedder(config):
        embed(config)["image"] = "ghcr.io/ggml-org/llama.cpp:server-cuda-b10731"
        del embed(config)["backend"]

    summary = render_with(tmp_path, cuda_embedder)
    assert ("warning: models.embed.image: ghcr.io/ggml-org/llama.cpp:server-cuda-b10731 is built for cuda, but "
            "gpu_layers is 0, so the server runs on the CPU and the cuda image only adds its size to every pull; use "
            "ghcr.io/ggml-org/llama.cpp:server-b10731") in summary
    shipped = render_stack(STACK, tmp_path / "shipped", project_dir=ROOT).summary()
    assert "models.embed.image" not in shipped and "models.chat.image" not in shipped
