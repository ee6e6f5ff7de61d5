"""The stack file as commented values: every key with the reason for its value, built from the
hardware, the cluster and the chosen models, and written as YAML with the reason above each line."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from common.constants import PROJECT
from config.checks import private_suffix
from config.catalog import lookup
from engines import BACKEND_NAMES, backend_advice, quantized_kv_cost
from tools.new_stack.candidates import IMAGES, Candidate, ChatSetup
from tools.new_stack.hardware import INGRESS, KINDS, STORAGE, Cluster, Hardware

# The shipped stacks' placeholder for a `secure:` value (base64 of "placeholder: set with pulumi
# config"): the Pulumi CLI replaces it on `pulumi config set --secret`; the offline render reads
# every secure value as a placeholder.
SECRET_PLACEHOLDER = "v1:cGxhY2Vob2xkZXI6IHNldCB3aXRoIHB1bHVtaSBjb25maWc="


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


def gi_quantity(value: float) -> str:
    """A memory quantity: whole GiB where it is whole."""
    return f"{int(value)}Gi" if float(value).is_integer() else f"{value:g}Gi"


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def threads(hw: Hardware) -> tuple[int, int]:
    """(chat threads, embedding threads): one per core, the embedding server taking one or two. Where the
    P-cores are given, one per P-core: llama.cpp's own default counts only those (common/common.cpp,
    cpu_count_math_cpus: efficiency cores harm its lockstep threads, SMT siblings do not help), and the
    embedding server takes its threads from the other CPUs where there are enough."""
    embed = 2 if hw.cpus >= 6 else 1
    if hw.p_cores is None:
        return max(1, min(16, hw.cpus - embed)), embed
    spare = hw.cpus - hw.p_cores
    return max(1, min(16, hw.p_cores if spare >= embed else hw.p_cores - embed)), embed


def threads_why(hw: Hardware) -> str:
    if hw.p_cores is None:
        return ("One per core, less the embedding server's. On a CPU with SMT or efficiency cores give --p-cores "
                "(and --e-cores): a decode step waits for its slowest thread.")
    others = hw.cpus - hw.p_cores
    return (f"One per physical P-core ({hw.p_cores}" + (f" of {hw.p_cores}P+{hw.e_cores}E" if hw.e_cores else "")
            + f"), as llama.cpp's own default counts them: efficiency cores slow its lockstep threads and SMT "
            f"siblings do not help; the other {others} CPUs are the embedding server's and the system's."
            if others >= (2 if hw.cpus >= 6 else 1) else
            f"One per physical P-core ({hw.p_cores}), less the embedding server's.")


def cache_ram_mib(hw: Hardware) -> int:
    offers = hw.offers_gib()
    return 4096 if offers >= 48 else 1024 if offers >= 12 else 256


def node_pool(hw: Hardware) -> dict[str, V]:
    _, backend, resource, profile, what = KINDS[hw.gpu]
    pool: dict[str, V] = {}
    if resource is not None:
        plugin = {"nvidia.com/gpu": "the NVIDIA device plugin (k3s: install it or the GPU Operator)",
                  "gpu.intel.com/i915": "Intel's GPU device plugin (Xe-driver GPUs advertise gpu.intel.com/xe)",
                  "gpu.intel.com/xe": "Intel's GPU device plugin (an Arc card on the xe driver; i915-driven "
                                      "A-series cards advertise gpu.intel.com/i915: `kubectl describe node` shows which)",
                  "amd.com/gpu": "AMD's k8s-device-plugin (ROCm/k8s-device-plugin)"}[resource]
        pool["gpu_resource"] = V(resource, f"The GPU as {plugin} advertises it; it alone places the chat server.")
        pool["gpu_shares"] = V(1, "Only the chat server uses the GPU (the embedding server runs on the CPU cores), "
                               "so the device plugin needs no sharing.")
    arch = hw.arch
    pool["node_labels"] = V({"kubernetes.io/arch": arch},
                            f"Every kubelet sets this label: the pods land only on {arch} nodes, which the image is "
                            f"built for ({'the pinned llama.cpp images are published for linux/amd64' if arch == 'amd64' else '--image'}).")
    pool["nodes"] = V(hw.nodes, "Identical nodes; the planner places the servers on them by memory." if hw.nodes > 1
                      else "One node.")
    pool["memory"] = V(gi_quantity(hw.ram_gib), "--ram: physical memory of one node" + (
        "; the GPU uses this same memory." if not hw.discrete and hw.gpu != "none" else "."))
    pool["allocatable"] = V(gi_quantity(hw.allocatable_gib()),
                            "An estimate of what the kubelet offers pods (firmware, kernel and k3s' eviction "
                            "threshold take the rest): put `kubectl describe node` Allocatable memory here.")
    pool["reserved"] = V(gi_quantity(hw.reserved_gib()),
                         "Held by pods this program does not manage: k3s' CoreDNS, Traefik, metrics-server, "
                         "local-path provisioner and the OS beside them.")
    pool["memory_bandwidth_gbs"] = V(_number(hw.ram_bandwidth), hw.ram_bandwidth_why)
    pool["cpu_decode_by_threads"] = V(None, "What llama.cpp's decode costs this node's CPU: run `make host-profile` on "
                                      "a node and paste its lines here (this, memory_bandwidth_by_threads and cpu_quantized_kv"
                                      + ("; with the card's build, `LLAMA_CPP_BACKEND=cuda make host-profile EXPERTS=1`, "
                                         "experts_in_ram_us_by_threads too" if hw.discrete and backend == "cuda" else "")
                                      + "); null: the plan shows a range for what the CPU decodes.")
    if hw.discrete:
        pool["vram"] = V(gi_quantity(hw.vram_gib), "--vram: memory of the card; offloaded layers and their KV cache are "
                         "planned here, the rest in system RAM.")
        pool["vram_bandwidth_gbs"] = V(_number(hw.vram_bandwidth), hw.vram_bandwidth_why)
        if backend == "cuda":
            pool["runtime_class"] = V("nvidia", "k3s ships the nvidia RuntimeClass (once the NVIDIA container toolkit "
                                      "is on the node); containerd's default runtime stays runc.")
    profile = hw.profile or profile
    if profile is not None:
        pool["decode_profile"] = V(profile, f"How {what} turns bandwidth into tokens, for the decode prediction "
                                   "(engines/llamacpp_speed.py: the class's published or measured figures); Vulkan "
                                   "and SYCL have no default profile.")
    pool["backend"] = V(backend, {"cpu": "No GPU: llama.cpp's CPU build.",
                                  "cuda": "llama.cpp's CUDA build for the chat server.",
                                  "rocm": "llama.cpp's ROCm build (server-rocm) for the Radeon card.",
                                  "sycl": "llama.cpp's SYCL build (server-intel) for the Arc card, Intel's own.",
                                  "vulkan": f"llama.cpp's Vulkan build: it drives the {what} through /dev/dri."}[backend]
                       + _vulkan_instead(backend, profile))
    if hw.render_gids:
        pool["supplemental_groups"] = V(list(hw.render_gids),
                                        "GIDs of the node's video and render groups (`getent group video render`), "
                                        "for non-root access to /dev/dri; check yours.")
    return pool


def _vulkan_instead(backend: str, profile: Optional[str]) -> str:
    """For a Radeon or an Arc card: what llama.cpp's published runs say of its Vulkan build, and how to switch."""
    if backend not in ("rocm", "sycl"):
        return ""
    advice = backend_advice(profile) if profile else None
    vulkan_profile = "amd-discrete-vulkan" if backend == "rocm" else profile
    return ((f" Its Vulkan build also drives the card: {advice}." if advice else " Its Vulkan build also drives the card.")
            + f" To run it: image {IMAGES['vulkan']} (on the chat server), backend: vulkan"
            + (f", decode_profile: {vulkan_profile}" if vulkan_profile and vulkan_profile != profile else
               f" (decode_profile {profile} stays: measured on {BACKEND_NAMES[backend]})" if profile else "") + ".")


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
    server["threads"] = V(chat_threads, threads_why(hw))
    server["ctx_size"] = V(setup.ctx_size, "The longest context that fits beside the model (tried 32768, 16384, "
                           "8192), shared by the slots.")
    if hw.discrete and setup.cache_type == "f16":
        server["cache_type_k"] = V("f16", "An f16 cache fits the card at this context: faster at depth than a quantized "
                                   f"one where measured ({quantized_kv_cost()}).")
        server["cache_type_v"] = V("f16", "As cache_type_k.")
    elif hw.discrete:
        server["cache_type_k"] = V(setup.cache_type, f"{setup.cache_type} halves the KV cache: an f16 cache does not "
                                   f"fit the card at this context and placement (slower at depth: {quantized_kv_cost()}).")
        server["cache_type_v"] = V(setup.cache_type, "As cache_type_k (the CUDA build turns flash attention on for it).")
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
