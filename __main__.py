"""inference-plane: one stack per cluster. Reads the stack's config, builds the components."""

import pulumi

from components.capacity import CapacityError, plan
from components.config import ConfigError, PodPeer, load_stack
from components.embed_server import EmbedServer
from components.engine import InferenceEngine
from components.gateway import InferenceGateway, InferenceGatewayArgs, derived_client_key
from components.llama_server import LlamaServer
from components.model_cache import ModelCache, ModelCacheArgs
from components.model_server import ModelServerArgs
from components.namespace import AINamespace, AINamespaceArgs
from components.observability import Monitoring, MonitoringArgs, fallback_alerts

try:
    stack = load_stack()
    capacity = plan(stack)
    if stack.observability is not None:
        fallback_alerts(stack)  # refused before any resource is registered
except (ConfigError, CapacityError) as error:
    raise pulumi.RunError(str(error)) from None

config = pulumi.Config()
ns_name = stack.namespace.name
envoy = None
if stack.gateway is not None:
    envoy = PodPeer(
        namespace=stack.gateway.envoy_namespace,
        pod_labels={"app.kubernetes.io/name": "envoy", "gateway.envoyproxy.io/owning-gateway-name": stack.gateway.name},
    )
namespace = AINamespace(ns_name, AINamespaceArgs(namespace=stack.namespace, cluster=stack.cluster, gateway=envoy))
cache = ModelCache(
    stack.model_cache.claim_name,
    ModelCacheArgs(cache=stack.model_cache, namespace=ns_name),
    opts=pulumi.ResourceOptions(depends_on=[namespace]),
)

servers = {}
for key, model in stack.models.items():
    if model.engine == "openai":
        component = InferenceEngine
    else:
        component = EmbedServer if model.role == "embedding" else LlamaServer
    api_key = model.api_key
    servers[key] = component(
        model.name,
        ModelServerArgs(
            model=model,
            namespace=ns_name,
            node_pool=stack.node_pools[model.node_pool],
            cache=stack.model_cache,
            cluster=stack.cluster,
            plan=capacity.servers[key],
            api_key_value=config.require_secret(api_key.from_config) if api_key and api_key.from_config else None,
        ),
        opts=pulumi.ResourceOptions(depends_on=[namespace, cache]),
    )

endpoints = {
    key: {"url": server.url, **({"external_url": server.external_url} if server.external_url else {})}
    for key, server in servers.items()
}

def upstream_keys(gw):
    """The key the gateway sends to each tier: a provider's, or a local llama.cpp server's own."""
    keys = {}
    for tier, settings in gw.tiers.items():
        if settings.remote is not None and settings.remote.api_key_config:
            keys[tier] = config.require_secret(settings.remote.api_key_config)
        elif settings.local is not None:
            api_key = stack.models[settings.local].api_key
            if api_key is not None and api_key.from_config:
                keys[tier] = config.require_secret(api_key.from_config)
    return keys


if stack.gateway is not None:
    gw = stack.gateway
    client_keys = {}
    for client, settings in gw.clients.items():
        if settings.key_config:
            client_keys[client] = config.require_secret(settings.key_config)
        else:
            master = config.require_secret(gw.master_key_config)
            client_keys[client] = master.apply(lambda value, c=client: derived_client_key(value, c))
    gateway = InferenceGateway(
        gw.name,
        InferenceGatewayArgs(
            gateway=gw,
            stack=stack,
            namespace=ns_name,
            client_keys=client_keys,
            provider_keys=upstream_keys(gw),
        ),
        # Not on the model servers: the gateway's objects name their Services by DNS name, and
        # waiting for strix-halo's engine (an hour's cold start) would delay the whole gateway.
        opts=pulumi.ResourceOptions(depends_on=[namespace]),
    )
    endpoints["gateway"] = {"url": gateway.endpoint}
    # Clients' keys, for handing out: a secret output, never shown in plain text.
    pulumi.export("client_api_keys", pulumi.Output.secret(pulumi.Output.all(**client_keys)))

if stack.observability is not None:
    Monitoring(
        "monitoring",
        MonitoringArgs(observability=stack.observability, stack=stack, plan=capacity, namespace=ns_name),
        opts=pulumi.ResourceOptions(depends_on=[namespace]),
    )

pulumi.export("namespace", namespace.name)
pulumi.export("capacity_plan", capacity.to_dict())
pulumi.export("model_cache", cache.claim_name)
pulumi.export("endpoints", endpoints)
