"""What every pod of the program shares (a model server's, a split's helper): the security contexts, the scratch
volume, the checkov waivers, where its pool's nodes are, and where the Hugging Face cache lives for engines that
use it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from common.constants import SCRATCH

if TYPE_CHECKING:
    from config.types import NodePool

RUN_AS = 1000  # any non-root UID; the cache volume is made group-writable for it through fsGroup

HF_HOME_DIR = "/home/engine"  # HOME for engines: the Hugging Face cache defaults to $HOME/.cache/huggingface
HF_CACHE = f"{HF_HOME_DIR}/.cache/huggingface"
# Read-only root: every path a container writes is a volume (the weights, /tmp), so nothing an
# attacker drops survives a restart and the image cannot be modified in place.
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
SCRATCH_VOLUME = {"name": "scratch", "mountPath": SCRATCH}
SCRATCH_EMPTY_DIR = {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}
# Mesa's and RADV's shader caches, and anything else that honours XDG, land on the scratch volume.
SCRATCH_ENV = [{"name": "XDG_CACHE_HOME", "value": f"{SCRATCH}/cache"}]


# checkov checks waived on every model server's workload, each with its reason (docs/guardrails.md lists them).
CHECKOV_WAIVERS = {
    "CKV_K8S_43": "pinned to a build tag that the config validates; a digest is accepted where wanted",
    "CKV_K8S_15": "pinned tags never move, so Always would only make every restart depend on the registry",
    "CKV_K8S_40": "UID 1000 owns the model cache (the seed's CephFS volume); fsGroup, not the UID, grants access",
}
CILIUM_WAIVER = {
    "CKV2_K8S_6": "governed by the namespace's CiliumNetworkPolicy (endpointSelector {}), which checkov does not read",
}


def pod_security(groups: Sequence[int] = ()) -> dict:
    """The pod's security context: non-root, the runtime's seccomp profile; ``groups``: the device nodes' groups
    (root:render and root:video), which a non-root process needs to open them."""
    security: dict = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        # Makes the cache volume group-writable so the weights can be cached.
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if groups:
        security["supplementalGroups"] = list(groups)
    return security


def pool_nodes(pool: "NodePool", hostname: Optional[str] = None) -> dict[str, str]:
    """The nodeSelector that keeps a pod on its pool's nodes (and on one node, where ``hostname`` pins it)."""
    nodes = dict(pool.node_labels)
    if pool.instance_type:
        nodes["node.kubernetes.io/instance-type"] = pool.instance_type
    if hostname:
        nodes["kubernetes.io/hostname"] = hostname
    return nodes


def checkov_waivers(cni: str, pod: bool = False, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The skip annotations: on the workload all of them (and ``extra``, its own), on its pods only the
    network-policy one (checkov judges that check on the pod; fewer pod annotations, fewer rollouts when one
    changes)."""
    waivers = {} if pod else {**CHECKOV_WAIVERS, **(extra or {})}
    if cni == "cilium":
        waivers.update(CILIUM_WAIVER)
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(sorted(waivers.items()), 1)}
