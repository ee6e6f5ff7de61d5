"""inference-plane: one stack per cluster. Reads the stack's config and builds the components.

``pulumi up`` runs this file as ``__main__``; the offline render (``python -m render``) loads it
and calls ``main()`` under Pulumi's mock engine, so both run exactly this wiring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pulumi

from common.errors import ConfigError, Problems
from common.quantity import gib
from components import SERVER_COMPONENTS
from components.gateway import InferenceGateway, InferenceGatewayArgs, client_keys, envoy_peer, upstream_keys
from components.model_cache import ModelCache, ModelCacheArgs
from components.model_server import ModelServerArgs, ModelServerBase
from components.gateway_routes import fallback_alerts
from components.monitoring import Monitoring, MonitoringArgs
from components.namespace import AINamespace, AINamespaceArgs
from config import StackConfig
from engines import ServerBuild, server_builds
from config.history import HistoryVerdict, compare, snapshot
from plane import HISTORY_OUTPUT, load_stack, plan_stack, previous_history
from planning.capacity import CapacityPlan


@dataclass
class Built:
    """What one run of the program built, for the stack outputs and the offline render."""

    stack: StackConfig
    capacity: CapacityPlan
    builds: dict[str, ServerBuild]
    servers: dict[str, ModelServerBase] = field(default_factory=dict)
    gateway: Optional[InferenceGateway] = None


def server_component(built: ServerBuild) -> type[ModelServerBase]:
    """The component a server is registered as: its engine names the type."""
    return SERVER_COMPONENTS[built.component_type]


def check(stack: StackConfig, edits: Optional[HistoryVerdict] = None
          ) -> tuple[StackConfig, CapacityPlan, dict[str, ServerBuild]]:
    """Everything that can be refused is refused here, before any resource is registered. The stack as it runs
    (the planner's choices applied: a KV cache type left unset), its plan, and each server as its engine builds
    it (asked once per server; every component renders from these). ``edits``: this run against the last update
    (the servers leaving a router's pool keep their VRAM)."""
    stack, capacity = plan_stack(stack, edits.leaving if edits is not None else None)
    builds = server_builds(stack, capacity)
    if stack.observability is not None:
        fallback_alerts(stack, builds)
    for key, server in capacity.servers.items():
        if gib(server.memory_request) < server.estimate.total_gib:
            # Allowed (the seed's chat server asks for less than it uses), but worth knowing.
            pulumi.log.warn(
                f"models.{key}.resources.memory_request {server.memory_request} is below the estimate of "
                f"{server.estimate.total_gib:.1f} GiB: the pod runs above its request, so under memory pressure "
                "the kubelet evicts it first; raise it, or leave it null (the limit)"
            )
    for warning in capacity.warnings + capacity.slow_notes:
        pulumi.log.warn(warning)
    return stack, capacity, builds


def check_edits(stack: StackConfig) -> HistoryVerdict:
    """This run against the last update's history: refuses the edits that would wedge the stack,
    warns of those the cluster would ignore, and finds servers whose key was renamed."""
    verdict = compare(previous_history(), stack)
    if verdict.problems:
        raise ConfigError(verdict.problems)
    for warning in verdict.warnings:
        pulumi.log.warn(warning)
    return verdict


def build(stack: StackConfig, capacity: CapacityPlan, builds: dict[str, ServerBuild], secret=None,
          edits: Optional[HistoryVerdict] = None) -> Built:
    """Register the stack's resources. ``secret(key)`` reads a secret config value (default: the
    Pulumi config of the running stack); ``edits`` names servers whose models key was renamed."""
    config = pulumi.Config()
    secret = secret or config.require_secret
    built = Built(stack=stack, capacity=capacity, builds=builds)
    ns_name = stack.namespace.name
    gateway_peer = envoy_peer(stack.gateway) if stack.gateway is not None else None
    # Components are named by what never changes with an edit (a role, a config key); the names
    # they had before are kept as aliases, so stacks already up keep their resources.
    namespace = AINamespace(
        "namespace", AINamespaceArgs(namespace=stack.namespace, cluster=stack.cluster, gateway=gateway_peer,
                                     rpc_helpers=any(model.rpc is not None for model in stack.models.values()))
    )
    cache = ModelCache(
        "model-cache",
        ModelCacheArgs(cache=stack.model_cache, namespace=ns_name),
        opts=pulumi.ResourceOptions(depends_on=[namespace]),
    )
    renamed = edits.renamed_keys if edits is not None else {}
    for key, model in stack.models.items():
        api_key = model.api_key
        # A renamed key keeps the server's resources: they are found under the old key.
        aliases = [pulumi.Alias(name=renamed[key])] if key in renamed else None
        built.servers[key] = server_component(builds[key])(
            key,
            ModelServerArgs(
                model=model,
                namespace=ns_name,
                node_pool=stack.node_pools[model.node_pool],
                cache=stack.model_cache,
                cluster=stack.cluster,
                plan=capacity.servers[key],
                build=builds[key],
                api_key_value=secret(api_key.from_config) if api_key and api_key.from_config else None,
                pools=dict(stack.node_pools),
            ),
            opts=pulumi.ResourceOptions(depends_on=[namespace, cache], aliases=aliases),
        )
    endpoints = {
        key: {"url": server.url, **({"external_url": server.external_url} if server.external_url else {})}
        for key, server in built.servers.items()
    }
    if stack.gateway is not None:
        gw = stack.gateway
        keys = client_keys(gw, secret)
        built.gateway = InferenceGateway(
            "gateway",
            InferenceGatewayArgs(
                gateway=gw, stack=stack, namespace=ns_name, builds=builds, client_keys=keys,
                provider_keys=upstream_keys(gw, stack, builds, secret)
            ),
            # Not on the model servers: the gateway's objects name their Services by DNS name, and
            # waiting for strix-halo's engine (an hour's cold start) would delay the whole gateway.
            opts=pulumi.ResourceOptions(depends_on=[namespace]),
        )
        endpoints["gateway"] = {"url": built.gateway.endpoint}
        # Clients' keys, for handing out: a secret output, never shown in plain text.
        pulumi.export("client_api_keys", pulumi.Output.secret(pulumi.Output.all(**keys)))
    if stack.observability is not None:
        Monitoring(
            "monitoring",
            MonitoringArgs(observability=stack.observability, stack=stack, plan=capacity, namespace=ns_name, builds=builds),
            opts=pulumi.ResourceOptions(depends_on=[namespace]),
        )
    pulumi.export("namespace", namespace.name)
    pulumi.export("capacity_plan", capacity.to_dict())
    pulumi.export("model_cache", cache.claim_name)
    pulumi.export("endpoints", endpoints)
    # Read back by the next run (plane.previous_history): names, pools and claim sizes, nothing secret.
    pulumi.export(HISTORY_OUTPUT, snapshot(stack, {key: server.vram.total_gib for key, server in capacity.servers.items()
                                                   if server.vram is not None}))
    return built


def main() -> Built:
    try:
        stack = load_stack()
        edits = check_edits(stack)
        stack, capacity, builds = check(stack, edits)
    except Problems as error:
        # The file the paths are in: the stack's own settings file.
        raise pulumi.RunError(f"Pulumi.{pulumi.get_stack()}.yaml: {error}") from None
    return build(stack, capacity, builds, edits=edits)


if __name__ == "__main__":
    main()
