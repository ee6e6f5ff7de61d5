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
