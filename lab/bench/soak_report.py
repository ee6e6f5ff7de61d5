"""lab/bench/router_soak.py's figures from what it watched: peak VRAM over the idle card against the plan's
budget, each resident set's peak against the sum of its planned VRAM, each model's own VRAM, every load,
swap, eviction, child exit and failed request, and each model's swap time (warm, cold) against the
plan's swap_seconds (warm and cold). Standard library only."""

from __future__ import annotations

import re
import statistics
from typing import Optional

GIB = 1024.0  # MiB per GiB
RUNNING = ("loading", "loaded", "sleeping")
OFF = 0.20  # a plan figure further than this from the measurement is called off
EVICT = re.compile(r"evicting idle LRU name=(\S+) to make room for name=(\S+)|models_max limit reached, removing LRU name=(\S+)")
EXIT = re.compile(r"instance name=(\S+) exited with status (-?\d+)")
SPAWN = re.compile(r"spawning server instance with name=(\S+)")


def _running(states: dict[str, str]) -> frozenset[str]:
    return frozenset(m for m, s in states.items() if s.split()[0] in RUNNING)


def _settled(states: dict[str, str]) -> bool:
    return all(s.split()[0] != "loading" for s in states.values())


def _classify(error: str, status: Optional[int]) -> str:
    text = error.lower()
    for needle, label in (("failed to load", "load failed"), ("proxy error", "proxy error (eviction race)"),
                          ("model limit reached", "model limit reached (load race)"), ("timed out", "client timeout"),
                          ("timeout", "client timeout"), ("connection", "connection error")):
        if needle in text:
            return label
    return f"status {status}" if status else "no answer"


def resident_sets(card: list[tuple[float, int]], statuses: list[tuple[float, dict]], baseline: int, plan: dict) -> list[dict]:
    """Per resident set: the card's peak over the idle baseline while that set was loaded and settled
    (the same set, nothing loading, at the status samples either side), against its planned VRAM."""
    peaks: dict[frozenset, int] = {}
    j = 0
    for t, mib in card:
        while j + 1 < len(statuses) and statuses[j + 1][0] <= t:
            j += 1
        if j + 1 >= len(statuses) or statuses[j][0] > t:
            continue
        before, after = statuses[j][1], statuses[j + 1][1]
        if _running(before) != _running(after) or not (_settled(before) and _settled(after)):
            continue
        key = _running(before)
        peaks[key] = max(peaks.get(key, 0), mib)
    rows = []
    for models, mib in sorted(peaks.items(), key=lambda kv: (len(kv[0]), sorted(kv[0]))):
        planned = sum(plan["models"][m]["vram_gib"] for m in models if m in plan["models"])
        measured = (mib - baseline) / GIB
        rows.append({"models": sorted(models), "peak_gib": round(measured, 2), "planned_vram_gib": round(planned, 2),
                     "over_plan_gib": round(measured - planned, 2)})
    return rows


def per_model_vram(procs: list[tuple[float, dict]], statuses: list[tuple[float, dict]], plan: dict) -> dict:
    """Each child's own peak on the card (nvidia-smi per process) while its model read `loaded`."""
    peak: dict[str, int] = {}
    j = 0
    for t, found in procs:
        while j + 1 < len(statuses) and statuses[j + 1][0] <= t:
            j += 1
        states = statuses[j][1] if statuses and statuses[j][0] <= t else {}
        for name, mib in found.items():
            if states.get(name, "").startswith("loaded") or name not in plan["models"]:
                peak[name] = max(peak.get(name, 0), mib)
    return {name: {"peak_gib": round(mib / GIB, 2), "planned_vram_gib": plan["models"].get(name, {}).get("vram_gib"),
                   "over_plan_gib": (round(mib / GIB - plan["models"][name]["vram_gib"], 2) if name in plan["models"] else None)}
            for name, mib in sorted(peak.items())}


def loads(statuses: list[tuple[float, dict]], t0: float) -> list[dict]:
    """Every load seen in /models: loading first seen -> loaded first seen (0.2 s resolution)."""
    found, started, last = [], {}, {}
    for t, states in statuses:
        for name, state in states.items():
            s = state.split()[0]
            if s == "loading" and last.get(name) != "loading":
                started[name] = t
            if s == "loaded" and last.get(name) == "loading" and name in started:
                found.append({"model": name, "at_s": round(started[name] - t0, 1), "seconds": round(t - started.pop(name), 1)})
            if "failed" in state and "failed" not in last.get(name + "#raw", ""):
                found.append({"model": name, "at_s": round(t - t0, 1), "failed": state})
            last[name], last[name + "#raw"] = s, state
    return found


def swaps(results, cold: list[dict], plan: dict) -> dict:
    """Per model: the first-token time of each sequential request that found its model not running
    (the swap a client waits through: eviction, spawn, load, first token), the warm first-token time
    of requests to a running model, the cold load, and the plan's swap_seconds (warm: page cache; cold: disk)."""
    out = {}
    for name, planned in plan["models"].items():
        seq = [r for r in results if r.model == name and r.kind in ("sequential", "cancel") and r.ok and r.first_token_s]
        swap = [r.first_token_s for r in seq if name not in r.resident_before]
        hit = [r.first_token_s for r in seq if name in r.resident_before]
        predicted = planned.get("swap_seconds") or {}
        row = {"planned_warm_s": predicted.get("warm"), "planned_cold_s": predicted.get("cold"), "swaps": len(swap)}
        if swap:
            row |= {"swap_median_s": round(statistics.median(swap), 2), "swap_min_s": round(min(swap), 2),
                    "swap_max_s": round(max(swap), 2)}
        if hit:
            row["resident_first_token_median_s"] = round(statistics.median(hit), 3)
        for c in cold:
            if c.get("model") == name:
                for phase in ("warm", "cold"):
                    if isinstance(c.get(phase), dict) and c[phase].get("first_token_s") is not None:
                        row[f"{phase}_empty_card_s"] = round(c[phase]["first_token_s"], 2)
                row["drop_caches"] = c.get("drop_caches")
        for measured, plan_s in (("swap_median_s", row["planned_warm_s"]), ("warm_empty_card_s", row["planned_warm_s"]),
                                 ("cold_empty_card_s", row["planned_cold_s"])):
            if plan_s and row.get(measured):
                ratio = plan_s / row[measured]
                row[measured.removesuffix("_s") + "_plan_ratio"] = round(ratio, 2)
                row[measured.removesuffix("_s") + "_plan_off"] = abs(ratio - 1) > OFF
        out[name] = row
    return out


def report(out: dict, results, cold: list[dict], card: list, procs: list, statuses: list, log: list, t0: float,
           limit: int) -> dict:
    plan = out["plan"]
    baseline = out["gpu"]["baseline_mib"]
    during = [mib for t, mib in card if t >= t0]
    if during and baseline is not None:
        peak = max(during)
        out["gpu"] |= {"peak_mib": peak, "peak_over_baseline_gib": round((peak - baseline) / GIB, 2),
                       "budget_gib": plan["vram_budget_gib"],
                       "within_budget": (peak - baseline) / GIB <= (plan["vram_budget_gib"] or float("inf")),
                       "samples": len(during)}
        out["resident_sets"] = resident_sets(card, statuses, baseline, plan)
        out["per_model_vram"] = per_model_vram(procs, statuses, plan)
    most = max((len(_running(s)) for _, s in statuses), default=0)
    failures = [{"index": r.index, "model": r.model, "kind": r.kind, "status": r.status, "why": _classify(r.error, r.status),
                 "error": r.error[:200]} for r in results if not r.ok]
    exits = [{"at_s": round(t - t0, 1), "model": m.group(1), "status": int(m.group(2))}
             for t, line in log for m in [EXIT.search(line)] if m]
    evictions = [{"at_s": round(t - t0, 1), "evicted": m.group(1) or m.group(3), "for": m.group(2)}
                 for t, line in log for m in [EVICT.search(line)] if m]
    spawned = [SPAWN.search(line).group(1) for _, line in log if SPAWN.search(line)]
    load_rows = loads(statuses, t0)
    troubles = [(round(t - t0, 1), line) for t, line in log
                if re.search(r"out of memory|CUDA error|GGML_ASSERT|ABORT|failed to load|force-killing", line, re.I)]
    kinds: dict[str, int] = {}
    for r in results:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    out["requests"] = {"sent": len(results), "by_kind": kinds, "answered_200": sum(1 for r in results if r.ok),
                       "cancelled_by_client": sum(1 for r in results if r.cancelled), "failures": failures}
    out["most_running_seen"] = most
    out["loads"] = load_rows
    out["spawned"] = len(spawned)
    out["evictions"] = evictions
    out["child_exits"] = exits
    out["log_trouble"] = troubles[:50]
    out["swaps"] = swaps(results, cold, plan)
    out["cold"] = cold
    out["verdict"] = verdict(out, limit)
    out["requests_detail"] = [{"i": r.index, "model": r.model, "kind": r.kind, "status": r.status,
                               "first_token_s": round(r.first_token_s, 3) if r.first_token_s else None,
                               "total_s": round(r.total_s, 3) if r.total_s else None, "chunks": r.chunks,
                               "resident_before": r.resident_before, "cancelled": r.cancelled,
                               "sent_at_s": round(r.sent - t0, 2)} for r in results]
    out["card_mib"] = [[round(t - t0, 2), mib] for t, mib in card]
    out["status_changes"] = _changes(statuses, t0)
    return out


FORCED = re.compile(r"force-killing model instance name=(\S+)")


def verdict(out: dict, limit: int) -> dict:
    """The run's verdict, from the recorded figures alone (so a stored result can be judged again).
    /models marks a child `failed` whenever it exits non-zero; one the router force-killed on its way out
    (an eviction whose child did not exit within stop-timeout) is a forced stop, not a failed load."""
    forced = [(at, m.group(1)) for at, line in out.get("log_trouble", []) for m in [FORCED.search(line)] if m]
    failed_rows = [row for row in out["loads"] if "failed" in row]
    forced_stops = [row for row in failed_rows if any(name == row["model"] and 0 <= row["at_s"] - at <= 2 for at, name in forced)]
    failed_loads = [row for row in failed_rows if row not in forced_stops] + \
        [f for f in out["requests"]["failures"] if f["why"] == "load failed"]
    return {
        "peak_within_budget": out["gpu"].get("within_budget"),
        "failures": len(out["requests"]["failures"]),
        "failures_by_why": _count(f["why"] for f in out["requests"]["failures"]),
        "failed_loads": len(failed_loads), "forced_stops": len(forced_stops),
        "child_exits_nonzero": sum(1 for e in out["child_exits"] if e["status"] != 0),
        "never_more_running_than_limit": out["most_running_seen"] <= limit if limit > 0 else None,
        "sets_over_plan": [s for s in out.get("resident_sets", []) if s["over_plan_gib"] > 0],
        "swap_plan_off": {m: {k: v for k, v in row.items() if k.endswith("_plan_ratio")}
                          for m, row in out["swaps"].items() if any(v is True for k, v in row.items() if k.endswith("_plan_off"))},
    }


def _count(items) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in items:
        found[item] = found.get(item, 0) + 1
    return found


def _changes(statuses: list[tuple[float, dict]], t0: float) -> list:
    rows, last = [], None
    for t, states in statuses:
        if states != last:
            rows.append([round(t - t0, 2), states])
            last = states
    return rows


def summary_lines(result: dict) -> list[str]:
    spec, gpu, v = result["spec"], result["gpu"], result["verdict"]
    lines = [f"== router soak {spec['stack']}/{spec['key']} ({result['meta']['gpu'] or 'no GPU'}; "
             f"{' '.join(result['meta']['llama_cpp'])})",
             f"requests {result['requests']['sent']} ({result['requests']['by_kind']}), 200: {result['requests']['answered_200']}, "
             f"failures {v['failures']} {v['failures_by_why']} (failed loads {v['failed_loads']}, forced stops {v['forced_stops']}), "
             f"cancelled by the client {result['requests']['cancelled_by_client']}, child exits non-zero {v['child_exits_nonzero']}, "
             f"evictions {len(result['evictions'])}, loads {len(result['loads'])}, most running {result['most_running_seen']}"]
    if gpu.get("peak_mib") is not None:
        lines.append(f"VRAM: idle {gpu['baseline_mib']} MiB, peak {gpu['peak_mib']} MiB = {gpu['peak_over_baseline_gib']} GiB "
                     f"over idle; plan budget {gpu['budget_gib']} GiB -> {'within' if gpu['within_budget'] else 'OVER'}")
        for s in result.get("resident_sets", []):
            lines.append(f"  set {'+'.join(s['models']):40} peak {s['peak_gib']:6.2f} GiB, planned {s['planned_vram_gib']:6.2f} "
                         f"({s['over_plan_gib']:+.2f})")
        for name, row in result.get("per_model_vram", {}).items():
            planned = row["planned_vram_gib"]
            lines.append(f"  child {name:20} peak {row['peak_gib']:6.2f} GiB, planned {planned if planned is not None else '-'}")
    for name, row in result["swaps"].items():
        lines.append(f"  swap {name:16} plan {row['planned_warm_s']}/{row['planned_cold_s']} s warm/cold; traffic median "
                     f"{row.get('swap_median_s')} s "
                     f"(n={row['swaps']}, max {row.get('swap_max_s')}); empty card warm {row.get('warm_empty_card_s')} s, "
                     f"cold {row.get('cold_empty_card_s')} s")
    for f in result["requests"]["failures"][:10]:
        lines.append(f"  failed #{f['index']} {f['model']} ({f['kind']}): {f['why']}: {f['error'][:100]}")
    return lines
