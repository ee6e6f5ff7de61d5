"""ModelCache: the volume that holds downloaded weights, shared by every model server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from config.types import ModelCacheConfig

from .meta import metadata, token


@dataclass(frozen=True)
class ModelCacheArgs:
    cache: ModelCacheConfig
    namespace: str


class ModelCache(pulumi.ComponentResource):
    """A ReadWriteMany claim for the GGUF weights, kept when the stack lets go of it."""

    claim: k8s.core.v1.PersistentVolumeClaim
    claim_name: pulumi.Output[str]

    def __init__(self, name: str, args: ModelCacheArgs, opts: Optional[pulumi.ResourceOptions] = None):
        cache = args.cache
        if cache.claim_name != name:
            # Stacks brought up before the component was named "model-cache" know it by the claim's name.
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(name=cache.claim_name)]))
        super().__init__(token("ModelCache"), name, None, opts)
        self.claim = k8s.core.v1.PersistentVolumeClaim(
            name,
            metadata=metadata(
                cache.claim_name,
                args.namespace,
                cache.claim_name,
                "model-cache",
                # Flux's equivalent of retain-on-delete, for the rendered manifests: retiring the
                # Kustomization must not throw away weights that take an hour to download again.
                annotations={"kustomize.toolkit.fluxcd.io/prune": "disabled"},
            ),
            spec={
                "accessModes": [cache.access_mode],
                "storageClassName": cache.storage_class,
                "resources": {"requests": {"storage": cache.size}},
            },
            # Weights take an hour to download: a destroy, a rename or a move leaves the claim in
            # place (the namespace around it is retained too, see AINamespace). A claim's class and
            # access mode cannot change in place: the provider would replace it delete-first, the
            # retained delete would do nothing and the create would collide with the old claim,
            # wedging every later update. They are fixed at creation; see docs/day-2.md to move a cache.
            opts=pulumi.ResourceOptions(
                parent=self,
                retain_on_delete=True,
                protect=cache.protect,
                ignore_changes=["spec.storageClassName", "spec.accessModes"],
            ),
        )
        self.claim_name = self.claim.metadata.apply(lambda m: m["name"])
        self.register_outputs({"claim_name": self.claim_name})
