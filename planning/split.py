"""A model split over nodes, as the plan names and reads it (the split itself is its engine's: Estimate.split)."""

from __future__ import annotations

from common.quantity import gib


def helper_name(server: str, index: int) -> str:
    """The workload, Service and pod name of helper ``index`` of a split's main server ``server``."""
    return f"{server}-rpc-{index}"


def helper_endpoints(server: str, helpers: int, port: int) -> str:
    """llama-server's --rpc value: each helper's Service and port, in llama.cpp's device order (the main server's flag
    and its wait for the helpers name the same)."""
    return ",".join(f"{helper_name(server, i)}:{port}" for i in range(helpers))


def estimates_by_workload(plan: dict) -> dict[str, dict]:
    """Each workload's memory estimate in a plan's dict (CapacityPlan.to_dict): the servers' and their split helpers'."""
    out = {s["name"]: s["estimate"] for s in plan["servers"].values()}
    for server in plan["servers"].values():
        for index, helper in enumerate((server.get("split") or {}).get("helpers") or []):
            out[helper_name(server["name"], index)] = helper["memory"]
    return out


def helpers_on(servers, pool_key: str) -> list[tuple[str, float, float]]:
    """(workload, memory GiB, VRAM GiB) of each split helper the plan's servers put on node pool ``pool_key``: what a
    router beside them on that pool cannot take (its limit and VRAM, its card's share when time-sliced)."""
    from common.quantity import gib

    return [(server.helper_name(i), gib(server.helper_memory(i)), helper.vram.total_gib if helper.vram else 0.0)
            for server in servers if server.split is not None
            for i, helper in enumerate(server.split.helpers) if helper.node_pool == pool_key]
