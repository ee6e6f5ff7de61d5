"""What a node's CPU costs llama.cpp's decode, beside the card or alone: the weights it keeps in system RAM read at
the node's read bandwidth for the server's threads (HOST, host_read_gbs), a time per block and the KV cache's rate
that differ from host to host (HostCost, measured by `make host-profile`: cpu_decode_by_threads, solved at
KV_PROFILE_DEPTH, its slow-down at KV_DEEP_DEPTH), and the share of the bandwidth its CPU reads routed experts at
(node_expert_share, from experts_in_ram_us_by_threads, `make host-profile EXPERTS=1`). Where a node's figures are
not given, the slowest and the fastest host measured (HOST_COST_SLOW, HOST_COST_FAST). The decode model that adds
these to the card's side is engines/llamacpp_speed.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from config.types import NodePool


@dataclass(frozen=True)
class HostProfile:
    """How a CPU reads the weights a server keeps in system RAM, with --threads T: at a share of what the node
    reads with T threads (memory_bandwidth_by_threads), no faster than T times a thread's compute ceiling; a
    block whose experts are in RAM costs a fixed time more (the hidden state to the CPU and back, routing
    there). What else the CPU's decode costs differs from host to host: HostCost."""

    weight_share: float  # of the node's read bandwidth at T threads, for dense weights
    expert_share: float  # the same, for routed experts (many small matrices)
    expert_block_us: float  # per block whose experts are in RAM, per token
    thread_gbs: float  # a thread's ceiling: GB of K-quant weights it decodes per second
    thread_read_gbs: float  # the least one thread of a busy node reads: the low end where no figure is given
    source: str


# Measured (bench/results-speed-h200.json, llama-bench b10729 on the H200 machine's 16-core Xeon, host read
# 7.4/13-15.5/27-31/45-53/80-85 GB/s with 1/2/4/8/16 threads by bench/host_bandwidth.c): Llama-3.1-8B all in
# RAM decodes at 0.90-0.93 of the read bandwidth at 4, 8 and 16 threads; Qwen3-30B-A3B and Qwen3.6-35B-A3B
# with 12-48 blocks of experts in RAM at 0.75-0.83 of it plus ~110 us per such block. The CI machine's 2
# threads, quiet, decode Llama-3.1-8B Q4_K_M at 15.3 GB/s each while reading 24 GB/s each: a compute
# ceiling (bench/results-decode-cpu.json). These five numbers were chosen on the first H200 host's and the
# CI machine's rows; a second H200 host (runs 3-4 of results-speed-h200.json) was measured after, out of sample.
HOST = HostProfile(weight_share=0.92, expert_share=0.78, expert_block_us=110.0, thread_gbs=15.3,
                   thread_read_gbs=5.0, source="H200 host Xeon and CI machine llama-bench (bench/results-speed-h200.json)")


@dataclass(frozen=True)
class HostCost:
    """What llama.cpp's decode costs a node's CPU beyond reading the weights, at a thread count: per block it
    runs, per token (its threads meet after every operation), and the KV cache's rate per thread (attention
    on a CPU is compute-bound: half of its cost grows with the query heads; the rate is for 4 per KV head).
    Measured per node by `make host-profile` (lab/bench/host_profile.py: llama-bench on a real-shape model at an
    empty context and at depth, solved by solve_host_cost); node_pools.<pool>.cpu_decode_by_threads."""

    block_us: float
    kv_gbs: float
    # The time per position in the context at KV_DEEP_DEPTH over that at KV_PROFILE_DEPTH (make host-profile's two
    # depths): a CPU's attention slows per position past some depth. None: not measured.
    kv_deep_slowdown: Optional[float] = None

    def kv_time_scale(self, depth: int) -> float:
        """What the time per position at this depth is, over that at KV_PROFILE_DEPTH: 1 up to it, then on the line
        to the slow-down at KV_DEEP_DEPTH (none where not measured), held past it."""
        if depth <= KV_PROFILE_DEPTH:
            return 1.0
        slowdown = self.kv_deep_slowdown or 1.0
        return 1.0 + (slowdown - 1.0) * min(1.0, (depth - KV_PROFILE_DEPTH) / (KV_DEEP_DEPTH - KV_PROFILE_DEPTH))


# The depths make host-profile measures a CPU's attention at (lab/bench/host_profile.py): its KV rate at the first,
# how much slower each position is at the second (HostCost.kv_deep_slowdown).
KV_PROFILE_DEPTH, KV_DEEP_DEPTH = 4096, 8192


# The largest of those slow-downs measured (1.2-1.67 on the GPU machines' 16-thread Xeons, the most on lease 16's;
# 1.27-1.49 on the 2-core CI EPYC: bench/results-speed-h*.json, bench/results-decode-cpu.json): a node whose slow-down
# is not measured is planned between none and this.
KV_DEEP_SLOWDOWN_MOST = 1.67


# The slowest and the fastest of the hosts measured (`lab/bench/decode_error.py --node-figures` prints each: five
# leases of the H200 machine, three of the H100 machine and two CI machines): a node not measured is planned between
# them (tests/test_speed_model.py holds both ends to the records). The KV rate is what differs between hosts (0.75 GB/s
# a thread at 16 threads on the seventh lease, 0.8-0.9 on the fourth whichever shape it is solved from, 1.9-2.7 on
# the third, 4.0 on the second CI machine's 2 threads); the block time is what the solving shape's weights leave
# unexplained, so it depends on that shape (one shape, make host-profile's, for every node), and 0 where the
# weights alone are already slower than measured (the CI machine's single thread).
HOST_COST_SLOW = HostCost(block_us=700.0, kv_gbs=0.74, kv_deep_slowdown=KV_DEEP_SLOWDOWN_MOST)
HOST_COST_FAST = HostCost(block_us=0.0, kv_gbs=4.0, kv_deep_slowdown=1.0)


# The query heads per KV head the KV rate is stated for (Llama-3.1-8B: 32 / 8).
HOST_KV_GROUP = 4


def by_threads(table: dict[int, float], threads: int) -> float:
    """A figure measured at some thread counts, at this count: on the line between the two counts around it,
    the nearest count's figure outside them."""
    points = sorted(table.items())
    if threads <= points[0][0]:
        return points[0][1]
    if threads >= points[-1][0]:
        return points[-1][1]
    (t0, v0), (t1, v1) = next((a, b) for a, b in zip(points, points[1:]) if a[0] <= threads <= b[0])
    return v0 + (v1 - v0) * (threads - t0) / (t1 - t0)


def read_gbs_at(table: dict[int, float], threads: int) -> float:
    """What a node reads with this many threads from its memory_bandwidth_by_threads: interpolated between the counts
    given, proportional below the first, flat beyond the last."""
    first, gbs = min(table.items())
    return gbs * threads / first if threads < first else by_threads({t: float(v) for t, v in table.items()}, threads)


def host_read_gbs(pool: "NodePool", threads: int) -> Optional[tuple[float, float]]:
    """(low, high) GB/s the node reads with this many threads: the measured figure (interpolated between the
    counts given, proportional below the first, flat beyond the last) twice, or without it from
    HOST.thread_read_gbs per thread up to memory_bandwidth_gbs, and memory_bandwidth_gbs. None: no figure."""
    table = pool.memory_bandwidth_by_threads
    if table:
        value = read_gbs_at(table, threads)
        return value, value
    if pool.memory_bandwidth_gbs is None:
        return None
    top = float(pool.memory_bandwidth_gbs)
    return min(top, threads * HOST.thread_read_gbs), top


def host_cost(pool: "NodePool", threads: int) -> tuple[HostCost, HostCost]:
    """(slow, fast) HostCost at this many threads: the node's measured figures (cpu_decode_by_threads,
    interpolated between the counts given, the nearest beyond them) twice, or without them the slowest and the
    fastest host measured (HOST_COST_SLOW, HOST_COST_FAST)."""
    table = pool.cpu_decode_by_threads
    if not table:
        return HOST_COST_SLOW, HOST_COST_FAST
    slowdowns = {t: float(f.kv_deep_slowdown) for t, f in table.items() if f.kv_deep_slowdown is not None}
    slowdown = by_threads(slowdowns, threads) if slowdowns else None
    cost = HostCost(by_threads({t: float(f.block_us) for t, f in table.items()}, threads),
                    by_threads({t: float(f.kv_gbs_per_thread) for t, f in table.items()}, threads))
    # Its slow-down past KV_PROFILE_DEPTH not measured: between none and the most measured.
    return (HostCost(cost.block_us, cost.kv_gbs, slowdown or KV_DEEP_SLOWDOWN_MOST),
            HostCost(cost.block_us, cost.kv_gbs, slowdown or 1.0))


# make host-profile --experts measures, on a node with its card, a real-shape Qwen3-30B-A3B Q4_K_M (token routing) with
# the experts of EXPERTS_PROFILE_BLOCKS blocks in system RAM and reports what each block moved to RAM adds per token
# (experts_in_ram_us_by_threads). A block of it reads this many bytes of routed experts per token (8 of its 128
# experts; tests/test_speed_model.py holds the figure to the planner's layout of that shape).
EXPERTS_PROFILE_SHAPE = ("qwen3-30b-a3b", "Q4_K_M")
EXPERTS_PROFILE_BLOCKS = (24, 48)
EXPERTS_PROFILE_BLOCK_BYTES = 22.94e6


# What the solved share may be: outside it the figure measured something else (a node that moved, a card that held
# less than the tool asked): the plan keeps HOST.expert_share. Hosts measured: 0.65-1.15 (docs, "Decode speed").
EXPERT_SHARE_BOUNDS = (0.2, 2.0)


def node_expert_share(pool: "NodePool", threads: int, card_gbs: float) -> Optional[float]:
    """The node's share of its read bandwidth for routed experts, from its experts_in_ram_us_by_threads and
    memory_bandwidth_by_threads (expert_share); None: not measured."""
    if not pool.experts_in_ram_us_by_threads or not pool.memory_bandwidth_by_threads:
        return None
    return expert_share(pool.experts_in_ram_us_by_threads, pool.memory_bandwidth_by_threads, threads, card_gbs)


def expert_share(experts_us: dict, read_gbs: dict, threads: int, card_gbs: float) -> Optional[float]:
    """The share of its read bandwidth (read_gbs, by threads) a node's CPU reads routed experts at, from what a block
    moved to RAM adds (experts_us, by threads): that move adds its CPU time (HOST.expert_block_us, and its bytes read
    at the share of what the node reads with that many threads) less the card's time for the same bytes (card_gbs,
    the card's K-quant rate); solved for the share at each count measured, and at this count on the line between them
    (by_threads). None: a share outside EXPERT_SHARE_BOUNDS."""
    shares, refused = figure_shares(experts_us, read_gbs, card_gbs)
    return None if refused else by_threads(shares, threads)


def figure_shares(experts_us: dict, read_gbs: dict, card_gbs: float) -> tuple[dict[int, float], Optional[tuple]]:
    """The share each thread count of a figure gives (solved_share), and the first (threads, us, share) whose share
    is outside EXPERT_SHARE_BOUNDS (share None: the figure leaves no time for reading the experts), None where all
    stand: the plan uses no part of a figure with one refused (expert_share; experts_figure_problems says which)."""
    shares = {}
    for t, us in experts_us.items():
        share = solved_share(us, read_gbs, int(t), card_gbs)
        if share is None or not EXPERT_SHARE_BOUNDS[0] <= share <= EXPERT_SHARE_BOUNDS[1]:
            return shares, (int(t), us, share)
        shares[int(t)] = share
    return shares, None


def solved_share(us: float, read_gbs: dict, threads: int, card_gbs: float) -> Optional[float]:
    """The share one figure (us a block with this many threads) gives, unbounded; None where the figure is no more
    than what moving a block adds without reading its experts (HOST.expert_block_us, less the card's time)."""
    # expert_block_seconds(share, read, card) == us, for the share:
    cpu_s = float(us) / 1e6 + EXPERTS_PROFILE_BLOCK_BYTES / (card_gbs * 1e9) - HOST.expert_block_us / 1e6
    if cpu_s <= 0:
        return None
    read = by_threads({int(t): float(v) for t, v in read_gbs.items()}, threads)
    return EXPERTS_PROFILE_BLOCK_BYTES / (cpu_s * read * 1e9)


def expert_block_seconds(share: float, read_gbs: float, card_gbs: float) -> float:
    """What a block of the experts profile's shape moved from the card to RAM adds to a token, as the plan has it:
    HOST.expert_block_us, and its routed experts read at this share of the node's read bandwidth, less the card's time
    for them (what experts_in_ram_us_by_threads states; node_expert_share solves it for the share)."""
    return (HOST.expert_block_us / 1e6 + EXPERTS_PROFILE_BLOCK_BYTES / (share * read_gbs * 1e9)
            - EXPERTS_PROFILE_BLOCK_BYTES / (card_gbs * 1e9))


def kv_deep_slowdown(empty_tok_s: float, profile_tok_s: float, deep_tok_s: float) -> float:
    """A node's kv_deep_slowdown from a CPU server's rates at an empty context, at KV_PROFILE_DEPTH and at
    KV_DEEP_DEPTH (make host-profile's f16 runs): the time each position costs at the second depth over the first."""
    return ((1 / deep_tok_s - 1 / empty_tok_s) / KV_DEEP_DEPTH) / ((1 / profile_tok_s - 1 / empty_tok_s) / KV_PROFILE_DEPTH)
