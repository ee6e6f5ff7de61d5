"""What an image's tag says about the backend it was built for (llama.cpp's published images,
ghcr.io/ggml-org/llama.cpp: `.github/workflows/docker.yml` publishes server, server-cuda,
server-cuda12/13, server-vulkan, server-rocm, server-intel (SYCL) and server-musa, each also
as <tag>-b<build>)."""

from __future__ import annotations

import re
from typing import Optional

from .gpus import IMAGE_VARIANTS

_LLAMACPP = re.compile(r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?ggml-org/llama\.cpp:server(?:-(?!b[0-9]+(?:@|$))(?P<variant>[a-z]+[0-9]*))?(?:-b[0-9]+)?(?:@.*)?$")


def backend_of_image(image: str) -> Optional[str]:
    """The backend a llama.cpp server image is built for, or None for any other image."""
    match = _LLAMACPP.fullmatch(image)
    if match is None:
        return None
    return IMAGE_VARIANTS.get(match["variant"], match["variant"])


_BUILD = re.compile(r"-b(?P<build>[0-9]+)$")



def build_of_image(image: str) -> Optional[int]:
    """The llama.cpp build number an image's tag names (server-cuda-b10731 -> 10731), or None."""
    if backend_of_image(image) is None:
        return None
    match = _BUILD.search(image.split("@", 1)[0])  # the tag, without a digest
    return int(match["build"]) if match else None


def cpu_image(image: str) -> str:
    """The CPU build of a llama.cpp server image of the same build (server-cuda-b10731 -> server-b10731)."""
    repository = image.split("@", 1)[0].rsplit(":", 1)[0]
    build = build_of_image(image)
    return f"{repository}:server" + (f"-b{build}" if build is not None else "")
