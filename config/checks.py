"""Checks between fields, which no single field's type can express (after kind's validate.go):
each returns ``(config path, message with the fix)`` pairs; ``validation.validate_values`` runs
``stack_problems`` once, with each engine's own checks (handed in: config never imports engines)."""

from __future__ import annotations

import difflib
import ipaddress
from typing import Optional

from common.constants import LLAMACPP_TESTED_BUILD, TAILSCALE_CLASS
from common.quantity import parse_quantity

from .defaults import PRIVATE_SOURCE_RANGES

from .gpus import BACKEND_VENDORS, BACKENDS, drives_elsewhere, image_choices
from .images import backend_of_image, build_of_image, cpu_image
from .ingress import SOURCE_RANGE_ANNOTATIONS, TRAEFIK_MIDDLEWARES, annotation_refusal, program_annotations
from .credentials import one_role_each
from .gateway import GatewayConfig
from .types import (
    SYSTEM_NAMESPACES,
    ModelHubEgress,
    ModelServer,
    NodePool,
    Problem,
    Resources,
    StackConfig,
    Workload,
)


def hub_egress_problems(hub: ModelHubEgress, path: str) -> list[Problem]:
    if hub.mode == "world" and hub.reason is None:
        return [(f"{path}.reason", "world egress needs a reason; prefer mode: fqdn with the hosts named")]
    return []


def node_pool_problems(pool: NodePool, path: str) -> list[Problem]:
    problems: list[Problem] = []
    if parse_quantity(pool.reserved) >= parse_quantity(pool.allocatable):
        problems.append((f"{path}.reserved", f"{pool.reserved} leaves nothing of allocatable {pool.allocatable} for the "
                         "model servers (reserved is what other pods on the node take out of allocatable); lower it"))
    if 0 in pool.supplemental_groups:
        problems.append((f"{path}.supplemental_groups", "0 is root's group: the pods would open every root-group file "
                         "on their mounts; give the render and video groups' GIDs (getent group render video)"))
    if pool.sharing() == "exclusive" and pool.gpu_shares > 1:
        problems.append((
            f"{path}.gpu_shares",
            f"{pool.gpu_resource}'s device plugin gives each GPU to one container only; set gpu_shares: 1 and "
            "run other model servers on the CPU (gpu_layers: 0) or on another pool",
        ))
    if pool.vram is not None and pool.gpu_resource is None:
        problems.append((f"{path}.gpu_resource", "a pool with vram has discrete GPUs: name the device plugin's resource (e.g. nvidia.com/gpu)"))
    if pool.vram is None and (pool.gpus_per_node > 1 or pool.vram_bandwidth_gbs is not None):
        problems.append((f"{path}.vram", "gpus_per_node and vram_bandwidth_gbs describe discrete GPUs: set vram (memory of one GPU)"))
    if pool.vram is None and pool.experts_in_ram_us_by_threads:
        problems.append((f"{path}.experts_in_ram_us_by_threads", "measures experts moved from a discrete card to "
                         "system RAM; on unified memory or a CPU they are in the same memory already: remove it"))
    if pool.backend == "cpu" and pool.gpu_resource is not None:
        problems.append((f"{path}.backend", "a cpu backend uses no GPU: remove gpu_resource, or name the GPU backend"))
    return problems


def resources_problems(resources: Resources, path: str) -> list[Problem]:
    problems = []
    if resources.memory_request and resources.memory_limit:
        if parse_quantity(resources.memory_request) > parse_quantity(resources.memory_limit):
            problems.append((f"{path}.memory_request", "is larger than memory_limit"))
    if parse_quantity(resources.cpu_request) > parse_quantity(resources.cpu_limit):
        problems.append((f"{path}.cpu_request", "is larger than cpu_limit"))
    return problems


def workload_problems(workload: Workload, path: str, pool_key: str, pool: Optional[NodePool]) -> list[Problem]:
    problems = []
    if workload.cache_volume is not None and workload.kind != "StatefulSet":
        problems.append((f"{path}.cache_volume", "a claim per replica needs kind: StatefulSet"))
    if pool is not None and workload.one_per_node and workload.replicas > pool.nodes:
        problems.append((
            f"{path}.replicas",
            f"{workload.replicas} replicas, one per node, but node pool {pool_key} has {pool.nodes} nodes",
        ))
    return problems


def model_problems(model: ModelServer, path: str, pools: dict[str, NodePool]) -> list[Problem]:
    """What this server's own fields, its engine and its node pool say about each other."""
    problems: list[Problem] = []
    pool = pools.get(model.node_pool)
    if pool is None:
        problems.append((f"{path}.node_pool", f"no node pool {model.node_pool!r}; defined: {', '.join(pools)}"))
    elif model.gpu_layers > 0 and pool.gpu_resource is None and model.backend_on(pool) != "cpu":
        problems.append((
            f"node_pools.{model.node_pool}.gpu_resource",
            f"{path} offloads {model.gpu_layers} layers to a GPU, so its node pool must name the GPU resource "
            "(e.g. gpu.intel.com/i915), or set gpu_layers: 0",
        ))
    if model.in_cluster_clients and model.api_key is None:
        problems.append((f"{path}.in_cluster_clients", "pods of other namespaces reach the server: add api_key (they "
                         "send it like any client from outside the namespace)"))
    own = {peer.namespace for peer in model.in_cluster_clients}
    if len(own) != len(model.in_cluster_clients):
        problems.append((f"{path}.in_cluster_clients", "a namespace is listed twice; give each once (pod_labels narrow it)"))
    if model.role == "embedding":
        if model.exposure is not None and model.api_key is None:
            # Exposed, only POST /v1/embeddings is routed (asked to chat it would answer fluent nonsense).
            problems.append((
                f"{path}.exposure",
                "an exposed embedding server needs api_key: anyone on the LAN could otherwise spend the node's "
                "compute on it; add api_key (or remove exposure and call it in-cluster)",
            ))
        if model.webui:
            problems.append((f"{path}.webui", "an embedding server has no use for the WebUI; set webui: false"))
    if pool is not None:
        problems += _backend_problems(model, path, pool)
    if model.prefetch is not None and model.workload.cache_volume is None:
        problems.append((f"{path}.prefetch", "prefetched weights need workload.cache_volume to land in"))
    problems += workload_problems(model.workload, f"{path}.workload", model.node_pool, pool)
    problems += resources_problems(model.resources, f"{path}.resources")
    if model.rpc is not None:
        problems += rpc_problems(model, path, pools)
    return problems


RPC_IMAGE_FIX = ("llama.cpp's published images are built without GGML_RPC (.devops/*.Dockerfile), so they have neither "
                 "--rpc nor ggml-rpc-server: build images/llama-rpc/Dockerfile for this backend (make rpc-image "
                 "BACKEND=...; docs/rpc-split.md) and set the image it pushes, pinned")


def rpc_problems(model: ModelServer, server: str, pools: dict[str, NodePool]) -> list[Problem]:
    """A split over nodes (config/rpc.py): one main server, helpers on distinct nodes, images with RPC. ``server``:
    the server's config path."""
    split = model.rpc
    if split is None:
        raise ValueError("config/checks.py: a split was asked for with no rpc block")
    path = f"{server}.rpc"
    problems: list[Problem] = []
    if model.on_demand is not None:
        problems.append((path, "a router of models on demand cannot split a model over nodes; serve the split model "
                         "from a server of its own (remove on_demand or rpc)"))
    if model.workload.replicas != 1:
        problems.append((f"{server}.workload.replicas", "a split model runs one main server (its helpers serve one "
                         "client at a time); set replicas: 1"))
    if model.gpus != 1:
        problems.append((f"{server}.gpus", "a split puts one device per node; set gpus: 1"))
    if model.cpu_moe_layers is not None:
        problems.append((f"{server}.cpu_moe_layers", "experts in RAM and a split over nodes are not planned together; "
                         "remove cpu_moe_layers (the split gives each node what fits in its memory)"))
    if backend_of_image(model.image) is not None:
        problems.append((f"{server}.image", RPC_IMAGE_FIX))
    members: dict[str, int] = {model.node_pool: 1}
    named: dict[str, str] = {split.node: path + ".node"} if split.node else {}
    for index, helper in enumerate(split.helpers):
        where = f"{path}.helpers[{index}]"
        if helper.node_pool not in pools:
            problems.append((f"{where}.node_pool", f"no node pool {helper.node_pool!r}; defined: {', '.join(pools)}"))
            continue
        members[helper.node_pool] = members.get(helper.node_pool, 0) + 1
        if helper.image is not None and backend_of_image(helper.image) is not None:
            problems.append((f"{where}.image", RPC_IMAGE_FIX))
        if helper.node is not None:
            if helper.node in named:
                problems.append((f"{where}.node", f"{helper.node} already runs {named[helper.node]}; each member of "
                                 "a split needs a node of its own"))
            named[helper.node] = where
    for pool_key, count in members.items():
        if pool_key in pools and count > pools[pool_key].nodes:
            problems.append((f"node_pools.{pool_key}.nodes", f"{path} puts {count} members of its split on node pool "
                             f"{pool_key}, one per node, but the pool has {pools[pool_key].nodes}; add nodes or helpers "
                             "from another pool"))
    return problems


def _backend_problems(model: ModelServer, path: str, pool: NodePool) -> list[Problem]:
    problems: list[Problem] = []
    named = model.image_backend()
    backend = model.backend or pool.backend
    where = f"{path}.backend" if model.backend else f"node_pools.{model.node_pool}.backend"
    if named is not None and named not in BACKENDS:
        # One problem, with one fix: an unknown build (a misspelt tag) is not a backend to switch to.
        near = difflib.get_close_matches(named, BACKENDS, n=1, cutoff=0.6)
        hint = f" (did you mean the {near[0]} build?)" if near else ""
        problems.append((f"{path}.image", f"llama.cpp's {named} build is not one this program plans for{hint}; use "
                         f"the {image_choices()} image"))
    elif named is not None and backend is not None and named != backend:
        problems.append((
            where,
            f"{backend}, but the image {model.image} is llama.cpp's {named} build; use the {backend} image "
            f"(or set backend: {named})",
        ))
    effective = model.backend_on(pool)
    if model.gpu_layers > 0 and drives_elsewhere(effective, pool.gpu_resource):
        vendor = BACKEND_VENDORS[effective or ""][0].rstrip("/")
        problems.append((where if backend is not None else f"{path}.image", f"a {effective} build drives {vendor} "
                         f"GPUs, but node pool {model.node_pool} offers {pool.gpu_resource}; use the image built for "
                         "that card (or vulkan, which runs on any vendor's)"))
    build = build_of_image(model.image)
    if build is not None and build < LLAMACPP_TESTED_BUILD:
        problems.append((f"{path}.image", f"llama.cpp b{build} is older than b{LLAMACPP_TESTED_BUILD}, the oldest build "
                         "the rendered flags are tested against (an older server may refuse them at start); use "
                         f"b{LLAMACPP_TESTED_BUILD} or later"))
    if named is None and backend is None:
        problems.append((
            f"{path}.backend",
            f"the image {model.image} does not say which backend it is built for; set backend (vulkan, rocm, cuda, "
            "sycl or cpu) here or on the node pool",
        ))
    return problems


def _on_demand_names(gateway: GatewayConfig, models: dict[str, ModelServer], tier_name: str) -> Optional[list[str]]:
    """The names a tier's router serves; None when the tier is not a local router."""
    tier = gateway.tiers.get(tier_name)
    local = models.get(tier.local) if tier is not None and tier.local is not None else None
    return list(local.on_demand.models) if local is not None and local.on_demand is not None else None


def gateway_problems(gateway: GatewayConfig, models: dict[str, ModelServer]) -> list[Problem]:
    problems: list[Problem] = []
    for name, tier in gateway.tiers.items():
        path = f"gateway.tiers.{name}"
        if (tier.local is None) == (tier.remote is None):
            problems.append((path, "set exactly one of local (a models key) or remote (a provider)"))
        elif tier.local is not None and tier.local not in models:
            problems.append((f"{path}.local", f"no model server {tier.local!r}; defined: {', '.join(models)}"))
        elif tier.remote is not None and tier.remote.api_key_config is None:
            problems.append(
                (f"{path}.remote.api_key_config", "a remote tier needs its provider key: name a Pulumi secret config key")
            )

    def role_of(tier_name: str) -> Optional[str]:
        tier = gateway.tiers.get(tier_name)
        if tier is None or tier.local is None or tier.local not in models:
            return None
        return models[tier.local].role

    seen: dict[str, int] = {}
    for index, route in enumerate(gateway.routes):
        path = f"gateway.routes[{index}]"
        if route.model in seen:
            problems.append((f"{path}.model", f"{route.model!r} is already routed by gateway.routes[{seen[route.model]}]"))
        seen[route.model] = index
        tiers = [b.tier for b in route.backends]
        if len(set(tiers)) != len(tiers):
            problems.append((f"{path}.backends", "a tier appears twice; each tier is one priority"))
        for b_index, backend in enumerate(route.backends):
            where = f"{path}.backends[{b_index}].tier"
            if backend.tier not in gateway.tiers:
                problems.append((where, f"no tier {backend.tier!r}; defined: {', '.join(gateway.tiers)}"))
                continue
            role = role_of(backend.tier)
            if role == "embedding" and route.kind == "chat":
                problems.append((
                    where,
                    f"{backend.tier} serves an embedding model; a chat route to it answers nonsense "
                    "('capital capital ...'); use kind: embedding or another tier",
                ))
            if role == "chat" and route.kind == "embedding":
                problems.append((where, f"{backend.tier} serves a chat model, not embeddings"))
            listed = _on_demand_names(gateway, models, backend.tier)
            sent = backend.model or route.model
            if listed is not None and sent not in listed:
                # A router answers 400 "model not found" for any other name, which is not retried.
                problems.append((
                    f"{path}.backends[{b_index}].model",
                    f"{backend.tier} serves on demand only {', '.join(listed)}, not {sent!r}; route one of them "
                    f"(or set this backend's model to one)",
                ))
    explicit = gateway.retry.attempts_per_priority
    if explicit is not None:
        for index, route in enumerate(gateway.routes):
            needed = gateway.local_replicas([b.tier for b in route.backends], models)
            if explicit < needed:
                problems.append((
                    "gateway.retry.attempts_per_priority",
                    f"{explicit} sends a request that failed on one of the {needed} local replicas of "
                    f"{route.model!r} to the next tier while another local replica is healthy; remove it "
                    f"(default: one attempt per local replica) or set it to {needed}",
                ))
                break
    if gateway.retry.num_retries is not None:
        # The attempts a policy gives each priority: at most this (its rules' largest local server's replicas).
        attempts = explicit or gateway.local_replicas([b.tier for r in gateway.routes for b in r.backends], models)
        for index, route in enumerate(gateway.routes):
            needed = gateway.retries_needed(len(route.backends), attempts)
            if gateway.retry.num_retries < needed:
                problems.append((
                    "gateway.retry.num_retries",
                    f"{gateway.retry.num_retries} gives route {route.model!r} {gateway.retry.num_retries + 1} attempts at "
                    f"{attempts} per tier: its last tier ({route.backends[-1].tier}) is never tried; remove it (derived "
                    f"per route) or set it to {needed}",
                ))
                break
    for index, tier_name in enumerate(gateway.catch_all):
        if tier_name not in gateway.tiers:
            problems.append((f"gateway.catch_all[{index}]", f"no tier {tier_name!r}; defined: {', '.join(gateway.tiers)}"))
        elif role_of(tier_name) == "embedding":
            problems.append((f"gateway.catch_all[{index}]", f"{tier_name} serves an embedding model; it cannot take any model"))
        elif _on_demand_names(gateway, models, tier_name) is not None and index < len(gateway.catch_all) - 1:
            problems.append((
                f"gateway.catch_all[{index}]",
                f"{tier_name} serves models on demand and answers 400 for any other name, which ends the request "
                f"before {gateway.catch_all[index + 1]} is tried; route its models by name and keep it out of catch_all "
                "(or last)",
            ))
    if not gateway.routes and not gateway.catch_all:
        problems.append(("gateway.routes", "the gateway routes nothing: add routes or catch_all"))
    owners: dict[str, str] = {}
    for client, settings in gateway.clients.items():
        if settings.key_config is None and gateway.master_key_config is None:
            problems.append(
                (f"gateway.clients.{client}.key_config", "set it, or gateway.master_key_config to derive the key")
            )
        elif settings.key_config is not None:
            if settings.key_config in owners:
                problems.append((
                    f"gateway.clients.{client}.key_config",
                    f"{settings.key_config} is already the key of client {owners[settings.key_config]}; "
                    "one key per client identity",
                ))
            owners[settings.key_config] = client
    return problems


def _namespace_owned(stack: StackConfig) -> list[Problem]:
    """The namespace is the stack's own: it gets a Pod Security level and a default-deny policy.
    On a system namespace or a peer's, those would lock the cluster's own pods out."""
    name = stack.namespace.name
    if name in SYSTEM_NAMESPACES:
        return [("namespace.name", f"{name} is a Kubernetes system namespace; the stack labels it (Pod Security) "
                 "and denies all traffic not listed: use a namespace of its own, e.g. ai")]
    peers = {
        "cluster.dns.namespace": stack.cluster.dns.namespace,
        "cluster.ingress.namespace": stack.cluster.ingress.namespace if stack.cluster.ingress else None,
        "cluster.monitoring.namespace": stack.cluster.monitoring.namespace if stack.cluster.monitoring else None,
        "cluster.storage.namespace": stack.cluster.storage.namespace if stack.cluster.storage else None,
        "gateway.envoy_namespace": stack.gateway.envoy_namespace if stack.gateway else None,
    }
    for where, peer in peers.items():
        if peer == name:
            return [("namespace.name", f"{name} is also {where}: the stack's default-deny policy would cut that "
                     "peer's own pods off; use a namespace of its own")]
    return []


def stack_problems(stack: StackConfig) -> list[Problem]:
    """Checks between fields that no single field's type can express."""
    problems: list[Problem] = []
    names: dict[str, str] = {}
    hosts: dict[str, str] = {}
    for key, model in stack.models.items():
        path = f"models.{key}"
        if model.name in names:
            problems.append((f"{path}.name", f"{model.name!r} is already the name of models.{names[model.name]}"))
        names[model.name] = key
        if model.workload.name is not None:
            for other_key, other in stack.models.items():
                if other_key != key and other.workload_name == model.workload_name:
                    problems.append((f"{path}.workload.name", f"{model.workload_name!r} is already the workload "
                                     f"of models.{other_key}; pick another name"))
                    break
        if model.exposure is not None:
            if model.exposure.host in hosts:
                problems.append(
                    (f"{path}.exposure.host", f"{model.exposure.host} is already exposed by models.{hosts[model.exposure.host]}")
                )
            hosts[model.exposure.host] = key
        problems += model_problems(model, path, stack.node_pools)
    problems += _namespace_owned(stack)
    problems += hub_egress_problems(stack.namespace.model_hub_egress, "namespace.model_hub_egress")
    problems += _egress_expressible(stack)
    problems += _exposure_problems(stack)
    problems += _acknowledged(stack)
    problems += one_role_each(stack)
    problems += _public_names(stack)
    if stack.observability is not None and stack.cluster.monitoring is None:
        # The namespace's policy admits only the peers the config names: no scraper, no series.
        problems.append(("observability", "scrapes and alerts need a scraper the network policy admits, and "
                         "cluster.monitoring is null (no monitoring): set cluster.monitoring to the namespace and pod "
                         "labels of your vmagent, or remove observability"))
    problems += certificate_problems(stack)
    for pool_key, pool in stack.node_pools.items():
        problems += node_pool_problems(pool, f"node_pools.{pool_key}")
    problems += _gpu_demand(stack)
    if stack.gateway is not None:
        problems += gateway_problems(stack.gateway, stack.models)
    return problems


def _public_names(stack: StackConfig) -> list[Problem]:
    """A model name clients send is answered by one router: two would make the name mean either."""
    problems: list[Problem] = []
    owner: dict[str, str] = {}
    for key, model in stack.models.items():
        for name in (model.on_demand.models if model.on_demand is not None else {}):
            if name in owner:
                problems.append((f"models.{key}.on_demand.models.{name}", f"models.{owner[name]} already offers "
                                 f"{name!r}; give one of them another name"))
            owner.setdefault(name, key)
    return problems


def public_ranges(ranges) -> list[str]:
    """The ranges that admit addresses outside private (RFC 1918), CGNAT and unique-local space."""
    private = [ipaddress.ip_network(r) for r in PRIVATE_SOURCE_RANGES]
    return [r for r in ranges or [] if not any(
        ipaddress.ip_network(r).version == p.version and ipaddress.ip_network(r).subnet_of(p) for p in private)]


def _acknowledged(stack: StackConfig) -> list[Problem]:
    """What opens the plane wider than its defaults needs a reason, which the summary repeats."""
    problems: list[Problem] = []
    for key, model in stack.models.items():
        public = public_ranges(model.exposure.source_ranges) if model.exposure is not None else []
        if public and model.exposure.public_reason is None:
            problems.append((f"models.{key}.exposure.source_ranges", f"{', '.join(public)} admits addresses on the "
                             "internet; narrow it to your LAN's ranges, or set exposure.public_reason with why"))
        if model.exposure is not None and model.exposure.source_ranges is None and model.exposure.public_reason is None:
            problems.append((f"models.{key}.exposure.source_ranges", "null admits every client the ingress controller "
                             "serves (the API key is the only guard); list your LAN's ranges, or set "
                             "exposure.public_reason with who can reach the controller"))
    if stack.namespace.pod_security != "restricted" and stack.namespace.pod_security_reason is None:
        problems.append(("namespace.pod_security", f"{stack.namespace.pod_security} admits privileged pods the model "
                         "servers never need; use restricted, or set namespace.pod_security_reason with why"))
    gateway = stack.gateway
    if gateway is not None and gateway.load_balancer_class != TAILSCALE_CLASS and gateway.load_balancer_reason is None:
        what = (f"{gateway.load_balancer_class} may give the gateway an address outside the tailnet (a cloud load "
                "balancer faces the internet)" if gateway.load_balancer_class is not None else
                "null gives the gateway the cluster's default load balancer (k3s ServiceLB or MetalLB: an address on "
                "the LAN; a cloud's: a public one)")
        problems.append(("gateway.load_balancer_class", f"{what}; set gateway.load_balancer_reason with who can reach "
                         "it and how its hostname resolves there, or use tailscale"))
    ingress = stack.cluster.ingress
    if (gateway is not None and gateway.load_balancer_class is None and gateway.port in (80, 443)
            and ingress is not None and ingress.namespace == "kube-system"):
        # k3s' ServiceLB runs a hostPort pod per LoadBalancer port on each node, and its bundled Traefik
        # (kube-system) holds 80 and 443: a second Service on one of them never gets an address.
        problems.append(("gateway.port", f"{gateway.port} is taken on k3s' ServiceLB by the ingress controller in "
                         "kube-system (each LoadBalancer port is one hostPort per node), so the gateway's Service would "
                         "stay Pending; set another port, e.g. 8443 (clients then use https://"
                         f"{gateway.hostname}:8443)"))
    if gateway is not None and gateway.load_balancer_class == TAILSCALE_CLASS and not gateway.hostname.endswith(".ts.net"):
        device = gateway.hostname.split(".", 1)[0]
        problems.append(("gateway.hostname", f"a tailscale gateway answers as the tailnet device {device}.<tailnet>.ts.net "
                         f"(MagicDNS), which a listener for {gateway.hostname} never matches: set hostname to "
                         f"{device}.<your tailnet>.ts.net, or load_balancer_class: null (ServiceLB or MetalLB, an address on "
                         "the LAN) with load_balancer_reason"))
    return problems


def _egress_expressible(stack: StackConfig) -> list[Problem]:
    """Plain NetworkPolicy matches addresses, not names: named hosts cannot be enforced there."""
    hub = stack.namespace.model_hub_egress
    if stack.cluster.cni == "networkpolicy" and hub.mode == "fqdn":
        return [(
            "namespace.model_hub_egress.mode",
            "plain NetworkPolicy cannot match host names, so the hosts would silently become any address on 443; "
            "set mode: world with a reason (the egress it really gets), or use cni: cilium",
        )]
    return []


# Names no public DNS zone of the user's can hold: mDNS and the special-use / private-use suffixes
# (RFC 6762, RFC 8375 home.arpa, ICANN's .internal) and Tailscale's MagicDNS domain (Tailscale's zone).
PRIVATE_SUFFIXES = (".local", ".lan", ".home", ".home.arpa", ".internal", ".localdomain", ".corp", ".ts.net")


def private_suffix(host: str) -> Optional[str]:
    """The private (never publicly delegated) suffix a host name ends with, if any."""
    return next((s for s in PRIVATE_SUFFIXES if host.endswith(s)), None)


def certificate_problems(stack: StackConfig) -> list[Problem]:
    """Every name the program asks cert-manager for, against what its issuer can prove: these hosts
    are never published on the internet (public_dns_label is refused), so ACME HTTP-01 cannot reach
    them, and DNS-01 needs a public zone the user controls."""
    cluster = stack.cluster
    names = [(f"models.{key}.exposure.host", m.exposure.host) for key, m in stack.models.items() if m.exposure]
    if stack.gateway is not None:
        names.append(("gateway.hostname", stack.gateway.hostname))
    problems: list[Problem] = []
    for path, host in names:
        if cluster.issuer_solver == "http01":
            problems.append((
                "cluster.issuer_solver",
                f"{cluster.cert_manager_issuer} (http01) cannot issue for {host} ({path}): Let's Encrypt must fetch a "
                "token from it over the internet, and the program publishes no record for it; use a dns01 issuer on a "
                "public zone you control (issuer_solver: dns01) or a CA issuer (issuer_solver: ca)",
            ))
            break
        private = private_suffix(host)
        if cluster.issuer_solver == "dns01" and private is not None:
            problems.append((
                "cluster.issuer_solver",
                f"{cluster.cert_manager_issuer} (dns01) cannot issue for {host} ({path}): no public zone of yours "
                f"holds *{private}; use a CA issuer for it (cluster.cert_manager_issuer: <your CA ClusterIssuer>, "
                "issuer_solver: ca)",
            ))
    return problems


def _exposure_problems(stack: StackConfig) -> list[Problem]:
    problems: list[Problem] = []
    for key, model in stack.models.items():
        exposure = model.exposure
        if exposure is None:
            continue
        if stack.cluster.ingress is None:
            problems.append((
                f"models.{key}.exposure",
                "the cluster has no ingress controller (cluster.ingress: null); remove exposure or configure one",
            ))
            continue
        if exposure.source_ranges is not None and stack.cluster.ingress.kind == "other":
            problems.append((
                f"models.{key}.exposure.source_ranges",
                "the program can restrict sources only on ingress-nginx or Traefik (cluster.ingress.kind); restrict "
                "them in your controller, set source_ranges: null and exposure.public_reason saying where they are restricted",
            ))
        ours = program_annotations(stack.cluster.cert_manager_issuer, stack.cluster.ingress.kind, exposure,
                                   stack.namespace.name, model.name)
        for name, value in exposure.annotations.items():
            where = f"models.{key}.exposure.annotations.{name}"
            if name == TRAEFIK_MIDDLEWARES and stack.cluster.ingress.kind == "traefik":
                continue  # the user's middlewares run after the program's (components/model_server.py)
            if name in SOURCE_RANGE_ANNOTATIONS:
                problems.append((where, "who may connect is exposure.source_ranges (ingress-nginx reads this name "
                                 "before the program's); set the ranges there instead"))
            elif name in ours and ours[name] != value:
                problems.append((
                    where,
                    f"the program sets {ours[name]!r} here (from cluster.cert_manager_issuer, or exposure's "
                    "timeout_seconds / max_body for long streamed answers); remove it, or change those settings",
                ))
            elif name not in ours and annotation_refusal(name, stack.cluster.ingress.kind) is not None:
                problems.append((where, f"{annotation_refusal(name, stack.cluster.ingress.kind)}; remove it"))
            if stack.cluster.public_dns_label and name == stack.cluster.public_dns_label:
                problems.append((f"models.{key}.exposure.annotations.{name}", "would publish the API on the internet; remove it"))
    return problems


def _gpu_demand(stack: StackConfig) -> list[Problem]:
    problems = []
    for pool_key, pool in stack.node_pools.items():
        users = [k for k, m in stack.models.items() if m.node_pool == pool_key and m.uses_gpu(pool)]
        demand = sum(stack.models[k].workload.replicas * stack.models[k].gpus for k in users)
        gpus = pool.nodes * (pool.gpus_per_node if pool.discrete() else 1)
        if demand > pool.gpu_shares * gpus:
            # The way out depends on how the pool's device plugin shares a card (or cannot).
            fix = {
                "shared-dev-num": "raise the device plugin's -shared-dev-num and gpu_shares",
                "time-slicing": "give the NVIDIA device plugin time-slicing replicas and set gpu_shares to them",
                "exclusive": "its device plugin gives each card to one container: add cards or nodes, or run fewer "
                             "GPU servers (gpu_layers: 0 for one of them)",
            }.get(pool.sharing() or "", "add cards or nodes, or share them (gpu_sharing, gpu_shares)")
            if any(stack.models[k].gpus > 1 for k in users):
                fix = "a server split over several cards cannot share them: add cards or nodes (nodes), or fewer replicas"
            problems.append((
                f"node_pools.{pool_key}.gpu_shares",
                f"model server pods ({', '.join(users)}) request {demand} {pool.gpu_resource}, but the pool "
                f"offers {pool.gpu_shares * gpus}; {fix}",
            ))
    return problems


def config_warnings(stack: StackConfig) -> list[str]:
    """Warnings, not refusals: a GPU image on a server that offloads nothing (it runs on the CPU anyway), and
    weights served twice."""
    found = []
    for key, model in stack.models.items():
        backend = backend_of_image(model.image)
        if backend in (None, "cpu"):
            continue
        offloads = [model.gpu_layers] + ([m.gpu_layers for m in model.on_demand.models.values() if m.gpu_layers is not None]
                                         if model.on_demand is not None else [])
        if any(layers > 0 for layers in offloads):
            continue
        found.append(
            f"models.{key}.image: {model.image} is built for {backend}, but gpu_layers is 0, so the server runs on the "
            f"CPU and the {backend} image only adds its size to every pull; use {cpu_image(model.image)}"
        )
    return found + _served_twice(stack)


def _served_twice(stack: StackConfig) -> list[str]:
    """The same weights on a single-model server and as a router's model: both are planned (no OOM), but
    the memory is held twice when both are loaded."""
    single = {m.hf_repo: key for key, m in stack.models.items() if m.hf_repo is not None and m.on_demand is None}
    return [f"models.{key}.on_demand.models.{name}: {entry.hf_repo} is also served by models.{single[entry.hf_repo]}; "
            "both are counted, so both may hold its memory at once: drop one, or route its name to that server"
            for key, m in stack.models.items() if m.on_demand is not None
            for name, entry in m.on_demand.models.items() if entry.hf_repo in single]
