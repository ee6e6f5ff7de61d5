"""What a model server holds, in the terms every engine's estimate is given in (MemoryEstimate,
VramEstimate), and the margins that depend on the backend rather than the engine. Each engine's own
memory model lives with the engine (engines/llamacpp_memory.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.quantity import GIB, Quantity, gib, parse_quantity
from config.gpus import BACKEND_OVERHEAD

if TYPE_CHECKING:
    from config.gpus import GpuBackend
    from config.types import ModelServer

# A discrete GPU holds, besides what the engine puts there, the runtime's context: measured 0.57-0.60 GiB
# with CUDA (engines/llamacpp_memory.py CUDA_CONTEXT_MIB); a margin for the other runtimes.
VRAM_CONTEXT_GIB = 0.5
# The most a server's VRAM plan was below what its process held on a real card (nvidia-smi, 24 servers on an
# H200: bench/results-vram-h200.json, recomputed by lab/bench/vram_error.py; tests/test_vram_measured.py holds
# it). A router reserves it for each resident model, so that a full resident set stays on the card
# however many models it holds.
VRAM_PLAN_MOST_UNDER_GIB = 0.16
# What the process keeps in system RAM beside a discrete GPU besides the weights there (the input embedding
# among them): the runtime and pinned staging buffers. A margin, not a measurement.
DISCRETE_HOST_GIB = 1.0


LIMIT_HEADROOM = 0.10  # a derived limit sits 10% above the estimate: compute buffers vary with load


def ceil_gib(value: float) -> int:
    return max(1, math.ceil(value - 1e-9))


def derived_limit_gib(total_gib: float) -> int:
    """The memory limit (and request) the plan derives from an estimate: LIMIT_HEADROOM above it, whole GiB."""
    return ceil_gib(total_gib * (1 + LIMIT_HEADROOM))

@dataclass(frozen=True)
class MemoryEstimate:
    weights_gib: float
    kv_gib: float
    recurrent_gib: float
    overhead_gib: float
    host_caches_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.recurrent_gib + self.overhead_gib + self.host_caches_gib

    def breakdown(self) -> str:
        return (
            f"weights {self.weights_gib:.1f} + KV {self.kv_gib:.2f} + recurrent {self.recurrent_gib:.2f} "
            f"+ backend {self.overhead_gib:.1f} + host caches {self.host_caches_gib:.1f}"
        )


def resident_estimate(resident_memory: str, backend: "GpuBackend") -> MemoryEstimate:
    """An engine that reports what it locks (weights and KV pool, measured) plus the backend's margin."""
    resident = float(parse_quantity(resident_memory))
    return MemoryEstimate(
        weights_gib=resident / GIB,
        kv_gib=0.0,
        recurrent_gib=0.0,
        overhead_gib=resident * BACKEND_OVERHEAD[backend] / GIB,
        host_caches_gib=0.0,
    )


@dataclass(frozen=True)
class VramEstimate:
    """What one replica holds on each of its discrete GPUs (the fullest one, when they differ)."""

    layers_offloaded: int
    layers: int
    weights_gib: float
    kv_gib: float
    recurrent_gib: float
    reserve_gib: float
    gpus: int = 1
    experts_in_ram: int = 0  # offloaded blocks whose experts stay in system RAM (--n-cpu-moe)

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.recurrent_gib + self.reserve_gib

    def breakdown(self) -> str:
        cards = f" on each of {self.gpus} GPUs" if self.gpus > 1 else ""
        experts = f" (experts of {self.experts_in_ram} in RAM)" if self.experts_in_ram else ""
        return (f"{self.layers_offloaded}/{self.layers} layers{experts}{cards}: weights {self.weights_gib:.1f} + KV {self.kv_gib:.2f} "
                f"+ recurrent {self.recurrent_gib:.2f} + context and compute {self.reserve_gib:.1f}")

    def layers_that_fit(self, vram_gib: float) -> int:
        """How many layers fit in this much VRAM per card, everything else unchanged."""
        per_layer = (self.weights_gib + self.kv_gib + self.recurrent_gib) * self.gpus / max(self.layers_offloaded, 1)
        fit = int((vram_gib - self.reserve_gib) * self.gpus / per_layer) if per_layer > 0 else self.layers
        return max(0, min(self.layers, fit))


def discrete_resident(resident_memory: str, model: "ModelServer") -> tuple[MemoryEstimate, VramEstimate]:
    """Another engine on a discrete GPU: what it is measured to lock is on the GPU."""
    resident = gib(resident_memory)
    ram = MemoryEstimate(weights_gib=0.0, kv_gib=0.0, recurrent_gib=0.0, overhead_gib=DISCRETE_HOST_GIB, host_caches_gib=0.0)
    vram = VramEstimate(layers_offloaded=1, layers=1, weights_gib=resident, kv_gib=0.0, recurrent_gib=0.0,
                        reserve_gib=VRAM_CONTEXT_GIB)
    return ram, vram


def weights_quantity(size_bytes: float) -> Quantity:
    """A download's size as the plan writes it: GiB rounded up to a tenth (never 0)."""
    return Quantity(f"{max(1, math.ceil(size_bytes / GIB * 10 - 1e-9)) / 10}Gi")


@dataclass(frozen=True)
class Estimate:
    """The engine's answer to the plan's one question about a server (``Engine.estimate``): what one
    replica holds where, what it downloads, what it reads per generated token and how fast it decodes."""

    memory: MemoryEstimate  # system RAM (the node's memory on unified memory or a CPU)
    vram: Optional[VramEstimate]  # one discrete GPU's share; None on unified memory or without a GPU
    weights: str  # the download, as a quantity (configured, or derived from the architecture)
    read_per_token: Optional[tuple[float, float]]  # bytes from VRAM, bytes from the node's memory; None: unknown
    decode_predicted_tok_s: Optional[dict[str, float]]  # context empty, half and full; None: not predicted
    # (low, high) per depth where a CPU reads part of the model at a bandwidth known only as a range (the low
    # end is decode_predicted_tok_s); None: the prediction is one figure.
    decode_range_tok_s: Optional[dict[str, tuple[float, float]]] = None
    decode_range_why: tuple[str, ...] = ()  # why it is a range (engines/llamacpp_speed.py range_reasons)
    # Prompt tokens/s at a 4096-token prompt (or the context), and seconds to the first token of a prompt that
    # fills the context; None: not predicted (engines/llamacpp_speed.py prefill).
    prefill_tok_s: Optional[float] = None
    first_token_full_s: Optional[float] = None
    multimodal: bool = False  # a vision projector is loaded beside the model (counted in the figures above)
    split: Optional[Split] = None  # the model over several nodes; memory above is then the main server's share
    warnings: tuple[str, ...] = ()  # what the plan should say of the server though it fits (logged as warnings)


@dataclass(frozen=True)
class SplitMember:
    """One node of a model split over llama.cpp's RPC backend: a helper (ggml-rpc-server) or the main server."""

    node_pool: str
    node: Optional[str]  # the node it is pinned to (kubernetes.io/hostname); None: placed by anti-affinity
    backend: str
    blocks: int  # transformer blocks it holds
    output: bool  # it holds the output layer
    memory: MemoryEstimate  # what its pod holds in the node's memory
    vram: Optional[VramEstimate] = None  # what it holds on its card, on a node of discrete GPUs

    @property
    def weights_gib(self) -> float:
        """The weights of its blocks, wherever they are held."""
        return self.vram.weights_gib if self.vram is not None else self.memory.weights_gib


@dataclass(frozen=True)
class Split:
    """A model over several nodes (engines/llamacpp_split.py): the helpers in llama.cpp's device order, then the
    main server, the --tensor-split that gives each its blocks, and what crosses the link."""

    helpers: tuple[SplitMember, ...]
    main: SplitMember
    tensor_split: tuple[int, ...]
    upload_gib: float  # what the main server sends the helpers at each start (without the helpers' tensor cache)
    upload_seconds: int  # at the link's bandwidth; 0 without link figures


@dataclass(frozen=True)
class OnRequestModel:
    """One model of a server that loads models when a request names them."""

    name: str  # the name clients send
    source: str  # the weights it loads (org/repo:TAG): a change fetches them again
    pinned: bool
    estimate: Estimate  # as the single-model server it runs as


@dataclass(frozen=True)
class OnRequest:
    """A server of models loaded on request (``Engine.estimate`` of a router): the plan decides which
    may be resident together (planning/residency.py)."""

    models: tuple[OnRequestModel, ...]
    max_loaded: Optional[int]  # what the config asks for; None: planned
    path: str  # the config path of the server's settings for them, for the plan's messages
