"""The stack's configuration types. Each top-level field of ``StackConfig`` is one Pulumi config
key in the project's namespace (``inference-plane:models``, ``inference-plane:cluster`` ...), so
``pulumi config set --path 'models.chat.ctx_size' 16384`` reaches any field.

Every field says what it is for in its ``description`` (docs/configuration.md's reference is generated from
these). Checks between fields live in ``checks.py``; ``validation.validate_values`` runs them once.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from .defaults import PREFETCH_IMAGE, PRIVATE_SOURCE_RANGES
from .gpus import DEVICE_PLUGIN_SHARING, GpuBackend
from .images import backend_of_image
from .facts import ModelFacts  # noqa: F401 - the config's types are imported from here
from .gateway import GatewayConfig
from .model_settings import OWN, ModelSettings, over_the_catalog
from .cluster import SYSTEM_NAMESPACES, PodPeer, IngressController, ClusterConfig, ModelHubEgress, NamespaceConfig  # noqa: F401 - re-exported
from .on_demand import OnDemand
from .rpc import RpcSplit
from .values import (
    doc,
    Args,
    Cidr,
    ConfigKey,
    Cpu,
    DnsLabel,
    DnsName,
    Duration,
    HfRepo,
    Hostname,
    HttpPath,
    Labels,
    Line,
    Memory,
    Number,
    PinnedImage,
    QualifiedName,
    SecretDataKey,
    ThreadCount,
    Reason,
    RepoId,
    ResourceName,
    Strict,
)

Problem = tuple[str, str]




# --- nodes, storage, start-up --------------------------------------------------------------------




class HostDecodeFigure(Strict):
    """What llama.cpp's decode costs a node's CPU beyond reading the weights, at one thread count
    (engines/llamacpp_host.py, HostCost)."""

    block_us: Annotated[Number, Field(ge=0, le=100_000)] = doc(
        "Microseconds per block the CPU runs, per token (its threads meet after every operation).")
    kv_gbs_per_thread: Annotated[Number, Field(gt=0, le=1000)] = doc(
        "GB/s of KV cache a thread attends over, for 4 query heads per KV head, at 4096 positions in the context.")
    kv_deep_slowdown: Optional[Annotated[Number, Field(ge=1, le=10)]] = doc(
        "The time each position in the context costs at 8192 positions over its time at 4096 (1.2-1.67 on "
        "16-thread Xeons, 1.27-1.49 on a 2-core EPYC): past some depth a CPU's attention slows per position. "
        "Between the two depths the plan draws a line, past 8192 it holds this. null: from none to the most measured "
        "(a range).", default=None)


class NodePool(Strict):
    """Identical nodes that model servers are placed on."""

    instance_type: Optional[DnsName] = doc(
        "node.kubernetes.io/instance-type of the nodes; null when the GPU resource alone places the pods. k3s sets "
        "it to `k3s` on every node: there, tell pools apart with node_labels.",
        default=None,
    )
    node_labels: Labels = doc(
        "Labels the pool's nodes carry and no other node does (e.g. one you apply: `kubectl label node n1 "
        "inference-plane/pool=gpu`); the servers' nodeSelector, with instance_type.",
        default={},
    )
    gpu_resource: Optional[ResourceName] = doc(
        "Extended resource the GPU device plugin advertises, e.g. gpu.intel.com/i915, amd.com/gpu.", default=None
    )
    gpu_shares: Annotated[int, Field(gt=0, le=64)] = doc(
        "Containers that may share one GPU: the device plugin's -shared-dev-num (Intel, default 1) or NVIDIA "
        "time-slicing replicas. Must be 1 where the plugin cannot share (see gpu_sharing).",
        default=1,
    )
    gpu_sharing: Optional[Literal["exclusive", "shared-dev-num", "time-slicing"]] = doc(
        "How the device plugin shares a GPU; null: known from gpu_resource.", default=None
    )
    nodes: Annotated[int, Field(gt=0, le=1000)] = doc("Nodes in the pool: the planner simulates every one.", default=1)
    memory: Memory = doc("Physical memory of one node; on an APU the GPU's memory is this same pool.")
    allocatable: Memory = doc("What the kubelet offers pods on one node (capacity less system and kube reservations).")
    reserved: Memory = doc(
        "Held on each node by workloads this program does not manage (storage daemons, DNS ...).", default="0Gi"
    )
    memory_bandwidth_gbs: Optional[Annotated[Number, Field(gt=0)]] = doc(
        "Sustained memory bandwidth of one node in GB/s, for the decode-speed bound; null: not shown.", default=None
    )
    memory_bandwidth_by_threads: Optional[dict[ThreadCount, Annotated[Number, Field(gt=0)]]] = doc(
        "What the node reads in GB/s with N threads ({4: 28, 8: 49, 16: 82}), measured by `make host-bandwidth` "
        "(and by `make host-profile`): the weights a server keeps in system RAM are read by its --threads, so its "
        "decode follows this figure at that count (interpolated). null: known only between a few GB/s per thread and memory_bandwidth_gbs, "
        "and the plan shows that range.", default=None
    )
    cpu_decode_by_threads: Optional[dict[ThreadCount, HostDecodeFigure]] = doc(
        "What llama.cpp's decode costs the node's CPU beyond reading the weights, with N threads ({4: {block_us: "
        "314, kv_gbs_per_thread: 1.33}}), measured by `make host-profile` (llama-bench on a real-shape model at an "
        "empty context and at depth, printed with the read bandwidth): the KV cache's rate differs from host to host. "
        "null: the plan shows the range between the slowest and the fastest host measured (engines/llamacpp_host.py, "
        "HOST_COST_SLOW and HOST_COST_FAST).", default=None
    )
    cpu_quantized_kv: Optional[dict[Literal["q8_0", "q4_0"], Annotated[Number, Field(ge=0.25, le=20)]]] = doc(
        "What a quantized KV cache costs the node's CPU per position in the context, as a multiple of an f16 cache's "
        "time ({q8_0: 1.82, q4_0: 2.3} on a 2-core EPYC), measured by `make host-profile` (llama-bench at 8192 "
        "positions with each cache type, at the node's largest thread count, against the f16 time there that "
        "cpu_decode_by_threads gives). null: the plan shows the range from the slowest host measured "
        "(engines/llamacpp_speed.py, CPU_QUANTIZED_KV) to an f16 cache's time for 16 query heads (CPU_KV_SHAPES).",
        default=None
    )
    experts_in_ram_us_by_threads: Optional[dict[ThreadCount, Annotated[Number, Field(gt=0, le=100000)]]] = doc(
        "What each block of a mixture-of-experts model whose experts move from the card to system RAM adds to a "
        "token, in microseconds, with N threads ({16: 410}), measured by `make host-profile EXPERTS=1` on the node "
        "with its card (llama-bench on a real-shape Qwen3-30B-A3B Q4_K_M, its experts of 24 and of all 48 blocks in "
        "RAM): the plan solves from it the share of memory_bandwidth_by_threads this node's CPU reads routed experts "
        "at (eight hosts measured: 0.65-1.15; engines/llamacpp_host.py, node_expert_share); a figure that gives a share "
        "outside 0.2-2.0 on the pool's card, a pool without memory_bandwidth_by_threads or without vram, is refused. "
        "null: 0.78, one H200 host's (HOST.expert_share).", default=None
    )
    vram: Optional[Memory] = doc(
        "Memory of one discrete GPU (an RTX 4090: 24Gi). null: unified memory (iGPU/APU), the GPU uses the node's "
        "memory. Set, offloaded layers and their KV cache are planned in VRAM and only the rest in system RAM.",
        default=None,
    )
    gpus_per_node: Annotated[int, Field(gt=0, le=16)] = doc("Discrete GPUs per node the device plugin advertises.", default=1)
    decode_profile: Optional[Literal["nvidia", "nvidia-datacenter", "intel-igpu", "amd-apu", "amd-discrete-rocm",
                                     "amd-discrete-vulkan", "intel-arc-a", "intel-arc-b"]] = doc(
        "How the pool's GPUs turn bandwidth into tokens, for the decode prediction (engines/llamacpp_speed.py: "
        "measured or published per device class; nvidia: GeForce cards, nvidia-datacenter: H100 SXM/H200, a range at another bandwidth, amd-discrete-*: "
        "Radeon RX 7000, intel-arc-a: A770/A750, intel-arc-b: B580/B570). null: by backend and card (cuda: nvidia, rocm "
        "with vram: amd-discrete-rocm, rocm without: amd-apu); Vulkan and SYCL need it named, else no prediction. "
        "What a CPU reads (a CPU pool, layers or experts kept in RAM) follows the node's read bandwidth at the "
        "server's threads (memory_bandwidth_by_threads).",
        default=None,
    )
    vram_bandwidth_gbs: Optional[Annotated[Number, Field(gt=0)]] = doc(
        "Memory bandwidth of one discrete GPU in GB/s (RTX 4090: 1008), for the decode-speed bound.", default=None
    )
    runtime_class: Optional[DnsName] = doc(
        "runtimeClassName for pods that use the GPU: `nvidia` where the NVIDIA container runtime is not the node's "
        "default (k3s and RKE2 ship the class; the GPU Operator creates it).",
        default=None,
    )
    backend: Optional[GpuBackend] = doc(
        "The backend the servers' images are built for (sets the memory overhead); null: read from each server's "
        "image tag (llama.cpp: server-vulkan, server-cuda, server-rocm, server-intel = sycl, server = cpu).",
        default=None,
    )
    supplemental_groups: list[Annotated[int, Field(ge=0)]] = doc(
        "Numeric GIDs of the host's render/video groups, for non-root access to /dev/dri and /dev/kfd (never 0: root's "
        "group would open every root-group file on the node's mounts).", default=[]
    )

    def sharing(self) -> Optional[str]:
        return self.gpu_sharing or DEVICE_PLUGIN_SHARING.get(self.gpu_resource or "")

    def discrete(self) -> bool:
        return self.vram is not None


class HubToken(Strict):
    """A Secret you create (never the program: the token is yours) holding a Hugging Face access token."""

    secret_name: DnsName = doc("The Secret's name, in the stack's namespace.")
    secret_key: SecretDataKey = doc("The key holding the token.", default="token")


class ModelCacheConfig(Strict):
    """The shared volume that holds downloaded weights (the ModelCache component)."""

    claim_name: DnsName = doc("The PersistentVolumeClaim's name.", default="llama-server-models")
    storage_class: DnsName = doc("The claim's storage class (k3s: local-path, on one node's disk).", default="local-path")
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = doc(
        "ReadWriteMany (CephFS, Longhorn RWX, NFS) lets servers on several nodes, a second replica or a benchmark "
        "Job mount the same weights; ReadWriteOnce (local-path) keeps every server that mounts it on one node.",
        default="ReadWriteOnce",
    )
    size: Memory = doc("The claim's size.", default="40Gi")
    mount_path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]*$")] = doc(
        "Where the servers mount it (llama.cpp's LLAMA_CACHE).", default="/models"
    )
    protect: bool = doc("Refuse `pulumi destroy` outright. The claim is always retained on delete either way.", default=False)
    hub_token: Optional[HubToken] = doc(
        "For gated repos (Meta's, Google's own): a Hugging Face token from a Secret, given as HF_TOKEN to every "
        "container that downloads weights (llama.cpp's --hf-repo, the prefetch and the router's downloader) and to "
        "no other; null: public repos only. llama.cpp sends it to the Hub's API only when it is shaped as one (hf_ and "
        "34 or more letters or digits).", default=None)


class Startup(Strict):
    """How long a cold start is expected to take. The startup probe, Pulumi's wait, the Deployment's
    progress deadline and the NotReady alert allow the estimate, but never less than a start at the
    defaults: rates at or above the default rates, and a min_seconds at or below the default, change
    no pod (and restart nothing); a slower estimate lengthens the probe, which restarts the servers
    (the change preview says which)."""

    download_mib_per_s: Annotated[Number, Field(ge=0.1, le=100_000)] = doc(
        "Sustained download rate from the model hub; the seed's 40 min for ~19 GiB assumes about this.", default=8.5
    )
    load_mib_per_s: Annotated[Number, Field(ge=0.1, le=100_000)] = doc(
        "Reading the weights back off the cache volume and onto the GPU.", default=200.0
    )
    min_seconds: Annotated[int, Field(gt=0, le=86_400)] = doc(
        "Never less: image pull on a cold node and Vulkan start-up alone can take minutes.", default=600
    )
    probe_period_seconds: Annotated[int, Field(gt=0, le=3600)] = doc(
        "The startup and readiness probes' period. Part of the pod: changing it restarts the servers.", default=10
    )
    image_pull_seconds: Annotated[int, Field(gt=0, le=86_400)] = doc(
        "Pulling the server image (~1-2 GiB) before the container, and its startup clock, starts.", default=600
    )


# --- model servers -------------------------------------------------------------------------------


class Resources(Strict):
    """CPU and memory of a model server's container. Memory is planned (see the capacity plan)."""

    cpu_request: Cpu = doc("CPU request.")
    cpu_limit: Cpu = doc("CPU limit.")
    memory_request: Optional[Memory] = doc("null: derived from the memory estimate; when set, checked against it.", default=None)
    memory_limit: Optional[Memory] = doc("null: the estimate plus 10%; when set, checked against the estimate.", default=None)
    accepted_risk: Optional[Reason] = doc(
        "A limit below the estimate is refused unless this says why the risk is accepted.", default=None
    )


class OpenAIEngine(Strict):
    """Any other OpenAI-compatible server: its own image, arguments, port and paths."""

    args: Args = doc("The engine's command-line arguments.", default=[])
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = doc(
        "Environment variables for the engine.", default={}
    )
    health_path: HttpPath = doc(
        "Path that answers 200 only once the model is loaded (the probes'); vLLM, SGLang and llama.cpp use /health.",
        default="/health",
    )
    metrics_path: Optional[HttpPath] = doc("Prometheus metrics path; null: not scraped.", default="/metrics")
    served_model: Annotated[Line, Field(min_length=1, max_length=200)] = doc(
        "The model name the engine serves, sent upstream by the gateway (modelNameOverride)."
    )
    resident_memory: Memory = doc("What the engine locks in memory, weights and KV pool together, as measured on the node.")


class Prefetch(Strict):
    """An init container that downloads the weights before the engine starts (idempotent)."""

    repo: RepoId = doc("The Hugging Face repo to download.")
    revision: Annotated[str, Field(pattern=r"^[A-Za-z0-9._/-]+$")] = doc("Branch, tag or 40-hex commit; a commit, once fetched, starts with no Hub.", default="main")
    image: PinnedImage = doc("The init container's image (needs python3; nothing is installed).", default=PREFETCH_IMAGE)
    command: Optional[Annotated[list[Annotated[Line, Field(max_length=4096)]], Field(min_length=1, max_length=64)]] = doc(
        "null: the built-in downloader (incluster/hub_download.py, standard library only, shipped in the pod's programs ConfigMap: no PyPI at start). "
        "Otherwise runs with HF_REPO, HF_REVISION, HOME and HF_HOME set, and must skip files it already has.",
        default=None,
    )


class CacheVolume(Strict):
    """A claim per replica (StatefulSet volumeClaimTemplates) for the prefetched weights."""

    storage_class: DnsName = doc("Storage class of each replica's claim (node-local is typical).")
    size: Memory = doc("Size of each replica's claim.")


class Workload(Strict):
    """How a model server's pods are run."""

    kind: Literal["Deployment", "StatefulSet"] = doc(
        "Deployment (shared cache) or StatefulSet (a claim per replica).", default="Deployment"
    )
    name: Optional[DnsLabel] = doc(
        "The Deployment's or StatefulSet's own name; a StatefulSet's claims are named after it "
        "(weights-<name>-<ordinal>). null: the server's name. When renaming a StatefulSet server, set "
        "this to its old name to keep its claims and the weights in them.",
        default=None,
    )
    replicas: Annotated[int, Field(gt=0, le=100)] = doc("Pods.", default=1)
    one_per_node: bool = doc("Required pod anti-affinity on kubernetes.io/hostname: at most one replica per node.", default=False)
    cache_volume: Optional[CacheVolume] = doc("A claim per replica for prefetched weights (StatefulSet only).", default=None)
    vpa_update_mode: Optional[Literal["Off", "Initial", "Recreate", "Auto"]] = doc(
        "A VerticalPodAutoscaler that may manage CPU only: memory stays pinned (the seed's #2711).", default=None
    )


class Exposure(Strict):
    """An Ingress for the chat endpoint: TLS from cert-manager, no public DNS record, and only the
    source ranges listed may connect."""

    host: Hostname = doc("The LAN host name.")
    source_ranges: Optional[Annotated[list[Cidr], Field(min_length=1)]] = doc(
        "Client address ranges the controller admits (ingress-nginx: whitelist-source-range; Traefik v3: an "
        "ipAllowList Middleware). Only as good as the client address the controller sees: its Service needs "
        "externalTrafficPolicy: Local (or the PROXY protocol), or every client arrives as a node's address. "
        "null: anyone who reaches the controller (the API key is then the only guard).",
        default=PRIVATE_SOURCE_RANGES,
    )
    tls_secret: DnsName = doc("The Secret cert-manager writes the certificate to.")
    timeout_seconds: Annotated[int, Field(ge=60, le=86_400)] = doc(
        "The longest a client waits for the first token or a whole non-streamed answer; the controller's read "
        "timeout is set to it where the controller has one (ingress-nginx).",
        default=3600,
    )
    max_body: Memory = doc("Largest request body (long chat histories, pasted documents).", default="64Mi")
    public_reason: Optional[Reason] = doc(
        "Required when source_ranges admit addresses outside private (RFC 1918), CGNAT and unique-local space: why "
        "this API may be reached from the internet (the summary then says so, with the reason).", default=None)
    annotations: dict[QualifiedName, Annotated[Line, Field(max_length=4096)]] = doc(
        "More Ingress annotations, listed in the summary: only those on the controller's list (config/ingress.py "
        "ALLOWED_ANNOTATIONS: a Homepage entry, ingress-nginx's rate limits, Traefik middlewares), which change "
        "presentation or a limit; everything else (TLS, CORS, paths, hosts, mirrors, DNS publication) is the "
        "program's to set and refused. Those the program sets win (a different value is refused).",
        default={},
    )


class ApiKey(Strict):
    """llama.cpp's --api-key-file, read from a Kubernetes Secret."""

    secret_name: DnsName = doc("The Secret holding the key file.")
    secret_key: SecretDataKey = doc("The key file's name in the Secret.", default="api-keys")
    from_config: Optional[ConfigKey] = doc(
        "A Pulumi secret config key whose value (one key per line) becomes that Secret; null: the Secret is "
        "created outside this program.",
        default=None,
    )


# llama.cpp's KV cache types (--cache-type-k/-v; common/arg.cpp kv_cache_types).


# Defaults that follow from a server's role, used where its stack file leaves the field out.
ROLE_DEFAULTS: dict[str, dict[str, object]] = {
    "embedding": {
        # Nobody chats with an embedding model (asked to, it answers fluent nonsense).
        "webui": False,
        # The host-RAM prompt cache keeps chat prefixes for the next turn; embeddings have none, and
        # llama.cpp's 8 GiB default would be counted (and requested) for nothing.
        "cache_ram_mib": 0,
    },
}


class ModelServer(ModelSettings):
    """One model server: llama.cpp in single-model mode, or another OpenAI-compatible engine."""

    @model_validator(mode="before")
    @classmethod
    def _role_defaults(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("role"), str):
            data = {**ROLE_DEFAULTS.get(data["role"], {}), **data}
        return over_the_catalog(data)

    role: Literal["chat", "embedding"] = doc("chat, or embedding (never on a chat route; behind an Ingress only on request, for /v1/embeddings alone).")
    name: DnsLabel = doc("Name of its Service, its pods' app.kubernetes.io/name and (unless workload.name) its workload.")
    engine: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")] = doc(
        "llamacpp (settings below) or openai (any OpenAI-compatible server, settings under `openai`): an engine "
        "registered in engines/ (an unknown name is refused with the registered ones).",
        default="llamacpp",
    )
    hf_repo: Optional[HfRepo] = doc("llama.cpp's --hf-repo (org/Model-GGUF:QUANT); required for llamacpp.", default=None)
    openai: Optional[OpenAIEngine] = doc("The engine's settings; required for engine openai, refused otherwise.", default=None)
    prefetch: Optional[Prefetch] = doc("Download the weights in an init container before the engine starts.", default=None)
    on_demand: Optional[OnDemand] = doc(
        "Several models behind this one server, each loaded when a request names it (llama.cpp's router; hf_repo "
        "stays null): residency planned from memory.",
        default=None,
    )
    workload: Workload = doc("How the pods are run.", default=Workload())
    backend: Optional[GpuBackend] = doc("Overrides the node pool's backend for this server's image.", default=None)
    image: PinnedImage = doc("The server image, pinned to a build tag or digest.")
    node_pool: DnsLabel = doc("The node_pools key this server runs on.")
    gpus: Annotated[int, Field(ge=1, le=16)] = doc(
        "Discrete GPUs one replica uses (a 70B over two 24 GiB cards): the pod requests this many, the layers are "
        "split evenly (--split-mode layer, --tensor-split) and each card is planned. Time-sliced GPUs cannot be "
        "combined: a pool with gpu_shares > 1 takes 1.",
        default=1,
    )
    threads: Annotated[int, Field(gt=0, le=1024)] = doc("--threads.", default=4)
    cache_ram_mib: Optional[Annotated[int, Field(ge=0, le=1_048_576)]] = doc(
        "Host-RAM prompt cache (--cache-ram, MiB); null: llama.cpp's default of 8192, counted in full (an embedding "
        f"server's default is {ROLE_DEFAULTS['embedding']['cache_ram_mib']}: it has no prompts to reuse).", default=None
    )
    ctx_checkpoints: Optional[Annotated[int, Field(ge=0, le=1024)]] = doc(
        "Context checkpoints per slot (--ctx-checkpoints); null: llama.cpp's 32, each a full copy of a hybrid "
        "model's recurrent state in host RAM.",
        default=None,
    )
    cors_origins: Optional[Annotated[Line, Field(min_length=1, max_length=1000)]] = doc(
        "--cors-origins: which other web origins may read the API's answers. localhost (special): pages served "
        "from localhost only; or one origin such as https://chat.example.org. Never null: without the flag the "
        "server echoes any Origin with credentials allowed (seen running it).",
        default="localhost",
    )
    webui: bool = doc("Serve llama.cpp's WebUI (chat servers only; an embedding server's default is "
                      f"{str(ROLE_DEFAULTS['embedding']['webui']).lower()}).", default=True)
    metrics: bool = doc("--metrics, scraped by the monitoring stack.", default=True)
    port: Annotated[int, Field(ge=1024, le=65535)] = doc(
        "The container port, always passed explicitly: llama.cpp's default moves across builds.", default=8080
    )
    resources: Resources = doc("CPU and memory.")
    exposure: Optional[Exposure] = doc(
        "An Ingress on the LAN. An embedding server's routes only /v1/embeddings (never a chat path) and needs api_key.",
        default=None,
    )
    in_cluster_clients: Annotated[list[PodPeer], Field(max_length=16)] = doc(
        "Pods in other namespaces of this cluster that may call this server (a RAG app's namespace, its pod labels): a "
        "network policy admits them to this server's pods on its port, and no other server's; the summary lists them. "
        "They need api_key like any client from outside the namespace.", default=[])
    api_key: Optional[ApiKey] = doc("llama.cpp's API key; required once anything outside the namespace reaches it.", default=None)
    rpc: Optional[RpcSplit] = doc(
        "Split the model over nodes with llama.cpp's RPC backend, where it fits on no one node; null: one node.",
        default=None)
    extra_args: Args = doc("More llama.cpp flags; flags generated from the fields above are refused here.", default=[])

    def as_single(self, name: str) -> "ModelServer":
        """One on-demand model as a single-model server with this server's settings: what the router
        runs it as (a child process), and what the memory and speed plans are asked about."""
        if self.on_demand is None:
            raise ValueError(f"{self.name}: no on_demand models")
        entry = self.on_demand.models[name]
        own = entry.model_dump(exclude={"pinned"}, exclude_none=True)
        return self.model_copy(update={**own, "on_demand": None, **{field: getattr(entry, field) for field in OWN}})

    @property
    def workload_name(self) -> str:
        """The Deployment's or StatefulSet's name (not its Service's, which is always `name`)."""
        return self.workload.name or self.name

    def uses_gpu(self, pool: NodePool) -> bool:
        return self.gpu_layers > 0 and pool.gpu_resource is not None and self.backend_on(pool) != "cpu"

    def image_backend(self) -> Optional[str]:
        """The backend the image's tag names (llama.cpp's server images), or None when it names none."""
        return backend_of_image(self.image)

    def backend_on(self, pool: NodePool) -> Optional[GpuBackend]:
        """The backend this server runs with: its own setting, the pool's, or its image's."""
        return self.backend or pool.backend or self.image_backend()  # type: ignore[return-value]

    def compute_backend(self, pool: NodePool) -> Optional[str]:
        """Where its layers run on this pool: backend_on when it uses the GPU, else "cpu"."""
        return self.backend_on(pool) if self.uses_gpu(pool) else "cpu"


class Observability(Strict):
    """VictoriaMetrics operator objects: scrapes and alert rules."""

    scrape_interval: Duration = doc("How often /metrics is scraped.", default="60s")
    queue_alert_after: Duration = doc("Requests waiting for a free slot this long mean the server is saturated.", default="5m")
    fallback_alert_after: Duration = doc("Traffic falling back to another tier for this long alerts.", default="15m")


# --- the stack -----------------------------------------------------------------------------------


# What model_hub_egress.mode null becomes on a cluster whose policies cannot name hosts.
PLAIN_POLICY_EGRESS_REASON = "plain NetworkPolicy (cluster.cni: networkpolicy) cannot match the model hub's hosts by name"


class StackConfig(Strict):
    """One cluster's inference plane. Each field is one Pulumi config key."""

    @model_validator(mode="before")
    @classmethod
    def _egress_for_the_cni(cls, data: object) -> object:
        """model_hub_egress.mode null: the narrowest egress the cluster's policies can express."""
        if not isinstance(data, dict):
            return data
        namespace = data.get("namespace", {})
        cluster = data.get("cluster", {})
        if not isinstance(namespace, dict) or not isinstance(cluster, dict):
            return data
        egress = namespace.get("model_hub_egress", {})
        if not isinstance(egress, dict) or egress.get("mode") is not None:
            return data
        cni = cluster.get("cni", ClusterConfig.model_fields["cni"].default)
        resolved = {"mode": "fqdn"} if cni == "cilium" else {"mode": "world", "reason": PLAIN_POLICY_EGRESS_REASON}
        return {**data, "namespace": {**namespace, "model_hub_egress": {**egress, **resolved, **(
            {"reason": egress["reason"]} if egress.get("reason") else {})}}}

    cluster: ClusterConfig = doc("The cluster.", default=ClusterConfig())
    namespace: NamespaceConfig = doc("The namespace everything lives in.", default=NamespaceConfig())
    node_pools: Annotated[dict[DnsLabel, NodePool], Field(min_length=1)] = doc("Where model servers run.")
    model_cache: ModelCacheConfig = doc("The shared weights volume.")
    startup: Startup = doc("Cold-start budgets.", default=Startup())
    models: Annotated[dict[DnsLabel, ModelServer], Field(min_length=1)] = doc("The model servers, by key.")
    gateway: Optional[GatewayConfig] = doc("Envoy AI Gateway in front of the servers; null: none.", default=None)
    observability: Optional[Observability] = doc("Scrapes and alerts; null: none.", default=None)

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


TOP_LEVEL_KEYS = tuple(StackConfig.model_fields)
