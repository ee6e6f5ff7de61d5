"""The machines and clusters a stack is written for: the GPU kinds, typical NVIDIA cards, one node's
memory as the kubelet offers it, and the storage and ingress choices with their namespaces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Typical cards by VRAM, for the decode prediction when --vram-bandwidth is not given (GB/s).
NVIDIA_CARDS = ((4, 128, "a GTX 1650 (128-bit GDDR5 at 8 Gbps)"), (6, 336, "an RTX 2060 (192-bit GDDR6 at 14 Gbps)"),
                (8, 272, "an RTX 4060 (128-bit GDDR6 at 17 Gbps)"), (12, 360, "an RTX 3060 12GB (192-bit GDDR6 at 15 Gbps)"),
                (16, 448, "an RTX 5060 Ti 16GB (128-bit GDDR7 at 28 Gbps)"), (24, 936, "an RTX 3090 (384-bit GDDR6X at 19.5 Gbps)"),
                (32, 1792, "an RTX 5090 (512-bit GDDR7 at 28 Gbps)"))
# Discrete Radeon and Arc cards by VRAM: (GiB, GB/s, what, decode profile). The profiles are the
# class's (engines/llamacpp_speed.py, each from a published llama-bench figure).
AMD_CARDS = ((8, 288, "an RX 7600 (128-bit GDDR6 at 18 Gbps)", "amd-discrete-rocm"),
             (16, 624, "an RX 7800 XT (256-bit GDDR6 at 19.5 Gbps)", "amd-discrete-rocm"),
             (20, 800, "an RX 7900 XT (320-bit GDDR6 at 20 Gbps)", "amd-discrete-rocm"),
             (24, 960, "an RX 7900 XTX (384-bit GDDR6 at 20 Gbps)", "amd-discrete-rocm"))
INTEL_CARDS = ((12, 456, "an Arc B580 (192-bit GDDR6 at 19 Gbps)", "intel-arc-b"),
               (16, 560, "an Arc A770 16GB (256-bit GDDR6 at 17.5 Gbps)", "intel-arc-a"))
# The kinds of GPU with a card of their own: --vram is required, and the card's bandwidth is assumed from it.
DISCRETE = {"nvidia": NVIDIA_CARDS, "amd": AMD_CARDS, "intel-arc": INTEL_CARDS}
KINDS = {
    # gpu: (pool key, backend, gpu_resource, decode_profile, what it is)
    "none": ("cpu", "cpu", None, None, "CPU only"),
    "nvidia": ("nvidia", "cuda", "nvidia.com/gpu", None, "NVIDIA GPU"),
    # ROCm build (server-rocm): AMD's k8s-device-plugin advertises amd.com/gpu; /dev/kfd and /dev/dri.
    "amd": ("radeon", "rocm", "amd.com/gpu", "amd-discrete-rocm", "AMD Radeon card"),
    # SYCL build (server-intel): Intel's device plugin advertises Xe-driver cards (Arc B-series, A-series
    # on recent kernels) as gpu.intel.com/xe.
    "intel-arc": ("arc", "sycl", "gpu.intel.com/xe", None, "Intel Arc card"),
    "intel-igpu": ("igpu", "vulkan", "gpu.intel.com/i915", "intel-igpu", "Intel iGPU"),
    "amd-apu": ("apu", "vulkan", "amd.com/gpu", "amd-apu", "AMD APU"),
}


@dataclass(frozen=True)
class Hardware:
    gpu: str
    ram_gib: float
    vram_gib: Optional[float]
    nodes: int
    cpus: int  # as nproc counts them
    arch: str
    ram_bandwidth: float
    ram_bandwidth_why: str
    vram_bandwidth: Optional[float]
    vram_bandwidth_why: str
    render_gids: tuple[int, ...]
    image: Optional[str]  # --image: overrides the llama.cpp image (required on arm64)
    profile: Optional[str] = None  # the card's decode profile, where the kind's depends on the card
    p_cores: Optional[int] = None  # physical performance cores, where given (--p-cores)
    e_cores: int = 0  # a hybrid CPU's efficiency cores (--e-cores)

    @property
    def pool(self) -> str:
        return KINDS[self.gpu][0]

    @property
    def backend(self) -> str:
        return KINDS[self.gpu][1]

    @property
    def discrete(self) -> bool:
        return self.vram_gib is not None

    def allocatable_gib(self) -> float:
        return self.ram_gib - (1 if self.ram_gib <= 16 else 2 if self.ram_gib <= 64 else 4)

    def reserved_gib(self) -> float:
        return 1 if self.ram_gib <= 32 else 2 if self.ram_gib <= 64 else 4

    def offers_gib(self) -> float:
        return self.allocatable_gib() - self.reserved_gib()


@dataclass(frozen=True)
class Cluster:
    cni: str
    ingress: str
    storage: str
    issuer: Optional[str]
    host: Optional[str]
    monitoring: Optional[str]
    namespace: str
    kubernetes_version: str


STORAGE = {
    # --storage: (storage class, access mode, storage daemons' namespace, why)
    "local-path": ("local-path", "ReadWriteOnce", None,
                   "k3s' bundled local-path provisioner: a folder on the node, attached to one node at a time"),
    "longhorn": ("longhorn", "ReadWriteMany", "longhorn-system",
                 "Longhorn; ReadWriteMany through its share manager, so a second server or replica mounts the same weights"),
    "ceph-filesystem": ("ceph-filesystem", "ReadWriteMany", "rook-ceph",
                        "CephFS from Rook; ReadWriteMany, so a second server or replica mounts the same weights"),
    "nfs-client": ("nfs-client", "ReadWriteMany", None,
                   "nfs-subdir-external-provisioner; ReadWriteMany (the node mounts NFS, pods talk to no daemon)"),
}
INGRESS = {
    # --ingress: (kind, class, namespace, pod labels, why)
    "traefik-k3s": ("traefik", "traefik", "kube-system", {"app.kubernetes.io/name": "traefik"},
                    "k3s' bundled Traefik (its HelmChart installs it in kube-system)"),
    "nginx": ("ingress-nginx", "nginx", "ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"},
              "ingress-nginx from its Helm chart (namespace ingress-nginx)"),
}
