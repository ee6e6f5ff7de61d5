"""Shared fixtures: the real stacks' config, and running the program under Pulumi's mocks."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

# Property tests are deterministic: the same examples on every run and machine, and no local example
# database replaying a stale failure (a failing example found once becomes an explicit case in
# tests/, e.g. tests/test_one_line_errors.py).
settings.register_profile("repo", derandomize=True, database=None, print_blob=True)
settings.load_profile("repo")

ROOT = Path(__file__).resolve().parent.parent  # on sys.path by pytest.ini's pythonpath

from render.offline import ProgramRun, config_from_mapping, run_program

STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))


def stack_values(stack: str) -> dict[str, Any]:
    """A stack file's config with the project prefix stripped: key -> decoded value."""
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    # The project's keys only: provider settings (kubernetes:*) are not the program's config.
    return {k.split(":", 1)[1]: v for k, v in document["config"].items() if k.startswith("inference-plane:")}


def run_values(values: dict[str, Any], secrets: dict[str, str] | None = None, stack: str = "test") -> ProgramRun:
    """Run the program with these config values; ``secrets`` are set as Pulumi secret config
    (default: a test value for every known secret key the values name)."""
    if secrets is None:
        named = json.dumps(values)
        secrets = {k: v for k, v in TEST_SECRETS.items() if f'"{k}"' in named}
    config, secret_keys = config_from_mapping(values)
    for key, value in (secrets or {}).items():
        config[f"inference-plane:{key}"] = value
        secret_keys.append(f"inference-plane:{key}")
    return run_program(config, secret_keys, stack=stack)


@pytest.fixture
def homelab_values() -> dict[str, Any]:
    return copy.deepcopy(homelab_plain_values())


HOMELAB_SECRETS = {"llama_api_key": "llama-key-4e2a"}
TEST_SECRETS = {**HOMELAB_SECRETS}


def homelab_plain_values() -> dict[str, Any]:
    """The homelab stack without its `secure:` placeholders (tests pass real secret values)."""
    return {k: v for k, v in stack_values("homelab").items() if not (isinstance(v, dict) and "secure" in v)}


@pytest.fixture(scope="session")
def homelab_run() -> ProgramRun:
    return run_values(homelab_plain_values(), secrets=HOMELAB_SECRETS, stack="homelab")


STRIX_SECRETS = {
    "gateway_master_key": "master-7c1e0d",
    "nous_api_key": "nous-key-5a2b",
    "openrouter_api_key": "or-key-9f31",
    "zai_api_key": "zai-key-77d0",
    "llamacpp_api_key": "llamacpp-key-31c8",
}


TEST_SECRETS.update(STRIX_SECRETS)


def strix_values() -> dict[str, Any]:
    """The strix-halo stack without its `secure:` placeholders (tests pass real secret values)."""
    return {k: v for k, v in stack_values("strix-halo").items() if not (isinstance(v, dict) and "secure" in v)}


def run_strix(values: dict[str, Any] | None = None, secrets: dict[str, str] | None = None) -> ProgramRun:
    return run_values(values or strix_values(), secrets={**STRIX_SECRETS, **(secrets or {})}, stack="strix-halo")


@pytest.fixture
def strix() -> dict[str, Any]:
    return copy.deepcopy(strix_values())


@pytest.fixture(scope="session")
def strix_run() -> ProgramRun:
    return run_strix()


RTX_SECRETS = {"chat_api_key": "chat-key-1b7f", "embed_api_key": "embed-key-6c02",
               "gateway_master_key": "master-0d9e", "openrouter_api_key": "or-key-2a44"}
CPU_SECRETS = {"chat_api_key": "chat-key-1b7f"}
TEST_SECRETS.update({"big_api_key": "big-key-5d31"})



def plain_values(stack: str) -> dict[str, Any]:
    """A shipped stack's config without its `secure:` placeholders (tests pass real secret values)."""
    return {k: v for k, v in stack_values(stack).items() if not (isinstance(v, dict) and "secure" in v)}


def serve_quant(model: dict[str, Any], quant: str, from_gib: float, from_quant: str = "Q4_K_M") -> float:
    """Serve a model's values at another quant of its repo, its weights scaled from a file of ``from_gib`` GiB at
    ``from_quant`` by llama-quantize's bits per weight (as the smaller-quant line scales them); the new GiB."""
    from engines.llamacpp_memory import BITS_PER_WEIGHT

    gib = from_gib * BITS_PER_WEIGHT[quant] / BITS_PER_WEIGHT[from_quant]
    model.update(hf_repo=model["hf_repo"].rsplit(":", 1)[0] + f":{quant}", weights=f"{gib:.2f}Gi")
    return gib


def next_larger_quant(quant: str) -> str:
    """The llama.cpp K/legacy quant with the fewest bits per weight above ``quant``'s."""
    from engines.llamacpp_memory import BITS_PER_WEIGHT

    return min((q for q, b in BITS_PER_WEIGHT.items() if b > BITS_PER_WEIGHT[quant] and q.startswith("Q")),
               key=BITS_PER_WEIGHT.get)


def stack_file_config(stack: str) -> dict[str, Any]:
    """A shipped stack file's `config:` mapping as written (full keys, `secure:` entries included)."""
    return yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def run_stack_file(stack: str, mapping: dict[str, Any], secrets: dict[str, str] | None = None) -> ProgramRun:
    """Run the program on a stack file's mapping; ``secrets`` (project key -> value) stand for the
    decrypted values of its `secure:` entries (offline they all read the same placeholder)."""
    config, secret_keys = config_from_mapping(mapping)
    for key, value in (secrets or {}).items():
        config[f"inference-plane:{key}"] = value
    return run_program(config, secret_keys, stack=stack)


def router_move_configs() -> tuple[dict, dict, dict[str, str]]:
    """rtx3090-library with its card shared (time-slicing, gpu_shares 2) and a library small enough that
    qwen3-14b fits on a server of its own beside the router; then the same with qwen3-14b moved out of the
    library to that server (models.qwen14, routed by the gateway). Both stack mappings and the secrets they
    read."""
    import copy

    base = stack_file_config("rtx3090-library")
    base["inference-plane:node_pools"]["rtx3090"]["gpu_shares"] = 2
    library = base["inference-plane:models"]["library"]
    for name in ("gemma-3-12b", "qwen3-30b-a3b"):
        library["on_demand"]["models"].pop(name)
    gateway = base["inference-plane:gateway"]
    gateway["routes"] = [r for r in gateway["routes"] if r["model"] not in ("gemma-3-12b", "qwen3-30b-a3b")]
    moved = copy.deepcopy(base)
    moved["inference-plane:models"]["library"]["on_demand"]["models"].pop("qwen3-14b")
    moved["inference-plane:models"]["qwen14"] = {
        "role": "chat", "name": "qwen14", "image": library["image"], "node_pool": "rtx3090",
        "hf_repo": "Qwen/Qwen3-14B-GGUF:Q4_K_M", "gpu_layers": 99, "ctx_size": 4096, "cache_type_k": "q8_0",
        "cache_type_v": "q8_0", "resources": {"cpu_request": "2", "cpu_limit": "8"},
        "api_key": {"secret_name": "qwen14-key", "from_config": "chat_api_key"}}
    moved["inference-plane:gateway"]["tiers"]["qwen14"] = {"local": "qwen14"}
    for route in moved["inference-plane:gateway"]["routes"]:
        if route["model"] == "qwen3-14b":
            route["backends"][0] = {"tier": "qwen14"}
    secrets = {k.split(":", 1)[1]: f"{k}-value" for k, v in base.items() if isinstance(v, dict) and "secure" in v}
    return base, moved, secrets


# The tests that need llama.cpp's own programs, built by lab/llama_build.py (`make llama`),
# are marked `llama` here, from what they use, so the mark cannot drift from the need: every test
# that uses the `binary` or `llama_source` fixture (directly or through another fixture: llama.cpp's
# source, its vocab files among it, comes with the build), and every test of a module that imports
# lab.llama_build's build() or source_dir() itself. `make quick` runs the rest without building
# llama.cpp: pytest -m "not llama". The rule holds by construction: a test left unmarked that reaches
# the build or the source anyway (through the lab's GGUF writers, say) fails, warm cache or not.
LLAMA_FIXTURES = {"binary", "llama_source"}
# The build tool's own tests run it on stand-ins (a user's binary, a fake archive, an empty cache).
BUILD_TOOL_TESTS = "test_llama_build"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from lab.llama_build import build, source_dir

    for item in items:
        module = getattr(item, "module", None)
        imports_it = any(getattr(module, name, None) is fn for name, fn in (("build", build), ("source_dir", source_dir)))
        if imports_it or LLAMA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.llama)


@pytest.fixture(autouse=True)
def _llama_only_when_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unmarked test may not reach llama.cpp's build or source: it would pass here on a warm cache and
    fail `make quick` on a fresh clone (issue #46 item 2: a hidden path insert hid one that way)."""
    if request.node.get_closest_marker("llama") or request.module.__name__ == BUILD_TOOL_TESTS:
        return
    import lab.llama_build as llama

    def refused(*_args, **_kwargs):
        raise AssertionError(f"{request.node.nodeid} reaches llama.cpp's build or source but is not marked llama: "
                             "take the binary or llama_source fixture")

    monkeypatch.setattr(llama, "build", refused)
    monkeypatch.setattr(llama, "source_dir", refused)


@pytest.fixture(scope="session")
def binary() -> Path:
    """llama.cpp's llama-server for the contract tests. `make test` builds first with progress on the
    terminal; run alone, pytest builds here (lab/llama_build.py, cached outside the clone)."""
    from lab.llama_build import BuildError, build

    try:
        return build()
    except BuildError as e:
        failure = str(e)
    pytest.fail(failure, pytrace=False)  # outside the except: one line, no chained traceback


@pytest.fixture(scope="session")
def llama_source(binary) -> Path:
    """The pinned llama.cpp's source folder (its vocab-only GGUFs under models/), fetched with the build."""
    from lab.llama_build import source_dir

    return source_dir()
