"""One model over several nodes: llama.cpp's RPC backend (models.<key>.rpc; docs/rpc-split.md).

The main server runs llama-server with --rpc and --tensor-split; each helper node runs ggml-rpc-server, which holds
some of the layers and computes them when the main server asks. llama.cpp's RPC protocol has no authentication:
each helper's port is reachable only from the main server's pods (components/rpc.py, policy/rpc.py).
"""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field

from .defaults import PREFETCH_IMAGE
from .gpus import GpuBackend
from .values import DnsLabel, DnsName, Number, PinnedImage, Strict, doc

# A node's name as the kubelet registers it (kubernetes.io/hostname, as `kubectl get nodes` prints it).
NodeName = DnsName
# ggml-rpc-server's own default port (tools/rpc/rpc-server.cpp).
RPC_PORT = 50052


class LinkFigures(Strict):
    """The network between the main server's node and a helper's, as tools/link_probe.py measures it (make
    link-profile): what each generated token's round trip and bytes cost (engines/llamacpp_rpc.py)."""

    rtt_ms: Annotated[Number, Field(gt=0, le=100)] = doc("Median round trip of a small message, milliseconds.")
    gbps: Annotated[Number, Field(gt=0, le=800)] = doc("Bandwidth of one TCP stream, Gbit/s.")


class RpcHelper(Strict):
    """A node that holds part of the model's layers: one ggml-rpc-server pod, pinned there."""

    node_pool: DnsLabel = doc("The node_pools key of the helper's node.")
    node: Optional[NodeName] = doc(
        "The node's name (kubernetes.io/hostname) to pin the helper to; null: any node of the pool that holds neither "
        "the main server nor another helper of this split (required anti-affinity).", default=None)
    image: Optional[PinnedImage] = doc(
        "An image with ggml-rpc-server for the helper's backend, from the same llama.cpp build as the main server's "
        "(the RPC protocol's version must match); null: the main server's image.", default=None)
    backend: Optional[GpuBackend] = doc("The helper's backend; null: its pool's.", default=None)
    layers: Optional[Annotated[int, Field(ge=1, le=1024)]] = doc(
        "Transformer blocks this helper holds; null: planned by each node's memory.", default=None)
    threads: Annotated[int, Field(gt=0, le=1024)] = doc("ggml-rpc-server's --threads (its CPU device only).", default=4)


class RpcSplit(Strict):
    """How one model is split over nodes. The main server keeps the output layer and the input embedding."""

    helpers: Annotated[list[RpcHelper], Field(min_length=1, max_length=8)] = doc(
        "The helper nodes, in the order llama.cpp gives them layers (the first holds the first blocks).")
    node: Optional[NodeName] = doc("The main server's node (kubernetes.io/hostname); null: any node of its pool "
                                   "that holds no helper of this split.", default=None)
    main_layers: Optional[Annotated[int, Field(ge=0, le=1024)]] = doc(
        "Transformer blocks the main server holds; null: planned by memory.", default=None)
    port: Annotated[int, Field(ge=1024, le=65535)] = doc("Each helper's ggml-rpc-server port.", default=RPC_PORT)
    link: Optional[LinkFigures] = doc(
        "The link between the nodes (make link-profile); null: the plan gives no decode or prefill figure for the split.",
        default=None)
    programs_image: PinnedImage = doc(
        "The image that runs the main server's wait for its helpers (incluster/rpc_wait.py; needs python3).",
        default=PREFETCH_IMAGE)
    wait_seconds: Annotated[int, Field(ge=30, le=86_400)] = doc(
        "How long the main server's pod waits for every helper to answer before its init container fails (the "
        "kubelet then retries).", default=600)
    tensor_cache: bool = doc(
        "ggml-rpc-server -c: each helper keeps what it was sent in an emptyDir, so a restarted main server sends "
        "hashes, not its layers, over the link.", default=True)
