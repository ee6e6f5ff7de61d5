"""A llama.cpp server split over nodes (models.<key>.rpc): which blocks each node holds, what each pod holds,
and the split's decode speed over the link (engines/llamacpp_rpc.py says how llama.cpp does it).

The blocks are planned by memory: each member's node offers what its pool offers (allocatable less reserved);
what a member holds whatever its share (its compute buffer, its backend's margin; the main server's input
embedding, output layer and host caches) comes first, and the blocks are shared in proportion to what is left,
no member past its room. Blocks a stack sets (helpers[i].layers, main_layers) are kept, and checked.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Optional

from common.quantity import GIB, Quantity, gib
from config.gpus import BACKEND_OVERHEAD
from planning.capacity import GPU_FREE_TARGET_GIB, node_offers_gib
from planning.memory import (DISCRETE_HOST_GIB, VRAM_CONTEXT_GIB, MemoryEstimate, Split, SplitMember, VramEstimate,
                             derived_limit_gib)

from .llamacpp_memory import (BITS_PER_WEIGHT, CUDA_DENSE_COPY_SHARE, compute_bytes, cuda_compute_bytes, discrete_split,
                              kv_bytes, layout, llamacpp_estimate, quant_of, slots, vram_reserve_gib, weights_bytes,
                              DEFAULT_UBATCH)
from .llamacpp_rpc import (RPC_TOKEN_MS, Link, cpu_helper_prefill, layers_per_device, output_device,
                           split_decode_seconds, split_for_layers, split_memory, split_prefill_seconds, split_weights)
from .llamacpp_prefill import PROMPT_TOKENS, prompt_seconds
from .llamacpp_speed import predict_range_tok_s

if TYPE_CHECKING:
    from config.types import ModelFacts, ModelServer, NodePool

Problem = tuple[str, str]


def _member_backend(model: "ModelServer", pool: "NodePool", backend: Optional[str]) -> str:
    return backend or pool.backend or model.image_backend() or "cpu"


def _on_card(pool: "NodePool", backend: str) -> bool:
    """A member whose blocks live on a discrete card (its VRAM), not in the node's memory."""
    return pool.discrete() and backend != "cpu"


def _card_compute(model: "ModelServer", facts: "ModelFacts", backend: str) -> tuple[float, float]:
    """(the runtime's context, the compute buffer) a card holds for the whole model on it, in bytes: what a single
    server's plan counts (vram_reserve_gib: CUDA measured, margins elsewhere); the split's compute is derived from
    it as a CPU member's is (split_memory)."""
    whole = model.model_copy(update={"rpc": None, "gpu_layers": 999})
    place = layout(whole, facts)
    reserve = vram_reserve_gib(whole, facts, place, backend) * GIB
    compute = cuda_compute_bytes(whole, facts, place) if backend == "cuda" else None
    if compute is None:
        # Off CUDA the reserve is two margins (VRAM_CONTEXT_GIB and the compute's per 512 tokens): the context's.
        context = VRAM_CONTEXT_GIB * GIB
        return context, reserve - context
    return reserve - compute, compute


def _overhead(backend: str, weights: float, compute: float) -> float:
    """Bytes a member's pod holds beside its weights and KV: the compute buffer on a CPU; on a GPU backend of a
    unified-memory node its margin per GiB of weights (config/gpus.py), as a single server's plan counts it."""
    return compute if backend == "cpu" else max(compute, weights * BACKEND_OVERHEAD[backend])


def split_estimate(model: "ModelServer", facts: "ModelFacts", pools: dict[str, "NodePool"], path: str
                   ) -> tuple[Optional[Split], Optional[dict], Optional[tuple[float, float]], list[Problem]]:
    """(the split, its decode by depth {empty, half, full} or None, its prefill (tokens/s at PROMPT_TOKENS, seconds
    to the first token of a full context) or None, problems)."""
    split = model.rpc
    if split is None:
        raise ValueError("engines/llamacpp_split.py: the split estimate")
    main_pool = pools[model.node_pool]
    members = [(pools[h.node_pool], h.node_pool, h.node, _member_backend(model, pools[h.node_pool], h.backend), h.layers)
               for h in split.helpers]
    main_backend = model.compute_backend(main_pool)
    on_card = main_backend != "cpu"
    problems: list[Problem] = []
    # The devices in llama.cpp's order: the helpers, then the main server's own (none on a CPU: llama.cpp
    # offloads to GPU and RPC devices only, so a CPU main server holds no block and the output layer goes to
    # the last helper).
    devices = members + ([(main_pool, model.node_pool, split.node, main_backend, split.main_layers)] if on_card else [])
    if not on_card and split.main_layers:
        problems.append((f"{path}.rpc.main_layers", "a main server on a CPU holds no blocks (llama.cpp offloads to its "
                         "GPU and RPC devices only); remove main_layers or give the main server a GPU"))
        return None, None, None, problems
    if len({_on_card(pool, backend) for pool, _, _, backend, _ in devices}) > 1 and any(
            given is None for *_, given in devices):
        # Shared by room, a card's share would follow its VRAM while a node's memory takes the most blocks and sets
        # the pace: the card left mostly idle (a 24 GiB card beside a 60 GiB CPU node got 20 of 80 blocks).
        problems.append((f"{path}.rpc", "its members mix discrete cards with node memory (CPU or unified), where "
                         "planning blocks by room would leave the cards mostly idle; give every member its blocks "
                         "(rpc.helpers[i].layers and rpc.main_layers, the faster devices the most that fit), or split "
                         "over members of one kind"))
        return None, None, None, problems
    embedding, output_bytes, per_block = split_weights(model, facts)
    per_block_kv = kv_bytes(facts, model.ctx_size, model.cache_type_k, model.cache_type_v, slots(model),
                            model.ubatch_size or DEFAULT_UBATCH) / facts.layers
    whole = llamacpp_estimate(model, facts, "cpu")
    host_caches = whole.host_caches_gib * GIB
    compute = compute_bytes(model, facts) or 0.0
    cards = {backend: _card_compute(model, facts, backend) for pool, _, _, backend, _ in devices if _on_card(pool, backend)}
    # Each device's compute for the whole model alone: its card's backend's, else a CPU's.
    singles = [cards[backend][1] if _on_card(pool, backend) else compute for pool, _, _, backend, _ in devices]
    # What each device holds before its blocks, with the output layer on the last (a probe split: the pipeline's
    # copies depend only on there being more than one device); a card also its runtime's context.
    probe, fixed_host = split_memory(model, facts, [0] * len(devices), len(devices) - 1, singles)
    fixed = [d.compute + (output_bytes if i == len(devices) - 1 else 0.0)
             + (cards[backend][0] if _on_card(pool, backend) else 0.0)
             for i, (d, (pool, _, _, backend, _)) in enumerate(zip(probe, devices))]
    host = fixed_host.model + fixed_host.compute + host_caches
    # A card offers its VRAM less what llama.cpp's own fitting leaves free; a node its memory.
    rooms = [(gib(pool.vram) - GPU_FREE_TARGET_GIB) * GIB if _on_card(pool, backend) else node_offers_gib(pool) * GIB
             for pool, _, _, backend, _ in devices]
    main_on_card = on_card and _on_card(main_pool, main_backend)
    if not on_card or main_on_card:
        # The main server's own part in its node's memory: beside a card, with the runtime's host side.
        host += DISCRETE_HOST_GIB * GIB if main_on_card else 0.0
        main_room = node_offers_gib(main_pool) * GIB
        if host > main_room:
            problems.append((path, f"the main server holds {host / GIB:.1f} GiB (input embedding, compute, host "
                             f"caches) but node pool {model.node_pool} offers {main_room / GIB:.1f} GiB"))
    else:
        rooms[-1] -= host
    per_block_total = per_block + per_block_kv
    counts = _plan_blocks(facts.layers, [given for *_, given in devices], [
        (room - f) / (per_block_total * (1 + (0 if backend == "cpu" or _on_card(pool, backend) else BACKEND_OVERHEAD[backend])))
        for room, f, (pool, _, _, backend, _) in zip(rooms, fixed, devices)])
    need = sum(fixed) + facts.layers * per_block_total + (host if on_card and not main_on_card else 0.0)
    if counts is None or sum(counts) != facts.layers:
        given = [g for *_, g in devices if g is not None]
        if given and len(given) == len(devices):
            problems.append((f"{path}.rpc", f"the blocks given ({'+'.join(map(str, given))}) are not the model's "
                             f"{facts.layers}; give each member its share so they add up, or leave them null"))
        else:
            offers = ", ".join(f"{key}{f' ({node})' if node else ''} {room / GIB:.1f}" for (_, key, node, _, _), room
                               in zip(devices, rooms))
            problems.append((f"{path}.rpc.helpers", f"the model needs {need / GIB:.1f} GiB over its {len(devices)} "
                             f"devices ({per_block_total / GIB:.2f} GiB a block with its KV, for {facts.layers}) but they "
                             f"offer {sum(rooms) / GIB:.1f} GiB ({offers}); add a helper node, a smaller quant or a "
                             "shorter ctx_size"))
        return None, None, None, problems
    tensor_split = split_for_layers(counts)
    out = output_device(facts.layers, tensor_split)
    if not (layers_per_device(facts.layers, tensor_split) == counts and out == len(counts) - 1):
        raise ValueError("engines/llamacpp_split.py: the split estimate")
    buffers, host_buffers = split_memory(model, facts, counts, out, singles)
    made: list[SplitMember] = []
    for index, ((pool, key, node, backend, _), device, room) in enumerate(zip(devices, buffers, rooms)):
        where = f"{path}.rpc.helpers[{index}]" if index < len(members) else f"{path}.rpc.main_layers"
        vram = None
        if _on_card(pool, backend):
            # Its blocks on the card; in the node's memory the runtime's host side alone (a helper; the main
            # server's own part is added below).
            vram = VramEstimate(layers_offloaded=device.blocks, layers=facts.layers, weights_gib=device.model / GIB,
                                kv_gib=device.kv / GIB, recurrent_gib=0.0,
                                reserve_gib=(cards[backend][0] + device.compute) / GIB, experts_in_ram=0)
            # ggml-rpc-server takes each tensor whole into its memory before the copy to the card (ggml-rpc.cpp
            # recv_msg, set_tensor): the largest it is sent, the output layer or a block's largest (~0.4 of it).
            largest = output_bytes if device.output else CUDA_DENSE_COPY_SHARE * per_block
            memory = MemoryEstimate(weights_gib=0.0, kv_gib=0.0, recurrent_gib=0.0,
                                    overhead_gib=(DISCRETE_HOST_GIB + largest / GIB) if index < len(members) else 0.0,
                                    host_caches_gib=0.0)
            held, what = vram.total_gib, f"{vram.breakdown()}, on one GPU of"
        else:
            overhead = _overhead(backend, device.model, device.compute)
            memory = MemoryEstimate(weights_gib=device.model / GIB, kv_gib=device.kv / GIB, recurrent_gib=0.0,
                                    overhead_gib=overhead / GIB, host_caches_gib=0.0)
            held, what = memory.total_gib, f"{memory.breakdown()}, on"
        if held * GIB > room + 1e-6:
            problems.append((where, f"{device.blocks} blocks hold {held:.1f} GiB ({what} node pool {key}) but it offers "
                             f"{room / GIB:.1f} GiB there; give it fewer blocks (or leave layers null to plan them)"))
        made.append(SplitMember(node_pool=key, node=node, backend=backend, blocks=device.blocks, output=device.output,
                                memory=memory, vram=vram))
    host_memory = MemoryEstimate(weights_gib=host_buffers.model / GIB, kv_gib=0.0, recurrent_gib=0.0,
                                 overhead_gib=host_buffers.compute / GIB + (DISCRETE_HOST_GIB if main_on_card else 0.0),
                                 host_caches_gib=host_caches / GIB)
    if on_card:
        main_device = made.pop()
        main = dataclasses.replace(main_device, memory=_plus(main_device.memory, host_memory))
    else:
        main = SplitMember(node_pool=model.node_pool, node=split.node, backend="cpu", blocks=0, output=False,
                           memory=host_memory)
    upload = sum(d.model for d in buffers[:len(members)])
    upload_seconds = math.ceil(upload * 8 / (split.link.gbps * 1e9)) if split.link else 0
    result = Split(helpers=tuple(made), main=main, tensor_split=tuple(tensor_split), upload_gib=upload / GIB,
                   upload_seconds=upload_seconds)
    return result, _decode(model, facts, devices, counts, out), _prefill(model, facts, devices, counts, out), problems


def _plus(a: MemoryEstimate, b: MemoryEstimate) -> MemoryEstimate:
    return MemoryEstimate(*(x + y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b))))


def _plan_blocks(layers: int, given: list[Optional[int]], capacity: list[float]) -> Optional[list[int]]:
    """Blocks per device: those given kept, the rest shared in proportion to what each has room for (whole blocks,
    never past its room); None where they do not fit."""
    counts = [g if g is not None else 0 for g in given]
    free = [i for i, g in enumerate(given) if g is None]
    left = layers - sum(counts)
    if left < 0:
        return None
    room = [max(0, math.floor(capacity[i])) for i in free]
    if sum(room) < left:
        return None if free or left else counts
    total = sum(room)
    shares = [left * r / total for r in room] if total else [0.0] * len(room)
    for i, share, r in zip(free, shares, room):
        counts[i] = min(r, math.floor(share))
    # The blocks the rounding left: to the device with the most room still free.
    while sum(counts) < layers:
        best = max(free, key=lambda i: room[free.index(i)] - counts[i])
        if room[free.index(best)] - counts[best] <= 0:
            return None
        counts[best] += 1
    return counts


def _members(model: "ModelServer", devices: list) -> list["ModelServer"]:
    """Each device's node serving the whole model alone, as the plan's speed models take it: its backend, every
    layer on it, a helper's own threads."""
    threads = [h.threads for h in model.rpc.helpers] if model.rpc else []
    return [model.model_copy(update={"rpc": None, "backend": backend, "gpu_layers": 0 if backend == "cpu" else 999,
                                     "threads": threads[i] if i < len(threads) else model.threads, "gpus": 1})
            for i, (_, _, _, backend, _) in enumerate(devices)]


def _predictable(model: "ModelServer") -> bool:
    """A split's speed is planned with link figures."""
    return bool(model.rpc and model.rpc.link)


def _prefill(model: "ModelServer", facts: "ModelFacts", devices: list, counts: list[int],
             output: int) -> Optional[tuple[float, float]]:
    """(tokens/s for a prompt of PROMPT_TOKENS or the context, seconds to the first token of a prompt that fills the
    context) over the link (split_prefill_seconds); None where decode is not planned or a member's backend has no
    prefill model."""
    if not _predictable(model):
        return None
    # Every CPU device of a split is a helper (a CPU main server holds no block), and a helper does not repack.
    slower = cpu_helper_prefill(quant_of(model.hf_repo) if model.hf_repo else None)
    per_device = []
    for member, (pool, _, _, backend, _) in zip(_members(model, devices), devices):
        seconds = prompt_seconds(member, facts, pool, backend, _on_card(pool, backend),
                                 weight_rate=slower if backend == "cpu" else 1.0)
        if seconds is None:
            return None
        per_device.append(seconds)
    link = Link(rtt_ms=float(model.rpc.link.rtt_ms), gbps=float(model.rpc.link.gbps))
    helpers = len(model.rpc.helpers)

    def prompt(tokens: int) -> float:
        return split_prefill_seconds(per_device, counts, [link] * helpers, facts.layers, facts.embedding_length or 0,
                                     tokens, 0, model.ubatch_size or DEFAULT_UBATCH, facts.vocab_size or 0, output)

    tokens = min(PROMPT_TOKENS, model.ctx_size)
    return tokens / prompt(tokens), prompt(model.ctx_size)


def _decode(model: "ModelServer", facts: "ModelFacts", devices: list, counts: list[int],
            output: int) -> Optional[dict]:
    """Decode by depth over the link, (low, high) per depth: each device's blocks at its node's speed for the whole
    model, per helper a round trip, the token's bytes and RPC_TOKEN_MS; None without link figures, without a decode
    model for a member."""
    if not _predictable(model):
        return None
    link = model.rpc.link
    depths = {"empty": 0, "half": model.ctx_size // 2, "full": model.ctx_size}
    per_device: list[dict[str, float]] = []
    for member, (pool, _, _, backend, _) in zip(_members(model, devices), devices):
        rates = predict_range_tok_s(member, facts, pool, backend, _on_card(pool, backend), depths)
        if rates is None:
            return None
        per_device.append({name: (1 / low, 1 / high) for name, (low, high) in rates.items()})  # (slow, fast) seconds
    links = [Link(rtt_ms=float(link.rtt_ms), gbps=float(link.gbps))] * len(devices)
    helpers = len(model.rpc.helpers) if model.rpc else 0

    def rate(name: str, depth: int, slow: bool) -> float:
        """The slow end pairs each node's slow figure with RPC_TOKEN_MS's dearer end; the fast end, the other two."""
        seconds = split_decode_seconds([d[name][0 if slow else 1] for d in per_device], counts, links[:helpers],
                                       facts.layers, facts.embedding_length or 0, depth, RPC_TOKEN_MS[1 if slow else 0],
                                       facts.vocab_size or 0, output)
        return 1 / seconds

    return {name: (rate(name, depth, True), rate(name, depth, False)) for name, depth in depths.items()}


RPC_RANGE_WHY = (f"what RPC costs a token beyond the link, {RPC_TOKEN_MS[0]:g}-{RPC_TOKEN_MS[1]:g} ms a helper, differs "
                 "from host to host (engines/llamacpp_rpc.py)")


def one_node_instead(model: "ModelServer", facts: "ModelFacts", pool: "NodePool", path: str,
                     split_half_tok_s: float) -> Optional[str]:
    """Where a smaller quant of the same model fits one node of the main server's pool alone and decodes faster at
    half context than the split, the summary's line saying so. The quant is the largest that fits (the best quality
    that does), its weights scaled from the file's by bits per weight (llama-quantize's means, BITS_PER_WEIGHT),
    planned as a single server on that node with the memory request the plan would give it (derived_limit_gib).
    None where the quant is not a llama.cpp file type, none fits, or that quant is not the faster."""
    if model.hf_repo is None or facts.bits_per_weight is not None:
        return None
    repo, quant = model.hf_repo.rsplit(":", 1)[0], quant_of(model.hf_repo)
    if quant not in BITS_PER_WEIGHT:
        return None
    weights = weights_bytes(model, facts)
    backend = model.compute_backend(pool)
    offers = node_offers_gib(pool)
    smaller = sorted((q for q, bits in BITS_PER_WEIGHT.items() if bits < BITS_PER_WEIGHT[quant] and q.startswith("Q")),
                     key=BITS_PER_WEIGHT.get, reverse=True)
    for candidate in smaller:
        size = weights * BITS_PER_WEIGHT[candidate] / BITS_PER_WEIGHT[quant]
        alone = model.model_copy(update={"rpc": None, "hf_repo": f"{repo}:{candidate}",
                                          "weights": Quantity(f"{size / GIB:.2f}Gi")})
        card = _on_card(pool, backend)
        if card:
            # All of it on one card of the node (a partial offload is slower than the split it would replace).
            alone = alone.model_copy(update={"gpu_layers": 999, "gpus": 1})
            memory, vram = discrete_split(alone, facts, backend)
            if vram.total_gib > gib(pool.vram) - GPU_FREE_TARGET_GIB:
                continue
            total = derived_limit_gib(memory.total_gib)
        else:
            total = derived_limit_gib(llamacpp_estimate(alone, facts, backend).total_gib)
        if total > offers:
            continue
        rates = predict_range_tok_s(alone, facts, pool, backend, card, {"half": model.ctx_size // 2})
        if rates is None or rates["half"][0] <= split_half_tok_s:
            return None
        return (f"{path}.rpc: splitting is slower than a smaller quant on one node: {candidate} of this model "
                f"({size / GIB:.0f} GiB of weights, where a repo publishes it) fits one {model.node_pool} node alone "
                f"({f'{vram.total_gib:.1f} GiB on its card, ' if card else ''}a {total}Gi request of {offers:.1f} GiB) and decodes ~{rates['half'][0]:.1f} tok/s at half context against the "
                f"split's {split_half_tok_s:.1f}, at a lower quality; keep the split for {quant}'s quality, or serve "
                f"{candidate} on one node")
    return None
