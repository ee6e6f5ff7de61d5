"""The init container of a server that shares its GPU with a router (planning/capacity.py RoomWait): the pod's
server starts once the router holds no more than the VRAM budget that leaves it room.

Why: the router's budget is the card less every other GPU server of its pool, but its admission proxy holds the
budget of the plan it last read. When a model moves out of the router's library to a server of its own, the new
server's pod starts at once while the router's proxy reads the smaller budget only once the kubelet has
refreshed its ConfigMap (~1-2 min) and unloads idle models at its next round: meanwhile both could hold the
card's memory and a load on either side would fail.

What it reads: ROOM_STATUS, a small JSON file the router's proxy rewrites every round on the model cache both
pods mount ({"vram_budget_gib", "resident_vram_gib", "at"}: the budget it holds the router to, the planned VRAM
of what is resident, when). It waits while either exceeds that budget. No file, or one older than ROOM_STALE_SECONDS: no router runs, and one that starts reads the new
plan, so the server starts. Past ROOM_WAIT_SECONDS it exits 1 with the figures (the kubelet restarts it).

Standard library only: run as a file of the server's programs ConfigMap (components/programs.py)."""

import json
import math
import os
import sys
import time

STATUS_BYTES = 4096  # the file is one small object; more is not the proxy's
POLL_SECONDS = 2.0


def _status(path):
    """The router's status, or None where there is none (no file, or one being replaced)."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(STATUS_BYTES))
        figures = {key: float(data[key]) for key in ("vram_budget_gib", "resident_vram_gib", "at")}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"room: {path} unreadable ({error}); reading it again", flush=True)
        return {}
    if not all(math.isfinite(v) for v in figures.values()):
        return {}
    return figures


def _budget(path):
    """The router's budget this server's plan holds it to (ROOM_BUDGET_FILE, beside this program in the server's
    programs ConfigMap: {"router": name, "router_budget_gib": GiB})."""
    with open(path, "rb") as handle:
        value = float(json.loads(handle.read(STATUS_BYTES))["router_budget_gib"])
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{path}: router_budget_gib {value}")
    return value


def main():
    path = os.environ["ROOM_STATUS"]
    most = _budget(os.environ["ROOM_BUDGET_FILE"])
    stale = float(os.environ["ROOM_STALE_SECONDS"])
    deadline = time.monotonic() + float(os.environ["ROOM_WAIT_SECONDS"])
    said = None
    while True:
        status = _status(path)
        if status is None:
            print("room: no router status on the cache: no router holds the card; starting", flush=True)
            return 0
        if status:
            age = time.time() - status["at"]
            if age > stale:
                print(f"room: the router's status is {age:.0f} s old: its proxy is not running; starting", flush=True)
                return 0
            budget, resident = status["vram_budget_gib"], status["resident_vram_gib"]
            if budget <= most + 1e-9 and resident <= most + 1e-9:
                print(f"room: the router holds {resident:g} GiB within its budget of {budget:g} GiB "
                      f"(at most {most:g}); starting", flush=True)
                return 0
            now = (budget, resident)
            if now != said:
                print(f"room: waiting: the router's budget is {budget:g} GiB and it holds {resident:g} GiB; this server "
                      f"starts once both are at most {most:g} GiB (its proxy reads the new plan, then unloads idle "
                      "models)", flush=True)
                said = now
        if time.monotonic() > deadline:
            print(f"room: the router still holds more than {most:g} GiB after {os.environ['ROOM_WAIT_SECONDS']} s "
                  "(models busy with long requests, or a plan it has not read); exiting to be restarted", flush=True)
            return 1
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
