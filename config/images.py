"""What an image's tag says about the backend it was built for (llama.cpp's published images,
ghcr.io/ggml-org/llama.cpp: `.github/workflows/docker.yml` publishes server, server-cuda,
server-cuda12/13, server-vulkan, server-rocm, server-intel (SYCL) and server-musa, each also
as <tag>-b<build>)."""

from __future__ import annotations

import re
from typing import Optional

_LLAMACPP = re.compile(r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?ggml-org/llama\.cpp:server(?:-(?!b[0-9]+(?:@|$))(?P<variant>[a-z]+[0-9]*))?(?:-b[0-9]+)?(?:@.*)?$")
_VARIANTS = {None: "cpu", "cuda": "cuda", "cuda12": "cuda", "cuda13": "cuda", "vulkan": "vulkan", "rocm": "rocm",
             "intel": "sycl", "musa": "musa"}


def backend_of_image(image: str) -> Optional[str]:
    """The backend a llama.cpp server image is built for, or None for any other image."""
    match = _LLAMACPP.fullmatch(image)
    if match is None:
        return None
    return _VARIANTS.get(match["variant"], match["variant"])
