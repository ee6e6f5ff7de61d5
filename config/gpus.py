"""GPU vendors and backends, in one place: the backends this program plans for, which image variant
of llama.cpp's builds each is, which device plugin's cards each drives, what each plugin can share, and
the memory each backend holds beside the weights. Every other module asks here."""

from __future__ import annotations

import typing
from typing import Literal

GpuBackend = Literal["vulkan", "rocm", "cuda", "sycl", "cpu"]
BACKENDS: tuple[str, ...] = typing.get_args(GpuBackend)

# llama.cpp's published server images (ghcr.io/ggml-org/llama.cpp, .github/workflows/docker.yml): the
# tag's variant -> the backend it is built for (server = CPU, server-intel = SYCL).
IMAGE_VARIANTS = {None: "cpu", "cuda": "cuda", "cuda12": "cuda", "cuda13": "cuda", "vulkan": "vulkan", "rocm": "rocm",
                  "intel": "sycl", "musa": "musa"}

# Which device plugin's GPUs each backend can drive (Vulkan runs on any vendor's card).
BACKEND_VENDORS = {"cuda": ("nvidia.com/",), "rocm": ("amd.com/",), "sycl": ("gpu.intel.com/",), "musa": ("mthreads.com/",)}


def drives_elsewhere(backend: str | None, gpu_resource: str | None) -> bool:
    """Whether a backend's build drives another vendor's cards than this device plugin's (a CUDA build on amd.com/gpu);
    False where either is unknown or the build runs on any vendor's (Vulkan)."""
    vendors = BACKEND_VENDORS.get(backend or "")
    return bool(vendors and gpu_resource and not gpu_resource.startswith(vendors))

# What each known device plugin can do with one GPU. ROCm's k8s-device-plugin advertises each GPU
# exactly once (sharing is an open request upstream); Intel's plugin shares by -shared-dev-num;
# NVIDIA's by time-slicing replicas in its config.
DEVICE_PLUGIN_SHARING = {
    "amd.com/gpu": "exclusive",
    "gpu.intel.com/i915": "shared-dev-num",
    "gpu.intel.com/xe": "shared-dev-num",
    "nvidia.com/gpu": "time-slicing",
}

# Memory the backend holds on top of the weights, per GiB of weights, counted against the pod.
BACKEND_OVERHEAD: dict[str, float] = {
    # Vulkan allocates the iGPU's working set from system RAM and it is charged to the pod's
    # cgroup: the seed measured 7.54 GiB RSS for 5.2 GiB of weights (x1.45).
    "vulkan": 7.54 / 5.2 - 1,
    # HIP maps the weights into GTT, which amdgpu does not charge to the memcg; the node pays for
    # them all the same. Compute buffers on top: a 10% margin, not a measurement.
    "rocm": 0.10,
    # Weights are counted as node memory, as on every unified-memory node this program targets;
    # compute buffers on top: a 10% margin, not a measurement.
    "cuda": 0.10,
    # mmap'd weights are page cache charged to the pod; compute buffers on top: a 10% margin.
    "cpu": 0.10,
    # Intel's SYCL build on an iGPU: allocations come from system RAM like Vulkan's, but no
    # measurement exists here; a 10% margin, not a measurement.
    "sycl": 0.10,
}



def image_choices() -> str:
    """The llama.cpp builds to choose from, as a message says them."""
    named = {backend: variant for variant, backend in reversed(IMAGE_VARIANTS.items()) if backend in BACKENDS}
    words = [f"{variant} ({backend})" if variant not in (backend, None) else (variant or "CPU")
             for backend, variant in sorted(named.items(), key=lambda item: BACKENDS.index(item[0]))]
    return ", ".join(words[:-1]) + " or " + words[-1]
