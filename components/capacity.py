"""Capacity planning: does every model fit its node's memory? Pure arithmetic, no Pulumi.

On an iGPU or APU the GPU and the CPU share one pool of memory, so "VRAM" is a policy: weights,
KV cache, the backend's working set and llama.cpp's host-side caches all count against the pod's
cgroup and the node. A plan that does not fit is refused before anything is applied, naming the
node pool, the workloads and the numbers, instead of an OOM kill after an hour's download.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from .budget import StartupBudget, startup_budget
from .catalog import CATALOG, repo_of
from .config import Backend, ModelFacts, ModelServer, NodePool, StackConfig
from .quantity import GIB, MIB, parse_quantity

# Memory the backend holds on top of the weights, per GiB of weights, counted against the pod.
BACKEND_OVERHEAD: dict[str, float] = {
    # Vulkan allocates the iGPU's working set from system RAM and it is charged to the pod's
    # cgroup: the seed measured 7.54 GiB RSS for 5.2 GiB of weights (x1.45).
    "vulkan": 7.54 / 5.2 - 1,
    # HIP maps the weights into GTT, which amdgpu does not charge to the memcg; the node pays for
    # them all the same. Compute buffers on top: a 10% margin, not a measurement.
    "rocm": 0.10,
    # Weights are counted as node memory, as on every unified-memory node this program targets;
    # compute buffers on top: a 10% margin, not a measurement.
    "cuda": 0.10,
    # mmap'd weights are page cache charged to the pod; compute buffers on top: a 10% margin.
    "cpu": 0.10,
}

# Bits per weight of common GGUF quantisations (llama.cpp's quantize table, averaged over tensors).
BITS_PER_WEIGHT: dict[str, float] = {
    "Q2_K": 2.96, "Q3_K_S": 3.50, "Q3_K_M": 3.91, "Q3_K_L": 4.27, "Q4_0": 4.55, "Q4_1": 5.0, "Q4_K_S": 4.58,
    "Q4_K_M": 4.85, "Q5_0": 5.54, "Q5_1": 6.0, "Q5_K_S": 5.54, "Q5_K_M": 5.69, "Q6_K": 6.56, "Q8_0": 8.5,
    "F16": 16.0, "BF16": 16.0, "F32": 32.0,
}
KV_BYTES_PER_ELEMENT = 2  # f16 K and V, llama.cpp's default cache type
CTX_PAD = 256  # llama.cpp pads the context to a multiple of this
AUTO_SLOTS = 4  # --parallel unset: 4 slots sharing one unified KV pool
DEFAULT_CACHE_RAM_MIB = 8192
DEFAULT_CTX_CHECKPOINTS = 32
LIMIT_HEADROOM = 0.10  # a derived limit sits 10% above the estimate: compute buffers vary with load


class CapacityError(Exception):
    """A plan that does not fit; ``str()`` names pool, workloads, estimate and budget in GiB."""

    def __str__(self) -> str:
        return f"capacity plan does not fit: {self.args[0]}"


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gib: float
    kv_gib: float
    recurrent_gib: float
    overhead_gib: float
    host_caches_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.recurrent_gib + self.overhead_gib + self.host_caches_gib


def quant_of(hf_repo: str) -> str:
    return hf_repo.rsplit(":", 1)[1].upper()


def bits_per_weight(hf_repo: str) -> float:
    quant = quant_of(hf_repo)
    if quant not in BITS_PER_WEIGHT:
        raise KeyError(quant)
    return BITS_PER_WEIGHT[quant]


def facts_for(model: ModelServer) -> Optional[ModelFacts]:
    if model.facts is not None:
        return model.facts
    return CATALOG.get(repo_of(model.hf_repo)) if model.hf_repo else None


def model_bits(model: ModelServer, facts: ModelFacts) -> float:
    if facts.bits_per_weight is not None:
        return facts.bits_per_weight
    if model.hf_repo is None:
        raise KeyError("no quant")
    return bits_per_weight(model.hf_repo)


def weights_bytes(model: ModelServer, facts: ModelFacts) -> float:
    if model.weights is not None:
        return float(parse_quantity(model.weights))
    return facts.params_b * 1e9 * model_bits(model, facts) / 8


def kv_bytes(facts: ModelFacts, ctx_size: int) -> float:
    """K and V for every full-attention layer, for the whole context (shared by all slots)."""
    layers = facts.full_attention_layers or facts.layers
    tokens = math.ceil(ctx_size / CTX_PAD) * CTX_PAD
    return layers * facts.kv_heads * facts.head_dim * 2 * KV_BYTES_PER_ELEMENT * tokens


def slots(model: ModelServer) -> int:
    return model.parallel or AUTO_SLOTS


def estimate_memory(model: ModelServer, facts: ModelFacts, backend: Backend) -> MemoryEstimate:
    weights = weights_bytes(model, facts)
    n_slots = slots(model)
    # llama.cpp's -c is the total context: with N slots each gets ctx/N, so KV does not scale with
    # slots. The recurrent state of a hybrid model is per slot, and so are its checkpoints.
    recurrent = facts.recurrent_state_mib * MIB * n_slots
    checkpoints = model.ctx_checkpoints if model.ctx_checkpoints is not None else DEFAULT_CTX_CHECKPOINTS
    cache_ram = model.cache_ram_mib if model.cache_ram_mib is not None else DEFAULT_CACHE_RAM_MIB
    host = cache_ram * MIB + checkpoints * n_slots * facts.recurrent_state_mib * MIB
    return MemoryEstimate(
        weights_gib=weights / GIB,
        kv_gib=kv_bytes(facts, model.ctx_size) / GIB,
        recurrent_gib=recurrent / GIB,
        overhead_gib=weights * BACKEND_OVERHEAD[backend] / GIB,
        host_caches_gib=host / GIB,
    )


def estimate_resident(model: ModelServer, backend: Backend) -> MemoryEstimate:
    """An engine that reports what it locks (weights and KV pool, measured) plus the backend's margin."""
    assert model.openai is not None
    resident = float(parse_quantity(model.openai.resident_memory))
    return MemoryEstimate(
        weights_gib=resident / GIB,
        kv_gib=0.0,
        recurrent_gib=0.0,
        overhead_gib=resident * BACKEND_OVERHEAD[backend] / GIB,
        host_caches_gib=0.0,
    )


def decode_bound_tok_s(model: ModelServer, facts: Optional[ModelFacts], pool: NodePool) -> Optional[float]:
    """Upper bound on decode speed: bandwidth / bytes read per token (active parameters for MoE).
    None for embedding servers: they do not decode."""
    if pool.memory_bandwidth_gbs is None or facts is None or model.role == "embedding":
        return None
    active = facts.active_params_b or facts.params_b
    bytes_per_token = active * 1e9 * model_bits(model, facts) / 8
    return pool.memory_bandwidth_gbs * 1e9 / bytes_per_token


def ceil_gib(value: float) -> int:
    return max(1, math.ceil(value - 1e-9))


@dataclass(frozen=True)
class ServerPlan:
    key: str
    name: str
    node_pool: str
    replicas: int
    one_per_node: bool
    estimate: MemoryEstimate
    memory_request: str
    memory_limit: str
    budget: StartupBudget
    weights: str
    decode_bound_tok_s: Optional[float]

    @property
    def need_gib(self) -> float:
        """What one replica holds on its node: the estimate, or the request if that is larger."""
        return max(self.estimate.total_gib, float(parse_quantity(self.memory_request)) / GIB)


@dataclass(frozen=True)
class NodePlan:
    pool: str
    node: int
    budget_gib: float
    workloads: tuple[tuple[str, float], ...]

    @property
    def planned_gib(self) -> float:
        return sum(need for _, need in self.workloads)

    @property
    def free_gib(self) -> float:
        return self.budget_gib - self.planned_gib


@dataclass
class Plan:
    servers: dict[str, ServerPlan] = field(default_factory=dict)
    nodes: list[NodePlan] = field(default_factory=list)

    def fits(self) -> bool:
        return all(node.free_gib >= 0 for node in self.nodes)

    def to_dict(self) -> dict:
        def rounded(value):
            if isinstance(value, float):
                return round(value, 2)
            if isinstance(value, dict):
                return {k: rounded(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [rounded(v) for v in value]
            return value

        servers = {}
        for key, server in self.servers.items():
            data = asdict(server)
            data["estimate"]["total_gib"] = server.estimate.total_gib
            data["budget"]["startup_seconds"] = server.budget.startup_seconds
            servers[key] = data
        nodes = [
            {
                "pool": n.pool,
                "node": n.node,
                "budget_gib": n.budget_gib,
                "planned_gib": n.planned_gib,
                "free_gib": n.free_gib,
                "workloads": {name: need for name, need in n.workloads},
            }
            for n in self.nodes
        ]
        return rounded({"servers": servers, "nodes": nodes})


def node_budget_gib(pool: NodePool) -> float:
    return float(parse_quantity(pool.allocatable) - parse_quantity(pool.reserved)) / GIB


def _server_plan(key: str, model: ModelServer, stack: StackConfig) -> ServerPlan:
    facts = facts_for(model)
    pool = stack.node_pools[model.node_pool]
    backend = model.backend or pool.backend
    if model.engine == "openai":
        estimate = estimate_resident(model, backend)
    else:
        assert facts is not None  # checked by plan()
        estimate = estimate_memory(model, facts, backend)
    weights = model.weights or f"{ceil_gib(weights_bytes(model, facts) / GIB * 10) / 10}Gi"
    limit = model.resources.memory_limit or f"{ceil_gib(estimate.total_gib * (1 + LIMIT_HEADROOM))}Gi"
    # Derived request = limit: a GPU server cannot shed memory, so it gets Guaranteed memory.
    request = model.resources.memory_request or limit
    return ServerPlan(
        key=key,
        name=model.name,
        node_pool=model.node_pool,
        replicas=model.workload.replicas,
        one_per_node=model.workload.one_per_node,
        estimate=estimate,
        memory_request=request,
        memory_limit=limit,
        budget=startup_budget(weights, stack.startup, prefetched=model.prefetch is not None),
        weights=weights,
        decode_bound_tok_s=decode_bound_tok_s(model, facts, pool),
    )


def _place(stack: StackConfig, servers: dict[str, ServerPlan]) -> list[NodePlan]:
    """First fit, largest first: how the scheduler fills nodes by requests, replica by replica.
    A server with one_per_node (required anti-affinity) never puts two replicas on one node."""
    nodes: list[NodePlan] = []
    for pool_key, pool in stack.node_pools.items():
        budget = node_budget_gib(pool)
        loads: list[list[tuple[str, float]]] = [[] for _ in range(pool.nodes)]
        replicas = [
            (s.name, s.need_gib, s.one_per_node)
            for s in servers.values()
            if s.node_pool == pool_key
            for _ in range(s.replicas)
        ]
        for name, need, one_per_node in sorted(replicas, key=lambda r: (-r[1], r[0])):
            allowed = [i for i in range(pool.nodes) if not (one_per_node and any(n == name for n, _ in loads[i]))]
            if not allowed:
                raise CapacityError(
                    f"node_pools.{pool_key}: {name} wants one replica per node but the pool has {pool.nodes} nodes"
                )
            free = {i: budget - sum(n for _, n in loads[i]) for i in allowed}
            fitting = [i for i in allowed if free[i] >= need]
            target = fitting[0] if fitting else max(allowed, key=lambda i: free[i])
            loads[target].append((name, need))
        for index, load in enumerate(loads):
            nodes.append(NodePlan(pool=pool_key, node=index, budget_gib=budget, workloads=tuple(load)))
    return nodes


def plan(stack: StackConfig) -> Plan:
    """The capacity plan for a stack; raises CapacityError (every problem, one line) if it does not fit."""
    problems: list[str] = []
    result = Plan()
    for key, model in stack.models.items():
        problem = _unplannable(key, model)
        if problem is not None:
            problems.append(problem)
            continue
        pooling_problem = _pooling_refuses_long_inputs(key, model)
        if pooling_problem is not None:
            problems.append(pooling_problem)
        server = _server_plan(key, model, stack)
        _check_limit(key, model, server, problems)
        result.servers[key] = server
    if problems:
        raise CapacityError("; ".join(problems))
    result.nodes = _place(stack, result.servers)
    for node in result.nodes:
        if node.free_gib < 0:
            workloads = ", ".join(f"{name} {need:.1f} GiB" for name, need in node.workloads)
            problems.append(
                f"node_pools.{node.pool}: node {node.node + 1} of {stack.node_pools[node.pool].nodes} would hold "
                f"{node.planned_gib:.1f} GiB ({workloads}) but offers {node.budget_gib:.1f} GiB "
                "(allocatable less reserved); move a model to another pool, shrink it, or add nodes"
            )
    if problems:
        raise CapacityError("; ".join(problems))
    return result


# llama.cpp's default --ubatch-size (common/common.h n_ubatch).
LLAMACPP_DEFAULT_UBATCH = 512


def _pooling_refuses_long_inputs(key: str, model: ModelServer) -> Optional[str]:
    """An embedding server whose pooling needs the whole input in one micro-batch (mean, cls) refuses
    inputs longer than --ubatch-size with HTTP 500, although --ctx-size promises more."""
    facts = facts_for(model) if model.engine == "llamacpp" and model.role == "embedding" else None
    if facts is None or facts.pooling not in ("mean", "cls"):
        return None
    ubatch = model.ubatch_size or LLAMACPP_DEFAULT_UBATCH
    if ubatch >= model.ctx_size:
        return None
    return (f"models.{key}.ubatch_size: {facts.pooling} pooling needs the whole input in one micro-batch, so inputs "
            f"over {ubatch} tokens would be refused although ctx_size is {model.ctx_size}; set ubatch_size: {model.ctx_size} "
            f"(or lower ctx_size to {ubatch})")


def _unplannable(key: str, model: ModelServer) -> Optional[str]:
    """Why a server's memory cannot be estimated from its config, or None."""
    if model.engine == "openai":
        return None if model.weights is not None else f"models.{key}.weights: required for engine openai (the download size)"
    facts = facts_for(model)
    if facts is None:
        return (
            f"models.{key}.facts: no architecture facts for {repo_of(model.hf_repo)}; give params_b, layers, "
            "kv_heads and head_dim so its memory can be planned"
        )
    if model.weights is None:
        try:
            model_bits(model, facts)
        except KeyError:
            return f"models.{key}.weights: quant {quant_of(model.hf_repo)} has no known bits per weight; set weights to the GGUF's size"
    return None


def _check_limit(key: str, model: ModelServer, server: ServerPlan, problems: list[str]) -> None:
    limit_gib = float(parse_quantity(server.memory_limit)) / GIB
    if limit_gib < server.estimate.total_gib and model.resources.accepted_risk is None:
        problems.append(
            f"models.{key}.resources.memory_limit: {server.memory_limit} is below the estimate of "
            f"{server.estimate.total_gib:.1f} GiB ({_breakdown(server.estimate)}); raise it, lower ctx_size, "
            "or set accepted_risk with the reason"
        )


def _breakdown(estimate: MemoryEstimate) -> str:
    return (
        f"weights {estimate.weights_gib:.1f} + KV {estimate.kv_gib:.2f} + recurrent {estimate.recurrent_gib:.2f} "
        f"+ backend {estimate.overhead_gib:.1f} + host caches {estimate.host_caches_gib:.1f}"
    )
