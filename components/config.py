"""The stack's configuration: the one place where user input is checked.

Every top-level field of ``StackConfig`` is one Pulumi config key in the project's namespace
(``inference-plane:models``, ``inference-plane:cluster`` ...), so
``pulumi config set --path 'models.chat.ctx_size' 16384`` reaches any field. Unknown keys are
errors at every level, and every error names the config path it is about.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from typing import Annotated, Any, Literal, Mapping, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from policy.rules import PINNED_IMAGE

from .meta import OFFLINE_SECRET_PLACEHOLDER, one_line
from .quantity import parse_quantity

PROJECT = "inference-plane"


class ConfigError(Exception):
    """Invalid stack config. ``str()`` is one line that names the config path and the fix."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        first = "; ".join(f"{path}: {message}" for path, message in problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        super().__init__(one_line(f"invalid stack config: {first}{more}"))


# --- value types -------------------------------------------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_FQDN_PATTERN = re.compile(r"^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*:[A-Za-z0-9_]+$")
# The policy pack's definition of a pinned image, so that config and policy never disagree.
_PINNED_IMAGE = PINNED_IMAGE
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_CONFIG_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def _matches(pattern: re.Pattern[str], what: str):
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def _memory(value: str) -> str:
    parse_quantity(value)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)", value):
        raise ValueError(f"{value!r}: write memory with a binary suffix, e.g. 24Gi or 512Mi")
    return value


def _cpu(value: str) -> str:
    if not re.fullmatch(r"([0-9]+m|[0-9]+(\.[0-9]+)?)", value):
        raise ValueError(f"{value!r} is not a CPU quantity (examples: 500m, 2)")
    return value


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key, label in value.items():
        if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(label):
            raise ValueError(f"{key}={label!r} is not a valid Kubernetes label")
    return value


DnsLabel = Annotated[str, _matches(_DNS_LABEL, "a DNS label (lower-case letters, digits, '-', at most 63)")]
DnsName = Annotated[str, _matches(_DNS_NAME, "a DNS subdomain name (lower-case letters, digits, '-', '.')")]
Hostname = Annotated[str, _matches(_HOSTNAME, "a fully qualified host name such as llm.example.org")]
FqdnPattern = Annotated[str, _matches(_FQDN_PATTERN, "a host name or a '*.' wildcard host name")]
HfRepo = Annotated[str, _matches(_HF_REPO, "a Hugging Face repo with a quant, such as org/Model-GGUF:Q4_K_M")]
RepoId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$")]
Duration = Annotated[str, _matches(_DURATION, "a duration such as 600s, 5m or 1h")]
HttpPath = Annotated[str, Field(pattern=r"^/[A-Za-z0-9._~/-]*$")]
PinnedImage = Annotated[
    str, _matches(_PINNED_IMAGE, "a pinned image: registry/name:<build or version tag, e.g. b10731> or @sha256:<digest>")
]
def _number_as_quantity(value: Any) -> Any:
    """`pulumi config set --path x.cpu_limit 6` stores the number 6: a whole number is the quantity "6"."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Memory = Annotated[str, BeforeValidator(_number_as_quantity), AfterValidator(_memory)]
Cpu = Annotated[str, BeforeValidator(_number_as_quantity), AfterValidator(_cpu)]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]
ConfigKey = Annotated[str, _matches(_CONFIG_KEY, "a config key name (lower-case, digits, '_')")]
Positive = Annotated[int, Field(gt=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


# --- cluster -------------------------------------------------------------------------------------


class PodPeer(Strict):
    """A set of pods in another namespace that the inference namespace talks to."""

    namespace: DnsLabel
    pod_labels: Labels = {}


class IngressController(Strict):
    class_name: DnsName = "traefik"
    namespace: DnsLabel = "ingress"
    pod_labels: Labels = {"app.kubernetes.io/name": "traefik"}


class ClusterConfig(Strict):
    # Checks every rendered manifest against this Kubernetes version's schemas.
    kubernetes_version: Annotated[str, Field(pattern=r"^1\.[0-9]{2}$")] = "1.33"
    # cilium: CiliumNetworkPolicy (ICMP and host entities expressible); networkpolicy: plain NetworkPolicy.
    cni: Literal["cilium", "networkpolicy"] = "cilium"
    ingress: IngressController = IngressController()
    cert_manager_issuer: DnsName = "letsencrypt-cluster"
    # Scrapes /metrics; None when the cluster runs no monitoring.
    monitoring: Optional[PodPeer] = PodPeer(namespace="monitoring")
    # Where the model cache's storage lives (CephFS: the rook-ceph namespace); None for node-local storage.
    storage: Optional[PodPeer] = PodPeer(namespace="rook-ceph")
    dns: PodPeer = PodPeer(namespace="kube-system", pod_labels={"k8s-app": "kube-dns"})
    # A label that makes external-dns publish a record on the internet. The program never sets it,
    # and refuses any exposure that asks for it: the llama.cpp API must stay LAN-only.
    public_dns_label: Optional[str] = None


class ModelHubEgress(Strict):
    # fqdn: only the model hub's hosts (Cilium toFQDNs). world: any address, as the seed had it.
    # Image pulls are the kubelet's, not the pod's, so pods need nothing else from the internet.
    mode: Literal["fqdn", "world"] = "fqdn"
    # Hugging Face serves repo metadata from huggingface.co and the files from its CDN and Xet
    # storage hosts (cdn-lfs*.hf.co, cas-bridge.xethub.hf.co), so all of them are needed.
    hosts: list[FqdnPattern] = Field(
        default=["huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co", "*.xethub.hf.co"], min_length=1
    )
    # Required with mode world: why the hosts cannot be named (recorded on the policy object).
    reason: Optional[Annotated[str, Field(min_length=10, max_length=300)]] = None


class NamespaceConfig(Strict):
    name: DnsLabel = "ai"
    # The pods need no privilege: the GPU comes in through the device-plugin API.
    pod_security: Literal["restricted", "baseline", "privileged"] = "restricted"
    model_hub_egress: ModelHubEgress = ModelHubEgress()


# --- nodes, storage, start-up --------------------------------------------------------------------


Backend = Literal["vulkan", "rocm", "cuda", "cpu"]
# What each known device plugin can do with one GPU. ROCm's k8s-device-plugin advertises each GPU
# exactly once (sharing is an open request upstream); Intel's plugin shares by -shared-dev-num;
# NVIDIA's by time-slicing replicas in its config.
DEVICE_PLUGIN_SHARING = {
    "amd.com/gpu": "exclusive",
    "gpu.intel.com/i915": "shared-dev-num",
    "gpu.intel.com/xe": "shared-dev-num",
    "nvidia.com/gpu": "time-slicing",
}


class NodePool(Strict):
    """Identical nodes that model servers are placed on."""

    # node.kubernetes.io/instance-type; None when the GPU resource alone places the pods.
    instance_type: Optional[DnsName] = None
    # Extended resource the GPU device plugin advertises, e.g. gpu.intel.com/i915, amd.com/gpu.
    gpu_resource: Optional[Annotated[str, _matches(_LABEL_KEY, "a resource name such as gpu.intel.com/i915")]] = None
    # Containers that may share one GPU: the device plugin's -shared-dev-num (Intel default 1) or
    # NVIDIA time-slicing replicas. Must be 1 where the plugin cannot share (see gpu_sharing).
    gpu_shares: Annotated[int, Field(gt=0, le=64)] = 1
    # How the device plugin shares a GPU; None: known from gpu_resource (DEVICE_PLUGIN_SHARING).
    gpu_sharing: Optional[Literal["exclusive", "shared-dev-num", "time-slicing"]] = None

    def sharing(self) -> Optional[str]:
        return self.gpu_sharing or DEVICE_PLUGIN_SHARING.get(self.gpu_resource or "")
    # A small cluster's pool: the planner simulates every node.
    nodes: Annotated[int, Field(gt=0, le=1000)] = 1
    # Physical memory of one node; on an APU the GPU's "VRAM" is this same pool.
    memory: Memory
    # What the kubelet offers pods (capacity less system and kube reservations).
    allocatable: Memory
    # Held on each node by workloads this program does not manage (storage daemons, DNS ...).
    reserved: Memory = "0Gi"
    # Sustained memory bandwidth of one node in GB/s, for the decode-speed bound; None: not shown.
    memory_bandwidth_gbs: Optional[Annotated[float, Field(gt=0)]] = None
    # The GPU backend the servers' image uses; sets the default memory overhead.
    backend: Backend = "vulkan"
    # Numeric GIDs of the host's render/video groups, for non-root access to /dev/dri and /dev/kfd.
    supplemental_groups: list[Annotated[int, Field(ge=0)]] = []


class ModelCache(Strict):
    claim_name: DnsName = "llama-server-models"
    storage_class: DnsName
    # ReadWriteMany so both servers, a second replica or a benchmark Job mount the same weights.
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = "ReadWriteMany"
    size: Memory = "40Gi"
    mount_path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]*$")] = "/models"
    # Refuse `pulumi destroy` outright. The claim is always retained on delete either way.
    protect: bool = False


class Startup(Strict):
    """How long a cold start may take, from which probes and Pulumi's wait are derived."""

    # The seed's budget of 40 min for ~19 GiB of weights assumes about this sustained rate.
    download_mib_per_s: Annotated[float, Field(ge=0.1, le=100_000)] = 8.5
    # Reading the weights back off the cache volume and onto the GPU.
    load_mib_per_s: Annotated[float, Field(ge=0.1, le=100_000)] = 200.0
    # Never less: image pull on a cold node and Vulkan start-up alone can take minutes.
    min_seconds: Annotated[int, Field(gt=0, le=86_400)] = 600
    probe_period_seconds: Annotated[int, Field(gt=0, le=3600)] = 10
    # Pulling the server image (~1-2 GiB) before the container, and its startup clock, starts.
    image_pull_seconds: Annotated[int, Field(gt=0, le=86_400)] = 600


# --- model servers -------------------------------------------------------------------------------


class Resources(Strict):
    cpu_request: Cpu
    cpu_limit: Cpu
    # Derived from the memory estimate when not set; when set, checked against it.
    memory_request: Optional[Memory] = None
    memory_limit: Optional[Memory] = None
    # A limit below the estimate is refused unless this says why the risk is accepted.
    accepted_risk: Optional[Annotated[str, Field(min_length=10, max_length=300)]] = None


class ModelFacts(Strict):
    """What the memory model needs to know about a model's architecture."""

    params_b: Annotated[float, Field(gt=0)]
    # Parameters read per token, for mixture-of-experts; None: dense (all of them).
    active_params_b: Optional[Annotated[float, Field(gt=0)]] = None
    layers: Positive
    # Layers with a KV cache; hybrid models (Gated DeltaNet, Mamba) have fewer than `layers`.
    full_attention_layers: Optional[Positive] = None
    kv_heads: Positive
    head_dim: Positive
    # Fixed-size recurrent state per slot (hybrid models), independent of context.
    recurrent_state_mib: Annotated[float, Field(ge=0)] = 0.0
    # Overrides the quant's table value (engines whose checkpoints are not GGUF).
    bits_per_weight: Optional[Annotated[float, Field(gt=0, le=32)]] = None
    # Embedding models: how the server pools token vectors into one (the GGUF's pooling_type).
    # mean and cls need the whole input in one micro-batch: llama.cpp refuses a longer input (HTTP 500).
    pooling: Optional[Literal["none", "mean", "cls", "last", "rank"]] = None


class OpenAIEngine(Strict):
    """Any OpenAI-compatible server: its own image, arguments, port and paths."""

    args: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = []
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    health_path: HttpPath = "/health"
    metrics_path: Optional[HttpPath] = "/metrics"
    # The model name the engine serves, sent upstream by the gateway (modelNameOverride).
    served_model: Annotated[str, Field(min_length=1, max_length=200)]
    # What the engine locks in memory, weights and KV pool together, as measured on the node.
    resident_memory: Memory


_PREFETCH_COMMAND = [
    "sh",
    "-c",
    'pip install --quiet --no-cache-dir --user "huggingface_hub[hf_xet]==0.35.3" && '
    'exec "$PYTHONUSERBASE/bin/hf" download "$HF_REPO" --revision "$HF_REVISION"',
]


class Prefetch(Strict):
    """An init container that downloads the weights before the engine starts (idempotent)."""

    repo: RepoId
    revision: Annotated[str, Field(pattern=r"^[A-Za-z0-9._/-]+$")] = "main"
    image: PinnedImage = "docker.io/library/python:3.12.11-slim-bookworm"
    # Runs with HF_REPO, HF_REVISION, HOME and PYTHONUSERBASE set; hf download skips files it has.
    command: list[str] = Field(default=_PREFETCH_COMMAND, min_length=1)


class CacheVolume(Strict):
    """A claim per replica (StatefulSet volumeClaimTemplates) for the prefetched weights."""

    storage_class: DnsName
    size: Memory


class Workload(Strict):
    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    replicas: Annotated[int, Field(gt=0, le=100)] = 1
    # Required pod anti-affinity on kubernetes.io/hostname: at most one replica per node.
    one_per_node: bool = False
    cache_volume: Optional[CacheVolume] = None
    # A VerticalPodAutoscaler that may only manage CPU: memory stays pinned (the seed's #2711).
    vpa_update_mode: Optional[Literal["Off", "Initial", "Recreate", "Auto"]] = None


class Exposure(Strict):
    """An Ingress for the chat endpoint: LAN-only, TLS from cert-manager."""

    host: Hostname
    tls_secret: DnsName


class ApiKey(Strict):
    """llama.cpp's --api-key-file, read from a Kubernetes Secret."""

    secret_name: DnsName
    secret_key: Annotated[str, Field(pattern=r"^[-._a-zA-Z0-9]+$")] = "api-keys"
    # A Pulumi secret config key whose value (one key per line) becomes that Secret.
    # None: the Secret is created outside this program.
    from_config: Optional[ConfigKey] = None


class ModelServer(Strict):
    """One model server: llama.cpp in single-model mode, or another OpenAI-compatible engine."""

    role: Literal["chat", "embedding"]
    # Name of the workload, its Service and its pods' app.kubernetes.io/name.
    name: DnsLabel
    engine: Literal["llamacpp", "openai"] = "llamacpp"
    # llama.cpp's --hf-repo; required for llamacpp.
    hf_repo: Optional[HfRepo] = None
    openai: Optional[OpenAIEngine] = None
    prefetch: Optional[Prefetch] = None
    workload: Workload = Workload()
    # Overrides the node pool's backend for this server's image.
    backend: Optional[Backend] = None
    image: PinnedImage
    node_pool: DnsLabel
    # Size of the GGUF download; None: derived from params_b x the quant's bits per weight.
    weights: Optional[Memory] = None
    # None: taken from components/catalog.py by hf_repo.
    facts: Optional[ModelFacts] = None
    gpu_layers: Annotated[int, Field(ge=0, le=999)] = 99
    threads: Annotated[int, Field(gt=0, le=1024)] = 4
    ctx_size: Annotated[int, Field(gt=0, le=4_194_304)] = 4096
    ubatch_size: Optional[Annotated[int, Field(gt=0, le=65536)]] = None
    # Slots (--parallel). None: the server's auto, 4 slots sharing one unified KV pool.
    parallel: Optional[Annotated[int, Field(gt=0, le=256)]] = None
    # Host-RAM prompt cache (--cache-ram, MiB). None: llama.cpp's default of 8192, counted in full.
    cache_ram_mib: Optional[Annotated[int, Field(ge=0, le=1_048_576)]] = None
    # Context checkpoints per slot (--ctx-checkpoints). None: llama.cpp's default of 32; each is a
    # full copy of a hybrid model's recurrent state in host RAM.
    ctx_checkpoints: Optional[Annotated[int, Field(ge=0, le=1024)]] = None
    # The server otherwise allows every origin: any page a LAN browser visits could call the API.
    cors_origins: Optional[Annotated[str, Field(min_length=1, max_length=1000)]] = "localhost"
    webui: bool = True
    metrics: bool = True
    port: Annotated[int, Field(ge=1024, le=65535)] = 8080
    resources: Resources
    exposure: Optional[Exposure] = None
    api_key: Optional[ApiKey] = None
    extra_args: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = []


# --- the gateway ---------------------------------------------------------------------------------


class RemoteProvider(Strict):
    """An OpenAI-compatible provider on the internet, reached over TLS with its own key."""

    host: Hostname
    port: Annotated[int, Field(ge=1, le=65535)] = 443
    # Path before /chat/completions: /v1 for most, /api/v1 for OpenRouter.
    prefix: HttpPath = "/v1"
    # The Pulumi secret config key holding the provider's API key.
    api_key_config: Optional[ConfigKey] = None


class Tier(Strict):
    """Where a route's backend lives: one of this stack's model servers, or a remote provider."""

    local: Optional[DnsLabel] = None
    remote: Optional[RemoteProvider] = None


class RouteBackend(Strict):
    tier: DnsLabel
    # The model name sent to this tier; None: the local engine's served name, or the public name.
    model: Optional[Annotated[str, Field(min_length=1, max_length=200)]] = None


class Route(Strict):
    """One public model name, tried on its backends in order (priority 0, 1, ...)."""

    model: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/@-]+$")]
    kind: Literal["chat", "embedding"] = "chat"
    backends: Annotated[list[RouteBackend], Field(min_length=1, max_length=16)]


class ApiClient(Strict):
    # A Pulumi secret config key holding this client's key; None: derived from the master key.
    key_config: Optional[ConfigKey] = None


class Retry(Strict):
    num_retries: Annotated[int, Field(ge=0, le=10)] = 3
    # One attempt per priority: a failing tier hands the request to the next one at once.
    attempts_per_priority: Annotated[int, Field(ge=1, le=5)] = 1
    status_codes: list[Annotated[int, Field(ge=400, le=599)]] = [429, 500, 502, 503, 504]
    # Embedding routes fail over only when the local server could not take the request at all
    # (connection failures, resets, 502/503/504 while it loads or restarts). Never on 4xx or 500:
    # llama.cpp answers 500 to an input longer than its micro-batch, and re-sending that document
    # to a remote tier would move private data off the cluster for a request that is simply too large.
    embedding_status_codes: list[Annotated[int, Field(ge=502, le=504)]] = [502, 503, 504]


class LlamaCppEmbeddingsPath(Strict):
    """A plain HTTPRoute straight to a llama.cpp embedding server, bypassing the AI gateway."""

    model: DnsLabel  # models.<key>
    path: HttpPath = "/llama-cpp/v1/embeddings"
    # A whole document batch can take minutes on an iGPU; the AI routes have no request timeout.
    timeout: Duration = "600s"


class Gateway(Strict):
    name: DnsLabel = "inference"
    class_name: DnsLabel = "envoy-ai-gateway"
    create_class: bool = True
    hostname: Hostname
    port: Annotated[int, Field(ge=1, le=65535)] = 443
    tls_secret: DnsName
    # Only reachable on the tailnet: the Envoy Service gets this load-balancer class, never a public LB.
    load_balancer_class: Annotated[str, Field(min_length=1)] = "tailscale"
    envoy_namespace: DnsLabel = "envoy-gateway-system"
    # Secret or ConfigMap with ca.crt: clients must present a certificate it signed. None: no mTLS.
    client_ca_secret: Optional[DnsName] = None
    # Envoy Gateway's default of 32 KiB rejects ordinary chat payloads with 413.
    buffer_limit: Memory = "50Mi"
    # Ends a stream that sends nothing for this long; generation length itself is unbounded.
    stream_idle_timeout: Duration = "300s"
    api_key_header: Annotated[str, Field(pattern=r"^[a-z0-9-]+$")] = "x-api-key"
    clients: Annotated[dict[DnsLabel, ApiClient], Field(min_length=1)]
    # Pulumi secret config key from which clients without key_config get their keys (HMAC).
    master_key_config: Optional[ConfigKey] = None
    tiers: Annotated[dict[DnsLabel, Tier], Field(min_length=1)]
    routes: list[Route] = []
    # Tiers tried, in order, for any model no route names; the model name passes through.
    catch_all: list[DnsLabel] = []
    session_header: Annotated[str, Field(pattern=r"^[a-z0-9-]+$")] = "x-sks-session-id"
    retry: Retry = Retry()
    llamacpp_embeddings: Optional[LlamaCppEmbeddingsPath] = None


class Observability(Strict):
    """VictoriaMetrics operator objects: scrapes and alert rules."""

    scrape_interval: Duration = "60s"
    # Requests waiting for a free slot this long mean the server is saturated.
    queue_alert_after: Duration = "5m"
    fallback_alert_after: Duration = "15m"


# --- the stack -----------------------------------------------------------------------------------


class StackConfig(Strict):
    cluster: ClusterConfig = ClusterConfig()
    namespace: NamespaceConfig = NamespaceConfig()
    node_pools: Annotated[dict[DnsLabel, NodePool], Field(min_length=1)]
    model_cache: ModelCache
    startup: Startup = Startup()
    models: Annotated[dict[DnsLabel, ModelServer], Field(min_length=1)]
    gateway: Optional[Gateway] = None
    observability: Optional[Observability] = None

    def secret_config_keys(self) -> set[str]:
        keys = {m.api_key.from_config for m in self.models.values() if m.api_key and m.api_key.from_config}
        if self.gateway is not None:
            keys |= {c.key_config for c in self.gateway.clients.values() if c.key_config}
            keys |= {t.remote.api_key_config for t in self.gateway.tiers.values() if t.remote and t.remote.api_key_config}
            if self.gateway.master_key_config:
                keys.add(self.gateway.master_key_config)
        return keys


TOP_LEVEL_KEYS = tuple(StackConfig.model_fields)
_GENERATED_FLAGS = {
    "--hf-repo", "-hf", "-hfr", "--model", "-m", "--n-gpu-layers", "-ngl", "--gpu-layers", "--threads", "-t",
    "--ctx-size", "-c", "--ubatch-size", "-ub", "--cors-origins", "--host", "--port", "--api-key",
    "--api-key-file", "--metrics", "--embeddings", "--embedding", "--no-webui", "--webui", "--no-ui", "--ui", "--parallel", "-np",
    "--cache-ram", "-cram", "--ctx-checkpoints", "-ctxcp", "--pooling",
}


def _relations(stack: StackConfig) -> list[tuple[str, str]]:
    """Checks between fields that no single field's type can express."""
    problems: list[tuple[str, str]] = []
    names: dict[str, str] = {}
    hosts: dict[str, str] = {}
    gpu_users: dict[str, list[str]] = {}
    for key, model in stack.models.items():
        path = f"models.{key}"
        if model.name in names:
            problems.append((f"{path}.name", f"{model.name!r} is already the name of models.{names[model.name]}"))
        names[model.name] = key
        pool = stack.node_pools.get(model.node_pool)
        if pool is None:
            problems.append(
                (f"{path}.node_pool", f"no node pool {model.node_pool!r}; defined: {', '.join(stack.node_pools)}")
            )
        elif model.gpu_layers > 0:
            if pool.gpu_resource is None:
                problems.append(
                    (
                        f"node_pools.{model.node_pool}.gpu_resource",
                        f"models.{key} offloads {model.gpu_layers} layers to a GPU, so its node pool must name the "
                        "GPU resource (e.g. gpu.intel.com/i915), or set gpu_layers: 0",
                    )
                )
            else:
                gpu_users.setdefault(model.node_pool, []).append(key)
        if model.role == "embedding":
            if model.exposure is not None:
                problems.append(
                    (
                        f"{path}.exposure",
                        "an embedding model must not be exposed: asked to chat it answers fluent nonsense "
                        "('capital capital ...') instead of an error; remove exposure and call it in-cluster",
                    )
                )
            if model.webui:
                problems.append((f"{path}.webui", "an embedding server has no use for the WebUI; set webui: false"))
        if model.exposure is not None:
            if model.exposure.host in hosts:
                problems.append(
                    (f"{path}.exposure.host", f"{model.exposure.host} is already exposed by models.{hosts[model.exposure.host]}")
                )
            hosts[model.exposure.host] = key
        if model.engine == "llamacpp" and model.hf_repo is None:
            problems.append((f"{path}.hf_repo", "required for engine llamacpp (org/Model-GGUF:QUANT)"))
        if model.engine == "openai" and model.openai is None:
            problems.append((f"{path}.openai", "required for engine openai: served_model, resident_memory, args"))
        if model.engine == "openai" and (model.api_key is not None or model.extra_args):
            problems.append((f"{path}.engine", "api_key and extra_args are llama.cpp settings; use openai.args"))
        workload = model.workload
        if workload.cache_volume is not None and workload.kind != "StatefulSet":
            problems.append((f"{path}.workload.cache_volume", "a claim per replica needs kind: StatefulSet"))
        if model.prefetch is not None and workload.cache_volume is None:
            problems.append((f"{path}.prefetch", "prefetched weights need workload.cache_volume to land in"))
        if pool is not None and workload.one_per_node and workload.replicas > pool.nodes:
            problems.append(
                (
                    f"{path}.workload.replicas",
                    f"{workload.replicas} replicas, one per node, but node pool {model.node_pool} has {pool.nodes} nodes",
                )
            )
        if model.ubatch_size is not None and model.ubatch_size > model.ctx_size:
            problems.append((f"{path}.ubatch_size", f"{model.ubatch_size} exceeds ctx_size {model.ctx_size}"))
        for index, arg in enumerate(model.extra_args):
            if arg.split("=", 1)[0] in _GENERATED_FLAGS:
                problems.append(
                    (f"{path}.extra_args[{index}]", f"{arg} is generated from a typed field; set that field instead")
                )
        if model.resources.memory_request and model.resources.memory_limit:
            request = parse_quantity(model.resources.memory_request)
            if request > parse_quantity(model.resources.memory_limit):
                problems.append((f"{path}.resources.memory_request", "is larger than memory_limit"))
        if parse_quantity(model.resources.cpu_request) > parse_quantity(model.resources.cpu_limit):
            problems.append((f"{path}.resources.cpu_request", "is larger than cpu_limit"))
    hub = stack.namespace.model_hub_egress
    if hub.mode == "world" and hub.reason is None:
        problems.append(
            ("namespace.model_hub_egress.reason", "world egress needs a reason; prefer mode: fqdn with the hosts named")
        )
    for pool_key, pool in stack.node_pools.items():
        if pool.sharing() == "exclusive" and pool.gpu_shares > 1:
            problems.append((
                f"node_pools.{pool_key}.gpu_shares",
                f"{pool.gpu_resource}'s device plugin gives each GPU to one container only; set gpu_shares: 1 and "
                "run other model servers on the CPU (gpu_layers: 0) or on another pool",
            ))
    for pool_key, users in gpu_users.items():
        pool = stack.node_pools[pool_key]
        demand = sum(stack.models[k].workload.replicas for k in users)
        if demand > pool.gpu_shares * pool.nodes:
            problems.append(
                (
                    f"node_pools.{pool_key}.gpu_shares",
                    f"{demand} model server pods ({', '.join(users)}) each request {pool.gpu_resource}, but the pool "
                    f"offers {pool.gpu_shares * pool.nodes}; raise the device plugin's -shared-dev-num and gpu_shares",
                )
            )
    if stack.gateway is not None:
        problems += _gateway_relations(stack, stack.gateway)
    problems += _api_key_relations(stack)
    return problems


def _api_key_relations(stack: StackConfig) -> list[tuple[str, str]]:
    """llama.cpp's API is unauthenticated unless given a key: required once anything outside its
    namespace (an Ingress, the gateway's Envoy pods) can reach it."""
    problems: list[tuple[str, str]] = []
    gateway = stack.gateway
    gateway_reaches = set()
    if gateway is not None:
        gateway_reaches = {t.local for t in gateway.tiers.values() if t.local}
        if gateway.llamacpp_embeddings is not None:
            gateway_reaches.add(gateway.llamacpp_embeddings.model)
    for key, model in stack.models.items():
        if model.engine != "llamacpp" or (model.role == "embedding" and model.exposure is not None):
            continue  # an exposed embedding server is refused outright, key or not
        if model.api_key is None and (model.exposure is not None or key in gateway_reaches):
            via = "its Ingress" if model.exposure is not None else "the gateway"
            problems.append(
                (
                    f"models.{key}.api_key",
                    f"required: {via} reaches this server from outside its namespace; "
                    "set api_key: {secret_name: ..., from_config: <secret config key>}",
                )
            )
        elif key in gateway_reaches and model.api_key is not None and model.api_key.from_config is None:
            problems.append(
                (
                    f"models.{key}.api_key.from_config",
                    "the gateway must send this server's key, so the key has to come from Pulumi config",
                )
            )
    return problems


def _gateway_relations(stack: StackConfig, gateway: Gateway) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for name, tier in gateway.tiers.items():
        path = f"gateway.tiers.{name}"
        if (tier.local is None) == (tier.remote is None):
            problems.append((path, "set exactly one of local (a models key) or remote (a provider)"))
        elif tier.local is not None and tier.local not in stack.models:
            problems.append((f"{path}.local", f"no model server {tier.local!r}; defined: {', '.join(stack.models)}"))
        elif tier.remote is not None and tier.remote.api_key_config is None:
            problems.append(
                (f"{path}.remote.api_key_config", "a remote tier needs its provider key: name a Pulumi secret config key")
            )

    def role_of(tier_name: str) -> Optional[str]:
        tier = gateway.tiers.get(tier_name)
        if tier is None or tier.local is None or tier.local not in stack.models:
            return None
        return stack.models[tier.local].role

    seen: dict[str, int] = {}
    for index, route in enumerate(gateway.routes):
        path = f"gateway.routes[{index}]"
        if route.model in seen:
            problems.append((f"{path}.model", f"{route.model!r} is already routed by gateway.routes[{seen[route.model]}]"))
        seen[route.model] = index
        tiers = [b.tier for b in route.backends]
        if len(set(tiers)) != len(tiers):
            problems.append((f"{path}.backends", "a tier appears twice; each tier is one priority"))
        for b_index, backend in enumerate(route.backends):
            if backend.tier not in gateway.tiers:
                problems.append(
                    (f"{path}.backends[{b_index}].tier", f"no tier {backend.tier!r}; defined: {', '.join(gateway.tiers)}")
                )
                continue
            role = role_of(backend.tier)
            if role == "embedding" and route.kind == "chat":
                problems.append(
                    (
                        f"{path}.backends[{b_index}].tier",
                        f"{backend.tier} serves an embedding model; a chat route to it answers nonsense "
                        "('capital capital ...'); use kind: embedding or another tier",
                    )
                )
            if role == "chat" and route.kind == "embedding":
                problems.append((f"{path}.backends[{b_index}].tier", f"{backend.tier} serves a chat model, not embeddings"))
    for index, tier_name in enumerate(gateway.catch_all):
        if tier_name not in gateway.tiers:
            problems.append((f"gateway.catch_all[{index}]", f"no tier {tier_name!r}; defined: {', '.join(gateway.tiers)}"))
        elif role_of(tier_name) == "embedding":
            problems.append((f"gateway.catch_all[{index}]", f"{tier_name} serves an embedding model; it cannot take any model"))
    if not gateway.routes and not gateway.catch_all:
        problems.append(("gateway.routes", "the gateway routes nothing: add routes or catch_all"))
    owners: dict[str, str] = {}
    for client, settings in gateway.clients.items():
        if settings.key_config is None and gateway.master_key_config is None:
            problems.append(
                (f"gateway.clients.{client}.key_config", "set it, or gateway.master_key_config to derive the key")
            )
        elif settings.key_config is not None:
            if settings.key_config in owners:
                problems.append(
                    (
                        f"gateway.clients.{client}.key_config",
                        f"{settings.key_config} is already the key of client {owners[settings.key_config]}; "
                        "one key per client identity",
                    )
                )
            owners[settings.key_config] = client
    embeddings = gateway.llamacpp_embeddings
    if embeddings is not None:
        target = stack.models.get(embeddings.model)
        if target is None or target.role != "embedding" or target.engine != "llamacpp":
            problems.append(("gateway.llamacpp_embeddings.model", "must name a llama.cpp embedding server in models"))
    return problems


def _path_part(part: Any) -> str:
    """A path segment as the user typed it, or quoted when it holds anything unusual."""
    text = str(part)
    return text if re.fullmatch(r"[A-Za-z0-9_./:-]{1,80}", text) else repr(text)[:80]


def _keys_at(loc: tuple) -> list[str]:
    """The field names valid at a config path (for "did you mean"): walks the models' annotations,
    through Optional/Annotated, dict values and list items (whose key or index is the next part)."""

    def unwrap(annotation: Any) -> tuple[Any, bool]:
        """(a model class or None, whether a dict key / list index comes first)."""
        while getattr(annotation, "model_fields", None) is None:
            origin, args = typing.get_origin(annotation), [a for a in typing.get_args(annotation) if a is not type(None)]
            if origin in (dict, list):
                inner, _ = unwrap(args[-1]) if args else (None, False)
                return inner, True
            if not args:
                return None, False
            annotation = args[0]
        return annotation, False

    current, keyed = StackConfig, False
    for part in loc:
        if current is None:
            return []
        if keyed:
            keyed = False
            continue
        field = current.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        current, keyed = unwrap(field.annotation)
    return [] if current is None or keyed else list(current.model_fields)


def _describe(error: Mapping[str, Any]) -> tuple[str, str]:
    path = ".".join(_path_part(part) for part in error["loc"]) or "(stack)"
    kind = error["type"]
    if kind == "extra_forbidden":
        near = difflib.get_close_matches(str(error["loc"][-1]), _keys_at(error["loc"][:-1]), n=1, cutoff=0.6)
        return path, f"unknown key; did you mean {near[0]}?" if near else "unknown key; remove it or check its spelling"
    if kind == "missing":
        return path, "required; set it"
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if kind not in ("model_type", "dict_type") and isinstance(value, (str, int, float, bool)):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        if shown not in message:
            message = f"{message} (got {shown})"
    if len(message) > 300:
        message = message[:297] + "..."
    return path, message


def parse_stack(raw: Mapping[str, Any]) -> StackConfig:
    """Validate a stack's config values (top-level key -> decoded value); raise ConfigError."""
    try:
        stack = StackConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigError([_describe(e) for e in exc.errors()]) from None
    problems = _relations(stack)
    if problems:
        raise ConfigError(problems)
    return stack


def read_pulumi_config() -> tuple[dict[str, Any], set[str]]:
    """Every config value in this project's namespace, decoded, and the keys that are secret."""
    from pulumi.runtime import config as runtime_config

    values: dict[str, Any] = {}
    merged = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    prefix = f"{PROJECT}:"
    for full_key, text in merged.items():
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix):]
        try:
            values[key] = json.loads(text) if isinstance(text, str) and text[:1] in "[{" else text
        except json.JSONDecodeError:
            raise ConfigError([(key, "is not valid JSON structured config")]) from None
    secret = {
        k[len(prefix):]
        for k in (*runtime_config.get_config_secret_keys_env(), *runtime_config._SECRET_KEYS.get())
        if k.startswith(prefix)
    }
    return values, secret


def load_stack() -> StackConfig:
    """Read and validate the running stack's config (the program's boundary)."""
    values, secret_keys = read_pulumi_config()
    structured = {k: v for k, v in values.items() if k in TOP_LEVEL_KEYS}
    stack = parse_stack(structured)
    allowed_secrets = stack.secret_config_keys()
    problems: list[tuple[str, str]] = []
    for key in sorted(set(values) - set(TOP_LEVEL_KEYS)):
        if key not in allowed_secrets:
            near = difflib.get_close_matches(key, [*TOP_LEVEL_KEYS, *allowed_secrets], n=1, cutoff=0.6)
            fix = f"did you mean {near[0]}?" if near else f"known keys: {', '.join(TOP_LEVEL_KEYS)}"
            problems.append((_path_part(key), f"unknown config key; {fix}"))
    for key in sorted(allowed_secrets):
        if key not in values:
            problems.append((key, f"not set; run: pulumi config set --secret {key} <value>"))
        elif key not in secret_keys:
            problems.append((key, f"holds a credential in plain text; run: pulumi config set --secret {key} <value>"))
    if stack.gateway is not None:
        by_value: dict[str, str] = {}
        for client, settings in stack.gateway.clients.items():
            value = values.get(settings.key_config) if settings.key_config else None
            if value is None or value == OFFLINE_SECRET_PLACEHOLDER:
                continue  # offline, every secret reads the same placeholder: their real values differ
            if value in by_value:
                problems.append(
                    (
                        f"gateway.clients.{client}.key_config",
                        f"{settings.key_config} holds the same key as client {by_value[value]}'s; give each client its own",
                    )
                )
            by_value[value] = client
    for key in sorted(set(structured) & secret_keys):
        problems.append((key, "structured config must not be secret; keep credentials in their own keys"))
    if problems:
        raise ConfigError(problems)
    return stack
