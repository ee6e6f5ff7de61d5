"""llama.cpp's router mode (``models.<key>.on_demand``): llama-server started with no model runs
each model of its preset as a child llama-server, loaded when a request names it. Facts from the
b10729 source and runs are in tests/contract/ROUTER_FACTS.md; the ones relied on here:

- the router's own flags are merged on top of every model's preset (server-models.cpp:548-552), so
  the router's command line carries only what every child shares (host/port are replaced per
  child: 127.0.0.1 and a port of its own), and each model's flags live in its preset section;
- a section's keys are llama-server's long flags without their dashes (common/preset.cpp:251-323),
  a value-less flag is `flag = true`; an unknown key stops the router at start;
- --models-max counts loading, loaded and sleeping models; past it the least recently used idle
  model is unloaded before the next loads (server-models.cpp:83-101);
- there is no pin (common/arg.cpp:4762-4766): `load-on-startup` only loads at start;
- --sleep-idle-seconds reaches every child, which frees its model and context when idle but
  keeps its process and its place in --models-max;
- /health answers 200 once the router listens, whatever its models do; /metrics is per model
  (`?model=X`), and `&autoload=false` keeps a scrape from loading one;
- every model in the router's LLAMA_CACHE is listed and loadable under its cache name with
  llama.cpp's defaults, even with dedup-cache-models (server-models.cpp:504-589): so the router's
  LLAMA_CACHE is an empty folder, and its models come from --models-dir (LLAMA_ARG_MODELS_DIR), a
  folder the pod's init container fills with exactly the listed models, one subfolder per name
  (common/preset.cpp:387-460; the section of the same name merges into it).

Each model's section is exactly the command line a single-model server of it would get
(``LlamaCpp.args`` of ``ModelServer.as_single``), which the single-model contract tests run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from common.constants import SCRATCH

if TYPE_CHECKING:
    from config.types import ModelServer

# Where the preset ConfigMap is mounted in the router's container.
PRESET_DIR = "/etc/llama-router"
PRESET_FILE = "models.ini"
PRESET_PATH = f"{PRESET_DIR}/{PRESET_FILE}"
# What the router reads: the preset less the sections whose model is not fetched (yet, or at all),
# written by the init container and the keeper on the pod's scratch volume. A section without its
# files would be listed, and a request for it would evict a loaded model before failing to load
# (ROUTER_FACTS.md b); without the section the name is unknown (400) and nothing is evicted.
SERVED_PRESET_PATH = f"{SCRATCH}/llama-router/{PRESET_FILE}"
# Beside it, the models to fetch (name -> org/repo:TAG), read by the init container and the keeper.
LIBRARY_FILE = "library.json"
LIBRARY_PATH = f"{PRESET_DIR}/{LIBRARY_FILE}"

# The router's models, one subfolder per public name, inside the cache volume (beside the hub
# layout the blobs live in): filled before the router starts (components/prefetch, library mode).
LIBRARY_FOLDER = "on-demand"
# LLAMA_CACHE for the router and its children: an empty folder on the scratch volume, so the router
# lists no cache entries (each would be a model loadable outside the plan) and nothing downloads.
EMPTY_CACHE = f"{SCRATCH}/llama-cache-unused"
# Preset keys the library replaces: the subfolder of the model's name gives `model` (and `mmproj`).
LIBRARY_KEYS = frozenset({"hf-repo"})


def library_dir(model: "ModelServer", mount_path: str) -> str:
    """The router's --models-dir: its own folder, so only its listed models are in it."""
    return f"{mount_path}/{LIBRARY_FOLDER}/{model.name}"


def library(model: "ModelServer") -> dict[str, str]:
    """What the init container fetches: each public name and its org/repo:TAG."""
    if model.on_demand is None:
        raise ValueError(f"{model.name}: not a router (no on_demand)")
    return {name: entry.hf_repo for name, entry in model.on_demand.models.items()}


def library_json(model: "ModelServer") -> str:
    return json.dumps(library(model), indent=2) + "\n"


def cache_env(model: "ModelServer", mount_path: str) -> list[dict]:
    return [{"name": "LLAMA_ARG_MODELS_DIR", "value": library_dir(model, mount_path)},
            {"name": "LLAMA_CACHE", "value": EMPTY_CACHE}]


# Flags the router's own command line sets for every child (and host/port, which it replaces per
# child): shared_flags() writes them, and a section never repeats them (the router's would win).
ROUTER_LEVEL_FLAGS = frozenset({"--host", "--port", "--api-key-file", "--metrics", "--cors-origins", "--no-ui"})


def shared_flags(model: "ModelServer", key_file: str | None) -> list[str]:
    """The flags a single-model server ends its command line with, and a router passes to every
    child: browser origins, the web UI, where it listens, metrics, the key file."""
    args: list[str] = []
    if model.cors_origins is not None:
        args += ["--cors-origins", model.cors_origins]
    if not model.webui:
        # --no-ui: the pinned build (b10731) logs --no-webui as a deprecated alias (seen running it).
        args.append("--no-ui")
    # Explicit on purpose: the default port is moving from 8080 to 9931 across builds.
    args += ["--host", "0.0.0.0", "--port", str(model.port)]
    if model.metrics:
        args.append("--metrics")
    if key_file is not None:
        args += ["--api-key-file", key_file]
    return args


def preset_sections(single_args: list[str]) -> list[tuple[str, str]]:
    """One model's single-model command line as (key, value) preset lines, minus the router's flags
    and the download (the model's library folder holds its files)."""
    lines: list[tuple[str, str]] = []
    index = 0
    while index < len(single_args):
        flag = single_args[index]
        has_value = index + 1 < len(single_args) and not single_args[index + 1].startswith("--")
        value = single_args[index + 1] if has_value else "true"
        index += 2 if has_value else 1
        if flag in ROUTER_LEVEL_FLAGS or flag.lstrip("-") in LIBRARY_KEYS:
            continue
        lines.append((flag.lstrip("-"), value))
    return lines


def preset_ini(model: "ModelServer", single_args) -> str:
    """The preset file: one section per model, named by the name clients send."""
    if model.on_demand is None:
        raise ValueError(f"{model.name}: not a router (no on_demand)")
    out = ["; Rendered by inference-plane from models.<key>.on_demand: one section per model, the flags",
           "; of its single-model server. The router's own flags (host, port, key, metrics) apply to all.", ""]
    for name, entry in model.on_demand.models.items():
        out.append(f"[{name}]")
        for key, value in preset_sections(single_args(model.as_single(name))):
            out.append(f"{key} = {value}")
        if entry.pinned:
            out.append("load-on-startup = true")
        out.append("")
    return "\n".join(out)


def router_args(model: "ModelServer", key_file: str | None) -> list[str]:
    """The router's command line: what every child shares, the preset, and the planned limit
    (``on_demand.max_loaded``, resolved by the capacity plan before the pod is built)."""
    if model.on_demand is None:
        raise ValueError(f"{model.name}: not a router (no on_demand)")
    if model.on_demand.max_loaded is None:
        raise ValueError(f"{model.name}: on_demand.max_loaded is planned from memory before the pod is built")
    args = ["--models-preset", SERVED_PRESET_PATH, "--models-max", str(model.on_demand.max_loaded)]
    if model.on_demand.idle_unload_seconds is not None:
        args += ["--sleep-idle-seconds", str(model.on_demand.idle_unload_seconds)]
    return args + shared_flags(model, key_file) + list(model.extra_args)
