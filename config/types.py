"""The stack's configuration types. Each top-level field of ``StackConfig`` is one Pulumi config
key in the project's namespace (``inference-plane:models``, ``inference-plane:cluster`` ...), so
``pulumi config set --path 'models.chat.ctx_size' 16384`` reaches any field.

Every field says what it is for in its ``description`` (the README's reference is generated from
these). Checks between fields live beside the fields, as ``problems()`` methods returning
``(config path, message with the fix)`` pairs; ``validation.parse_stack`` runs them once.
"""

from __future__ import annotations

import difflib
import typing
from typing import Annotated, Literal, Optional

from pydantic import Field

from common.quantity import parse_quantity

from .defaults import DEVICE_PLUGIN_SHARING, MODEL_HUB_HOSTS, PREFETCH_IMAGE, PRIVATE_SOURCE_RANGES
from .values import (
    Args,
    Cidr,
    ConfigKey,
    Cpu,
    DnsLabel,
    DnsName,
    Duration,
    FqdnPattern,
    HfRepo,
    Hostname,
    HttpPath,
    Labels,
    Memory,
    Number,
    PinnedImage,
    Positive,
    Reason,
    RepoId,
    ResourceName,
    Strict,
)

Problem = tuple[str, str]


def _doc(text: str, **constraints) -> object:
    return Field(description=text, **constraints)


# --- cluster -------------------------------------------------------------------------------------

# Namespaces Kubernetes itself uses: a stack must never label or fence them.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "default"})


class PodPeer(Strict):
    """A set of pods in another namespace that the inference namespace talks to."""

    namespace: DnsLabel = _doc("The peer's namespace.")
    pod_labels: Labels = _doc("Labels selecting the peer's pods; empty: every pod in the namespace.", default={})


class IngressController(Strict):
    """The cluster's ingress controller: its class and where its pods run (for the network policy)."""

    kind: Literal["traefik", "ingress-nginx", "other"] = _doc(
        "Which controller serves the class: the program sets the annotations long streamed completions need "
        "(ingress-nginx: 60 s read timeout, 1 MiB body limit by default; Traefik streams and has no body limit).",
        default="traefik",
    )
    class_name: DnsName = _doc("The IngressClass the chat endpoint's Ingress names.", default="traefik")
    namespace: DnsLabel = _doc("Namespace of the controller's pods, admitted by the network policy.", default="ingress")
    pod_labels: Labels = _doc("Labels of the controller's pods.", default={"app.kubernetes.io/name": "traefik"})


class ClusterConfig(Strict):
    """What the program needs to know about the cluster it deploys to."""

    kubernetes_version: Annotated[str, Field(pattern=r"^1\.[0-9]{2}$")] = _doc(
        "Every rendered manifest is checked against this Kubernetes version's schemas.", default="1.33"
    )
    cni: Literal["cilium", "networkpolicy"] = _doc(
        "cilium: CiliumNetworkPolicy (ICMP, host entities and host names expressible); networkpolicy: plain NetworkPolicy.",
        default="cilium",
    )
    ingress: Optional[IngressController] = _doc(
        "The ingress controller that serves an exposed chat endpoint; null: the cluster has none (nothing can be "
        "exposed, and the network policy admits no ingress namespace).",
        default=IngressController(),
    )
    cert_manager_issuer: DnsName = _doc("The cert-manager ClusterIssuer for every TLS certificate.", default="letsencrypt-cluster")
    monitoring: Optional[PodPeer] = _doc(
        "The pods that scrape /metrics; null when the cluster runs no monitoring.", default=PodPeer(namespace="monitoring")
    )
    storage: Optional[PodPeer] = _doc(
        "Where the model cache's storage daemons live (CephFS: rook-ceph); null for node-local storage.",
        default=PodPeer(namespace="rook-ceph"),
    )
    dns: PodPeer = _doc(
        "The cluster DNS pods (egress on port 53).",
        default=PodPeer(namespace="kube-system", pod_labels={"k8s-app": "kube-dns"}),
    )
    public_dns_label: Optional[str] = _doc(
        "A label that makes external-dns publish a record on the internet. The program never sets it and refuses "
        "any exposure that asks for it: the llama.cpp API stays LAN-only.",
        default=None,
    )


class ModelHubEgress(Strict):
    """Where model servers may connect to download weights."""

    mode: Literal["fqdn", "world"] = _doc(
        "fqdn: only the named hosts (Cilium toFQDNs). world: any address on 443, which needs a reason. Image "
        "pulls are the kubelet's, not the pod's, so pods need nothing else from the internet.",
        default="fqdn",
    )
    hosts: list[FqdnPattern] = _doc(
        "The model hub's hosts: Hugging Face serves metadata from huggingface.co and files from its CDN and Xet hosts.",
        default=MODEL_HUB_HOSTS,
        min_length=1,
    )
    reason: Optional[Reason] = _doc(
        "Required with mode world: why the hosts cannot be named (recorded on the policy object).", default=None
    )

    def problems(self, path: str) -> list[Problem]:
        if self.mode == "world" and self.reason is None:
            return [(f"{path}.reason", "world egress needs a reason; prefer mode: fqdn with the hosts named")]
        return []


class NamespaceConfig(Strict):
    """The namespace the model servers (and the gateway's objects) live in."""

    name: DnsLabel = _doc("The namespace's name.", default="ai")
    pod_security: Literal["restricted", "baseline", "privileged"] = _doc(
        "Pod Security level enforced: the pods need no privilege, the GPU comes in through the device-plugin API.",
        default="restricted",
    )
    model_hub_egress: ModelHubEgress = _doc("Egress for weight downloads.", default=ModelHubEgress())


# --- nodes, storage, start-up --------------------------------------------------------------------


GpuBackend = Literal["vulkan", "rocm", "cuda", "sycl", "cpu"]


class NodePool(Strict):
    """Identical nodes that model servers are placed on."""

    instance_type: Optional[DnsName] = _doc(
        "node.kubernetes.io/instance-type of the nodes; null when the GPU resource alone places the pods.", default=None
    )
    gpu_resource: Optional[ResourceName] = _doc(
        "Extended resource the GPU device plugin advertises, e.g. gpu.intel.com/i915, amd.com/gpu.", default=None
    )
    gpu_shares: Annotated[int, Field(gt=0, le=64)] = _doc(
        "Containers that may share one GPU: the device plugin's -shared-dev-num (Intel, default 1) or NVIDIA "
        "time-slicing replicas. Must be 1 where the plugin cannot share (see gpu_sharing).",
        default=1,
    )
    gpu_sharing: Optional[Literal["exclusive", "shared-dev-num", "time-slicing"]] = _doc(
        "How the device plugin shares a GPU; null: known from gpu_resource.", default=None
    )
    nodes: Annotated[int, Field(gt=0, le=1000)] = _doc("Nodes in the pool: the planner simulates every one.", default=1)
    memory: Memory = _doc("Physical memory of one node; on an APU the GPU's memory is this same pool.")
    allocatable: Memory = _doc("What the kubelet offers pods on one node (capacity less system and kube reservations).")
    reserved: Memory = _doc(
        "Held on each node by workloads this program does not manage (storage daemons, DNS ...).", default="0Gi"
    )
    memory_bandwidth_gbs: Optional[Annotated[Number, Field(gt=0)]] = _doc(
        "Sustained memory bandwidth of one node in GB/s, for the decode-speed bound; null: not shown.", default=None
    )
    vram: Optional[Memory] = _doc(
        "Memory of one discrete GPU (an RTX 4090: 24Gi). null: unified memory (iGPU/APU), the GPU uses the node's "
        "memory. Set, offloaded layers and their KV cache are planned in VRAM and only the rest in system RAM.",
        default=None,
    )
    gpus_per_node: Annotated[int, Field(gt=0, le=16)] = _doc("Discrete GPUs per node the device plugin advertises.", default=1)
    vram_bandwidth_gbs: Optional[Annotated[Number, Field(gt=0)]] = _doc(
        "Memory bandwidth of one discrete GPU in GB/s (RTX 4090: 1008), for the decode-speed bound.", default=None
    )
    runtime_class: Optional[DnsName] = _doc(
        "runtimeClassName for pods that use the GPU: `nvidia` where the NVIDIA container runtime is not the node's "
        "default (k3s and RKE2 ship the class; the GPU Operator creates it).",
        default=None,
    )
    backend: Optional[GpuBackend] = _doc(
        "The backend the servers' images are built for (sets the memory overhead); null: read from each server's "
        "image tag (llama.cpp: server-vulkan, server-cuda, server-rocm, server-intel = sycl, server = cpu).",
        default=None,
    )
    supplemental_groups: list[Annotated[int, Field(ge=0)]] = _doc(
        "Numeric GIDs of the host's render/video groups, for non-root access to /dev/dri and /dev/kfd.", default=[]
    )

    def sharing(self) -> Optional[str]:
        return self.gpu_sharing or DEVICE_PLUGIN_SHARING.get(self.gpu_resource or "")

    def discrete(self) -> bool:
        return self.vram is not None

    def problems(self, path: str) -> list[Problem]:
        problems: list[Problem] = []
        if self.sharing() == "exclusive" and self.gpu_shares > 1:
            problems.append((
                f"{path}.gpu_shares",
                f"{self.gpu_resource}'s device plugin gives each GPU to one container only; set gpu_shares: 1 and "
                "run other model servers on the CPU (gpu_layers: 0) or on another pool",
            ))
        if self.vram is not None and self.gpu_resource is None:
            problems.append((f"{path}.gpu_resource", "a pool with vram has discrete GPUs: name the device plugin's resource (e.g. nvidia.com/gpu)"))
        if self.vram is None and (self.gpus_per_node > 1 or self.vram_bandwidth_gbs is not None):
            problems.append((f"{path}.vram", "gpus_per_node and vram_bandwidth_gbs describe discrete GPUs: set vram (memory of one GPU)"))
        if self.backend == "cpu" and self.gpu_resource is not None:
            problems.append((f"{path}.backend", "a cpu backend uses no GPU: remove gpu_resource, or name the GPU backend"))
        return problems


class ModelCacheConfig(Strict):
    """The shared volume that holds downloaded weights (the ModelCache component)."""

    claim_name: DnsName = _doc("The PersistentVolumeClaim's name.", default="llama-server-models")
    storage_class: DnsName = _doc("The claim's storage class.")
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = _doc(
        "ReadWriteMany so both servers, a second replica or a benchmark Job mount the same weights.",
        default="ReadWriteMany",
    )
    size: Memory = _doc("The claim's size.", default="40Gi")
    mount_path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]*$")] = _doc(
        "Where the servers mount it (llama.cpp's LLAMA_CACHE).", default="/models"
    )
    protect: bool = _doc("Refuse `pulumi destroy` outright. The claim is always retained on delete either way.", default=False)


class Startup(Strict):
    """How long a cold start is expected to take. The startup probe, Pulumi's wait, the Deployment's
    progress deadline and the NotReady alert allow the estimate, but never less than a start at the
    defaults: rates at or above the default rates, and a min_seconds at or below the default, change
    no pod (and restart nothing); a slower estimate lengthens the probe, which restarts the servers
    (the change preview says which)."""

    download_mib_per_s: Annotated[Number, Field(ge=0.1, le=100_000)] = _doc(
        "Sustained download rate from the model hub; the seed's 40 min for ~19 GiB assumes about this.", default=8.5
    )
    load_mib_per_s: Annotated[Number, Field(ge=0.1, le=100_000)] = _doc(
        "Reading the weights back off the cache volume and onto the GPU.", default=200.0
    )
    min_seconds: Annotated[int, Field(gt=0, le=86_400)] = _doc(
        "Never less: image pull on a cold node and Vulkan start-up alone can take minutes.", default=600
    )
    probe_period_seconds: Annotated[int, Field(gt=0, le=3600)] = _doc(
        "The startup and readiness probes' period. Part of the pod: changing it restarts the servers.", default=10
    )
    image_pull_seconds: Annotated[int, Field(gt=0, le=86_400)] = _doc(
        "Pulling the server image (~1-2 GiB) before the container, and its startup clock, starts.", default=600
    )


# --- model servers -------------------------------------------------------------------------------


class Resources(Strict):
    """CPU and memory of a model server's container. Memory is planned (see the capacity plan)."""

    cpu_request: Cpu = _doc("CPU request.")
    cpu_limit: Cpu = _doc("CPU limit.")
    memory_request: Optional[Memory] = _doc("null: derived from the memory estimate; when set, checked against it.", default=None)
    memory_limit: Optional[Memory] = _doc("null: the estimate plus 10%; when set, checked against the estimate.", default=None)
    accepted_risk: Optional[Reason] = _doc(
        "A limit below the estimate is refused unless this says why the risk is accepted.", default=None
    )

    def problems(self, path: str) -> list[Problem]:
        problems = []
        if self.memory_request and self.memory_limit:
            if parse_quantity(self.memory_request) > parse_quantity(self.memory_limit):
                problems.append((f"{path}.memory_request", "is larger than memory_limit"))
        if parse_quantity(self.cpu_request) > parse_quantity(self.cpu_limit):
            problems.append((f"{path}.cpu_request", "is larger than cpu_limit"))
        return problems


class ModelFacts(Strict):
    """What the memory model needs to know about a model's architecture."""

    params_b: Annotated[Number, Field(gt=0)] = _doc("Parameters, in billions.")
    active_params_b: Optional[Annotated[Number, Field(gt=0)]] = _doc(
        "Parameters read per token, for mixture-of-experts; null: dense (all of them).", default=None
    )
    layers: Positive = _doc("Transformer blocks.")
    full_attention_layers: Optional[Positive] = _doc(
        "Layers with a KV cache; hybrid models (Gated DeltaNet, Mamba) have fewer than layers. null: all.", default=None
    )
    sliding_window: Optional[Positive] = _doc(
        "Window of the sliding-window attention layers (Gemma 3: 1024, gpt-oss: 128). llama.cpp keeps only "
        "window-sized KV for them (unless --swa-full); null: the model has none.",
        default=None,
    )
    sliding_window_layers: Optional[Positive] = _doc(
        "How many layers use the sliding window (they are not in full_attention_layers).", default=None
    )
    kv_heads: Positive = _doc("Key/value heads per attention layer.")
    head_dim: Positive = _doc("Dimension of one head.")
    recurrent_state_mib: Annotated[Number, Field(ge=0)] = _doc(
        "Fixed-size recurrent state per slot (hybrid models), independent of context.", default=0.0
    )
    bits_per_weight: Optional[Annotated[Number, Field(gt=0, le=32)]] = _doc(
        "Overrides the quant's table value (checkpoints that are not GGUF).", default=None
    )
    pooling: Optional[Literal["none", "mean", "cls", "last", "rank"]] = _doc(
        "Embedding models: how token vectors are pooled into one (the GGUF's pooling_type). mean and cls need the "
        "whole input in one micro-batch: llama.cpp refuses a longer input (HTTP 500).",
        default=None,
    )


class OpenAIEngine(Strict):
    """Any other OpenAI-compatible server: its own image, arguments, port and paths."""

    args: Args = _doc("The engine's command-line arguments.", default=[])
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = _doc(
        "Environment variables for the engine.", default={}
    )
    health_path: HttpPath = _doc(
        "Path that answers 200 only once the model is loaded (the probes'); vLLM, SGLang and llama.cpp use /health.",
        default="/health",
    )
    metrics_path: Optional[HttpPath] = _doc("Prometheus metrics path; null: not scraped.", default="/metrics")
    served_model: Annotated[str, Field(min_length=1, max_length=200)] = _doc(
        "The model name the engine serves, sent upstream by the gateway (modelNameOverride)."
    )
    resident_memory: Memory = _doc("What the engine locks in memory, weights and KV pool together, as measured on the node.")


class Prefetch(Strict):
    """An init container that downloads the weights before the engine starts (idempotent)."""

    repo: RepoId = _doc("The Hugging Face repo to download.")
    revision: Annotated[str, Field(pattern=r"^[A-Za-z0-9._/-]+$")] = _doc("Branch, tag or 40-hex commit; a commit, once fetched, starts with no Hub.", default="main")
    image: PinnedImage = _doc("The init container's image (needs python3; nothing is installed).", default=PREFETCH_IMAGE)
    command: Optional[Annotated[list[str], Field(min_length=1)]] = _doc(
        "null: the built-in downloader (components/hub_download.py, standard library only: no PyPI at start). "
        "Otherwise runs with HF_REPO, HF_REVISION, HOME and HF_HOME set, and must skip files it already has.",
        default=None,
    )


class CacheVolume(Strict):
    """A claim per replica (StatefulSet volumeClaimTemplates) for the prefetched weights."""

    storage_class: DnsName = _doc("Storage class of each replica's claim (node-local is typical).")
    size: Memory = _doc("Size of each replica's claim.")


class Workload(Strict):
    """How a model server's pods are run."""

    kind: Literal["Deployment", "StatefulSet"] = _doc(
        "Deployment (shared cache) or StatefulSet (a claim per replica).", default="Deployment"
    )
    name: Optional[DnsLabel] = _doc(
        "The Deployment's or StatefulSet's own name; a StatefulSet's claims are named after it "
        "(weights-<name>-<ordinal>). null: the server's name. When renaming a StatefulSet server, set "
        "this to its old name to keep its claims and the weights in them.",
        default=None,
    )
    replicas: Annotated[int, Field(gt=0, le=100)] = _doc("Pods.", default=1)
    one_per_node: bool = _doc("Required pod anti-affinity on kubernetes.io/hostname: at most one replica per node.", default=False)
    cache_volume: Optional[CacheVolume] = _doc("A claim per replica for prefetched weights (StatefulSet only).", default=None)
    vpa_update_mode: Optional[Literal["Off", "Initial", "Recreate", "Auto"]] = _doc(
        "A VerticalPodAutoscaler that may manage CPU only: memory stays pinned (the seed's #2711).", default=None
    )

    def problems(self, path: str, pool_key: str, pool: Optional[NodePool]) -> list[Problem]:
        problems = []
        if self.cache_volume is not None and self.kind != "StatefulSet":
            problems.append((f"{path}.cache_volume", "a claim per replica needs kind: StatefulSet"))
        if pool is not None and self.one_per_node and self.replicas > pool.nodes:
            problems.append((
                f"{path}.replicas",
                f"{self.replicas} replicas, one per node, but node pool {pool_key} has {pool.nodes} nodes",
            ))
        return problems


class Exposure(Strict):
    """An Ingress for the chat endpoint: TLS from cert-manager, no public DNS record, and only the
    source ranges listed may connect."""

    host: Hostname = _doc("The LAN host name.")
    source_ranges: Optional[Annotated[list[Cidr], Field(min_length=1)]] = _doc(
        "Client address ranges the controller admits (ingress-nginx: whitelist-source-range; Traefik v3: an "
        "ipAllowList Middleware). Only as good as the client address the controller sees: its Service needs "
        "externalTrafficPolicy: Local (or the PROXY protocol), or every client arrives as a node's address. "
        "null: anyone who reaches the controller (the API key is then the only guard).",
        default=PRIVATE_SOURCE_RANGES,
    )
    tls_secret: DnsName = _doc("The Secret cert-manager writes the certificate to.")
    timeout_seconds: Annotated[int, Field(ge=60, le=86_400)] = _doc(
        "The longest a client waits for the first token or a whole non-streamed answer; the controller's read "
        "timeout is set to it where the controller has one (ingress-nginx).",
        default=3600,
    )
    max_body: Memory = _doc("Largest request body (long chat histories, pasted documents).", default="64Mi")
    annotations: dict[Annotated[str, Field(max_length=253)], Annotated[str, Field(max_length=4096)]] = _doc(
        "More Ingress annotations. Those the program sets for streaming win; a different value for one of them is refused.",
        default={},
    )


class ApiKey(Strict):
    """llama.cpp's --api-key-file, read from a Kubernetes Secret."""

    secret_name: DnsName = _doc("The Secret holding the key file.")
    secret_key: Annotated[str, Field(pattern=r"^[-._a-zA-Z0-9]+$")] = _doc("The key file's name in the Secret.", default="api-keys")
    from_config: Optional[ConfigKey] = _doc(
        "A Pulumi secret config key whose value (one key per line) becomes that Secret; null: the Secret is "
        "created outside this program.",
        default=None,
    )


# llama.cpp's KV cache types (--cache-type-k/-v; common/arg.cpp kv_cache_types).
KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


class ModelServer(Strict):
    """One model server: llama.cpp in single-model mode, or another OpenAI-compatible engine."""

    role: Literal["chat", "embedding"] = _doc("chat, or embedding (never behind an Ingress or a chat route).")
    name: DnsLabel = _doc("Name of its Service, its pods' app.kubernetes.io/name and (unless workload.name) its workload.")
    engine: Literal["llamacpp", "openai"] = _doc(
        "llamacpp (settings below) or openai (any OpenAI-compatible server, settings under `openai`).", default="llamacpp"
    )
    hf_repo: Optional[HfRepo] = _doc("llama.cpp's --hf-repo (org/Model-GGUF:QUANT); required for llamacpp.", default=None)
    openai: Optional[OpenAIEngine] = _doc("The engine's settings; required for engine openai, refused otherwise.", default=None)
    prefetch: Optional[Prefetch] = _doc("Download the weights in an init container before the engine starts.", default=None)
    workload: Workload = _doc("How the pods are run.", default=Workload())
    backend: Optional[GpuBackend] = _doc("Overrides the node pool's backend for this server's image.", default=None)
    image: PinnedImage = _doc("The server image, pinned to a build tag or digest.")
    node_pool: DnsLabel = _doc("The node_pools key this server runs on.")
    weights: Optional[Memory] = _doc(
        "Size of the weights download; null: parameters x the quant's bits per weight.", default=None
    )
    facts: Optional[ModelFacts] = _doc("Architecture facts; null: taken from the catalog by hf_repo.", default=None)
    gpu_layers: Annotated[int, Field(ge=0, le=999)] = _doc("--n-gpu-layers; 0 runs on the CPU and requests no GPU.", default=99)
    threads: Annotated[int, Field(gt=0, le=1024)] = _doc("--threads.", default=4)
    ctx_size: Annotated[int, Field(gt=0, le=4_194_304)] = _doc("--ctx-size: the context shared by all slots.", default=4096)
    ubatch_size: Optional[Annotated[int, Field(gt=0, le=65536)]] = _doc(
        "--ubatch-size; null: llama.cpp's 512.", default=None
    )
    parallel: Optional[Annotated[int, Field(gt=0, le=256)]] = _doc(
        "Slots (--parallel); null: the server's auto, 4 slots sharing one KV pool.", default=None
    )
    cache_ram_mib: Optional[Annotated[int, Field(ge=0, le=1_048_576)]] = _doc(
        "Host-RAM prompt cache (--cache-ram, MiB); null: llama.cpp's default of 8192, counted in full.", default=None
    )
    cache_type_k: Optional[KvCacheType] = _doc(
        "--cache-type-k: q8_0 halves the K cache (about 1.06 bytes per element instead of 2); null: f16.", default=None
    )
    cache_type_v: Optional[KvCacheType] = _doc(
        "--cache-type-v: as cache_type_k for V (a quantized V cache needs flash attention, which the server turns on "
        "itself where the backend supports it); null: f16.",
        default=None,
    )
    ctx_checkpoints: Optional[Annotated[int, Field(ge=0, le=1024)]] = _doc(
        "Context checkpoints per slot (--ctx-checkpoints); null: llama.cpp's 32, each a full copy of a hybrid "
        "model's recurrent state in host RAM.",
        default=None,
    )
    cors_origins: Optional[Annotated[str, Field(min_length=1, max_length=1000)]] = _doc(
        "--cors-origins: which other web origins may read the API's answers. localhost (special): pages served "
        "from localhost only; or one origin such as https://chat.example.org. Never null: without the flag the "
        "server echoes any Origin with credentials allowed (seen running it).",
        default="localhost",
    )
    webui: bool = _doc("Serve llama.cpp's WebUI (chat servers only).", default=True)
    metrics: bool = _doc("--metrics, scraped by the monitoring stack.", default=True)
    port: Annotated[int, Field(ge=1024, le=65535)] = _doc(
        "The container port, always passed explicitly: llama.cpp's default moves across builds.", default=8080
    )
    resources: Resources = _doc("CPU and memory.")
    exposure: Optional[Exposure] = _doc("An Ingress on the LAN (chat servers only).", default=None)
    api_key: Optional[ApiKey] = _doc("llama.cpp's API key; required once anything outside the namespace reaches it.", default=None)
    extra_args: Args = _doc("More llama.cpp flags; flags generated from the fields above are refused here.", default=[])

    def problems(self, path: str, pools: dict[str, NodePool]) -> list[Problem]:
        """What this server's own fields, its engine and its node pool say about each other."""
        from engines import engine_of

        problems = engine_of(self).config_problems(self, path)
        pool = pools.get(self.node_pool)
        if pool is None:
            problems.append((f"{path}.node_pool", f"no node pool {self.node_pool!r}; defined: {', '.join(pools)}"))
        elif self.gpu_layers > 0 and pool.gpu_resource is None and self.backend_on(pool) != "cpu":
            problems.append((
                f"node_pools.{self.node_pool}.gpu_resource",
                f"{path} offloads {self.gpu_layers} layers to a GPU, so its node pool must name the GPU resource "
                "(e.g. gpu.intel.com/i915), or set gpu_layers: 0",
            ))
        if self.role == "embedding":
            if self.exposure is not None:
                problems.append((
                    f"{path}.exposure",
                    "an embedding model must not be exposed: asked to chat it answers fluent nonsense "
                    "('capital capital ...') instead of an error; remove exposure and call it in-cluster",
                ))
            if self.webui:
                problems.append((f"{path}.webui", "an embedding server has no use for the WebUI; set webui: false"))
        if pool is not None:
            problems += self._backend_problems(path, pool)
        limit = parse_quantity(self.resources.cpu_limit)
        if self.threads > limit and self.engine == "llamacpp":
            cores = max(1, int(limit))
            problems.append((
                f"{path}.threads",
                f"{self.threads} threads on a CPU limit of {self.resources.cpu_limit}: the kernel throttles the pod "
                f"every period and generation stalls; set threads: {cores} or raise resources.cpu_limit",
            ))
        if self.prefetch is not None and self.workload.cache_volume is None:
            problems.append((f"{path}.prefetch", "prefetched weights need workload.cache_volume to land in"))
        problems += self.workload.problems(f"{path}.workload", self.node_pool, pool)
        problems += self.resources.problems(f"{path}.resources")
        return problems

    @property
    def workload_name(self) -> str:
        """The Deployment's or StatefulSet's name (not its Service's, which is always `name`)."""
        return self.workload.name or self.name

    def uses_gpu(self, pool: NodePool) -> bool:
        return self.gpu_layers > 0 and pool.gpu_resource is not None and self.backend_on(pool) != "cpu"

    def image_backend(self) -> Optional[str]:
        """The backend the image's tag names (llama.cpp's server images), or None when it names none."""
        from engines.images import backend_of_image

        return backend_of_image(self.image)

    def backend_on(self, pool: NodePool) -> Optional[GpuBackend]:
        """The backend this server runs with: its own setting, the pool's, or its image's."""
        return self.backend or pool.backend or self.image_backend()  # type: ignore[return-value]

    def _backend_problems(self, path: str, pool: NodePool) -> list[Problem]:
        problems: list[Problem] = []
        named = self.image_backend()
        backend = self.backend or pool.backend
        where = f"{path}.backend" if self.backend else f"node_pools.{self.node_pool}.backend"
        if named is not None and named not in typing.get_args(GpuBackend):
            # One problem, with one fix: an unknown build (a misspelt tag) is not a backend to switch to.
            near = difflib.get_close_matches(named, typing.get_args(GpuBackend), n=1, cutoff=0.6)
            hint = f" (did you mean the {near[0]} build?)" if near else ""
            problems.append((f"{path}.image", f"llama.cpp's {named} build is not one this program plans for{hint}; use "
                             f"the cuda, rocm, vulkan, intel (sycl) or CPU image"))
        elif named is not None and backend is not None and named != backend:
            problems.append((
                where,
                f"{backend}, but the image {self.image} is llama.cpp's {named} build; use the {backend} image "
                f"(or set backend: {named})",
            ))
        if named is None and backend is None:
            problems.append((
                f"{path}.backend",
                f"the image {self.image} does not say which backend it is built for; set backend (vulkan, rocm, cuda, "
                "sycl or cpu) here or on the node pool",
            ))
        if self.backend_on(pool) == "cpu" and self.gpu_layers > 0 and self.engine == "llamacpp":
            problems.append((
                f"{path}.gpu_layers",
                f"{self.gpu_layers} layers to offload, but the image is a CPU build (the server ignores the flag); "
                "set gpu_layers: 0",
            ))
        return problems


# --- the gateway ---------------------------------------------------------------------------------


class RemoteProvider(Strict):
    """An OpenAI-compatible provider on the internet, reached over TLS with its own key."""

    host: Hostname = _doc("The provider's API host.")
    port: Annotated[int, Field(ge=1, le=65535)] = _doc("The provider's TLS port.", default=443)
    prefix: HttpPath = _doc("Path before /chat/completions: /v1 for most, /api/v1 for OpenRouter.", default="/v1")
    api_key_config: Optional[ConfigKey] = _doc("The Pulumi secret config key holding the provider's API key.", default=None)


class Tier(Strict):
    """Where a route's backend lives: one of this stack's model servers, or a remote provider."""

    local: Optional[DnsLabel] = _doc("A models key.", default=None)
    remote: Optional[RemoteProvider] = _doc("A provider on the internet.", default=None)


class RouteBackend(Strict):
    """One priority of a route."""

    tier: DnsLabel = _doc("A gateway.tiers key.")
    model: Optional[Annotated[str, Field(min_length=1, max_length=200)]] = _doc(
        "The model name sent to this tier; null: the local engine's served name, or the public name.", default=None
    )


class Route(Strict):
    """One public model name, tried on its backends in order (priority 0, 1, ...)."""

    model: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/@-]+$")] = _doc(
        "The public model name clients send."
    )
    kind: Literal["chat", "embedding"] = _doc("chat or embedding: their retry policies differ.", default="chat")
    backends: Annotated[list[RouteBackend], Field(min_length=1, max_length=16)] = _doc("Tiers, in priority order.")


class ApiClient(Strict):
    """A client of the gateway."""

    key_config: Optional[ConfigKey] = _doc(
        "A Pulumi secret config key holding this client's key; null: derived from the master key.", default=None
    )


class Retry(Strict):
    """How a failed request moves to the next priority."""

    num_retries: Annotated[int, Field(ge=0, le=10)] = _doc("Retries after the first attempt.", default=3)
    attempts_per_priority: Annotated[int, Field(ge=1, le=5)] = _doc(
        "Attempts per priority: 1 hands a failing tier's request to the next one at once.", default=1
    )
    status_codes: list[Annotated[int, Field(ge=400, le=599)]] = _doc(
        "Chat routes: upstream statuses that are retried.", default=[429, 500, 502, 503, 504]
    )
    embedding_status_codes: list[Annotated[int, Field(ge=502, le=504)]] = _doc(
        "Embedding routes fail over only when the local server could not take the request (502/503/504 while it "
        "loads or restarts), never on 500: llama.cpp answers 500 to an input longer than its micro-batch, and "
        "re-sending that document to a remote tier would move private data off the cluster.",
        default=[502, 503, 504],
    )


class LlamaCppEmbeddingsPath(Strict):
    """A plain HTTPRoute straight to a llama.cpp embedding server, bypassing the AI gateway."""

    model: DnsLabel = _doc("The models key of a llama.cpp embedding server.")
    path: HttpPath = _doc("The path prefix on the gateway.", default="/llama-cpp/v1/embeddings")
    timeout: Duration = _doc("A whole document batch can take minutes on an iGPU.", default="600s")


class GatewayConfig(Strict):
    """Envoy AI Gateway in front of the model servers (the InferenceGateway component)."""

    name: DnsLabel = _doc("The Gateway's name; prefixes its objects.", default="inference")
    class_name: DnsLabel = _doc("The GatewayClass.", default="envoy-ai-gateway")
    create_class: bool = _doc("Create the GatewayClass (false when the cluster already has it).", default=True)
    hostname: Hostname = _doc("The listener's host name (on the tailnet: the MagicDNS name).")
    port: Annotated[int, Field(ge=1, le=65535)] = _doc("The HTTPS listener's port.", default=443)
    tls_secret: DnsName = _doc("The Secret cert-manager writes the listener's certificate to.")
    load_balancer_class: Annotated[str, Field(min_length=1)] = _doc(
        "The Envoy Service's load-balancer class: tailscale keeps it on the tailnet, never a public LB.", default="tailscale"
    )
    envoy_namespace: DnsLabel = _doc("Where Envoy Gateway runs the Envoy pods.", default="envoy-gateway-system")
    client_ca_secret: Optional[DnsName] = _doc(
        "Secret or ConfigMap with ca.crt: clients must present a certificate it signed. null: no mTLS.", default=None
    )
    buffer_limit: Memory = _doc("Envoy Gateway's default of 32 KiB rejects ordinary chat payloads with 413.", default="50Mi")
    stream_idle_timeout: Duration = _doc(
        "Ends a stream that sends nothing for this long; generation length itself is unbounded.", default="300s"
    )
    completion_idle_timeout: Duration = _doc(
        "How long an AI route waits for the next byte from a model. A non-streamed completion sends nothing "
        "until it is done, so this must outlast the longest one; a stream silent this long is ended. Set on "
        "the AI routes (overriding stream_idle_timeout there).",
        default="1800s",
    )
    api_key_header: Annotated[str, Field(pattern=r"^[a-z0-9-]+$")] = _doc("The header clients send their key in.", default="x-api-key")
    clients: Annotated[dict[DnsLabel, ApiClient], Field(min_length=1)] = _doc("Who may call the gateway.")
    master_key_config: Optional[ConfigKey] = _doc(
        "Pulumi secret config key from which clients without key_config get their keys (HMAC).", default=None
    )
    tiers: Annotated[dict[DnsLabel, Tier], Field(min_length=1)] = _doc("Where requests can go.")
    routes: list[Route] = _doc("Public model names and their tiers.", default=[])
    catch_all: list[DnsLabel] = _doc(
        "Tiers tried, in order, for any model no route names; the model name passes through.", default=[]
    )
    session_header: Annotated[str, Field(pattern=r"^[a-z0-9-]+$")] = _doc(
        "Requests with one value stay on one pod (its KV cache).", default="x-sks-session-id"
    )
    retry: Retry = _doc("Failover between priorities.", default=Retry())
    llamacpp_embeddings: Optional[LlamaCppEmbeddingsPath] = _doc("A direct path to a llama.cpp embedding server.", default=None)

    def local_models(self) -> set[str]:
        """The models keys the gateway's Envoy pods reach (and must authenticate to)."""
        reached = {t.local for t in self.tiers.values() if t.local}
        if self.llamacpp_embeddings is not None:
            reached.add(self.llamacpp_embeddings.model)
        return reached

    def secret_config_refs(self) -> dict[str, str]:
        """Each secret config key the gateway names -> the first setting that names it."""
        refs: dict[str, str] = {}
        if self.master_key_config:
            refs[self.master_key_config] = "gateway.master_key_config"
        for name, client in self.clients.items():
            if client.key_config:
                refs.setdefault(client.key_config, f"gateway.clients.{name}.key_config")
        for name, tier in self.tiers.items():
            if tier.remote and tier.remote.api_key_config:
                refs.setdefault(tier.remote.api_key_config, f"gateway.tiers.{name}.remote.api_key_config")
        return refs

    def secret_config_keys(self) -> set[str]:
        return set(self.secret_config_refs())

    def problems(self, models: dict[str, ModelServer]) -> list[Problem]:
        problems: list[Problem] = []
        for name, tier in self.tiers.items():
            path = f"gateway.tiers.{name}"
            if (tier.local is None) == (tier.remote is None):
                problems.append((path, "set exactly one of local (a models key) or remote (a provider)"))
            elif tier.local is not None and tier.local not in models:
                problems.append((f"{path}.local", f"no model server {tier.local!r}; defined: {', '.join(models)}"))
            elif tier.remote is not None and tier.remote.api_key_config is None:
                problems.append(
                    (f"{path}.remote.api_key_config", "a remote tier needs its provider key: name a Pulumi secret config key")
                )

        def role_of(tier_name: str) -> Optional[str]:
            tier = self.tiers.get(tier_name)
            if tier is None or tier.local is None or tier.local not in models:
                return None
            return models[tier.local].role

        seen: dict[str, int] = {}
        for index, route in enumerate(self.routes):
            path = f"gateway.routes[{index}]"
            if route.model in seen:
                problems.append((f"{path}.model", f"{route.model!r} is already routed by gateway.routes[{seen[route.model]}]"))
            seen[route.model] = index
            tiers = [b.tier for b in route.backends]
            if len(set(tiers)) != len(tiers):
                problems.append((f"{path}.backends", "a tier appears twice; each tier is one priority"))
            for b_index, backend in enumerate(route.backends):
                where = f"{path}.backends[{b_index}].tier"
                if backend.tier not in self.tiers:
                    problems.append((where, f"no tier {backend.tier!r}; defined: {', '.join(self.tiers)}"))
                    continue
                role = role_of(backend.tier)
                if role == "embedding" and route.kind == "chat":
                    problems.append((
                        where,
                        f"{backend.tier} serves an embedding model; a chat route to it answers nonsense "
                        "('capital capital ...'); use kind: embedding or another tier",
                    ))
                if role == "chat" and route.kind == "embedding":
                    problems.append((where, f"{backend.tier} serves a chat model, not embeddings"))
        for index, tier_name in enumerate(self.catch_all):
            if tier_name not in self.tiers:
                problems.append((f"gateway.catch_all[{index}]", f"no tier {tier_name!r}; defined: {', '.join(self.tiers)}"))
            elif role_of(tier_name) == "embedding":
                problems.append((f"gateway.catch_all[{index}]", f"{tier_name} serves an embedding model; it cannot take any model"))
        if not self.routes and not self.catch_all:
            problems.append(("gateway.routes", "the gateway routes nothing: add routes or catch_all"))
        owners: dict[str, str] = {}
        for client, settings in self.clients.items():
            if settings.key_config is None and self.master_key_config is None:
                problems.append(
                    (f"gateway.clients.{client}.key_config", "set it, or gateway.master_key_config to derive the key")
                )
            elif settings.key_config is not None:
                if settings.key_config in owners:
                    problems.append((
                        f"gateway.clients.{client}.key_config",
                        f"{settings.key_config} is already the key of client {owners[settings.key_config]}; "
                        "one key per client identity",
                    ))
                owners[settings.key_config] = client
        if self.llamacpp_embeddings is not None:
            target = models.get(self.llamacpp_embeddings.model)
            if target is None or target.role != "embedding" or target.engine != "llamacpp":
                problems.append(("gateway.llamacpp_embeddings.model", "must name a llama.cpp embedding server in models"))
        return problems


class Observability(Strict):
    """VictoriaMetrics operator objects: scrapes and alert rules."""

    scrape_interval: Duration = _doc("How often /metrics is scraped.", default="60s")
    queue_alert_after: Duration = _doc("Requests waiting for a free slot this long mean the server is saturated.", default="5m")
    fallback_alert_after: Duration = _doc("Traffic falling back to another tier for this long alerts.", default="15m")


# --- the stack -----------------------------------------------------------------------------------


class StackConfig(Strict):
    """One cluster's inference plane. Each field is one Pulumi config key."""

    cluster: ClusterConfig = _doc("The cluster.", default=ClusterConfig())
    namespace: NamespaceConfig = _doc("The namespace everything lives in.", default=NamespaceConfig())
    node_pools: Annotated[dict[DnsLabel, NodePool], Field(min_length=1)] = _doc("Where model servers run.")
    model_cache: ModelCacheConfig = _doc("The shared weights volume.")
    startup: Startup = _doc("Cold-start budgets.", default=Startup())
    models: Annotated[dict[DnsLabel, ModelServer], Field(min_length=1)] = _doc("The model servers, by key.")
    gateway: Optional[GatewayConfig] = _doc("Envoy AI Gateway in front of the servers; null: none.", default=None)
    observability: Optional[Observability] = _doc("Scrapes and alerts; null: none.", default=None)

    def secret_config_refs(self) -> dict[str, str]:
        """Each config key that must hold a Pulumi secret (a credential) -> the setting naming it."""
        refs = {
            m.api_key.from_config: f"models.{key}.api_key.from_config"
            for key, m in reversed(list(self.models.items())) if m.api_key and m.api_key.from_config
        }
        if self.gateway is not None:
            refs = {**self.gateway.secret_config_refs(), **refs}
        return refs

    def secret_config_keys(self) -> set[str]:
        return set(self.secret_config_refs())

    def _namespace_owned(self) -> list[Problem]:
        """The namespace is the stack's own: it gets a Pod Security level and a default-deny policy.
        On a system namespace or a peer's, those would lock the cluster's own pods out."""
        name = self.namespace.name
        if name in SYSTEM_NAMESPACES:
            return [("namespace.name", f"{name} is a Kubernetes system namespace; the stack labels it (Pod Security) "
                     "and denies all traffic not listed: use a namespace of its own, e.g. ai")]
        peers = {
            "cluster.dns.namespace": self.cluster.dns.namespace,
            "cluster.ingress.namespace": self.cluster.ingress.namespace if self.cluster.ingress else None,
            "cluster.monitoring.namespace": self.cluster.monitoring.namespace if self.cluster.monitoring else None,
            "cluster.storage.namespace": self.cluster.storage.namespace if self.cluster.storage else None,
            "gateway.envoy_namespace": self.gateway.envoy_namespace if self.gateway else None,
        }
        for where, peer in peers.items():
            if peer == name:
                return [("namespace.name", f"{name} is also {where}: the stack's default-deny policy would cut that "
                         "peer's own pods off; use a namespace of its own")]
        return []

    def problems(self) -> list[Problem]:
        """Checks between fields that no single field's type can express."""
        problems: list[Problem] = []
        names: dict[str, str] = {}
        hosts: dict[str, str] = {}
        for key, model in self.models.items():
            path = f"models.{key}"
            if model.name in names:
                problems.append((f"{path}.name", f"{model.name!r} is already the name of models.{names[model.name]}"))
            names[model.name] = key
            if model.workload.name is not None:
                for other_key, other in self.models.items():
                    if other_key != key and other.workload_name == model.workload_name:
                        problems.append((f"{path}.workload.name", f"{model.workload_name!r} is already the workload "
                                         f"of models.{other_key}; pick another name"))
                        break
            if model.exposure is not None:
                if model.exposure.host in hosts:
                    problems.append(
                        (f"{path}.exposure.host", f"{model.exposure.host} is already exposed by models.{hosts[model.exposure.host]}")
                    )
                hosts[model.exposure.host] = key
            problems += model.problems(path, self.node_pools)
        problems += self._namespace_owned()
        problems += self.namespace.model_hub_egress.problems("namespace.model_hub_egress")
        problems += self._egress_expressible()
        problems += self._exposure_problems()
        for pool_key, pool in self.node_pools.items():
            problems += pool.problems(f"node_pools.{pool_key}")
        problems += self._gpu_demand()
        if self.gateway is not None:
            problems += self.gateway.problems(self.models)
        problems += self._api_keys()
        return problems

    def _egress_expressible(self) -> list[Problem]:
        """Plain NetworkPolicy matches addresses, not names: named hosts cannot be enforced there."""
        hub = self.namespace.model_hub_egress
        if self.cluster.cni == "networkpolicy" and hub.mode == "fqdn":
            return [(
                "namespace.model_hub_egress.mode",
                "plain NetworkPolicy cannot match host names, so the hosts would silently become any address on 443; "
                "set mode: world with a reason (the egress it really gets), or use cni: cilium",
            )]
        return []

    def _exposure_problems(self) -> list[Problem]:
        from config.ingress import SOURCE_RANGE_ANNOTATIONS, TRAEFIK_MIDDLEWARES, program_annotations

        problems: list[Problem] = []
        for key, model in self.models.items():
            exposure = model.exposure
            if exposure is None:
                continue
            if self.cluster.ingress is None:
                problems.append((
                    f"models.{key}.exposure",
                    "the cluster has no ingress controller (cluster.ingress: null); remove exposure or configure one",
                ))
                continue
            if exposure.source_ranges is not None and self.cluster.ingress.kind == "other":
                problems.append((
                    f"models.{key}.exposure.source_ranges",
                    "the program can restrict sources only on ingress-nginx or Traefik (cluster.ingress.kind); restrict "
                    "them in your controller and set source_ranges: null",
                ))
            ours = program_annotations(self.cluster.cert_manager_issuer, self.cluster.ingress.kind, exposure,
                                       self.namespace.name, model.name)
            for name, value in exposure.annotations.items():
                where = f"models.{key}.exposure.annotations.{name}"
                if name == TRAEFIK_MIDDLEWARES:
                    continue  # the user's middlewares run after the program's (components/model_server.py)
                if name in SOURCE_RANGE_ANNOTATIONS:
                    problems.append((where, "who may connect is exposure.source_ranges (ingress-nginx reads this name "
                                     "before the program's); set the ranges there instead"))
                elif name in ours and ours[name] != value:
                    problems.append((
                        where,
                        f"the program sets {ours[name]!r} here (from cluster.cert_manager_issuer, or exposure's "
                        "timeout_seconds / max_body for long streamed answers); remove it, or change those settings",
                    ))
                if self.cluster.public_dns_label and name == self.cluster.public_dns_label:
                    problems.append((f"models.{key}.exposure.annotations.{name}", "would publish the API on the internet; remove it"))
        return problems

    def _gpu_demand(self) -> list[Problem]:
        problems = []
        for pool_key, pool in self.node_pools.items():
            users = [k for k, m in self.models.items() if m.node_pool == pool_key and m.uses_gpu(pool)]
            demand = sum(self.models[k].workload.replicas for k in users)
            gpus = pool.nodes * (pool.gpus_per_node if pool.discrete() else 1)
            if demand > pool.gpu_shares * gpus:
                problems.append((
                    f"node_pools.{pool_key}.gpu_shares",
                    f"{demand} model server pods ({', '.join(users)}) each request {pool.gpu_resource}, but the pool "
                    f"offers {pool.gpu_shares * gpus}; raise the device plugin's -shared-dev-num and gpu_shares",
                ))
        return problems

    def _api_keys(self) -> list[Problem]:
        """llama.cpp's API is unauthenticated unless given a key: required once anything outside its
        namespace (an Ingress, the gateway's Envoy pods) can reach it."""
        problems: list[Problem] = []
        gateway_reaches = self.gateway.local_models() if self.gateway is not None else set()
        for key, model in self.models.items():
            if model.engine != "llamacpp" or (model.role == "embedding" and model.exposure is not None):
                continue  # an exposed embedding server is refused outright, key or not
            if model.api_key is None and (model.exposure is not None or key in gateway_reaches):
                via = "its Ingress" if model.exposure is not None else "the gateway"
                problems.append((
                    f"models.{key}.api_key",
                    f"required: {via} reaches this server from outside its namespace; "
                    "set api_key: {secret_name: ..., from_config: <secret config key>}",
                ))
            elif key in gateway_reaches and model.api_key is not None and model.api_key.from_config is None:
                problems.append((
                    f"models.{key}.api_key.from_config",
                    "the gateway must send this server's key, so the key has to come from Pulumi config",
                ))
        return problems


TOP_LEVEL_KEYS = tuple(StackConfig.model_fields)
