"""llama.cpp's llama-server in single-model mode: the flags generated from typed settings, its
paths, and its memory model. Behaviours relied on here are checked against a real server built
from the pinned release (tests/test_llama_contract.py)."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Mapping, Optional

from common.constants import EMBEDDINGS_PATH, LLAMACPP_HEALTH_PATH, LLAMACPP_METRICS_PATH, METRICS_TOKEN_KEY
from common.quantity import GIB, MIB, parse_quantity
from config.catalog import facts_for, lookup, near_repos, repo_of
from planning.memory import Estimate, weights_quantity

from .base import Credentials, Engine, Problem
from .llamacpp_flags import extra_args_problems
from .llamacpp_ceiling import faster_than_on_card
from .llamacpp_held import decode_held_warning, unfigured_experts_warning
from .llamacpp_prefill import prefill
from .llamacpp_speed import experts_figure_problems, is_range, predict_range_tok_s, range_reasons
from .llamacpp_split import RPC_RANGE_WHY, one_node_instead, split_estimate
from .llamacpp_memory import (
    BITS_PER_WEIGHT,
    DEFAULT_BATCH,
    effective_batch,
    DEFAULT_UBATCH,
    discrete_split,
    layout,
    llamacpp_estimate,
    model_bits,
    quant_of,
    weights_bytes,
)

if TYPE_CHECKING:
    from config.facts import Projector
    from config.types import ModelFacts, ModelServer, NodePool
    from planning.capacity import ServerPlan

# Values per block of each quantized KV cache type (ggml's QK4_0, QK8_0 ...: 32); f16/bf16/f32 are not blocked.
# The KV cache types b10729's CUDA flash attention runs on the card without GGML_CUDA_FA_ALL_QUANTS, K and V alike.
CUDA_FA_KV_TYPES = frozenset({"f32", "f16", "bf16", "q8_0", "q4_0"})
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


def first_key(key_file: str) -> str:
    """The key a client of the server sends: --api-key-file holds one key per line and the server
    accepts any of them (checked against the real server), so during a rotation the file holds the
    old key first and the new one after it; everything that sends a key sends the first line."""
    lines = [line.strip() for line in key_file.splitlines() if line.strip()]
    return lines[0] if lines else ""


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


def key_file(model: "ModelServer") -> str | None:
    """--api-key-file: the key Secret's file, when the server takes a key."""
    return f"{API_KEY_DIR}/{model.api_key.secret_key}" if model.api_key is not None else None


def projector_gib(projector: "Projector", backend: str) -> tuple[float, float]:
    """(weights, compute buffer) of a vision projector: flash attention on, its default, where the
    backend has it for the projector's heads (CPU, CUDA: measured and read in ggml-cuda/fattn.cu); the
    larger buffer without it elsewhere (not measured there: the safe side)."""
    compute = projector.compute_mib if backend in ("cpu", "cuda") else (projector.compute_no_fa_mib or projector.compute_mib)
    return projector.weights_mib * MIB / GIB, compute * MIB / GIB


class LlamaCpp(Engine):
    """llama-server serving one model."""

    name = "llamacpp"
    config_name = "llamacpp"
    component_types = {"chat": "LlamaServer", "embedding": "EmbedServer"}
    weights_flags = WEIGHTS_FLAGS
    # Half an f16 cache's bytes (1.06 per element), and llama.cpp's CUDA, Metal and Vulkan builds run it with
    # flash attention; decoded slower at depth where measured (llamacpp_speed.Q8_0_KV_SLOWER_PCT_H200).
    kv_cache_fallback = "q8_0"
    _credentials = Credentials(mount_dir=API_KEY_DIR, metrics_token_key=METRICS_TOKEN_KEY, client_key=first_key)

    def config_problems(self, model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        problems: list[Problem] = []
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
        problems += extra_args_problems(list(model.extra_args), f"{path}.extra_args", GENERATED_FLAGS)
        problems += self._placement_problems(model, path, pool)
        problems += size_problems(model, path)
        return problems

    @staticmethod
    def _placement_problems(model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        problems: list[Problem] = []
        discrete = pool is not None and pool.discrete() and model.uses_gpu(pool)
        if model.cpu_moe_layers is not None and not discrete:
            problems.append((f"{path}.cpu_moe_layers", "keeps experts in system RAM beside a discrete GPU; on unified "
                             "memory or a CPU everything is in the same memory already: remove it"))
        if discrete:
            problems += experts_figure_problems(pool, model.backend_on(pool), f"node_pools.{model.node_pool}")
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

    def estimate(self, model: "ModelServer", pool: "NodePool", path: str,
                 pools: Optional[Mapping[str, "NodePool"]] = None) -> tuple[Optional[Estimate], list[Problem]]:
        """Memory from the architecture facts (engines/llamacpp_memory.py): on a discrete GPU split
        between the card and system RAM, else all in the node's memory; decode from where each
        weight lives (engines/llamacpp_speed.py)."""
        facts = facts_for(model)
        problems = self._plan_problems(path, model, facts) + self._cuda_kv_problems(path, model, pool)
        if facts is None or any(where.endswith((".facts", ".weights")) for where, _ in problems):
            return None, problems
        if model.rpc is not None:
            # A helper on a card runs its blocks' attention there: its cache types must have a kernel too.
            for helper in model.rpc.helpers:
                member = model.model_copy(update={"backend": helper.backend or model.backend, "gpu_layers": 999})
                problems += [p for p in self._cuda_kv_problems(path, member, (pools or {}).get(helper.node_pool, pool))
                             if p not in problems]
            return self._split(model, facts, dict(pools or {model.node_pool: pool}), path, problems)
        discrete = pool.discrete() and model.uses_gpu(pool)
        if discrete:
            memory, vram = discrete_split(model, facts, model.backend_on(pool))
        else:
            memory, vram = llamacpp_estimate(model, facts, model.backend_on(pool)), None
        backend = model.compute_backend(pool)
        span = predict_range_tok_s(model, facts, pool, backend, discrete,
                                   {"empty": 0, "half": model.ctx_size // 2, "full": model.ctx_size})
        decode = {name: low for name, (low, _) in span.items()} if span else None
        ranged = bool(span) and any(is_range(low, high) for low, high in span.values())
        # One figure printed: how far its class has held out of sample, where short of the goal (a range says why).
        held = decode_held_warning(model, facts, backend, discrete, path) if decode and not ranged else None
        unfigured = (unfigured_experts_warning(model, facts, pool, backend, discrete, path) if decode and not ranged
                     else None)
        prompt = prefill(model, facts, pool, backend, discrete)
        download = weights_bytes(model, facts)
        if facts.mmproj is not None:
            # The projector: llama.cpp fetches it with the model and loads it on the GPU when the model
            # offloads (mmproj_use_gpu, common/common.h), else in the node's memory; its weights and the
            # compute buffer it reserves at load (config/catalog.yaml, measured by the projector oracle).
            weights, compute = projector_gib(facts.mmproj, backend)
            if vram is not None:
                vram = dataclasses.replace(vram, weights_gib=vram.weights_gib + weights, reserve_gib=vram.reserve_gib + compute)
            else:
                memory = dataclasses.replace(memory, weights_gib=memory.weights_gib + weights,
                                             overhead_gib=memory.overhead_gib + compute)
            download += facts.mmproj.weights_mib * MIB
        return Estimate(
            memory=memory, vram=vram,
            weights=model.weights or weights_quantity(download),
            read_per_token=layout(model, facts).read_per_token(discrete),
            decode_predicted_tok_s=decode,
            decode_range_tok_s=span if ranged else None,
            decode_range_why=tuple(range_reasons(model, facts, pool, backend, discrete)) if ranged else (),
            prefill_tok_s=round(prompt[0], 1) if prompt else None,
            first_token_full_s=round(prompt[1], 2) if prompt else None,
            multimodal=facts.mmproj is not None,
            warnings=tuple(w for w in [faster_than_on_card(model, facts, pool, backend, path, span), held, unfigured]
                           if w),
        ), problems

    @staticmethod
    def _split(model: "ModelServer", facts: "ModelFacts", pools: dict, path: str,
               problems: list[Problem]) -> tuple[Optional[Estimate], list[Problem]]:
        """A model over several nodes (engines/llamacpp_split.py): the main server's share is its memory."""
        split, decode, prompt, found = split_estimate(model, facts, pools, path)
        problems = problems + found
        if split is None:
            return None, problems
        warnings: tuple[str, ...] = ()
        if model.rpc is not None and model.rpc.link is None:
            warnings = (f"{path}.rpc.link: not given, so the split's decode is not predicted; measure the link between "
                        "the nodes (make link-profile) and set rtt_ms and gbps",)
        elif decode is None:
            warnings = (f"{path}.rpc: no decode figure (a node's decode is not modelled for its backend)",)
        else:
            instead = one_node_instead(model, facts, pools[model.node_pool], path, decode["half"][0])
            warnings = (instead,) if instead else ()
        return Estimate(
            memory=split.main.memory, vram=split.main.vram,
            weights=model.weights or weights_quantity(weights_bytes(model, facts)),
            read_per_token=None, decode_predicted_tok_s={k: low for k, (low, _) in decode.items()} if decode else None,
            decode_range_tok_s=decode, decode_range_why=(RPC_RANGE_WHY,) if decode else (), split=split, warnings=warnings,
            prefill_tok_s=round(prompt[0], 1) if prompt else None,
            first_token_full_s=round(prompt[1], 2) if prompt else None,
        ), problems

    def _plan_problems(self, path: str, model: "ModelServer", facts: Optional["ModelFacts"]) -> list[Problem]:
        """Why the server's memory cannot be planned, or its promise cannot be kept."""
        if facts is None:
            near = near_repos(model.hf_repo or "")
            guess = f"did you mean {' or '.join(near)} (in the catalog)? Else give " if near else "give "
            return [(
                f"{path}.facts",
                f"no architecture facts for {repo_of(model.hf_repo or '')}; {guess}params_b, layers, kv_heads and "
                "head_dim (tools/gguf_facts.py org/Repo-GGUF:QUANT reads them from the GGUF) so its memory can be planned",
            )]
        if model.weights is None:
            try:
                model_bits(model, facts)
            except KeyError:
                return [(
                    f"{path}.weights",
                    f"quant {quant_of(model.hf_repo or ':?')} has no known bits per weight; set weights to the GGUF's size",
                )]
        problems = self._pooling_problems(path, model, facts) + self._kv_type_problems(path, model, facts)
        if model.cpu_moe_layers is not None and facts.expert_params_b is None:
            problems.append((f"{path}.facts.expert_params_b", "cpu_moe_layers keeps experts in RAM, so the plan "
                             "needs their size: give expert_params_b (the routed experts' parameters, all layers)"))
        elif model.cpu_moe_layers is not None and model.cpu_moe_layers > facts.layers:
            problems.append((f"{path}.cpu_moe_layers", f"{model.cpu_moe_layers} exceeds the model's "
                             f"{facts.layers} layers; set cpu_moe_layers: {facts.layers} (all experts in RAM)"))
        return problems

    @staticmethod
    def _kv_type_problems(path: str, model: "ModelServer", facts: "ModelFacts") -> list[Problem]:
        """A quantized KV cache stores heads in blocks of 32 values: llama.cpp refuses to start when the
        head dimension is not a multiple ("K cache type q8_0 with block size 32 does not divide
        n_embd_head_k", seen running the pinned build)."""
        problems: list[Problem] = []
        for field, kind in (("cache_type_k", model.cache_type_k), ("cache_type_v", model.cache_type_v)):
            block = KV_TYPE_BLOCK.get(kind or "f16", 1)
            if facts.head_dim % block:
                problems.append((
                    f"{path}.{field}",
                    f"{kind} stores the cache in blocks of {block} values, which do not divide this model's head "
                    f"dimension of {facts.head_dim}; llama.cpp would refuse to start; use f16 or bf16",
                ))
        return problems

    @staticmethod
    def _cuda_kv_problems(path: str, model: "ModelServer", pool: "NodePool") -> list[Problem]:
        """The official CUDA images are built without GGML_CUDA_FA_ALL_QUANTS (.devops/cuda.Dockerfile), so
        b10729's flash attention runs on the card only for a K and V cache of one type among CUDA_FA_KV_TYPES
        (ggml-cuda/fattn.cu: ggml_cuda_fattn_kv_type_supported, and K->type != V->type gives no kernel); any
        other pair leaves the card without a kernel for it: llama.cpp's automatic choice then turns flash attention
        off, which a quantized V cache refuses (llama-context.cpp), or attention runs on the CPU every token."""
        if not model.uses_gpu(pool) or model.backend_on(pool) != "cuda":
            return []
        k, v = model.cache_type_k or "f16", model.cache_type_v or "f16"
        if k == v and k in CUDA_FA_KV_TYPES:
            return []
        field = "cache_type_v" if k in CUDA_FA_KV_TYPES and k != v else "cache_type_k"
        why = (f"a {k} K cache with a {v} V cache" if k != v else f"a {k} cache")
        return [(f"{path}.{field}", f"{why} has no flash-attention kernel in llama.cpp's CUDA images "
                 "(fattn.cu): the server would refuse to start or run attention on the CPU; set cache_type_k and cache_type_v "
                 "to one of " + ", ".join(sorted(CUDA_FA_KV_TYPES)))]

    @staticmethod
    def _pooling_problems(path: str, model: "ModelServer", facts: "ModelFacts") -> list[Problem]:
        """Pooling that needs the whole input in one micro-batch (mean, cls) makes the server refuse
        inputs longer than --ubatch-size with HTTP 500, although --ctx-size promises more."""
        if model.role != "embedding" or facts.pooling not in ("mean", "cls"):
            return []
        ubatch = model.ubatch_size or DEFAULT_UBATCH
        if ubatch >= model.ctx_size:
            return []
        return [(
            f"{path}.ubatch_size",
            f"{facts.pooling} pooling needs the whole input in one micro-batch, so inputs over {ubatch} tokens would "
            f"be refused although ctx_size is {model.ctx_size}; set ubatch_size: {model.ctx_size} (or lower ctx_size "
            f"to {ubatch})",
        )]

    def args(self, model: "ModelServer", plan: Optional["ServerPlan"] = None) -> list[str]:
        """llama-server's command line, generated from the typed settings."""
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
        split = plan.split if plan is not None else None
        # A split offloads every block to its GPU and RPC devices (llama.cpp gives a CPU no block of a split).
        layers = 999 if split is not None else model.gpu_layers
        args += ["--n-gpu-layers", str(layers), "--threads", str(model.threads), "--ctx-size", str(model.ctx_size)]
        if split is not None and model.rpc is not None:
            # The helpers' Services, in llama.cpp's device order, and the blocks each holds (the main server's own
            # device last, with the output layer: engines/llamacpp_rpc.py split_for_layers). Explicit, so llama.cpp's
            # --fit (on by default) keeps them.
            args += ["--rpc", plan.helper_endpoints(model.rpc.port),
                     "--split-mode", "layer", "--tensor-split", ",".join(map(str, split.tensor_split))]
        if model.cpu_moe_layers:
            args += ["--n-cpu-moe", str(model.cpu_moe_layers)]
        if model.gpus > 1:
            # Explicit and even: llama.cpp's default splits by each card's free memory at start, which
            # depends on what else runs there; the plan gives each card the same share.
            args += ["--split-mode", "layer", "--tensor-split", ",".join(["1"] * model.gpus)]
        if model.ubatch_size is not None:
            args += ["--ubatch-size", str(model.ubatch_size)]
            if effective_batch(model) > DEFAULT_BATCH:
                args += ["--batch-size", str(effective_batch(model))]
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
        return args + shared_flags(model, key_file(model)) + list(model.extra_args)

    def env(self, model: "ModelServer") -> list[dict]:
        return []

    def cache_env(self, model: "ModelServer", mount_path: str) -> list[dict]:
        """--hf-repo downloads into LLAMA_CACHE: on the shared volume the download is a one-time cost,
        and the server stays off a home directory it cannot write as a non-root UID. A router reads
        its own folder of the volume, filled before it starts (llamacpp_router.cache_env)."""
        return [{"name": "LLAMA_CACHE", "value": mount_path}]

    def credentials(self, model: "ModelServer") -> Optional[Credentials]:
        return self._credentials

    def health_path(self, model: "ModelServer") -> str:
        return LLAMACPP_HEALTH_PATH

    def metrics_path(self, model: "ModelServer") -> Optional[str]:
        return LLAMACPP_METRICS_PATH if model.metrics else None

    def client_paths(self, model: "ModelServer") -> Optional[tuple[str, ...]]:
        """A chat server: everything (API and WebUI). An embedding server: the embeddings path alone."""
        return (EMBEDDINGS_PATH,) if model.role == "embedding" else None

    def served_model(self, model: "ModelServer", public_name: Optional[str]) -> Optional[str]:
        """In single-model mode llama-server answers any model name: it is sent the public one. A
        router answers only the names it lists (llamacpp_router.LlamaCppRouter)."""
        return public_name

    def reports_queue(self, model: "ModelServer") -> bool:
        """llamacpp:requests_deferred is on /metrics when --metrics is set."""
        return model.metrics

    def exports_llamacpp_metrics(self, model: "ModelServer") -> bool:
        return model.metrics


# A size is believed only near what the file holds: llama.cpp's files weigh their parameters at the quant's
# bits (the table's are averages; embedding and output tensors kept larger make real files heavier, never
# this much lighter). A size the plan is told that is far below makes it hold a fraction of the real model.
SIZE_FLOOR = 0.75
# Facts that change a known repo's size: believed down to 10 % below the catalog's (a re-quant, a variant).
CATALOG_FLOOR = 0.9


def size_problems(model: "ModelServer", path: str) -> list[Problem]:
    """The sizes a stack states held to the model's own arithmetic and to the catalog: weights against
    parameters x bits, bits against the quant's, facts against the catalog's for a repo it knows."""
    facts = facts_for(model)
    if facts is None or model.hf_repo is None:
        return []
    problems: list[Problem] = []
    quant = quant_of(model.hf_repo)
    table = BITS_PER_WEIGHT.get(quant)
    if facts.bits_per_weight is not None and table is not None and facts.bits_per_weight < SIZE_FLOOR * table:
        problems.append((f"{path}.facts.bits_per_weight", f"{facts.bits_per_weight} is far below {quant}'s "
                         f"{table} bits per weight: the plan would hold a fraction of the file; remove it or correct it"))
    bits = facts.bits_per_weight or table
    expected = facts.params_b * 1e9 * bits / 8 if bits else None
    if model.weights is not None and expected is not None and parse_quantity(model.weights) < SIZE_FLOOR * expected:
        problems.append((f"{path}.weights", f"{model.weights} is far below what {facts.params_b:g}B parameters at "
                         f"{bits:g} bits weigh ({expected / GIB:.1f} GiB): the plan would hold a fraction of the file "
                         "(the downloader refuses a model larger than planned); remove weights or correct it"))
    known = lookup(model.hf_repo)
    if model.facts is not None and known is not None and known is not model.facts:
        ours = weights_bytes(model.model_copy(update={"facts": None}), known) if table or known.bits_per_weight else None
        theirs = weights_bytes(model, facts) if bits else None
        if ours is not None and theirs is not None and theirs < CATALOG_FLOOR * ours:
            problems.append((f"{path}.facts", f"makes {repo_of(model.hf_repo)} {theirs / GIB:.1f} GiB of weights, the "
                             f"catalog's facts {ours / GIB:.1f} GiB: the plan would count less than the file; remove "
                             "the keys that shrink it (params_b, bits_per_weight) or correct them"))
    return problems
