"""llama.cpp's llama-server in single-model mode: the flags generated from typed settings, its
paths, and its memory model. Behaviours relied on here are checked against a real server built
from the pinned release (tests/test_llama_contract.py)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from common.constants import LLAMACPP_HEALTH_PATH, LLAMACPP_METRICS_PATH, METRICS_TOKEN_KEY
from common.quantity import parse_quantity
from planning.catalog import facts_for, repo_of
from planning.memory import MemoryEstimate, VramEstimate

from .base import Credentials, Engine, Library, Problem, Scrape
from .llamacpp_router import cache_env as router_cache_env
from .llamacpp_router import (LIBRARY_FILE, LIBRARY_PATH, PRESET_DIR, PRESET_FILE, PRESET_PATH, SERVED_PRESET_PATH, library_dir,
                              library_json,
                              preset_ini, router_args, shared_flags)
from .llamacpp_speed import predict_tok_s
from .llamacpp_memory import (
    DEFAULT_UBATCH,
    discrete_split,
    layout,
    llamacpp_estimate,
    model_bits,
    quant_of,
    weights_bytes,
)

if TYPE_CHECKING:
    from config.types import GpuBackend, ModelFacts, ModelServer, NodePool

# Values per block of each quantized KV cache type (ggml's QK4_0, QK8_0 ...: 32); f16/bf16/f32 are not blocked.
KV_TYPE_BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "iq4_nl": 32}

_ORIGIN = re.compile(r"https?://[a-z0-9.-]+(:[0-9]{1,5})?")

# Where the API key Secret is mounted; --api-key-file names a file in it.
API_KEY_DIR = "/run/secrets/llama-api-key"

# The flags that name the weights llama-server downloads itself (common/arg.cpp), by long form.
WEIGHTS_FLAGS = {"-hf": "--hf-repo", "-hfr": "--hf-repo", "--hf-repo": "--hf-repo", "-hff": "--hf-file",
                 "--hf-file": "--hf-file", "-mu": "--model-url", "--model-url": "--model-url"}

# Every flag args() generates, with its aliases: extra_args may not set them again (llama.cpp
# takes the last occurrence, so a duplicate would silently override the planned value).
GENERATED_FLAGS = frozenset({
    "--hf-repo", "-hf", "-hfr", "--model", "-m", "--n-gpu-layers", "-ngl", "--gpu-layers", "--threads", "-t",
    "--ctx-size", "-c", "--ubatch-size", "-ub", "--cors-origins", "--host", "--port", "--api-key",
    "--api-key-file", "--metrics", "--embeddings", "--embedding", "--no-webui", "--webui", "--no-ui", "--ui",
    "--parallel", "-np", "--cache-ram", "-cram", "--ctx-checkpoints", "-ctxcp", "--pooling",
    "--cache-type-k", "-ctk", "--cache-type-v", "-ctv", "--kv-unified", "-kvu", "--no-kv-unified", "-no-kvu",
    "--batch-size", "-b", "--n-cpu-moe", "-ncmoe", "--cpu-moe", "-cmoe", "--split-mode", "-sm", "--tensor-split", "-ts",
    "--main-gpu", "-mg",
})
# Placements the planner cannot see: a user's tensor overrides move weights between devices behind
# its back (the same regexes --n-cpu-moe writes); cpu_moe_layers and gpus say it in planned terms.
UNPLANNED_FLAGS = frozenset({"--override-tensor", "-ot", "--no-kv-offload", "-nkvo"})
# common/common.h (b10729): n_batch 2048. llama.cpp clamps the micro-batch to the batch
# (src/llama-context.cpp: n_ubatch = min(n_batch, n_ubatch)), so a larger ubatch needs --batch-size.
DEFAULT_BATCH = 2048


def first_key(key_file: str) -> str:
    """The key a client of the server sends: --api-key-file holds one key per line and the server
    accepts any of them (checked against the real server), so during a rotation the file holds the
    old key first and the new one after it; everything that sends a key sends the first line."""
    lines = [line.strip() for line in key_file.splitlines() if line.strip()]
    return lines[0] if lines else ""



class LlamaCpp(Engine):
    """llama-server serving one model."""

    name = "llamacpp"
    component_types = {"chat": "LlamaServer", "embedding": "EmbedServer"}
    weights_flags = WEIGHTS_FLAGS
    _credentials = Credentials(mount_dir=API_KEY_DIR, metrics_token_key=METRICS_TOKEN_KEY, client_key=first_key)

    def config_problems(self, model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        problems: list[Problem] = []
        if model.on_demand is not None:
            return self._router_problems(model, path, pool)
        if model.hf_repo is None:
            problems.append((f"{path}.hf_repo", "required for engine llamacpp (org/Model-GGUF:QUANT)"))
        if model.openai is not None:
            problems.append((
                f"{path}.openai",
                "engine llamacpp does not read an openai block; remove it, or set engine: openai to run another server",
            ))
        if model.workload.cache_volume is None and model.workload.replicas > 1:
            # common/download.cpp (b10729) downloads into <file>.downloadInProgress and renames it,
            # with no lock between processes: replicas starting together on an empty shared cache
            # write the same file at once.
            problems.append((
                f"{path}.workload.replicas",
                "llama.cpp replicas on the shared cache would download the same file at once (its downloader takes "
                "no lock between processes); run 1 replica, give each replica its own claim (kind: StatefulSet with "
                "cache_volume and prefetch), or one server per model key",
            ))
        limit = parse_quantity(model.resources.cpu_limit)
        if model.threads > limit:
            cores = max(1, int(limit))
            problems.append((
                f"{path}.threads",
                f"{model.threads} threads on a CPU limit of {model.resources.cpu_limit}: the kernel throttles the pod "
                f"every period and generation stalls; set threads: {cores} or raise resources.cpu_limit",
            ))
        if pool is not None and model.backend_on(pool) == "cpu" and model.gpu_layers > 0:
            problems.append((
                f"{path}.gpu_layers",
                f"{model.gpu_layers} layers to offload, but the image is a CPU build (the server ignores the flag); "
                "set gpu_layers: 0",
            ))
        problems += self._cors_problems(model, path)
        if model.ubatch_size is not None and model.ubatch_size > model.ctx_size:
            problems.append((f"{path}.ubatch_size", f"{model.ubatch_size} exceeds ctx_size {model.ctx_size}"))
        for index, arg in enumerate(model.extra_args):
            flag = arg.split("=", 1)[0]
            if flag in GENERATED_FLAGS:
                problems.append(
                    (f"{path}.extra_args[{index}]", f"{arg} is generated from a typed field; set that field instead")
                )
            elif flag in UNPLANNED_FLAGS:
                problems.append((f"{path}.extra_args[{index}]", f"{arg} moves weights or KV between devices where the "
                                 "plan cannot see it; use cpu_moe_layers (experts in RAM) or gpus (several cards)"))
        problems += self._placement_problems(model, path, pool)
        return problems

    def _router_problems(self, model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        """A router: its own settings, then each model as the single-model server it runs as."""
        problems: list[Problem] = []
        if model.hf_repo is not None:
            problems.append((f"{path}.hf_repo", "a server with on_demand models loads them by name; move hf_repo into "
                             "on_demand.models.<name>.hf_repo"))
        if model.role != "chat":
            problems.append((f"{path}.on_demand", "on-demand models are chat models: an embedding server serves one"))
        if model.workload.replicas > 1 or model.workload.kind != "Deployment":
            problems.append((f"{path}.workload", "a router runs as one Deployment replica on the shared cache"))
        for name in model.on_demand.models:
            single = model.as_single(name)
            for where, message in self.config_problems(single, path, pool):
                problems.append((where.replace(path, f"{path}.on_demand.models.{name}", 1), message))
        return problems

    @staticmethod
    def _placement_problems(model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        problems: list[Problem] = []
        discrete = pool is not None and pool.discrete() and model.uses_gpu(pool)
        if model.cpu_moe_layers is not None and not discrete:
            problems.append((f"{path}.cpu_moe_layers", "keeps experts in system RAM beside a discrete GPU; on unified "
                             "memory or a CPU everything is in the same memory already: remove it"))
        if model.gpus > 1:
            if not discrete:
                problems.append((f"{path}.gpus", "several GPUs per replica are discrete cards (node_pools.<pool>.vram); "
                                 "set gpus: 1"))
            elif pool is not None and model.gpus > pool.gpus_per_node:
                problems.append((f"{path}.gpus", f"{model.gpus} GPUs per replica, but node pool {model.node_pool} has "
                                 f"{pool.gpus_per_node} per node; set gpus: {pool.gpus_per_node} or less"))
            elif pool is not None and pool.gpu_shares > 1:
                # NVIDIA's time-slicing hands out replicas of a card: a pod asking for 2 may get two
                # slices of the same GPU (the plugin's own docs), so the layers would not get 2 cards.
                problems.append((f"{path}.gpus", f"node pool {model.node_pool} shares each GPU (gpu_shares "
                                 f"{pool.gpu_shares}): a request for {model.gpus} may be two slices of one card; use "
                                 "gpu_shares: 1 on a pool for multi-GPU servers"))
        return problems

    @staticmethod
    def _cors_problems(model: "ModelServer", path: str) -> list[Problem]:
        """tools/server/server-http.cpp (b10729) sends --cors-origins as the Access-Control-Allow-Origin
        value as it is, except for the special values localhost and *."""
        value = model.cors_origins
        if value is None:
            return [(f"{path}.cors_origins", "without it llama-server echoes any Origin with credentials allowed, so "
                     "any page a browser visits could call the API; set localhost (no other origin) or the one origin that may")]
        if value in ("localhost",):
            return []
        if value == "*" or "," in value or not _ORIGIN.fullmatch(value):
            return [(f"{path}.cors_origins", f"{value!r}: the server sends it as the one allowed origin, which browsers "
                     "honour only for a single scheme://host[:port] (a list or * is not a safe setting); set localhost "
                     "or one origin such as https://chat.example.org")]
        return []

    def plan_problems(self, key: str, model: "ModelServer", facts: Optional["ModelFacts"]) -> list[Problem]:
        """Why the server's memory cannot be planned, or its promise cannot be kept."""
        if facts is None:
            return [(
                f"models.{key}.facts",
                f"no architecture facts for {repo_of(model.hf_repo or '')}; give params_b, layers, kv_heads and "
                "head_dim so its memory can be planned",
            )]
        if model.weights is None:
            try:
                model_bits(model, facts)
            except KeyError:
                return [(
                    f"models.{key}.weights",
                    f"quant {quant_of(model.hf_repo or ':?')} has no known bits per weight; set weights to the GGUF's size",
                )]
        problems = self._pooling_problems(key, model, facts) + self._kv_type_problems(key, model, facts)
        if model.cpu_moe_layers is not None and facts.expert_params_b is None:
            problems.append((f"models.{key}.facts.expert_params_b", "cpu_moe_layers keeps experts in RAM, so the plan "
                             "needs their size: give expert_params_b (the routed experts' parameters, all layers)"))
        elif model.cpu_moe_layers is not None and model.cpu_moe_layers > facts.layers:
            problems.append((f"models.{key}.cpu_moe_layers", f"{model.cpu_moe_layers} exceeds the model's "
                             f"{facts.layers} layers; set cpu_moe_layers: {facts.layers} (all experts in RAM)"))
        return problems

    @staticmethod
    def _kv_type_problems(key: str, model: "ModelServer", facts: "ModelFacts") -> list[Problem]:
        """A quantized KV cache stores heads in blocks of 32 values: llama.cpp refuses to start when the
        head dimension is not a multiple ("K cache type q8_0 with block size 32 does not divide
        n_embd_head_k", seen running the pinned build)."""
        problems: list[Problem] = []
        for field, kind in (("cache_type_k", model.cache_type_k), ("cache_type_v", model.cache_type_v)):
            block = KV_TYPE_BLOCK.get(kind or "f16", 1)
            if facts.head_dim % block:
                problems.append((
                    f"models.{key}.{field}",
                    f"{kind} stores the cache in blocks of {block} values, which do not divide this model's head "
                    f"dimension of {facts.head_dim}; llama.cpp would refuse to start; use f16 or bf16",
                ))
        return problems

    @staticmethod
    def _pooling_problems(key: str, model: "ModelServer", facts: "ModelFacts") -> list[Problem]:
        """Pooling that needs the whole input in one micro-batch (mean, cls) makes the server refuse
        inputs longer than --ubatch-size with HTTP 500, although --ctx-size promises more."""
        if model.role != "embedding" or facts.pooling not in ("mean", "cls"):
            return []
        ubatch = model.ubatch_size or DEFAULT_UBATCH
        if ubatch >= model.ctx_size:
            return []
        return [(
            f"models.{key}.ubatch_size",
            f"{facts.pooling} pooling needs the whole input in one micro-batch, so inputs over {ubatch} tokens would "
            f"be refused although ctx_size is {model.ctx_size}; set ubatch_size: {model.ctx_size} (or lower ctx_size "
            f"to {ubatch})",
        )]

    def args(self, model: "ModelServer") -> list[str]:
        """llama-server's command line, generated from the typed settings (a router's: its shared
        flags; each model's own are in its preset section, ``config_files``)."""
        key_file = f"{API_KEY_DIR}/{model.api_key.secret_key}" if model.api_key is not None else None
        if model.on_demand is not None:
            return router_args(model, key_file)
        if model.hf_repo is None:  # refused by config_problems before anything is built
            raise ValueError(f"{model.name}: engine llamacpp needs hf_repo")
        args = ["--hf-repo", model.hf_repo]
        if model.role == "embedding":
            args.append("--embeddings")  # serves POST /v1/embeddings
            facts = facts_for(model)
            if facts is not None and facts.pooling is not None:
                # Explicit: the pooling the planner checked the micro-batch against is the one that
                # runs, whatever a re-uploaded GGUF declares.
                args += ["--pooling", facts.pooling]
        args += ["--n-gpu-layers", str(model.gpu_layers), "--threads", str(model.threads), "--ctx-size", str(model.ctx_size)]
        if model.cpu_moe_layers:
            args += ["--n-cpu-moe", str(model.cpu_moe_layers)]
        if model.gpus > 1:
            # Explicit and even: llama.cpp's default splits by each card's free memory at start, which
            # depends on what else runs there; the plan gives each card the same share.
            args += ["--split-mode", "layer", "--tensor-split", ",".join(["1"] * model.gpus)]
        if model.ubatch_size is not None:
            args += ["--ubatch-size", str(model.ubatch_size)]
            if model.ubatch_size > DEFAULT_BATCH:
                args += ["--batch-size", str(model.ubatch_size)]
        # Slots and host-RAM caches are set whenever the config sets them, so the plan counts what runs.
        if model.parallel is not None:
            # One KV pool for all slots, so one request may use the whole --ctx-size: the server
            # turns it on itself only when --parallel is auto (tools/server/server.cpp); with an
            # explicit --parallel N each slot would get ctx/N (src/llama-context.cpp n_ctx_seq).
            args += ["--parallel", str(model.parallel), "--kv-unified"]
        if model.cache_type_k is not None:
            args += ["--cache-type-k", model.cache_type_k]
        if model.cache_type_v is not None:
            args += ["--cache-type-v", model.cache_type_v]
        if model.cache_ram_mib is not None:
            args += ["--cache-ram", str(model.cache_ram_mib)]
        if model.ctx_checkpoints is not None:
            args += ["--ctx-checkpoints", str(model.ctx_checkpoints)]
        return args + shared_flags(model, key_file) + list(model.extra_args)

    def env(self, model: "ModelServer") -> list[dict]:
        return []

    def config_files(self, model: "ModelServer") -> dict[str, dict[str, str]]:
        """Files the server reads, mounted from a ConfigMap: a router's preset and the list its
        init container and keeper fetch."""
        if model.on_demand is None:
            return {}
        return {PRESET_DIR: {PRESET_FILE: preset_ini(model, self.args), LIBRARY_FILE: library_json(model)}}

    def library(self, model: "ModelServer", mount_path: str) -> Optional[Library]:
        if model.on_demand is None:
            return None
        # GET /models?reload=1 re-reads the preset and keeps unchanged children (server-models.cpp:1963-1967).
        return Library(list_file=LIBRARY_PATH, preset_file=PRESET_PATH, served_preset=SERVED_PRESET_PATH,
                       folder=library_dir(model, mount_path),
                       reload_path="/models?reload=1")

    def cache_env(self, model: "ModelServer", mount_path: str) -> list[dict]:
        """--hf-repo downloads into LLAMA_CACHE: on the shared volume the download is a one-time cost,
        and the server stays off a home directory it cannot write as a non-root UID. A router reads
        its own folder of the volume, filled before it starts (llamacpp_router.cache_env)."""
        if model.on_demand is not None:
            return router_cache_env(model, mount_path)
        return [{"name": "LLAMA_CACHE", "value": mount_path}]

    def credentials(self, model: "ModelServer") -> Optional[Credentials]:
        return self._credentials

    def facts(self, model: "ModelServer") -> Optional["ModelFacts"]:
        return facts_for(model)

    def weights_bytes(self, model: "ModelServer", facts: Optional["ModelFacts"]) -> float:
        if facts is None:  # refused by plan_problems
            raise ValueError(f"{model.name}: no architecture facts")
        return weights_bytes(model, facts)

    def predict_decode(self, model: "ModelServer", facts: Optional["ModelFacts"], pool: "NodePool",
                       discrete: bool) -> Optional[dict[str, float]]:
        if facts is None:
            return None
        backend = model.backend_on(pool) if model.uses_gpu(pool) else "cpu"
        return predict_tok_s(model, facts, pool, backend, discrete,
                             {"empty": 0, "half": model.ctx_size // 2, "full": model.ctx_size})

    def read_per_token(self, model: "ModelServer", facts: Optional["ModelFacts"], discrete: bool) -> Optional[tuple[float, float]]:
        """Weights read per generated token: every dense part and the active experts (MoE), from where
        each lives (Layout); the output layer once."""
        if facts is None:
            return None
        return layout(model, facts).read_per_token(discrete)

    def health_path(self, model: "ModelServer") -> str:
        return LLAMACPP_HEALTH_PATH

    def metrics_path(self, model: "ModelServer") -> Optional[str]:
        return LLAMACPP_METRICS_PATH if model.metrics else None

    def metrics_scrapes(self, model: "ModelServer") -> list[Scrape]:
        """A router has no metrics of its own: each model's child answers /metrics?model=<name>, with
        no label naming the model (server-task.cpp:1596-1598), so each is a target of its own that adds
        it. autoload=false: a scrape must not load a model (it would evict a used one); an unloaded
        model answers 400, an expected failure (ROUTER_FACTS.md f)."""
        if model.on_demand is None:
            return [Scrape()]
        return [Scrape(labels={"model": name}, params={"model": (name,), "autoload": ("false",)}, optional=True)
                for name in model.on_demand.models]

    def served_model(self, model: "ModelServer", public_name: Optional[str]) -> Optional[str]:
        """In single-model mode llama-server answers any model name: it is sent the public one. A
        router answers only the names it lists, under those names (config refuses any other)."""
        return public_name

    def memory(self, model: "ModelServer", facts: Optional["ModelFacts"], backend: "GpuBackend") -> MemoryEstimate:
        if facts is None:  # refused by plan_problems
            raise ValueError(f"{model.name}: no architecture facts")
        return llamacpp_estimate(model, facts, backend)

    def discrete(self, model: "ModelServer", facts: Optional["ModelFacts"]) -> tuple[MemoryEstimate, VramEstimate]:
        """(system RAM, one GPU's VRAM) with layers offloaded to a discrete GPU."""
        if facts is None:  # refused by plan_problems
            raise ValueError(f"{model.name}: no architecture facts")
        return discrete_split(model, facts)

    def reports_queue(self, model: "ModelServer") -> bool:
        """llamacpp:requests_deferred is on /metrics when --metrics is set."""
        return model.metrics
