"""What the written stacks run: the pinned llama.cpp images and the catalog models to choose from
(chat models ranked by parameters, embedding models best first), and a chat model's placement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from common.constants import LLAMACPP_IMAGE_BUILD
from config.catalog import lookup


# The llama.cpp build the shipped stacks pin (common/constants.py).
LLAMACPP_BUILD = f"b{LLAMACPP_IMAGE_BUILD}"
IMAGES = {
    "cpu": f"ghcr.io/ggml-org/llama.cpp:server-{LLAMACPP_BUILD}",
    "cuda": f"ghcr.io/ggml-org/llama.cpp:server-cuda-{LLAMACPP_BUILD}",
    "vulkan": f"ghcr.io/ggml-org/llama.cpp:server-vulkan-{LLAMACPP_BUILD}",
    "rocm": f"ghcr.io/ggml-org/llama.cpp:server-rocm-{LLAMACPP_BUILD}",
    "sycl": f"ghcr.io/ggml-org/llama.cpp:server-intel-{LLAMACPP_BUILD}",
}


@dataclass(frozen=True)
class Candidate:
    hf_repo: str  # org/Repo-GGUF:QUANT, a file known to exist in that repo
    weights: Optional[str] = None  # the GGUF's size where the planner's bits table cannot know it
    weights_why: str = ""
    ctx_size: int = 4096  # embedding servers only
    ubatch_size: Optional[int] = None  # embedding servers with mean/cls pooling: the whole input

    @property
    def repo(self) -> str:
        return self.hf_repo.split(":", 1)[0]

    @property
    def short(self) -> str:
        return self.repo.split("/", 1)[1].removesuffix("-GGUF").removesuffix("-gguf")


# Chat models: catalog entries whose GGUF repo and quant are published (the newest family of each
# size; Q4_K_M where the repo has it, Q8_0 where the repo ships only that). Ranked by parameters.
CHAT_CANDIDATES = (
    Candidate("ggml-org/gpt-oss-120b-GGUF:MXFP4", "59.1Gi",
              "gpt-oss-120b-mxfp4 (3 shards) is 59.02 GiB; MXFP4 is not in the planner's bits-per-weight table"),
    Candidate("bartowski/Llama-3.3-70B-Instruct-GGUF:Q4_K_M", "39.6Gi", "Llama-3.3-70B-Instruct-Q4_K_M.gguf, 42.5 GB"),
    Candidate("ggml-org/Qwen3.6-35B-A3B-GGUF:Q4_K_M", "19.8Gi", "Qwen3.6-35B-A3B-Q4_K_M.gguf, as the shipped stacks"),
    Candidate("Qwen/Qwen3-32B-GGUF:Q4_K_M"),
    Candidate("ggml-org/Qwen3-30B-A3B-GGUF:Q4_K_M", "17.3Gi", "Qwen3-30B-A3B-Q4_K_M.gguf, 18.6 GB"),
    Candidate("ggml-org/gemma-3-27b-it-GGUF:Q4_K_M"),
    Candidate("unsloth/Mistral-Small-3.2-24B-Instruct-2506-GGUF:Q4_K_M"),
    Candidate("ggml-org/gpt-oss-20b-GGUF:MXFP4", "11.3Gi",
              "gpt-oss-20b-mxfp4.gguf is 12.1 GB; MXFP4 is not in the planner's bits-per-weight table"),
    Candidate("Qwen/Qwen3-14B-GGUF:Q4_K_M"),
    Candidate("ggml-org/gemma-3-12b-it-GGUF:Q4_K_M"),
    Candidate("Qwen/Qwen3-8B-GGUF:Q4_K_M"),
    Candidate("Qwen/Qwen3-4B-GGUF:Q4_K_M"),
    Candidate("ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"),
    Candidate("Qwen/Qwen3-1.7B-GGUF:Q8_0"),
    Candidate("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"),
    Candidate("ggml-org/gemma-3-1b-it-GGUF:Q4_K_M"),
    Candidate("Qwen/Qwen3-0.6B-GGUF:Q8_0"),
)
# Embedding models, best first (retrieval quality): Qwen3-Embedding tops MTEB at every size.
EMBED_CANDIDATES = (
    Candidate("Qwen/Qwen3-Embedding-8B-GGUF:Q6_K"),
    Candidate("Qwen/Qwen3-Embedding-4B-GGUF:Q6_K"),
    Candidate("Qwen/Qwen3-Embedding-0.6B-GGUF:Q8_0", "0.6Gi", "Qwen3-Embedding-0.6B-Q8_0.gguf, as the shipped stacks"),
    # Mean pooling: an input must fit one micro-batch, so the micro-batch is the whole context.
    Candidate("nomic-ai/nomic-embed-text-v1.5-GGUF:Q8_0", ctx_size=2048, ubatch_size=2048),
)


def params_b(candidate: Candidate) -> float:
    facts = lookup(candidate.repo)
    assert facts is not None, f"{candidate.repo} is not in config/catalog.yaml"
    return facts.params_b


@dataclass(frozen=True)
class ChatSetup:
    candidate: Candidate
    ctx_size: int
    gpu_layers: int
    cpu_moe_layers: Optional[int] = None
    cache_type: str = "f16"  # K and V; q8_0 only where an f16 cache does not fit (choice.py)
