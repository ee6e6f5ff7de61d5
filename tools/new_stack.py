"""Write a working stack file (Pulumi.<NAME>.yaml) for your hardware, every value commented.

    python tools/new_stack.py NAME --gpu {none,nvidia,intel-igpu,amd-apu} [--vram GiB] --ram GiB
        [--nodes N] [--cpus N] [--arch amd64|arm64] [--image IMAGE]
        [--ram-bandwidth GB/s] [--vram-bandwidth GB/s] [--render-gids 44,992]
        [--cni flannel|cilium|calico] [--ingress traefik-k3s|nginx|none]
        [--storage local-path|longhorn|ceph-filesystem|nfs-client] [--issuer NAME|none]
        [--host LAN-HOST] [--monitoring NAMESPACE|none] [--namespace ai]
        [--kubernetes-version 1.33] [--out PATH] [--force]

The chat and embedding models are picked from the catalog (planning/catalog.yaml) with the
program's own planner: for each candidate a stack is built, validated (plane.parse_stack) and
planned (plane.plan_capacity); only plans without problems or warnings are kept. The chat model is
the largest (most parameters) that fits with a usable context (8k tokens or more) and is predicted
to decode fast enough at half context (decode_floor: 20 tok/s on a discrete card, a reading pace of
5 tok/s elsewhere); the embedding model is the best that
fits beside it in an eighth of the node. The defaults are a single k3s node: Flannel with k3s'
NetworkPolicy controller (kube-router), k3s' Traefik in kube-system, local-path storage, no
cert-manager issuer, no Ingress, no gateway, no monitoring objects.

The stack written is checked the same way before it is written (read back, validated and planned).
Bad input: one line on stderr (the flag, what is wrong, the fix), exit status 2, nothing written.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from common.constants import PINNED_IMAGE, PROJECT  # noqa: E402
from common.errors import CapacityError, ConfigError, one_line  # noqa: E402
from common.quantity import GIB, parse_quantity  # noqa: E402
from config.checks import private_suffix  # noqa: E402
from config.images import backend_of_image  # noqa: E402
from config.values import _DNS_LABEL, _DNS_NAME, _HOSTNAME  # noqa: E402
from planning.catalog import lookup  # noqa: E402

EXIT_BAD_INPUT = 2

# --- what the written stacks run ------------------------------------------------------------------

# The llama.cpp build the shipped stacks pin (the contract tests run b10729, the nearest PyPI sdist).
LLAMACPP_BUILD = "b10731"
IMAGES = {
    "cpu": f"ghcr.io/ggml-org/llama.cpp:server-{LLAMACPP_BUILD}",
    "cuda": f"ghcr.io/ggml-org/llama.cpp:server-cuda-{LLAMACPP_BUILD}",
    "vulkan": f"ghcr.io/ggml-org/llama.cpp:server-vulkan-{LLAMACPP_BUILD}",
}
# The shipped stacks' placeholder for a `secure:` value (base64 of "placeholder: set with pulumi
# config"): the Pulumi CLI replaces it on `pulumi config set --secret`; the offline render reads
# every secure value as a placeholder.
SECRET_PLACEHOLDER = "v1:cGxhY2Vob2xkZXI6IHNldCB3aXRoIHB1bHVtaSBjb25maWc="

MIN_CTX = 8192  # a usable context: a chat with some history, a pasted page
CTX_CHOICES = (32768, 16384, MIN_CTX)  # tried longest first, for the chosen model
MIN_DECODE_TOK_S = 5.0  # a reading pace, predicted at half the context
# On a discrete card a chat at reading pace is not what its owner bought it for: 20 tok/s (predicted at
# half the context) passes over a huge model spilled into RAM (gpt-oss-120b at ~10 tok/s on a 24 GiB card)
# for one the card holds (Qwen3.6-35B-A3B at ~100).
MIN_DECODE_TOK_S_GPU = 20.0


def decode_floor(hw: "Hardware") -> float:
    return MIN_DECODE_TOK_S_GPU if hw.discrete else MIN_DECODE_TOK_S
EMBED_SHARE = 1 / 8  # the embedding server's share of what a node offers


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
    assert facts is not None, f"{candidate.repo} is not in planning/catalog.yaml"
    return facts.params_b


# --- the hardware ---------------------------------------------------------------------------------

# Typical cards by VRAM, for the decode prediction when --vram-bandwidth is not given (GB/s).
NVIDIA_CARDS = ((4, 128, "a GTX 1650 (128-bit GDDR5 at 8 Gbps)"), (6, 336, "an RTX 2060 (192-bit GDDR6 at 14 Gbps)"),
                (8, 272, "an RTX 4060 (128-bit GDDR6 at 17 Gbps)"), (12, 360, "an RTX 3060 12GB (192-bit GDDR6 at 15 Gbps)"),
                (16, 448, "an RTX 5060 Ti 16GB (128-bit GDDR7 at 28 Gbps)"), (24, 936, "an RTX 3090 (384-bit GDDR6X at 19.5 Gbps)"),
                (32, 1792, "an RTX 5090 (512-bit GDDR7 at 28 Gbps)"))
KINDS = {
    # gpu: (pool key, backend, gpu_resource, decode_profile, what it is)
    "none": ("cpu", "cpu", None, None, "CPU only"),
    "nvidia": ("nvidia", "cuda", "nvidia.com/gpu", None, "NVIDIA GPU"),
    "intel-igpu": ("igpu", "vulkan", "gpu.intel.com/i915", "intel-igpu", "Intel iGPU"),
    "amd-apu": ("apu", "vulkan", "amd.com/gpu", "amd-apu", "AMD APU"),
}


@dataclass(frozen=True)
class Hardware:
    gpu: str
    ram_gib: float
    vram_gib: Optional[float]
    nodes: int
    cpus: int
    arch: str
    ram_bandwidth: float
    ram_bandwidth_why: str
    vram_bandwidth: Optional[float]
    vram_bandwidth_why: str
    render_gids: tuple[int, ...]
    image: Optional[str]  # --image: overrides the llama.cpp image (required on arm64)

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


# --- a stack as commented values --------------------------------------------------------------------


@dataclass
class V:
    """A value and why it is what it is; a mapping of V is written as a block, anything else inline."""

    value: Any
    why: str


def plain(value: Any) -> Any:
    """The stack values without their reasons: what parse_stack reads."""
    if isinstance(value, V):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("\n...").strip()


def _block(tree: dict[str, V], indent: int) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for key, item in tree.items():
        for line in textwrap.wrap(item.why, width=max(40, 100 - indent - 2)):
            lines.append(f"{pad}# {line}")
        value = item.value
        if isinstance(value, dict) and value and all(isinstance(v, V) for v in value.values()):
            lines.append(f"{pad}{key}:")
            lines += _block(value, indent + 2)
        else:
            lines.append(f"{pad}{key}: {_scalar(plain(value))}")
    return lines


def stack_text(header: list[str], config: dict[str, V]) -> str:
    lines = [f"# {line}" if line else "#" for line in header] + ["config:"] + _block(config, 2)
    return "\n".join(lines) + "\n"


# --- building a candidate stack -------------------------------------------------------------------


@dataclass(frozen=True)
class ChatSetup:
    candidate: Candidate
    ctx_size: int
    gpu_layers: int
    cpu_moe_layers: Optional[int] = None


def _gib(value: float) -> str:
    """A memory quantity: whole GiB where it is whole."""
    return f"{int(value)}Gi" if float(value).is_integer() else f"{value:g}Gi"


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def threads(hw: Hardware) -> tuple[int, int]:
    """(chat threads, embedding threads): one per core, the embedding server taking one or two."""
    embed = 2 if hw.cpus >= 6 else 1
    return max(1, min(16, hw.cpus - embed)), embed


def cache_ram_mib(hw: Hardware) -> int:
    offers = hw.offers_gib()
    return 4096 if offers >= 48 else 1024 if offers >= 12 else 256


def node_pool(hw: Hardware) -> dict[str, V]:
    _, backend, resource, profile, what = KINDS[hw.gpu]
    pool: dict[str, V] = {}
    if resource is not None:
        plugin = {"nvidia.com/gpu": "the NVIDIA device plugin (k3s: install it or the GPU Operator)",
                  "gpu.intel.com/i915": "Intel's GPU device plugin (Xe-driver GPUs advertise gpu.intel.com/xe)",
                  "amd.com/gpu": "AMD's k8s-device-plugin"}[resource]
        pool["gpu_resource"] = V(resource, f"The GPU as {plugin} advertises it; it alone places the chat server.")
        pool["gpu_shares"] = V(1, "Only the chat server uses the GPU (the embedding server runs on the CPU cores), "
                               "so the device plugin needs no sharing.")
    arch = hw.arch
    pool["node_labels"] = V({"kubernetes.io/arch": arch},
                            f"Every kubelet sets this label: the pods land only on {arch} nodes, which the image is "
                            f"built for ({'the pinned llama.cpp images are published for linux/amd64' if arch == 'amd64' else '--image'}).")
    pool["nodes"] = V(hw.nodes, "Identical nodes; the planner places the servers on them by memory." if hw.nodes > 1
                      else "One node.")
    pool["memory"] = V(_gib(hw.ram_gib), "--ram: physical memory of one node" + (
        "; the GPU uses this same memory." if not hw.discrete and hw.gpu != "none" else "."))
    pool["allocatable"] = V(_gib(hw.allocatable_gib()),
                            "An estimate of what the kubelet offers pods (firmware, kernel and k3s' eviction "
                            "threshold take the rest): put `kubectl describe node` Allocatable memory here.")
    pool["reserved"] = V(_gib(hw.reserved_gib()),
                         "Held by pods this program does not manage: k3s' CoreDNS, Traefik, metrics-server, "
                         "local-path provisioner and the OS beside them.")
    pool["memory_bandwidth_gbs"] = V(_number(hw.ram_bandwidth), hw.ram_bandwidth_why)
    if hw.discrete:
        pool["vram"] = V(_gib(hw.vram_gib), "--vram: memory of the card; offloaded layers and their KV cache are "
                         "planned here, the rest in system RAM.")
        pool["vram_bandwidth_gbs"] = V(_number(hw.vram_bandwidth), hw.vram_bandwidth_why)
        pool["runtime_class"] = V("nvidia", "k3s ships the nvidia RuntimeClass (once the NVIDIA container toolkit is "
                                  "on the node); containerd's default runtime stays runc.")
    if profile is not None:
        pool["decode_profile"] = V(profile, f"How {what} turns bandwidth into tokens, for the decode prediction "
                                   "(engines/llamacpp_speed.py); Vulkan has no default profile.")
    pool["backend"] = V(backend, {"cpu": "No GPU: llama.cpp's CPU build.",
                                  "cuda": "llama.cpp's CUDA build for the chat server.",
                                  "vulkan": f"llama.cpp's Vulkan build: it drives the {what} through /dev/dri."}[backend])
    if hw.render_gids:
        pool["supplemental_groups"] = V(list(hw.render_gids),
                                        "GIDs of the node's video and render groups (`getent group video render`), "
                                        "for non-root access to /dev/dri; check yours.")
    return pool


def image_for(hw: Hardware, backend: str) -> str:
    return hw.image or IMAGES[backend]


def chat_server(hw: Hardware, setup: ChatSetup, cluster: Cluster) -> dict[str, V]:
    candidate = setup.candidate
    facts = lookup(candidate.repo)
    chat_threads, _ = threads(hw)
    server: dict[str, V] = {
        "role": V("chat", "The chat completions server (llama.cpp's llama-server, one model)."),
        "name": V("llama-chat", "Its Service and Deployment name."),
        "hf_repo": V(candidate.hf_repo, "The chosen chat model (see the header): downloaded once into the model "
                     "cache on first start."),
        "image": V(image_for(hw, hw.backend), "llama.cpp's server image for the pool's backend, pinned to the build "
                   "the rendered flags are tested against." if hw.image is None else "--image: your llama.cpp server "
                   "build for this architecture."),
        "node_pool": V(hw.pool, "The node pool above."),
    }
    if candidate.weights:
        server["weights"] = V(candidate.weights, candidate.weights_why)
    if hw.gpu == "none":
        server["gpu_layers"] = V(0, "No GPU: every layer on the CPU.")
    elif setup.gpu_layers >= facts.layers + 1:
        server["gpu_layers"] = V(setup.gpu_layers, "Every layer on the GPU.")
    else:
        server["gpu_layers"] = V(setup.gpu_layers, f"The output layer and {setup.gpu_layers - 1} of {facts.layers} "
                                 "blocks on the GPU, as many as fit its memory; the rest run from system RAM.")
    if setup.cpu_moe_layers:
        server["cpu_moe_layers"] = V(setup.cpu_moe_layers, f"The experts of the first {setup.cpu_moe_layers} of "
                                     f"{facts.layers} blocks stay in system RAM (--n-cpu-moe), the fewest that leave "
                                     "the card llama.cpp's 1 GiB margin; attention and the KV cache stay on the GPU.")
    server["threads"] = V(chat_threads, "One per core, less the embedding server's.")
    server["ctx_size"] = V(setup.ctx_size, "The longest context that fits beside the model (tried 32768, 16384, "
                           "8192), shared by the slots.")
    if hw.discrete:
        server["cache_type_k"] = V("q8_0", "q8_0 halves the KV cache on the card.")
        server["cache_type_v"] = V("q8_0", "As cache_type_k (the CUDA build turns flash attention on for it).")
    server["parallel"] = V(2, "Two requests at once, sharing one KV pool of ctx_size (--kv-unified).")
    server["cache_ram_mib"] = V(cache_ram_mib(hw), "Host-RAM prompt cache, sized to the node (llama.cpp's default "
                                "8 GiB would be planned in full).")
    if facts.recurrent_state_mib or facts.sliding_window:
        kind = ("a full copy of the recurrent state" if facts.recurrent_state_mib
                else "the sliding-window layers' KV (which the plan does not count)")
        server["ctx_checkpoints"] = V(4, f"llama.cpp keeps 32 context checkpoints per slot by default, each {kind}.")
    if cluster.host:
        server["cors_origins"] = V(f"https://{cluster.host}", "The one web origin (the exposed host's own WebUI) whose "
                                   "pages may read the API's answers.")
    else:
        server["cors_origins"] = V("localhost", "Only pages served from localhost may read the API's answers "
                                   "(kubectl port-forward).")
    server["resources"] = V({
        "cpu_request": V(str(max(1, chat_threads // 2)), "Half the threads: what decoding keeps busy."),
        "cpu_limit": V(str(chat_threads), "The threads: more would be throttled."),
    }, "CPU only: memory request and limit are derived from the plan (the estimate plus 10%).")
    if cluster.host:
        server["exposure"] = V({
            "host": V(cluster.host, "--host: the LAN name clients use; point it at the ingress controller."),
            "tls_secret": V("llama-chat-tls", f"cert-manager writes the certificate from {cluster.issuer} here."),
        }, "An Ingress on the LAN (private source ranges only, no public DNS record).")
        server["api_key"] = V({
            "secret_name": V("llama-chat-api-key", "The Secret the server reads its key file from."),
            "from_config": V("chat_api_key", "The Pulumi secret that becomes that Secret: set it before `pulumi up`."),
        }, "Reachable from outside the namespace, so llama.cpp's API takes a key.")
    return server


def embed_server(hw: Hardware, candidate: Candidate) -> dict[str, V]:
    _, embed_threads = threads(hw)
    facts = lookup(candidate.repo)
    server: dict[str, V] = {
        "role": V("embedding", "Embeddings for RAG and search, in-cluster only."),
        "name": V("llama-embed", "Its Service and Deployment name."),
        "hf_repo": V(candidate.hf_repo, "The chosen embedding model (see the header)."),
        "image": V(image_for(hw, "cpu"), "llama.cpp's CPU build: the GPU stays the chat server's." if hw.image is None
                   else "--image: your llama.cpp server build for this architecture."),
        "node_pool": V(hw.pool, "The node pool above."),
    }
    if hw.backend != "cpu":
        server["backend"] = V("cpu", "The CPU build on a GPU pool: needs no GPU share.")
    if candidate.weights:
        server["weights"] = V(candidate.weights, candidate.weights_why)
    server["gpu_layers"] = V(0, "Runs on the CPU cores, requests no GPU.")
    server["threads"] = V(embed_threads, "One or two cores: embedding requests are short and bursty.")
    server["ctx_size"] = V(candidate.ctx_size, "The longest input (tokens) one embedding request may send.")
    if candidate.ubatch_size:
        server["ubatch_size"] = V(candidate.ubatch_size, f"{facts.pooling} pooling needs the whole input in one "
                                  "micro-batch, or longer inputs get HTTP 500.")
    server["webui"] = V(False, "No chat WebUI on an embedding server.")
    server["cache_ram_mib"] = V(0, "Embeddings reuse no prompt prefix: a prompt cache would be dead weight.")
    server["resources"] = V({
        "cpu_request": V("250m", "Idle most of the time."),
        "cpu_limit": V(str(embed_threads), "The threads."),
    }, "CPU only: memory request and limit are derived from the plan.")
    return server


def cluster_values(cluster: Cluster) -> tuple[dict[str, V], dict[str, V]]:
    """(inference-plane:cluster, inference-plane:namespace)."""
    values: dict[str, V] = {
        "kubernetes_version": V(cluster.kubernetes_version, "Every rendered manifest is checked against this "
                                "version's schemas: set your cluster's (kubectl version)."),
    }
    if cluster.cni == "cilium":
        values["cni"] = V("cilium", "--cni cilium: CiliumNetworkPolicy (the model hub's host names are expressible).")
    else:
        what = ("Flannel with k3s' embedded NetworkPolicy controller (kube-router)" if cluster.cni == "flannel"
                else "Calico")
        values["cni"] = V("networkpolicy", f"{what}: plain NetworkPolicy.")
    if cluster.ingress == "none":
        values["ingress"] = V(None, "--ingress none: the cluster has no ingress controller; nothing is exposed.")
    else:
        kind, class_name, namespace, labels, why = INGRESS[cluster.ingress]
        values["ingress"] = V({
            "kind": V(kind, "Which controller: the program sets its streaming annotations."),
            "class_name": V(class_name, "The IngressClass."),
            "namespace": V(namespace, "Where its pods run: the network policy admits them."),
            "pod_labels": V(labels, "Its pods' labels."),
        }, why + ".")
    if cluster.issuer:
        values["cert_manager_issuer"] = V(cluster.issuer, "--issuer: the cert-manager ClusterIssuer for the "
                                          "exposed endpoint's certificate.")
        private = private_suffix(cluster.host) if cluster.host else None
        if private is not None:
            values["issuer_solver"] = V("ca", f"No public zone proves a *{private} name (ACME cannot): {cluster.issuer} must "
                                        "be a CA or self-signed ClusterIssuer whose CA your clients trust.")
        elif cluster.host:
            values["issuer_solver"] = V("dns01", f"ACME proves {cluster.host} through its public DNS zone (the record "
                                        "itself is never published); use ca if your issuer is a private CA.")
    if cluster.monitoring:
        values["monitoring"] = V({"namespace": V(cluster.monitoring, "--monitoring: where the scrapers run.")},
                                 "The pods that scrape /metrics, admitted by the network policy.")
    else:
        values["monitoring"] = V(None, "No monitoring stack (k3s ships none): no scrape or alert objects.")
    storage_class, _, daemons, _ = STORAGE[cluster.storage]
    if daemons:
        values["storage"] = V({"namespace": V(daemons, "The storage daemons' namespace.")},
                              f"{storage_class} volumes talk to these daemons.")
    else:
        values["storage"] = V(None, "No storage daemons to talk to: the volume is the node's own disk or NFS.")
    namespace: dict[str, V] = {"name": V(cluster.namespace, "The namespace the servers live in (the stack owns it: "
                                         "Pod Security restricted, default-deny network policy).")}
    if cluster.cni == "cilium":
        namespace["model_hub_egress"] = V({"mode": V("fqdn", "Only Hugging Face's hosts, by name (Cilium toFQDNs).")},
                                          "Egress for the weights download.")
    else:
        reason = ("plain NetworkPolicy (k3s' kube-router) cannot match huggingface.co by name" if cluster.cni == "flannel"
                  else "Calico without its enterprise DNS policies cannot match huggingface.co by name")
        namespace["model_hub_egress"] = V({
            "mode": V("world", "Plain NetworkPolicy matches addresses, not names: any public address on 443."),
            "reason": V(reason, "Recorded on the policy object."),
        }, "Egress for the weights download.")
    return values, namespace


def build_config(hw: Hardware, cluster: Cluster, chat: ChatSetup, embed: Candidate,
                 cache_size: Optional[int] = None) -> dict[str, V]:
    """Every top-level key of the stack file (full keys), with reasons."""
    cluster_v, namespace_v = cluster_values(cluster)
    storage_class, access_mode, _, storage_why = STORAGE[cluster.storage]
    config: dict[str, V] = {
        "kubernetes:enableSecretMutable": V("true", "The Kubernetes provider updates a Secret in place when its data "
                                            "changes: a rotated key never leaves its readers without one."),
        f"{PROJECT}:cluster": V(cluster_v, "The cluster."),
        f"{PROJECT}:namespace": V(namespace_v, "The namespace."),
        f"{PROJECT}:node_pools": V({hw.pool: V(node_pool(hw), f"{KINDS[hw.gpu][4]} node(s), from the flags.")},
                                   "Where the model servers run."),
        f"{PROJECT}:model_cache": V({
            "claim_name": V("llama-models", "The PersistentVolumeClaim both servers mount."),
            "storage_class": V(storage_class, f"--storage: {storage_why}."),
            "access_mode": V(access_mode, "ReadWriteOnce: the servers share the node the volume is on."
                             if access_mode == "ReadWriteOnce" else "Both servers, on any node, mount the same weights."),
            "size": V(f"{cache_size or 1}Gi", "Both models' weights and a quarter more for a later swap."),
        }, "The weights volume: downloaded once, reused on every restart."),
        f"{PROJECT}:models": V({
            "chat": V(chat_server(hw, chat, cluster), "The chat model."),
            "embed": V(embed_server(hw, embed), "The embedding model."),
        }, "The model servers."),
    }
    if cluster.monitoring:
        config[f"{PROJECT}:observability"] = V({}, "--monitoring: VictoriaMetrics operator scrapes and alert rules "
                                               "(needs its CRDs in the cluster).")
    if cluster.host:
        config[f"{PROJECT}:chat_api_key"] = V(
            {"secure": V(SECRET_PLACEHOLDER, "Not a key: the shipped stacks' placeholder, replaced by the command above.")},
            "The chat server's API key, a Pulumi secret. Set it with `pulumi config set --secret chat_api_key <key>` "
            "before `pulumi up`.")
    return config


def stack_values(config: dict[str, V]) -> dict[str, Any]:
    """The program's config values (prefix stripped, secrets left out), as tests/conftest reads them."""
    prefix = f"{PROJECT}:"
    values = {k[len(prefix):]: plain(v) for k, v in config.items() if k.startswith(prefix)}
    return {k: v for k, v in values.items() if not (isinstance(v, dict) and "secure" in v)}


# --- planning -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    setup: Optional[ChatSetup]
    plan: Any = None
    problem: str = ""  # why it was not taken
    tok_s: Optional[float] = None


def plan_of(hw: Hardware, cluster: Cluster, chat: ChatSetup, embed: Candidate) -> tuple[Any, str]:
    """(the plan, "") or (None, why it does not fit)."""
    from plane import parse_stack, plan_capacity

    config = build_config(hw, cluster, chat, embed, cache_size=4096)
    try:
        plan = plan_capacity(parse_stack(stack_values(config)))
    except (ConfigError, CapacityError) as error:
        return None, str(error)
    if plan.warnings:
        return None, plan.warnings[0]
    return plan, ""


def placements(hw: Hardware, candidate: Candidate) -> Iterator[tuple[int, Optional[int]]]:
    """(gpu_layers, cpu_moe_layers), fastest first."""
    facts = lookup(candidate.repo)
    if hw.gpu == "none":
        yield 0, None
        return
    yield 99, None
    if not hw.discrete:
        return
    if facts.expert_params_b:
        for n in range(1, facts.layers + 1):
            yield 99, n
    else:
        for ngl in range(facts.layers, 0, -1):
            yield ngl, None


def half_tok_s(plan: Any) -> Optional[float]:
    predicted = plan.servers["chat"].decode_predicted_tok_s
    return predicted["half"] if predicted else None


def try_chat(hw: Hardware, cluster: Cluster, candidate: Candidate, embed: Candidate) -> Outcome:
    """The longest context at which this model fits and decodes at a reading pace, at its fastest
    placement; else the fastest fitting setup (marked slow by its tok_s), or why none fits."""
    last_problem = ""  # at the shortest context: the least this model needs
    slowest_ok: Optional[Outcome] = None
    for ctx in CTX_CHOICES:
        for gpu_layers, cpu_moe in placements(hw, candidate):
            setup = ChatSetup(candidate, ctx, gpu_layers, cpu_moe)
            plan, problem = plan_of(hw, cluster, setup, embed)
            if plan is None:
                last_problem = problem
                continue
            outcome = Outcome(setup, plan, tok_s=half_tok_s(plan))
            if outcome.tok_s is None or outcome.tok_s >= decode_floor(hw):
                return outcome
            if slowest_ok is None or outcome.tok_s > (slowest_ok.tok_s or 0):
                slowest_ok = outcome
            break  # the fastest placement at this context is too slow: try a shorter context
    return slowest_ok or Outcome(None, problem=last_problem)


@dataclass
class Choice:
    chat: ChatSetup
    embed: Candidate
    plan: Any
    slow: bool
    passed_over: list[str] = field(default_factory=list)


class NoFit(Exception):
    pass


def choose(hw: Hardware, cluster: Cluster) -> Choice:
    """The largest chat model that fits and decodes at a reading pace (else the fastest that fits),
    then the best embedding model that fits beside it in its share of the node."""
    smallest_embed = EMBED_CANDIDATES[-1]
    passed_over: list[str] = []
    fallback: Optional[Outcome] = None
    chosen: Optional[Outcome] = None
    for candidate in sorted(CHAT_CANDIDATES, key=params_b, reverse=True):
        outcome = try_chat(hw, cluster, candidate, smallest_embed)
        if outcome.setup is None:
            passed_over.append(f"{candidate.short} does not fit ({_short_problem(outcome.problem)})")
            continue
        if outcome.tok_s is not None and outcome.tok_s < decode_floor(hw):
            passed_over.append(f"{candidate.short} fits but is predicted at {outcome.tok_s:.1f} tok/s")
            if fallback is None or (outcome.tok_s or 0) > (fallback.tok_s or 0):
                fallback = outcome
            continue
        chosen = outcome
        break
    slow = False
    if chosen is None:
        if fallback is None:
            raise NoFit(passed_over[-1] if passed_over else "no candidates")
        chosen, slow = fallback, True
    budget = hw.offers_gib() * EMBED_SHARE
    for embed in EMBED_CANDIDATES:
        plan, _ = plan_of(hw, cluster, chosen.setup, embed)
        if plan is not None and (plan.servers["embed"].need_gib <= budget or embed == smallest_embed):
            return Choice(chosen.setup, embed, plan, slow, passed_over)
    raise NoFit("the chat model fits with no embedding model beside it")  # smallest_embed was planned above


def _short_problem(problem: str) -> str:
    """A planner problem without its heading, path and remedy: what does not fit, with the numbers."""
    text = problem.split(": ", 1)[-1]  # "capacity plan does not fit: "
    text = text.split(": ", 1)[-1] if re.match(r"^[a-z_]+\.[A-Za-z0-9_.\-]+: ", text) else text  # the config path
    text = text.split("; ", 1)[0]
    return text[:200] + ("..." if len(text) > 200 else "")


# --- the command ----------------------------------------------------------------------------------


class BadInput(Exception):
    """One line: the flag, what is wrong, the fix."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors, one line too
        raise BadInput(f"{message}; see --help")


def parser() -> Parser:
    p = Parser(prog="python tools/new_stack.py", description=__doc__.splitlines()[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", help="stack name: writes Pulumi.NAME.yaml")
    p.add_argument("--gpu", required=True, choices=sorted(KINDS), help="the node's GPU, if any")
    p.add_argument("--vram", type=float, metavar="GiB", help="memory of the NVIDIA card (required with --gpu nvidia)")
    p.add_argument("--ram", type=float, required=True, metavar="GiB", help="physical memory of one node")
    p.add_argument("--nodes", type=int, default=1, help="identical nodes (default 1)")
    p.add_argument("--cpus", type=int, help="CPU cores of one node (default 8; 4 on arm64)")
    p.add_argument("--arch", choices=("amd64", "arm64"), default="amd64", help="the nodes' CPU architecture")
    p.add_argument("--image", help="a pinned llama.cpp server image to run instead of the project's (required on arm64)")
    p.add_argument("--ram-bandwidth", type=float, metavar="GB/s", help="sustained memory bandwidth of one node")
    p.add_argument("--vram-bandwidth", type=float, metavar="GB/s", help="the NVIDIA card's memory bandwidth")
    p.add_argument("--render-gids", metavar="GID,GID", help="the node's video and render GIDs (default for amd-apu: 44,992)")
    p.add_argument("--cni", choices=("flannel", "cilium", "calico"), default="flannel")
    p.add_argument("--ingress", choices=("traefik-k3s", "nginx", "none"), default="traefik-k3s")
    p.add_argument("--storage", choices=sorted(STORAGE), default="local-path")
    p.add_argument("--issuer", default="none", metavar="NAME|none", help="cert-manager ClusterIssuer (needed with --host)")
    p.add_argument("--host", help="expose the chat endpoint on the LAN at this host name (an Ingress, TLS, an API key)")
    p.add_argument("--monitoring", default="none", metavar="NAMESPACE|none",
                   help="namespace of a VictoriaMetrics scraper: adds scrapes and alert rules")
    p.add_argument("--namespace", default="ai", help="the namespace the servers live in (default ai)")
    p.add_argument("--kubernetes-version", default="1.33", metavar="1.NN")
    p.add_argument("--out", type=Path, help="where to write (default: Pulumi.NAME.yaml in the project)")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    return p


ARM64_IMAGES = ("the project pins ghcr.io/ggml-org/llama.cpp:server-b10731, and this tool cannot confirm that tag has "
                "a linux/arm64 image (upstream stopped building arm64 images, ggml-org/llama.cpp#11888, still missing "
                "in #19177, re-enabled by #20929); if `docker manifest inspect ghcr.io/ggml-org/llama.cpp:server-b10731` "
                "lists linux/arm64, pass that, else your own arm64 llama-server build, as --image (decode predictions "
                "use the CPU profile measured on x86)")


def hardware(args: argparse.Namespace) -> Hardware:
    if not 0 < args.ram <= 4096:
        raise BadInput(f"--ram {args.ram:g}: not a node's memory in GiB; give e.g. --ram 64")
    if args.gpu == "nvidia":
        if args.vram is None:
            raise BadInput("--vram: required with --gpu nvidia; give the card's memory in GiB, e.g. --vram 12")
        if not 1 <= args.vram <= 192:
            raise BadInput(f"--vram {args.vram:g}: not a card's memory in GiB; give e.g. --vram 12")
    elif args.vram is not None:
        raise BadInput(f"--vram: only for a discrete NVIDIA card; {args.gpu} uses the node's memory (--ram): drop --vram")
    if args.vram_bandwidth is not None and args.gpu != "nvidia":
        raise BadInput("--vram-bandwidth: only for --gpu nvidia; drop it")
    if not 1 <= args.nodes <= 1000:
        raise BadInput(f"--nodes {args.nodes}: give 1 to 1000")
    cpus = args.cpus if args.cpus is not None else (4 if args.arch == "arm64" else 8)
    if not 1 <= cpus <= 1024:
        raise BadInput(f"--cpus {cpus}: give the node's cores, 1 to 1024")
    for flag, value in (("--ram-bandwidth", args.ram_bandwidth), ("--vram-bandwidth", args.vram_bandwidth)):
        if value is not None and not 1 <= value <= 20_000:
            raise BadInput(f"{flag} {value:g}: give GB/s, e.g. 50")
    if args.arch == "arm64" and args.gpu != "none":
        raise BadInput(f"--arch arm64 --gpu {args.gpu}: llama.cpp's CUDA and Vulkan images are published for "
                       "linux/amd64 only and the project pins no arm64 GPU build; use --gpu none (CPU) on arm64")
    if args.arch == "arm64" and args.image is None:
        raise BadInput(f"--arch arm64: {ARM64_IMAGES}")
    if args.image is not None:
        if not PINNED_IMAGE.fullmatch(args.image):
            raise BadInput(f"--image {args.image!r}: not a pinned image; give registry/name:<build tag> or @sha256:<digest>")
        named = backend_of_image(args.image)
        if named is not None and named != KINDS[args.gpu][1]:
            raise BadInput(f"--image {args.image}: llama.cpp's {named} build, but --gpu {args.gpu} runs the "
                           f"{KINDS[args.gpu][1]} build; give that image")
        if args.gpu != "none":
            raise BadInput("--image: only with --gpu none (one CPU image runs both servers); drop it")
    gids: tuple[int, ...] = ()
    if args.render_gids is not None:
        if args.gpu not in ("intel-igpu", "amd-apu"):
            raise BadInput("--render-gids: only for an iGPU or APU (/dev/dri access); drop it")
        try:
            gids = tuple(int(g) for g in args.render_gids.split(",") if g.strip())
        except ValueError:
            raise BadInput(f"--render-gids {args.render_gids!r}: give numeric GIDs, e.g. 44,992") from None
        if not gids or any(g < 0 for g in gids):
            raise BadInput(f"--render-gids {args.render_gids!r}: give numeric GIDs, e.g. 44,992")
    elif args.gpu == "amd-apu":
        gids = (44, 992)  # video on Debian/Ubuntu; render as on the strix-halo stack's nodes
    vram_bw, vram_why = None, ""
    if args.gpu == "nvidia":
        if args.vram_bandwidth is not None:
            vram_bw, vram_why = args.vram_bandwidth, "--vram-bandwidth: the card's memory bandwidth (GB/s), for the decode prediction."
        else:
            size, vram_bw, card = next((c for c in NVIDIA_CARDS if c[0] >= args.vram), NVIDIA_CARDS[-1])
            vram_why = (f"Assumed for a {args.vram:g} GiB card: {card}. The decode prediction scales with it: "
                        "give your card's with --vram-bandwidth.")
    if args.ram_bandwidth is not None:
        ram_bw, ram_why = args.ram_bandwidth, "--ram-bandwidth: sustained memory bandwidth of one node (GB/s)."
    elif args.arch == "arm64":
        ram_bw, ram_why = 10.0, ("Assumed: a Raspberry Pi 5's 32-bit LPDDR4X sustains about 10 GB/s; give yours with "
                                 "--ram-bandwidth (for the decode prediction).")
    elif args.gpu == "amd-apu":
        ram_bw, ram_why = 215.0, ("Assumed: Strix Halo's 256-bit LPDDR5X-8000 sustains about 215 GB/s; a Ryzen "
                                  "7040/8040 APU on DDR5 has about 70: give yours with --ram-bandwidth.")
    else:
        ram_bw, ram_why = 50.0, ("Assumed: dual-channel DDR4-3200 sustains about 45-50 GB/s (DDR5-5600 about 70); "
                                 "give yours with --ram-bandwidth (for the decode prediction).")
    return Hardware(gpu=args.gpu, ram_gib=args.ram, vram_gib=args.vram, nodes=args.nodes, cpus=cpus, arch=args.arch,
                    ram_bandwidth=ram_bw, ram_bandwidth_why=ram_why, vram_bandwidth=vram_bw,
                    vram_bandwidth_why=vram_why, render_gids=gids, image=args.image)


def cluster_of(args: argparse.Namespace) -> Cluster:
    from kubernetes_validate import utils as kv

    issuer = None if args.issuer == "none" else args.issuer
    if issuer is not None and not re.fullmatch(_DNS_NAME, issuer):
        raise BadInput(f"--issuer {issuer!r}: not a ClusterIssuer name (lower-case letters, digits, '-', '.'); "
                       "give yours (kubectl get clusterissuer) or none")
    if args.host is not None:
        if not re.fullmatch(_HOSTNAME, args.host):
            raise BadInput(f"--host {args.host!r}: not a fully qualified host name; give e.g. llm.lan.example.org")
        if args.ingress == "none":
            raise BadInput("--host: exposing the chat endpoint needs an ingress controller; give --ingress "
                           "traefik-k3s or nginx, or drop --host")
        if issuer is None:
            raise BadInput("--host: the Ingress's TLS certificate comes from a cert-manager ClusterIssuer; give "
                           "--issuer NAME (kubectl get clusterissuer), or drop --host")
    monitoring = None if args.monitoring == "none" else args.monitoring
    if monitoring is not None and not re.fullmatch(_DNS_LABEL, monitoring):
        raise BadInput(f"--monitoring {monitoring!r}: not a namespace name; give e.g. monitoring, or none")
    if not re.fullmatch(_DNS_LABEL, args.namespace):
        raise BadInput(f"--namespace {args.namespace!r}: not a namespace name; give e.g. ai")
    reserved = {"kube-system", "kube-public", "kube-node-lease", "default", monitoring,
                INGRESS.get(args.ingress, (None,) * 5)[2], STORAGE[args.storage][2]}
    if args.namespace in reserved:
        raise BadInput(f"--namespace {args.namespace}: a system or peer namespace; the stack denies all traffic "
                       "there that it does not list: give one of its own, e.g. ai")
    versions = sorted({kv.major_minor(v) for v in kv.all_versions()}, key=lambda v: int(v.split(".")[1]))
    if args.kubernetes_version not in versions:
        raise BadInput(f"--kubernetes-version {args.kubernetes_version}: no schemas for it; give one of "
                       f"{', '.join(versions)}")
    return Cluster(cni=args.cni, ingress=args.ingress, storage=args.storage, issuer=issuer, host=args.host,
                   monitoring=monitoring, namespace=args.namespace, kubernetes_version=args.kubernetes_version)


def command_line(args: argparse.Namespace, hw: Hardware) -> str:
    parts = [f"python tools/new_stack.py {args.name} --gpu {args.gpu}"]
    if args.vram is not None:
        parts.append(f"--vram {args.vram:g}")
    parts.append(f"--ram {args.ram:g}")
    defaults = {"nodes": 1, "arch": "amd64", "cni": "flannel", "ingress": "traefik-k3s", "storage": "local-path",
                "issuer": "none", "monitoring": "none", "namespace": "ai", "kubernetes_version": "1.33"}
    for key in ("nodes", "cpus", "arch", "image", "ram_bandwidth", "vram_bandwidth", "render_gids", "cni", "ingress",
                "storage", "issuer", "host", "monitoring", "namespace", "kubernetes_version"):
        value = getattr(args, key)
        if value is None or defaults.get(key) == value:
            continue
        parts.append(f"--{key.replace('_', '-')} {value:g}" if isinstance(value, float) else f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


def machine(hw: Hardware) -> str:
    what = KINDS[hw.gpu][4]
    card = f" with {hw.vram_gib:g} GiB of VRAM" if hw.discrete else ""
    nodes = f"{hw.nodes} x " if hw.nodes > 1 else ""
    return f"{nodes}{what}{card}, {hw.ram_gib:g} GiB RAM, {hw.cpus} cores, {hw.arch}"


def describe(choice: Choice, hw: Hardware) -> dict[str, str]:
    """The summary's facts, for the header and stdout."""
    plan = choice.plan
    chat = plan.servers["chat"]
    embed = plan.servers["embed"]
    facts = lookup(choice.chat.candidate.repo)
    moe = f", {facts.active_params_b:g}B active" if facts.active_params_b else ""
    predicted = chat.decode_predicted_tok_s or {}
    speed = (f"{predicted['half']:.1f} tok/s at half context ({predicted['empty']:.1f} empty, {predicted['full']:.1f} "
             "full)" if predicted else "not predicted")
    node = plan.nodes[0]
    memory = f"{chat.estimate.total_gib:.1f} GiB of system RAM (limit {chat.memory_limit})"
    if chat.vram is not None:
        card = float(parse_quantity(_gib(hw.vram_gib))) / GIB
        memory = (f"{chat.vram.total_gib:.1f} of {card:g} GiB VRAM, {chat.vram.breakdown().split(':')[0]}; " + memory)
    reason = (f"the largest catalog chat model that fits with {choice.chat.ctx_size} tokens of context and is predicted "
              f"at >= {decode_floor(hw):g} tok/s" if not choice.slow else
              f"no model that fits is predicted at >= {decode_floor(hw):g} tok/s: the fastest that fits")
    return {
        "chat": f"{choice.chat.candidate.hf_repo} ({facts.params_b:g}B{moe}), ctx {choice.chat.ctx_size}",
        "why": reason,
        "passed": "; ".join(choice.passed_over[-2:]) if choice.passed_over else "none bigger in the catalog",
        "memory": memory,
        "speed": speed + (f", bound {chat.decode_bound_tok_s:.1f}" if chat.decode_bound_tok_s else ""),
        "embed": (f"{choice.embed.hf_repo} on the CPU, {embed.estimate.total_gib:.1f} GiB (the best within an eighth "
                  f"of the node, {hw.offers_gib() * EMBED_SHARE:.1f} GiB)"),
        "node": f"node 1 planned {node.planned_gib:.1f} of {node.offers_gib:.1f} GiB offered (allocatable less reserved)",
    }


def write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def check_written(text: str, expected: dict[str, Any]) -> Any:
    """The text read back as the program reads a stack file: the same values, valid, planned."""
    from plane import parse_stack, plan_capacity

    document = yaml.safe_load(text)
    prefix = f"{PROJECT}:"
    values = {k[len(prefix):]: v for k, v in document["config"].items() if k.startswith(prefix)}
    values = {k: v for k, v in values.items() if not (isinstance(v, dict) and "secure" in v)}
    assert values == expected, "the written text does not read back as the planned values"
    return plan_capacity(parse_stack(values))


def run(argv: Sequence[str]) -> tuple[Path, str, list[str]]:
    """(the path, its text, the summary lines); raises BadInput."""
    args = parser().parse_args(list(argv))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", args.name):
        raise BadInput(f"NAME {args.name!r}: a stack name is letters, digits, '_', '.' and '-'; give e.g. homelab")
    hw = hardware(args)
    cluster = cluster_of(args)
    out = args.out or ROOT / f"Pulumi.{args.name}.yaml"
    if out.exists() and not args.force:
        raise BadInput(f"{out}: already exists; choose another NAME or --out, or pass --force to replace it")
    if not out.parent.is_dir():
        raise BadInput(f"--out {out}: folder {out.parent} does not exist; create it or write elsewhere")
    try:
        choice = choose(hw, cluster)
    except NoFit as error:
        raise BadInput(f"--ram {hw.ram_gib:g}" + (f" --vram {hw.vram_gib:g}" if hw.discrete else "") +
                       f": no catalog chat model fits this machine (smallest: {error}); more memory is needed") from None
    weights = sum(float(parse_quantity(s.weights)) / GIB for s in choice.plan.servers.values())
    cache = max(10, math.ceil(weights * 1.25))
    config = build_config(hw, cluster, choice.chat, choice.embed, cache)
    facts = describe(choice, hw)
    header = [
        f"{machine(hw)}: written by",
        f"  {command_line(args, hw)}",
        "",
        f"Chat: {facts['chat']}: {facts['why']}. Passed over: {facts['passed']}.",
        f"  Memory: {facts['memory']}.",
        f"  Decode ~{facts['speed']} (engines/llamacpp_speed.py, from the bandwidths below).",
        f"Embeddings: {facts['embed']}.",
        f"Plan: {facts['node']}. Memory requests and limits come from the plan.",
        "No gateway, no monitoring objects" + (", an Ingress for the chat endpoint" if cluster.host else ", nothing "
                                               "exposed: reach the chat with kubectl port-forward svc/llama-chat 8080")
        + ". Render it offline first: python -m render " + args.name,
    ]
    if cluster.host:
        header.append("The secret below is a placeholder: set it with `pulumi config set --secret chat_api_key <key>`.")
    header = [wrapped for line in header for wrapped in (textwrap.wrap(line, 98, subsequent_indent="  ") or [""])]
    text = stack_text(header, config)
    plan = check_written(text, stack_values(config))
    assert plan.fits() and not plan.warnings
    summary = [
        f"wrote {out}: {machine(hw)}",
        f"  chat:  {facts['chat']}",
        f"         why: {facts['why']}; passed over: {facts['passed']}",
        f"         memory: {facts['memory']}",
        f"         decode ~{facts['speed']}",
        f"  embed: {facts['embed']}",
        f"  {facts['node']}",
    ]
    if choice.slow:
        summary.append(f"  warning: no catalog model that fits is predicted at >= {decode_floor(hw):g} tok/s here; this is "
                       "the fastest that fits")
    if hw.arch == "arm64":
        summary.append("  note: arm64 runs --image; the decode prediction uses the CPU profile measured on x86")
    if hw.ram_bandwidth_why.startswith("Assumed") or hw.vram_bandwidth_why.startswith("Assumed"):
        summary.append("  note: bandwidths are assumed (see the file's comments): give --ram-bandwidth/--vram-bandwidth "
                       "for your machine's")
    if hw.render_gids and args.render_gids is None:
        summary.append(f"  check: supplemental_groups {list(hw.render_gids)} are the video/render GIDs of the "
                       "strix-halo nodes; `getent group video render` on yours (--render-gids)")
    if cluster.host:
        summary.append("  secrets to set before `pulumi up`:")
        summary.append(f"    pulumi config set --stack {args.name} --secret chat_api_key \"$(openssl rand -hex 32)\"")
    else:
        summary.append("  secrets to set: none (nothing is exposed; add --host and --issuer for an Ingress with an API key)")
    summary.append(f"  next: python -m render {args.name}   then: pulumi stack init {args.name} && pulumi up")
    return out, text, summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        out, text, summary = run(sys.argv[1:] if argv is None else argv)
    except BadInput as error:
        print(one_line(f"new_stack: {error}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    write_atomically(out, text)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
