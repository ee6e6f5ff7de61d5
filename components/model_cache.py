"""ModelCache: the volume that holds downloaded weights, shared by every model server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from .config import ModelCache as ModelCacheConfig
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
        super().__init__(token("ModelCache"), name, None, opts)
        cache = args.cache
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
            # Weights take an hour to download: neither a destroy nor a refactor deletes them.
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True, protect=cache.protect),
        )
        self.claim_name = self.claim.metadata.apply(lambda m: m["name"])
        self.register_outputs({"claim_name": self.claim_name})
