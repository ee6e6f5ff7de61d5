"""llama.cpp's router, an engine of its own (``models.<key>.on_demand`` on engine llamacpp):
llama-server started with no model runs each model of its preset as a child llama-server, loaded
when a request names it. Each child is the single-model engine's server (engines/llamacpp.py),
whose flags, checks and estimate this engine asks for each model. Facts from the
b10729 source and runs are in lab/contract/ROUTER_FACTS.md; the ones relied on here:

- the router's own flags are merged on top of every model's preset (server-models.cpp:548-552), so
  the router's command line carries only what every child shares (host/port are replaced per
  child: 127.0.0.1 and a port of its own), and each model's flags live in its preset section;
- a section's keys are llama-server's long flags without their dashes (common/preset.cpp:251-323),
  a value-less flag is `flag = true`; an unknown key stops the router at start;
- --models-max counts loading, loaded and sleeping models; past it the least recently used idle
  model is unloaded before the next loads (server-models.cpp:83-101): 0 (no limit), so the router never
  evicts, and with --no-models-autoload it never loads on its own either (a request for a model not
  running is answered 400): the admission proxy in front of it (incluster/admission_proxy.py) loads and
  unloads, by memory, through /models/load and /models/unload on the pod's loopback;
- POST /models/unload stops a child and answers at once; the model reads `loaded` until its child
  has exited (server-models.cpp:1172-1197), which the proxy waits for before the next loads;
- there is no pin (common/arg.cpp:4762-4766): `load-on-startup` only loads at start, and a changed
  `load-on-startup` line is a changed preset, whose reload unloads the model: pinned models are the
  proxy's (admission.json), loaded by it at start and kept, never written into the preset;
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
import re
from typing import TYPE_CHECKING, Mapping, Optional

from common.constants import LLAMACPP_HEALTH_PATH, LLAMACPP_METRICS_PATH, ROUTER_CLIENT_PATHS, ROUTER_PRESET_FLAG, SCRATCH
from config.catalog import facts_for
from planning.memory import OnRequest, OnRequestModel

from .base import Admission, Credentials, Engine, Library, Problem, Scrape
from .llamacpp import LlamaCpp, key_file, shared_flags
from .llamacpp_flags import ALLOWED

if TYPE_CHECKING:
    from config.types import ModelServer, NodePool
    from planning.capacity import ServerPlan

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
# And what the admission proxy holds the router to (planning/residency.py Residency.admission_plan).
ADMISSION_FILE = "admission.json"

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


def library(model: "ModelServer", plan: Optional["ServerPlan"] = None) -> dict[str, dict]:
    """What the init container fetches: each public name, its org/repo:TAG, and whether its vision
    projector is fetched too: only where the plan counts one (facts.mmproj), since llama.cpp loads any
    mmproj file in the model's folder (common/preset.cpp), and `no-mmproj` does not stop it there. With the
    plan, the bytes it counted for the model's files: the downloader offers no model whose files are larger
    (incluster/library.py), so a size the plan was told wrong can waste memory but never overrun the budget."""
    planned = {m.name: m.weights_gib for m in plan.residency.models} if plan is not None and plan.residency else {}
    fetched = {}
    for name, entry in model.on_demand.models.items():
        facts = facts_for(model.as_single(name))
        fetched[name] = {"hf_repo": entry.hf_repo, "mmproj": facts is not None and facts.mmproj is not None}
        if name in planned:
            fetched[name]["planned_bytes"] = int(planned[name] * 2**30)
    return fetched


def library_json(model: "ModelServer", plan: Optional["ServerPlan"] = None) -> str:
    return json.dumps(library(model, plan), indent=2) + "\n"


def cache_env(model: "ModelServer", mount_path: str) -> list[dict]:
    return [{"name": "LLAMA_ARG_MODELS_DIR", "value": library_dir(model, mount_path)},
            {"name": "LLAMA_CACHE", "value": EMPTY_CACHE}]


# Flags the router's own command line sets for every child (and host/port, which it replaces per
# child): llamacpp.shared_flags() writes them, and a section never repeats them (the router's would win).
ROUTER_LEVEL_FLAGS = frozenset({"--host", "--port", "--api-key-file", "--metrics", "--cors-origins", "--no-ui"})


def preset_sections(single_args: list[str]) -> list[tuple[str, str]]:
    """One model's single-model command line as (key, value) preset lines, minus the router's flags
    and the download (the model's library folder holds its files). A preset key is any of the flag's
    names without its dashes (common/preset.cpp get_map_key_opt); a value-less flag is `key = true`."""
    lines: list[tuple[str, str]] = []
    index = 0
    while index < len(single_args):
        flag, _, inline = single_args[index].partition("=")
        if inline:
            value, index = inline, index + 1
        else:
            following = single_args[index + 1] if index + 1 < len(single_args) else None
            takes = ALLOWED.get(flag, following is not None and not following.startswith("--"))
            value, index = (following, index + 2) if takes and following is not None else ("true", index + 1)
        if flag in ROUTER_LEVEL_FLAGS or flag.lstrip("-") in LIBRARY_KEYS:
            continue
        lines.append((flag.lstrip("-"), value))
    return lines


# What llama.cpp's preset parser cannot carry in a value (common/preset.cpp): whitespace then ; or #
# starts a comment, and the whitespace around a value is dropped.
_PRESET_CUT = re.compile(r"[ \t][;#]|^\s|\s$")


def preset_ini(model: "ModelServer", single_args) -> str:
    """The preset file: one section per model, named by the name clients send."""
    out = ["; Rendered by inference-plane from models.<key>.on_demand: one section per model, the flags",
           "; of its single-model server. The router's own flags (host, port, key, metrics) apply to all.", ""]
    for name in model.on_demand.models:
        out.append(f"[{name}]")
        for key, value in preset_sections(single_args(model.as_single(name))):
            out.append(f"{key} = {value}")
        out.append("")
    return "\n".join(out)


def router_port(model: "ModelServer") -> int:
    """Where the router listens on the pod's loopback, behind the admission proxy on the server's port."""
    return model.port + 1


def router_args(model: "ModelServer") -> list[str]:
    """The router's command line: what every child shares, the preset, no count (0: the router never evicts)
    and no loading on its own (a request for a model not running is answered 400): the admission proxy
    loads and unloads by memory. Constant, so a model added restarts nothing."""
    args = [ROUTER_PRESET_FLAG, SERVED_PRESET_PATH, "--models-max", "0", "--no-models-autoload"]
    if model.on_demand.idle_unload_seconds is not None:
        args += ["--sleep-idle-seconds", str(model.on_demand.idle_unload_seconds)]
    shared = shared_flags(model, key_file(model))
    # Only the proxy (and the keeper) reach the router: the pod's loopback, a port of its own.
    shared[shared.index("--host") + 1] = "127.0.0.1"
    shared[shared.index("--port") + 1] = str(router_port(model))
    return args + shared + list(model.extra_args)


# Each child is this engine's server: its flags, checks and memory are asked of it.
CHILD = LlamaCpp()


class LlamaCppRouter(Engine):
    """llama-server as a router of models loaded on request."""

    name = "llamacpp-router"
    config_name = "llamacpp"
    settings_block = "on_demand"
    downloads_weights = False  # the init container and the keeper fetch its models
    component_types = {"chat": "LlamaServer", "embedding": "EmbedServer"}

    def config_problems(self, model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        """Its own settings, then each model as the single-model server it runs as."""
        problems: list[Problem] = []
        if model.hf_repo is not None:
            problems.append((f"{path}.hf_repo", "a server with on_demand models loads them by name; move hf_repo into "
                             "on_demand.models.<name>.hf_repo"))
        if model.role != "chat":
            problems.append((f"{path}.on_demand", "on-demand models are chat models: an embedding server serves one"))
        if model.workload.replicas > 1 or model.workload.kind != "Deployment":
            problems.append((f"{path}.workload", "a router runs as one Deployment replica on the shared cache"))
        for index, arg in enumerate(model.extra_args):
            if _PRESET_CUT.search(arg):
                problems.append((f"{path}.extra_args[{index}]", f"{arg!r}: the router writes it into its preset file, "
                                 "whose parser drops the spaces around a value and reads ' ;' or ' #' as a comment; "
                                 "write it without them"))
        for name in model.on_demand.models:
            for where, message in CHILD.config_problems(model.as_single(name), path, pool):
                # The router's own extra_args reach every child: a problem with them is the router's field's, said
                # once (Problems drops repeats), not under each model's path, where no extra_args is written.
                if not where.startswith(f"{path}.extra_args"):
                    where = where.replace(path, f"{path}.on_demand.models.{name}", 1)
                problems.append((where, message))
        return problems

    def estimate(self, model: "ModelServer", pool: "NodePool", path: str,
                 pools: Optional[Mapping[str, "NodePool"]] = None) -> tuple[Optional[OnRequest], list[Problem]]:
        """Each model as the single-model server it runs as; which may be resident together is the
        plan's (planning/residency.py)."""
        problems: list[Problem] = []
        models: list[OnRequestModel] = []
        for name, entry in model.on_demand.models.items():
            estimate, found = CHILD.estimate(model.as_single(name), pool, f"{path}.on_demand.models.{name}")
            problems += found
            if estimate is not None:
                models.append(OnRequestModel(name=name, source=entry.hf_repo, pinned=entry.pinned, estimate=estimate))
        if problems:
            return None, problems
        return OnRequest(models=tuple(models), max_loaded=model.on_demand.max_loaded, path=f"{path}.on_demand"), []

    def args(self, model: "ModelServer", plan: Optional["ServerPlan"] = None) -> list[str]:
        return router_args(model)

    def admission(self, model: "ModelServer", plan: "ServerPlan") -> Optional[Admission]:
        """The memory-aware admission the plan's residency is held to at run time (planning/residency.py)."""
        if plan.residency is None:
            raise ValueError(f"{model.name}: a router's residency is planned from memory before the pod is built")
        return Admission(server_port=router_port(model), plan_file=f"{PRESET_DIR}/{ADMISSION_FILE}",
                         image=model.on_demand.programs_image)

    def env(self, model: "ModelServer") -> list[dict]:
        return []

    def config_files(self, model: "ModelServer", plan: Optional["ServerPlan"] = None) -> dict[str, dict[str, str]]:
        """The preset and the list its init container and keeper fetch, and the admission proxy's plan,
        mounted from a ConfigMap (each applied in place: the proxy re-reads its plan when it changes)."""
        files = {PRESET_FILE: preset_ini(model, CHILD.args), LIBRARY_FILE: library_json(model, plan)}
        if plan is not None and plan.residency is not None:
            admission = {**plan.residency.admission_plan(), "allowed_paths": list(ROUTER_CLIENT_PATHS)}
            files[ADMISSION_FILE] = json.dumps(admission, indent=2, sort_keys=True) + "\n"
        return {PRESET_DIR: files}

    def library(self, model: "ModelServer", mount_path: str) -> Optional[Library]:
        # GET /models?reload=1 re-reads the preset and keeps unchanged children (server-models.cpp:1963-1967).
        return Library(list_file=LIBRARY_PATH, preset_file=PRESET_PATH, served_preset=SERVED_PRESET_PATH,
                       folder=library_dir(model, mount_path), reload_path="/models?reload=1",
                       image=model.on_demand.programs_image)

    def cache_env(self, model: "ModelServer", mount_path: str) -> list[dict]:
        return cache_env(model, mount_path)

    def credentials(self, model: "ModelServer") -> Optional[Credentials]:
        return CHILD.credentials(model)

    def health_path(self, model: "ModelServer") -> str:
        return LLAMACPP_HEALTH_PATH

    def metrics_path(self, model: "ModelServer") -> Optional[str]:
        return LLAMACPP_METRICS_PATH if model.metrics else None

    def metrics_scrapes(self, model: "ModelServer") -> list[Scrape]:
        """The admission proxy's own (residency) and each model's: a router has no metrics of its own, each
        model's child answers /metrics?model=<name>, with
        no label naming the model (server-task.cpp:1596-1598), so each is a target of its own that adds
        it. autoload=false: a scrape must not load a model (it would evict a used one); an unloaded
        model answers 400, an expected failure (ROUTER_FACTS.md f)."""
        # The admission proxy answers /metrics without ?model= itself: residency, unloads, failed loads.
        return [Scrape(labels={"scrape": "admission"})] + [
            Scrape(labels={"model": name}, params={"model": (name,), "autoload": ("false",)}, optional=True)
            for name in model.on_demand.models]

    def client_paths(self, model: "ModelServer") -> Optional[tuple[str, ...]]:
        """Inference and listing only: its model management (download, delete, load, unload) would be
        any key holder's (common.constants.ROUTER_CLIENT_PATHS). Its WebUI is not routed either."""
        return ROUTER_CLIENT_PATHS

    def served_model(self, model: "ModelServer", public_name: Optional[str]) -> Optional[str]:
        """A router answers only the names it lists, under those names (config refuses any other)."""
        return public_name

    def reports_queue(self, model: "ModelServer") -> bool:
        return CHILD.reports_queue(model)

    def exports_llamacpp_metrics(self, model: "ModelServer") -> bool:
        return CHILD.exports_llamacpp_metrics(model)
