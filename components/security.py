"""What every container of a model server's pod shares: the security context, the scratch volume,
and where the Hugging Face cache lives for engines that use it."""

from common.constants import SCRATCH

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
