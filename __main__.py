"""inference-plane: one stack per cluster. Reads the stack's config, builds the components."""

import pulumi

from components.capacity import CapacityError, plan
from components.config import ConfigError, load_stack
from components.embed_server import EmbedServer
from components.llama_server import LlamaServer
from components.model_cache import ModelCache, ModelCacheArgs
from components.model_server import ModelServerArgs
from components.namespace import AINamespace, AINamespaceArgs

try:
    stack = load_stack()
    capacity = plan(stack)
except (ConfigError, CapacityError) as error:
    raise pulumi.RunError(str(error)) from None

namespace = AINamespace(stack.namespace.name, AINamespaceArgs(namespace=stack.namespace, cluster=stack.cluster))
in_namespace = pulumi.ResourceOptions(depends_on=[namespace])
cache = ModelCache(
    stack.model_cache.claim_name,
    ModelCacheArgs(cache=stack.model_cache, namespace=stack.namespace.name),
    opts=in_namespace,
)

servers = {}
for key, model in stack.models.items():
    component = EmbedServer if model.role == "embedding" else LlamaServer
    api_key = model.api_key
    servers[key] = component(
        model.name,
        ModelServerArgs(
            model=model,
            namespace=stack.namespace.name,
            node_pool=stack.node_pools[model.node_pool],
            cache=stack.model_cache,
            cluster=stack.cluster,
            plan=capacity.servers[key],
            api_key_value=pulumi.Config().require_secret(api_key.from_config)
            if api_key and api_key.from_config
            else None,
        ),
        opts=pulumi.ResourceOptions(depends_on=[namespace, cache]),
    )

pulumi.export("namespace", namespace.name)
pulumi.export("capacity_plan", capacity.to_dict())
pulumi.export("model_cache", cache.claim_name)
pulumi.export(
    "endpoints",
    {
        key: {"url": server.url, **({"external_url": server.external_url} if server.external_url else {})}
        for key, server in servers.items()
    },
)
