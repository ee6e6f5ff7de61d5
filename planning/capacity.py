"""The capacity plan: every model server's memory estimate, request and limit, and a
simulation of the scheduler placing every replica on the pool's nodes. A plan that does not
fit is refused before anything is applied, with the numbers."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, Union

from common.errors import CapacityError
from common.quantity import Quantity, gib

from .split import helper_endpoints, helper_name, helpers_on
from .memory import (LIMIT_HEADROOM, VRAM_PLAN_MOST_UNDER_GIB, Estimate, MemoryEstimate, OnRequest, Split, VramEstimate,
                     ceil_gib, derived_limit_gib)
from .residency import ADMISSION_MEMORY_REQUEST, KEEPER_MEMORY_REQUEST, Residency, ResidentModel, limit_gib, plan_residency, summed_estimate, summed_vram
from .startup import StartupBudget, startup_budget, swap_seconds

if TYPE_CHECKING:
    from config.types import ModelServer, NodePool, StackConfig

Problem = tuple[str, str]


# The plan's one question, handed in by the caller (planning never imports engines): a server's
# estimate from its engine (engines.base.Engine.estimate), or why it cannot be planned.
Estimator = Callable[["ModelServer", "NodePool", str], tuple[Optional[Union[Estimate, OnRequest]], list[Problem]]]
# llama.cpp's own fitting keeps this much of each GPU free (common/common.h, b10729: fit_params_target
# 1 GiB per device): what is planned closer to the card's size fits on paper only.
GPU_FREE_TARGET_GIB = 1.0
# Below this predicted decode rate at half context a chat answer arrives slower than people read it (about
# 4-5 words/s, some 5-7 tokens/s): the plan says so (usable for batch work, not for a conversation).
USABLE_DECODE_TOK_S = 5.0


def decode_bound_tok_s(
    model: "ModelServer", read: Optional[tuple[float, float]], pool: "NodePool", vram: Optional[VramEstimate] = None
) -> Optional[float]:
    """Upper bound on decode speed: every weight read per token (``read``: bytes from VRAM, bytes
    from the node's memory; active experts only for MoE) at the bandwidth of where it lives, one part
    after the other, so time per token is the sum. None for embedding servers (they do not decode) or
    when a bandwidth it needs is unknown."""
    if read is None or model.role == "embedding":
        return None
    seconds = 0.0
    for part, bandwidth in ((read[0], pool.vram_bandwidth_gbs), (read[1], pool.memory_bandwidth_gbs)):
        if part <= 0:
            continue
        if bandwidth is None:
            return None
        seconds += part / (bandwidth * 1e9)
    return 1 / seconds if seconds > 0 else None


@dataclass(frozen=True)
class RoomWait:
    """A server that shares its pool's cards with a router: its pods start once the router holds no more than
    the budget that leaves them room (the router's proxy may still hold an older, larger one: a model moved out
    of its library). Read from the router's status on the model cache they share."""

    router_key: str
    router_name: str
    vram_budget_gib: float
    image: str  # the router's programs image: the wait is a program of the same kind (air-gapped mirrors too)


@dataclass(frozen=True)
class ServerPlan:
    key: str
    name: str
    workload: str  # the Deployment's or StatefulSet's name (models.<key>.workload.name, or name)
    node_pool: str
    replicas: int
    one_per_node: bool
    estimate: MemoryEstimate
    memory_request: str
    memory_limit: str
    budget: StartupBudget
    weights: str
    decode_bound_tok_s: Optional[float]
    # What one replica holds on one discrete GPU; None on unified memory or without a GPU.
    vram: Optional[VramEstimate] = None
    # Predicted decode tok/s with the context empty, half and full (engines/llamacpp_speed.py).
    decode_predicted_tok_s: Optional[dict[str, float]] = None
    # Where the node's read bandwidth at the server's threads is not measured: (low, high) per depth.
    decode_range_tok_s: Optional[dict[str, tuple[float, float]]] = None
    decode_range_why: tuple[str, ...] = ()  # why it is a range: the node's CPU or a KV cache type not measured
    # Prompt tokens/s at a 4096-token prompt, and seconds to the first token of a full-context prompt.
    prefill_tok_s: Optional[float] = None
    first_token_full_s: Optional[float] = None
    # A server of models on demand: which may be resident together (planning/residency.py).
    residency: Optional[Residency] = None
    # Shares a card with a router: waits for room at start (RoomWait); the router writes its status for it.
    room: Optional[RoomWait] = None
    room_status: bool = False
    # A model over several nodes: its helpers' shares (each a pod of its own, placed on another node).
    split: Optional[Split] = None

    def helper_name(self, index: int) -> str:
        return helper_name(self.name, index)

    def helper_endpoints(self, port: int) -> str:
        return helper_endpoints(self.name, len(self.split.helpers) if self.split is not None else 0, port)

    def helper_memory(self, index: int) -> Quantity:
        """Helper ``index``'s memory request and limit: its estimate and the derived limit's headroom."""
        if self.split is None:
            raise ValueError("planning/capacity.py: helper memory asked of a server with no split")
        return Quantity(f"{derived_limit_gib(self.split.helpers[index].memory.total_gib)}Gi")

    @property
    def need_gib(self) -> float:
        """What one replica holds on its node: the estimate, or the request if that is larger."""
        return max(self.estimate.total_gib, gib(self.memory_request))


@dataclass(frozen=True)
class GpuPlan:
    """One discrete GPU of a node and the replicas that share it."""

    index: int
    vram_gib: float
    workloads: tuple[tuple[str, float], ...]

    @property
    def planned_gib(self) -> float:
        return sum(need for _, need in self.workloads)

    @property
    def free_gib(self) -> float:
        return self.vram_gib - self.planned_gib


@dataclass(frozen=True)
class NodePlan:
    pool: str
    node: int
    # What the node offers the planned servers: allocatable less reserved.
    offers_gib: float
    workloads: tuple[tuple[str, float], ...]
    gpus: tuple[GpuPlan, ...] = ()

    @property
    def planned_gib(self) -> float:
        return sum(need for _, need in self.workloads)

    @property
    def free_gib(self) -> float:
        return self.offers_gib - self.planned_gib


@dataclass
class CapacityPlan:
    servers: dict[str, ServerPlan] = field(default_factory=dict)
    nodes: list[NodePlan] = field(default_factory=list)
    # What fits but is worth knowing (the program logs each as a warning).
    warnings: list[str] = field(default_factory=list)
    # Fits, but a chat model predicted slower than people read (also logged as a warning).
    slow_notes: list[str] = field(default_factory=list)

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
            if server.residency is not None:
                data["residency"] = server.residency.to_dict()
            else:
                del data["residency"]
            # Shown only where a server shares a router's cards (the plan of every other stack reads as before).
            if server.room is None:
                del data["room"]
            if not server.room_status:
                del data["room_status"]
            if server.vram is None:
                del data["vram"]
            else:
                data["vram"]["total_gib"] = server.vram.total_gib
            data["estimate"]["total_gib"] = server.estimate.total_gib
            data["budget"]["startup_seconds"] = server.budget.startup_seconds
            servers[key] = data
        nodes = []
        for n in self.nodes:
            node = {
                "pool": n.pool,
                "node": n.node,
                "offers_gib": n.offers_gib,
                "planned_gib": n.planned_gib,
                "free_gib": n.free_gib,
                "workloads": {name: need for name, need in n.workloads},
            }
            if n.gpus:  # discrete GPUs only: unified memory is the node's
                node["gpus"] = [
                    {"gpu": g.index, "vram_gib": g.vram_gib, "planned_gib": g.planned_gib,
                     "workloads": {name: need for name, need in g.workloads}}
                    for g in n.gpus
                ]
            nodes.append(node)
        return rounded({"servers": servers, "nodes": nodes})


def node_offers_gib(pool: "NodePool") -> float:
    return gib(pool.allocatable) - gib(pool.reserved)


def _server_plan(key: str, model: "ModelServer", stack: "StackConfig", estimate: Estimate) -> ServerPlan:
    pool = stack.node_pools[model.node_pool]
    limit = model.resources.memory_limit or Quantity(f"{derived_limit_gib(estimate.memory.total_gib)}Gi")
    # Derived request = limit: a GPU server cannot shed memory, so it gets Guaranteed memory.
    request = model.resources.memory_request or limit
    return ServerPlan(
        key=key,
        name=model.name,
        workload=model.workload_name,
        node_pool=model.node_pool,
        replicas=model.workload.replicas,
        one_per_node=model.workload.one_per_node,
        estimate=estimate.memory,
        memory_request=request,
        memory_limit=limit,
        budget=startup_budget(estimate.weights, stack.startup, prefetched=model.prefetch is not None,
                              upload_seconds=estimate.split.upload_seconds if estimate.split else 0),
        weights=estimate.weights,
        decode_bound_tok_s=decode_bound_tok_s(model, estimate.read_per_token, pool, estimate.vram),
        decode_predicted_tok_s=estimate.decode_predicted_tok_s,
        decode_range_tok_s=estimate.decode_range_tok_s,
        decode_range_why=estimate.decode_range_why,
        prefill_tok_s=estimate.prefill_tok_s,
        first_token_full_s=estimate.first_token_full_s,
        vram=estimate.vram,
        split=estimate.split,
    )


def _hundredths(value: float) -> float:
    """Up to the next 0.01 GiB: the figures the plan checks, the summary prints and the admission proxy
    sums are then the same numbers."""
    return math.ceil(value * 100 - 1e-9) / 100


def _router_plan(key: str, model: "ModelServer", stack: "StackConfig", on_request: OnRequest,
                 planned: dict[str, ServerPlan], leaving: Sequence[tuple[str, float]] = ()
                 ) -> tuple[Optional[ServerPlan], list[Problem]]:
    """A server of models loaded on request: each model planned as the single-model server it runs
    as, then the largest resident set that fits what the node and its GPU leave beside the other servers."""
    pool = stack.node_pools[model.node_pool]
    resident: list[ResidentModel] = []
    for entry in on_request.models:
        # Each model as the single-model server it runs as: its engine's estimate, with a limit's headroom.
        estimate = entry.estimate
        resident.append(ResidentModel(
            name=entry.name, pinned=entry.pinned, ram_gib=_hundredths(estimate.memory.total_gib * (1 + LIMIT_HEADROOM)),
            vram_gib=_hundredths(estimate.vram.total_gib + VRAM_PLAN_MOST_UNDER_GIB) if estimate.vram is not None else 0.0,
            weights_gib=gib(estimate.weights),
            swap_seconds=swap_seconds(estimate.weights, estimate.vram.weights_gib if estimate.vram is not None else 0.0,
                                      stack.startup),
            decode_predicted_tok_s=estimate.decode_predicted_tok_s, estimate=estimate.memory, vram=estimate.vram,
            source=entry.source, multimodal=estimate.multimodal,
        ))
    beside = [s for s in planned.values() if s.node_pool == model.node_pool]
    helpers = helpers_on(planned.values(), model.node_pool)  # split helpers on this pool, as the servers beside it
    ram_budget = (node_offers_gib(pool) - sum(s.need_gib * s.replicas for s in beside) - sum(h[1] for h in helpers)
                  - gib(KEEPER_MEMORY_REQUEST) - gib(ADMISSION_MEMORY_REQUEST))
    vram_budget = None
    if any(m.vram is not None for m in resident) and pool.vram is not None:
        # Time-sliced cards are shared with the pool's other GPU servers, which the plan may put on the same card.
        vram_budget = gib(pool.vram) - GPU_FREE_TARGET_GIB - sum(s.vram.total_gib for s in beside if s.vram is not None) - sum(
            h[2] for h in helpers) - sum(vram for _, vram in leaving)
    others = f", beside {', '.join([s.name for s in beside] + [h[0] for h in helpers])}" if beside or helpers else ""
    if leaving and vram_budget is not None:
        # Their pods hold the card until this update deletes them (config/history.py HistoryVerdict.leaving).
        others += (f"{' and' if beside else ', beside'} {', '.join(name for name, _ in leaving)} (removed in this update: "
                   "its pods hold the card until the update deletes them; run pulumi up again after it to give the "
                   "router their memory)")
    if vram_budget is not None and vram_budget <= 0:
        return None, [(f"node_pools.{model.node_pool}.vram", f"{pool.vram} leaves the router no VRAM ({vram_budget:.1f} "
                       f"GiB after llama.cpp's {GPU_FREE_TARGET_GIB:g} GiB free per GPU{others}); give the card's real "
                       "memory, or run the models on the CPU (gpu_layers: 0)")]
    if model.resources.memory_limit is not None and gib(model.resources.memory_limit) > node_offers_gib(pool) + 1e-9:
        return None, [(f"models.{key}.resources.memory_limit", f"{model.resources.memory_limit} is more than a node of "
                       f"pool {model.node_pool} offers ({node_offers_gib(pool):.1f} GiB, allocatable less reserved); set "
                       f"at most {math.floor(ram_budget)}Gi (what the node leaves the router), or remove it (planned)")]
    if model.resources.memory_limit is not None and gib(model.resources.memory_limit) < ram_budget:
        # The pod's own limit is the budget then: the proxy admits (and the plan counts) only sets within it.
        ram_budget = gib(model.resources.memory_limit)
        others += f" (its resources.memory_limit, {model.resources.memory_limit})"
    # Down to the hundredth the plan prints: the proxy's budget (admission.json) and the plan's are one number.
    ram_budget = math.floor(ram_budget * 100 + 1e-9) / 100
    vram_budget = None if vram_budget is None else math.floor(vram_budget * 100 + 1e-9) / 100
    residency, problems = plan_residency(on_request.path, on_request.max_loaded, resident, ram_budget,
                                         vram_budget, others)
    if residency is None:
        return None, problems
    worst = residency.worst()
    estimate = summed_estimate(worst)
    # The pod holds what the proxy may admit: the whole budget (whole GiB), not the largest set of today's
    # library, so a library edit within the card changes no pod template and restarts nothing (issue #48).
    limit = model.resources.memory_limit or Quantity(f"{max(limit_gib(worst), math.floor(ram_budget + 1e-9))}Gi")
    # Each repo once: two names for the same weights (other settings) share the download.
    weights = Quantity(f"{ceil_gib(sum({m.source: m.weights_gib for m in resident}.values()) * 10) / 10}Gi")
    return ServerPlan(
        key=key, name=model.name, workload=model.workload_name, node_pool=model.node_pool,
        replicas=model.workload.replicas, one_per_node=model.workload.one_per_node, estimate=estimate,
        memory_request=model.resources.memory_request or limit, memory_limit=limit,
        # The init container fetches every model first; the router then answers once it listens, and
        # each model loads when first asked (its swap cost, listed per model).
        budget=startup_budget(Quantity("0.1Gi"), stack.startup, prefetched=True, downloaded=weights), weights=weights,
        decode_bound_tok_s=None, decode_predicted_tok_s=None, vram=summed_vram(residency.worst_vram()),
        residency=residency,
    ), []


def _place(stack: "StackConfig", servers: dict[str, ServerPlan]) -> tuple[list[NodePlan], list[Problem]]:
    """First fit, largest first: how the scheduler fills nodes by requests, replica by replica.
    A server with one_per_node (required anti-affinity) never puts two replicas on one node."""
    nodes: list[NodePlan] = []
    problems: list[Problem] = []
    for pool_key, pool in stack.node_pools.items():
        offers = node_offers_gib(pool)
        loads: list[list[tuple[str, float]]] = [[] for _ in range(pool.nodes)]
        # (workload, need, the group none of whose members shares a node with it): one_per_node keeps a server's
        # replicas apart, a split its main server and helpers (required anti-affinity); pinned: a node index.
        replicas = [
            (s.name, s.need_gib, s.name if s.one_per_node or s.split else None)
            for s in servers.values()
            if s.node_pool == pool_key
            for _ in range(s.replicas)
        ] + [
            (s.helper_name(i), gib(s.helper_memory(i)), s.name)
            for s in servers.values() if s.split is not None
            for i, helper in enumerate(s.split.helpers) if helper.node_pool == pool_key
        ]
        group_of = {name: group for name, _, group in replicas}
        vram_gib = gib(pool.vram) if pool.vram is not None else None
        gpus: list[list[list[tuple[str, float]]]] = [
            [[] for _ in range(pool.gpus_per_node if vram_gib is not None else 0)] for _ in range(pool.nodes)
        ]
        # Per replica: the VRAM each of its cards holds, and how many cards it takes (one node's).
        vram_of = {s.name: (s.vram.total_gib, s.vram.gpus) for s in servers.values() if s.vram is not None}
        # A split's helper on a discrete card: one card of its node.
        vram_of |= {s.helper_name(i): (helper.vram.total_gib, 1) for s in servers.values() if s.split is not None
                    for i, helper in enumerate(s.split.helpers) if helper.vram is not None}
        for name, need, group in sorted(replicas, key=lambda r: (-r[1], r[0])):
            allowed = [i for i in range(pool.nodes) if not (group and any(group_of.get(n) == group for n, _ in loads[i]))]
            if not allowed:
                problems.append((
                    f"node_pools.{pool_key}.nodes",
                    f"{name} wants a node of its own ({'its split' if group != name else 'one replica per node'}) "
                    f"but the pool has {pool.nodes} nodes",
                ))
                continue
            free = {i: offers - sum(n for _, n in loads[i]) for i in allowed}
            if name in vram_of and vram_gib is not None:
                gpu_need, cards = vram_of[name]

                def room(i: int) -> list[int]:
                    """The node's GPUs with a device-plugin share and the VRAM for one card's part."""
                    return [g for g, on_gpu in enumerate(gpus[i])
                            if len(on_gpu) < pool.gpu_shares and vram_gib - sum(v for _, v in on_gpu) >= gpu_need]

                candidates = [i for i in allowed if len(room(i)) >= cards]
                fitting = [i for i in candidates if free[i] >= need]
                if fitting or candidates:
                    target = (fitting or candidates)[0]
                    chosen = room(target)[:cards]
                else:  # nowhere fits: the node with the most VRAM free, its emptiest cards, reported below
                    def emptiest(i: int) -> list[int]:
                        return sorted(range(len(gpus[i])), key=lambda g: sum(v for _, v in gpus[i][g]))[:cards]

                    target = max(allowed, key=lambda i: sum(vram_gib - sum(v for _, v in gpus[i][g]) for g in emptiest(i)))
                    chosen = emptiest(target)
                for gpu in chosen:
                    gpus[target][gpu].append((name, gpu_need))
            else:
                fitting_nodes = [i for i in allowed if free[i] >= need]
                target = fitting_nodes[0] if fitting_nodes else max(allowed, key=lambda i: free[i])
            loads[target].append((name, need))
        for index, load in enumerate(loads):
            node_gpus = tuple(
                GpuPlan(index=g, vram_gib=vram_gib or 0.0, workloads=tuple(on_gpu)) for g, on_gpu in enumerate(gpus[index])
            )
            nodes.append(NodePlan(pool=pool_key, node=index, offers_gib=offers, workloads=tuple(load), gpus=node_gpus))
    return nodes, problems


def plan_stack(stack: "StackConfig", estimate: Estimator,
               leaving: Optional[Mapping[str, Sequence[tuple[str, float]]]] = None) -> CapacityPlan:
    """The capacity plan for a stack, each server's memory estimated by its engine; raises
    CapacityError (path, numbers, remedy) if it does not fit. ``leaving``: per node pool, the GPU servers the
    last update ran there that this one removes (config/history.py): a router does not take their VRAM yet."""
    problems: list[Problem] = []
    result = CapacityPlan()
    estimates = {key: estimate(model, stack.node_pools[model.node_pool], f"models.{key}")
                 for key, model in stack.models.items()}
    # Servers of models on request last: their residency is planned in what the others leave.
    for key, model in sorted(stack.models.items(), key=lambda item: isinstance(estimates[item[0]][0], OnRequest)):
        found, unplannable = estimates[key]
        problems += unplannable
        if isinstance(found, OnRequest):
            gone = tuple((leaving or {}).get(model.node_pool, ()))
            server, router_problems = _router_plan(key, model, stack, found, result.servers, gone)
            problems += router_problems
            if server is not None and gone and server.residency is not None and server.residency.vram_budget_gib is not None:
                result.warnings.append(
                    f"models.{key}: its VRAM budget stays {server.residency.vram_budget_gib:g} GiB in this update: "
                    f"{', '.join(f'{name} ({vram:g} GiB)' for name, vram in gone)} leave{'s' if len(gone) == 1 else ''} "
                    f"node pool {model.node_pool}, and {'its' if len(gone) == 1 else 'their'} pods hold the card until "
                    "the update deletes them; the next pulumi up gives the router that memory")
            if server is not None:
                result.servers[key] = server
            continue
        if found is None:
            continue
        result.warnings.extend(found.warnings)
        server = _server_plan(key, model, stack, found)
        problems += _limit_problems(key, model, server, stack.node_pools[model.node_pool])
        problems += _vram_problems(key, model, server, stack.node_pools[model.node_pool], estimate)
        result.servers[key] = server
    if problems:
        raise CapacityError(problems)
    result.nodes, problems = _place(stack, result.servers)
    for node in result.nodes:
        for gpu in node.gpus:
            if gpu.workloads and gpu.planned_gib <= gpu.vram_gib + 1e-9 and gpu.free_gib < GPU_FREE_TARGET_GIB:
                result.warnings.append(
                    f"node_pools.{node.pool}.vram: GPU {gpu.index + 1} of node {node.node + 1} is planned to "
                    f"{gpu.planned_gib:.1f} of {gpu.vram_gib:.1f} GiB, leaving {gpu.free_gib:.2f} GiB; llama.cpp's own "
                    f"fitting keeps {GPU_FREE_TARGET_GIB:.0f} GiB free per GPU, and a card shows CUDA less than its "
                    "nominal size: leave that margin (shorter ctx_size, a quant smaller, or fewer layers on it)")
            if gpu.planned_gib > gpu.vram_gib + 1e-9:
                workloads = ", ".join(f"{name} {need:.1f} GiB" for name, need in gpu.workloads)
                problems.append((
                    f"node_pools.{node.pool}.vram",
                    f"GPU {gpu.index + 1} of node {node.node + 1} would hold {gpu.planned_gib:.1f} GiB ({workloads}) "
                    f"but has {gpu.vram_gib:.1f} GiB; time-sliced pods share the card's memory with no isolation: "
                    "move a server to the CPU (gpu_layers: 0) or another GPU, or shrink one",
                ))
        if node.free_gib < 0:
            workloads = ", ".join(f"{name} {need:.1f} GiB" for name, need in node.workloads)
            problems.append((
                f"node_pools.{node.pool}",
                f"node {node.node + 1} of {stack.node_pools[node.pool].nodes} would hold {node.planned_gib:.1f} GiB "
                f"({workloads}) but offers {node.offers_gib:.1f} GiB (allocatable less reserved); move a model to "
                "another pool, shrink it, or add nodes",
            ))
    problems += _cache_problems(stack, result)
    if problems:
        raise CapacityError(problems)
    result.slow_notes = slow_decode_notes(stack, result)
    _room_waits(stack, result)
    return result


def _room_waits(stack: "StackConfig", result: CapacityPlan) -> None:
    """Each GPU server in a router's pool waits at start for the router to hold no more than its budget: the
    budget leaves room for every GPU server of the pool, but a router's proxy holds its old budget until it has
    read a new plan (a model moved out of the library to a server of its own). Only where both mount the
    stack's model cache, on which the router's keeper publishes the proxy's status."""
    for router_key, router in list(result.servers.items()):
        residency = router.residency
        if residency is None or residency.vram_budget_gib is None or stack.models[router_key].workload.cache_volume:
            continue
        waiting = [key for key, server in result.servers.items()
                   if key != router_key and server.node_pool == router.node_pool and server.vram is not None
                   and server.residency is None and not stack.models[key].workload.cache_volume]
        for key in waiting:
            result.servers[key] = replace(result.servers[key], room=RoomWait(
                router_key, router.name, residency.vram_budget_gib, stack.models[router_key].on_demand.programs_image))
        # Always, not only beside a server today: a server moved out of the library waits on the status the
        # router wrote before the move, and the budget it held then.
        result.servers[router_key] = replace(router, room_status=True)


def slow_decode_notes(stack: "StackConfig", plan: CapacityPlan) -> list[str]:
    """A chat server (or a model of a library) predicted to decode slower than people read, at half context."""
    notes = []
    for key, server in plan.servers.items():
        if stack.models[key].role == "embedding":
            continue
        models = ({m.name: m.decode_predicted_tok_s for m in server.residency.models}
                  if server.residency is not None else {None: server.decode_predicted_tok_s})
        for name, predicted in models.items():
            if not predicted or predicted["half"] >= USABLE_DECODE_TOK_S:
                continue
            which = f"models.{key}" + (f" (library model {name})" if name is not None else "")
            faster = ""
            if name is None and server.decode_range_tok_s:
                high = server.decode_range_tok_s["half"][1]
                faster = f", up to {high:.1f} ({'; '.join(server.decode_range_why)})"
            notes.append(
                f"{which}: decode is predicted at {predicted['half']:.1f} tok/s at half context ({predicted['full']:.1f} "
                f"full){faster}, below {USABLE_DECODE_TOK_S:g} tok/s, slower than people read: fine for batch work, too "
                "slow for a conversation; a smaller quant or model, more layers on a GPU, or a faster pool")
    return notes


def _cache_problems(stack: "StackConfig", plan: CapacityPlan) -> list[Problem]:
    """The volumes the weights land on must hold them: a download that runs out of space fails at
    the end, after its whole cold start (nothing prunes a cache, so these are the least). The
    shared cache must also reach every node the plan puts its servers on."""
    problems: list[Problem] = []
    shared = {key: server for key, server in plan.servers.items() if stack.models[key].workload.cache_volume is None}
    need = sum(gib(server.weights) for server in shared.values())
    if shared and gib(stack.model_cache.size) < need:
        each = ", ".join(f"{key} {gib(s.weights):.1f}" for key, s in shared.items())
        problems.append(("model_cache.size", f"{stack.model_cache.size} holds less than the {need:.1f} GiB the servers on "
                         f"it download ({each}); set it to at least {math.ceil(need)}Gi"))
    for key, server in plan.servers.items():
        volume = stack.models[key].workload.cache_volume
        if volume is not None and gib(volume.size) < gib(server.weights):
            problems.append((f"models.{key}.workload.cache_volume.size", f"{volume.size} holds less than its "
                             f"{gib(server.weights):.1f} GiB of weights; set it to at least {math.ceil(gib(server.weights))}Gi"))
    if stack.model_cache.access_mode == "ReadWriteOnce" and shared:
        names = {server.name: key for key, server in shared.items()}
        nodes = sorted({(n.pool, n.node) for n in plan.nodes for name, _ in n.workloads if name in names})
        if len(nodes) > 1:
            where = ", ".join(f"{pool} node {node + 1}" for pool, node in nodes)
            problems.append(("model_cache.access_mode", f"ReadWriteOnce attaches to one node, but the plan puts the "
                             f"servers on it ({', '.join(sorted(names.values()))}) on {where}: use ReadWriteMany "
                             "(CephFS, NFS, Longhorn RWX), or give each server a cache of its own"))
    return problems


def _vram_problems(key: str, model: "ModelServer", server: ServerPlan, pool: "NodePool",
                   estimate: Estimator) -> list[Problem]:
    """A server that cannot fit on one GPU, with the numbers and what would make it fit: first the
    node's other cards (split by layer), when the pool has them."""
    vram = server.vram
    if vram is None or pool.vram is None:
        return []
    card = gib(pool.vram)
    if vram.total_gib <= card:
        return []
    for cards in range(model.gpus + 1, pool.gpus_per_node + 1):
        split, _ = estimate(model.model_copy(update={"gpus": cards}), pool, f"models.{key}")
        if isinstance(split, Estimate) and split.vram is not None and split.vram.total_gib <= card:
            return [(f"models.{key}.gpus", f"needs {vram.total_gib:.1f} GiB of VRAM ({vram.breakdown()}) but one GPU of "
                     f"node pool {model.node_pool} has {card:.1f} GiB; its nodes have {pool.gpus_per_node}: set gpus: "
                     f"{cards} (split by layer, {split.vram.total_gib:.1f} GiB on each card)")]
    fit = _layers_to_suggest(key, model, pool, estimate, card, vram.layers_that_fit(card) + 1)
    kv_hint = "" if model.cache_type_k == "q8_0" else ", cache_type_k/cache_type_v: q8_0 (halves the KV cache)"
    moe_hint = ", cpu_moe_layers (experts in system RAM)" if vram.experts_in_ram or model.cpu_moe_layers is not None else ""
    return [(
        f"models.{key}.gpu_layers",
        f"needs {vram.total_gib:.1f} GiB of VRAM ({vram.breakdown()}) but one GPU of node pool {model.node_pool} has "
        f"{card:.1f} GiB; set gpu_layers: {fit} (the rest runs from system RAM, slower){moe_hint}, use a smaller "
        f"quant, a shorter ctx_size{kv_hint}",
    )]


def _layers_to_suggest(key: str, model: "ModelServer", pool: "NodePool", estimate: Estimator, card: float,
                       first_guess: int) -> int:
    """The gpu_layers to suggest: the most the engine's own estimate puts within the card, leaving the free
    margin llama.cpp keeps where that still offloads some (so the next render takes it without a warning), else
    within the card. Checked by estimating, not by the linear guess (-ngl N is the output layer and N-1 blocks,
    and partial offload changes the compute buffer): a suggestion the next render refuses is worse than none."""
    def vram_at(layers: int) -> Optional[float]:
        found, _ = estimate(model.model_copy(update={"gpu_layers": layers}), pool, f"models.{key}")
        return found.vram.total_gib if isinstance(found, Estimate) and found.vram is not None else None

    def most_within(room: float) -> int:
        layers = max(0, first_guess)
        while layers > 0 and (vram_at(layers) or 0.0) > room:
            layers -= 1
        while layers < model.gpu_layers and (vram_at(layers + 1) or float("inf")) <= room:
            layers += 1
        return layers

    with_margin = most_within(card - GPU_FREE_TARGET_GIB)
    return with_margin if with_margin > 0 else most_within(card)


def _limit_problems(key: str, model: "ModelServer", server: ServerPlan, pool: "NodePool") -> list[Problem]:
    limit_gib = gib(server.memory_limit)
    offers = node_offers_gib(pool)
    # A configured limit above the node, for a server that fits it (else the placement says what to do).
    if model.resources.memory_limit is not None and limit_gib > offers + 1e-9 >= server.estimate.total_gib:
        return [(f"models.{key}.resources.memory_limit", f"{server.memory_limit} is more than a node of pool "
                 f"{model.node_pool} offers ({offers:.1f} GiB, allocatable less reserved): the limit would no longer "
                 f"keep the server from taking the node's memory; set at most {math.floor(offers)}Gi")]
    if limit_gib < server.estimate.total_gib and model.resources.accepted_risk is None:
        return [(
            f"models.{key}.resources.memory_limit",
            f"{server.memory_limit} is below the estimate of {server.estimate.total_gib:.1f} GiB "
            f"({server.estimate.breakdown()}); raise it, lower ctx_size, or set accepted_risk with the reason",
        )]
    return []
