"""The real shape (lab/contract/real_shape.py, real_shape_mmproj.py names) of each published GGUF repo the
project measures or runs as a real shape: the memory oracle, the router soak and the VRAM bench read this one
map (no third-party import, so a bench runs it without the venv)."""

REPO_SHAPES = {
    "Qwen/Qwen3-8B-GGUF": "qwen3-8b", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF": "llama-3.1-8b",
    "Qwen/Qwen3-14B-GGUF": "qwen3-14b", "Qwen/Qwen3-30B-A3B-GGUF": "qwen3-30b-a3b",
    "ggml-org/Qwen3-30B-A3B-GGUF": "qwen3-30b-a3b", "ggml-org/gemma-3-12b-it-GGUF": "gemma-3-12b",
    "ggml-org/gemma-3-4b-it-GGUF": "gemma-3-4b", "ggml-org/gemma-3-27b-it-GGUF": "gemma-3-27b",
    "ggml-org/Qwen3.6-35B-A3B-GGUF": "qwen3.6-35b-a3b", "Qwen/Qwen3-Embedding-0.6B-GGUF": "qwen3-embedding-0.6b",
    "Qwen/Qwen3-Embedding-8B-GGUF": "qwen3-embedding-8b", "bartowski/Llama-3.3-70B-Instruct-GGUF": "llama-3.3-70b",
    "Qwen/Qwen3-1.7B-GGUF": "qwen3-1.7b", "Qwen/Qwen3-32B-GGUF": "qwen3-32b",
    "bartowski/Llama-3.2-3B-Instruct-GGUF": "llama-3.2-3b", "bartowski/Mistral-Nemo-Instruct-2407-GGUF": "mistral-nemo-12b",
    "unsloth/Mistral-Small-3.2-24B-Instruct-2506-GGUF": "mistral-small-24b",
}
# Repos whose projector llama.cpp loads beside the model (the plan counts facts.mmproj).
REPO_PROJECTORS = {"ggml-org/gemma-3-12b-it-GGUF": "gemma-3-12b", "ggml-org/gemma-3-4b-it-GGUF": "gemma-3-4b",
                   "ggml-org/gemma-3-27b-it-GGUF": "gemma-3-27b"}
