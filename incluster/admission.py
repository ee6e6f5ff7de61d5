"""The admission proxy's decisions (admission_proxy.py serves HTTP around them): which models are resident,
which idle one unloads to make room (least recently used, never a pinned one, never one serving a
request), when one loads (fit.py: the rule the plan checked, on the plan's numbers from admission.json),
the pinned models kept loaded, and what /metrics says of it all. The router is asked over its loopback
port (GET /models, POST /models/load and /models/unload, with the first key of the key file).

Standard library and h11 only: run as a file of the server's programs ConfigMap (components/programs.py)."""

import asyncio
import json
import math
import os
import sys
import time
import urllib.parse

import h11

import fit
import http_io
from router_rules import READY, RUNNING, Refusal
# How long an unloaded child may take to exit: the router force-kills it after stop-timeout (10 s).
UNLOAD_SECONDS = 30.0
POLL_SECONDS = 0.1
# How long a request waits for busy models to free room before a 503 (the gateway's next tier).
ADMIT_WAIT_SECONDS = float(os.environ.get("ADMIT_WAIT_SECONDS", "60"))
# How long a load may take before the requests waiting for it get a 503: a large model from a slow disk.
LOAD_SECONDS = float(os.environ.get("LOAD_SECONDS", "1800"))
# How long a call of the proxy's own to the router may take (its model list, a load, an unload).
ROUTER_CALL_SECONDS = 10.0
# The router's answer to GET /models lists every model with its preset: bounded, but roomy.
MAX_ROUTER_ANSWER_BYTES = 16 * 1024 * 1024
# How often the pinned models are checked (and loaded again when the router lost one).
PIN_CHECK_SECONDS = float(os.environ.get("PIN_CHECK_SECONDS", "30"))
# After a drain's wait, how long the model stays refused if the keeper never says resume (it crashed): a
# router reload takes seconds, and no model may stay unserved because a sidecar died.
DRAIN_HOLD_SECONDS = float(os.environ.get("DRAIN_HOLD_SECONDS", "120"))
# What this router holds, for the servers sharing its card (incluster/room.py): rewritten every round on the
# pod's scratch volume, from where the keeper copies it to the model cache; unset for a router without a card.
ROOM_STATUS = os.environ.get("ROOM_STATUS")
ROOM_SECONDS = float(os.environ.get("ROOM_SECONDS", "10"))


def log(message: str) -> None:
    print(f"admission: {message}", file=sys.stderr, flush=True)


def unserved() -> dict:
    """The listed models the downloader does not offer, and why (LIBRARY_STATUS, written by library.py)."""
    path = os.environ.get("LIBRARY_STATUS")
    try:
        with open(path, "rb") as f:
            missing = json.loads(f.read(1 << 20)).get("missing", {})
    except (TypeError, OSError, ValueError, AttributeError):
        return {}
    reasons = {}
    for name, why in missing.items() if isinstance(missing, dict) else ():
        why = str(why)
        reasons[str(name)] = ("larger_than_planned" if why.startswith("refused: larger than planned") else
                              "refused" if why.startswith("refused") else
                              "fetching" if why.startswith("not fetched yet") else "unreachable")
    return reasons


class RouterClient:
    """The proxy's own requests to the router (its model list, a load, an unload), over the loopback, with
    the first key of the key file."""

    def __init__(self, url: str, keys: tuple):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.auth = [("Authorization", "Bearer " + keys[0].decode("latin-1"))] if keys else []

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """One request; a router that does not answer within ROUTER_CALL_SECONDS, refuses the connection or
        closes it early is a 503 (it is starting or restarting: the gateway tries its next tier)."""
        headers = self.auth + ([("Content-Type", "application/json")] if body else [])
        try:
            return await http_io.call(self.host, self.port, method, path, headers, body, ROUTER_CALL_SECONDS,
                                      MAX_ROUTER_ANSWER_BYTES)
        except (OSError, asyncio.TimeoutError, h11.ProtocolError, ValueError) as error:
            raise Refusal(503, f"the router is not answering ({type(error).__name__}); try again",
                          "unavailable_error") from None

    async def statuses(self, full: bool = False) -> dict:
        status, body = await self.call("GET", "/models")
        if status != 200:  # 503 while it loads its preset at start
            raise Refusal(503, f"the router's model list answered {status}; try again", "unavailable_error")
        try:
            data = json.loads(body)["data"]
            return {m["id"]: (m["status"] if full else m["status"]["value"]) for m in data}
        except (ValueError, KeyError, TypeError) as error:
            raise Refusal(502, f"the router's model list could not be read: {error!r}", "server_error") from None

    async def unload(self, name: str) -> None:
        status, body = await self.call("POST", "/models/unload", json.dumps({"model": name}).encode())
        # 400 "model is not running": it went on its own meanwhile, which is what was wanted.
        if status not in (200, 400):
            raise Refusal(502, f"the router answered {status} to unloading {name}: {body[:200]!r}", "server_error")

    async def load(self, name: str) -> None:
        status, body = await self.call("POST", "/models/load", json.dumps({"model": name}).encode())
        # 400 "model is already running": loaded meanwhile (by an earlier request of the proxy's).
        if status not in (200, 400):
            raise Refusal(503, f"the router answered {status} to loading {name}: {body[:200]!r}; try again",
                          "unavailable_error")


class Residency:
    """The proxy's view: requests in flight and recency per model, decided one admission at a time."""

    def __init__(self, plan_file: str, router: RouterClient):
        self.plan_file = plan_file
        self.plan_version = None
        self.router = router
        self.lock = asyncio.Lock()
        self.freed = asyncio.Event()
        self.in_flight: dict = {}
        self.last_used: dict = {}
        self.unloading: set = set()  # victims whose child has been told to stop and has not exited yet
        self.retired: dict = {}  # models the plan dropped, with their last figures, while the router runs them
        self.loads: dict = {}  # model -> future of the load the proxy asked for (None once loaded, else an error)
        self.tasks: set = set()  # background tasks, referenced until done
        self.pin_failures: dict = {}  # pinned model -> (failures in a row, when to try again)
        self.draining: dict = {}  # model the keeper reloads -> until when (monotonic) its new requests are refused
        self.shrinking: set = set()  # models drained by fit_budget itself (a smaller budget), resumed once unloaded
        # Figures for /metrics.
        self.evictions: dict = {}
        self.failed_loads: dict = {}
        self.swaps: dict = {}  # count, seconds: from the load's admission until the router said loaded
        self.waits = [0, 0.0]  # admissions that waited for room (to be made or freed): count, seconds
        self.last_statuses: dict = {}
        self.models: dict = {}
        self.refresh(strict=True)

    def refresh(self, strict: bool = False) -> None:
        """Reads the plan when its file changed (the kubelet swaps a ConfigMap's files in place): checked
        whole, then swapped in; a bad one is logged and the last good plan kept (at start: an error). A model
        the plan drops is kept as retired, its figures counted, while the router still runs it."""
        try:
            stat = os.stat(self.plan_file)
            version = (stat.st_mtime_ns, stat.st_ino, stat.st_size)
            if version == self.plan_version:
                return
            with open(self.plan_file, "rb") as f:
                plan = json.loads(f.read(MAX_ROUTER_ANSWER_BYTES))
            models = {str(n): {"vram_gib": float(m["vram_gib"]), "ram_gib": float(m["ram_gib"]),
                               "pinned": bool(m.get("pinned"))} for n, m in plan["models"].items()}
            budget = fit.Budget.from_plan(plan)
            allowed = frozenset(str(p) for p in plan["allowed_paths"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            if strict:
                raise
            log(f"plan {self.plan_file} unreadable, keeping the last one: {error!r}")
            return
        for name in set(self.models) - set(models):
            self.retired[name] = self.models[name]
        for name in models:
            self.retired.pop(name, None)
        self.plan_version = version
        self.models, self.budget, self.allowed_paths = models, budget, allowed
        self.pinned = {name for name, m in models.items() if m["pinned"]}
        for table, empty in ((self.in_flight, 0), (self.last_used, 0.0), (self.evictions, 0), (self.failed_loads, 0)):
            for name in models:
                table.setdefault(name, empty)
        for name in models:
            self.swaps.setdefault(name, [0, 0.0])
        log(f"plan: {len(models)} models, VRAM budget {budget.vram_gib} GiB, RAM budget {budget.ram_gib} GiB")

    def figures(self, name: str) -> dict:
        """A model's planned figures; one the router runs that no plan of this proxy's ever listed (the proxy
        restarted with a plan that dropped it) counts as filling everything, so it is unloaded before any load."""
        return self.models.get(name) or self.retired.get(name) or {"vram_gib": math.inf, "ram_gib": math.inf}

    def fits(self, names) -> bool:
        return fit.fits(self.budget, [(self.figures(n)["vram_gib"], self.figures(n)["ram_gib"]) for n in set(names)])

    async def resident(self) -> tuple[set, dict]:
        """What holds memory now: every model the router runs (a retired one included, with its last planned
        figures), every model a request holds, every child still on its way out."""
        statuses = await self.router.statuses()
        self.last_statuses = statuses
        for name in [n for n in self.retired if statuses.get(n) not in RUNNING]:
            del self.retired[name]
        running = {n for n, s in statuses.items() if s in RUNNING}
        return running | {n for n, c in self.in_flight.items() if c > 0} | self.unloading, statuses

    async def admit(self, name: str) -> None:
        """Returns once ``name`` is loaded and counted in flight: at once when it is resident, else once it
        fits (idle models unloaded first: least recently used, a retired one before any) and the router has
        loaded it. Waits at most ADMIT_WAIT_SECONDS for busy models to free room, then 503 (the gateway
        retries on its next tier). Cancelled (the client left): nothing stays counted and no lock is held."""
        if self.is_draining(name):
            raise Refusal(503, f"model {name} is being reloaded with new settings or weights; try again",
                          "unavailable_error")
        if self.in_flight.get(name, 0) > 0 and name not in self.unloading:  # a request holds it resident
            self._enter(name)
        else:
            await self._make_room(name)
        try:
            load = self.loads.get(name)
            if load is not None:
                await asyncio.shield(load)
        except BaseException:
            self.leave(name)
            raise

    async def _make_room(self, name: str) -> None:
        started = time.monotonic()
        waited = False
        while True:
            victim = None
            async with self.lock:
                if self.is_draining(name):
                    # Drained while this request waited for the lock or for room: it was not counted in flight,
                    # so the keeper's drain did not wait for it; it must not load the model now.
                    raise Refusal(503, f"model {name} is being reloaded with new settings or weights; try again",
                                  "unavailable_error")
                resident, statuses = await self.resident()
                if name not in statuses:
                    # Planned but not served: the keeper is still fetching it (the router reads a preset of the
                    # fetched models only), or refused it. A 503 the gateway retries on its next tier, not the
                    # router's 400.
                    if unserved().get(name) == "larger_than_planned":
                        raise Refusal(503, f"model {name} is not offered: its files are larger than the plan counted",
                                      "unavailable_error")
                    raise Refusal(503, f"model {name} is not on this server yet (its weights are being fetched); "
                                       "try again later", "unavailable_error")
                if statuses.get(name) in RUNNING and name not in self.unloading:
                    self._enter(name)
                    if statuses[name] == "loading" and name not in self.loads:
                        # Loading on someone else's request: its end is watched too.
                        self._spawn(self._watch_load(name, time.monotonic(), self._watch(name)))
                    break
                if name not in self.unloading and self.fits(resident | {name}):
                    self._enter(name)
                    # The load's future before the call: a request for the same model that arrives meanwhile
                    # (counted in flight, so it skips this lock) waits for it instead of going on unloaded.
                    future = self._watch(name)
                    try:
                        await self.router.load(name)
                    except BaseException as error:
                        if not future.done():
                            future.set_exception(error if isinstance(error, Refusal) else Refusal(
                                503, f"the load of {name} did not start; try again", "unavailable_error"))
                        self.leave(name)
                        raise
                    self._spawn(self._watch_load(name, time.monotonic(), future))
                    break
                victim = self._idle_victim(resident, statuses)
                if victim is not None:
                    await self._unload(victim, f"to make room for {name}")
                else:
                    self.freed.clear()
            waited = True
            if victim is not None:
                # Outside the lock: requests for resident models go on while the child exits.
                await self._gone(victim)
                continue
            if time.monotonic() - started > ADMIT_WAIT_SECONDS:
                raise Refusal(503, f"no room for {name}: every resident model has been busy for "
                                   f"{ADMIT_WAIT_SECONDS:.0f} s; try again later", "unavailable_error")
            try:
                await asyncio.wait_for(self.freed.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
        if waited:
            self.waits[0] += 1
            self.waits[1] += time.monotonic() - started

    def _idle_victim(self, resident: set, statuses: dict):
        """The model to unload for room: idle, not pinned, running; one the plan no longer lists (retired, or
        unknown to this proxy) first, then the least recently used."""
        candidates = [n for n in resident if self.in_flight.get(n, 0) == 0 and n not in self.pinned
                      and n not in self.unloading and statuses.get(n) in RUNNING]
        return min(candidates, key=lambda n: (n in self.models, self.last_used.get(n, 0.0), n)) if candidates else None

    async def fit_budget(self) -> None:
        """A plan whose budget shrank (a model moved to a server of its own on this card, a lower VRAM): idle
        models are unloaded, least recently used first, until what is resident fits it again, so the other
        server's memory is freed without waiting for a load here to make room. A busy model is left to finish
        (the next round takes it once idle); nothing past the budget is admitted meanwhile."""
        while True:
            async with self.lock:
                resident, statuses = await self.resident()
                if self.fits(resident):
                    return
                victim = self._idle_victim(resident, statuses)
                if victim is None:
                    # Every model over the budget is busy, and one always busy would never be idle: the least
                    # recently used of them takes no new request (503, the gateway's next tier) until it is idle
                    # and unloaded by a later round.
                    busy = [n for n in resident if n not in self.pinned and n not in self.unloading
                            and statuses.get(n) in RUNNING and not self.is_draining(n)]
                    if busy:
                        name = min(busy, key=lambda n: (n in self.models, self.last_used.get(n, 0.0), n))
                        self.draining[name] = time.monotonic() + DRAIN_HOLD_SECONDS
                        self.shrinking.add(name)
                        log(f"{name}: takes no new request until it is idle: what is resident exceeds the plan's budget")
                    return
                await self._unload(victim, "as what is resident exceeds the plan's budget")
            await self._gone(victim)
            if victim in self.shrinking:
                self.shrinking.discard(victim)
                self.resume([victim])

    async def _unload(self, victim: str, why: str) -> None:
        """Has the router unload an idle model, counted as on its way out until its child has exited (_gone);
        a call that fails leaves it counted as before."""
        self.unloading.add(victim)
        log(f"unloading {victim} (least recently used idle) {why}")
        try:
            await self.router.unload(victim)
        except BaseException:
            self.unloading.discard(victim)
            raise

    async def keep_room(self) -> None:
        """Every ROOM_SECONDS, on its own (a pinned model's load, which keep_pinned waits for, may take minutes,
        and a stale status reads as "no router"): write_room."""
        while True:
            try:
                self.refresh()
                await self.write_room()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - the next round writes it again
                log(f"room status: {error!r}")
            await asyncio.sleep(ROOM_SECONDS)

    async def write_room(self) -> None:
        """ROOM_STATUS: the VRAM budget this proxy holds the router to, the planned VRAM of what is resident, and
        when; replaced whole (a reader never sees half of it). Where the router does not answer, what it last
        said, with what requests hold and what is on its way out."""
        if not ROOM_STATUS or self.budget.vram_gib is None:
            return
        try:
            resident, _ = await self.resident()
        except Refusal:
            resident = ({n for n, s in self.last_statuses.items() if s in RUNNING}
                        | {n for n, c in self.in_flight.items() if c > 0} | self.unloading)
        held = sum(self.figures(n)["vram_gib"] for n in resident)
        status = {"vram_budget_gib": self.budget.vram_gib,
                  # A model no plan of this proxy's listed counts as filling the card: no server starts beside it.
                  "resident_vram_gib": round(held, 2) if math.isfinite(held) else 1e9, "at": time.time()}
        try:
            with open(ROOM_STATUS + ".new", "w") as out:
                json.dump(status, out)
            os.replace(ROOM_STATUS + ".new", ROOM_STATUS)
        except OSError as error:
            log(f"room status {ROOM_STATUS} not written: {error!r}")

    def _watch(self, name: str):
        """A future for the model's load (settled by _watch_load), registered where requests look for it."""
        future = asyncio.get_running_loop().create_future()
        # Read whether or not a request still waits for it (no "exception never retrieved" noise).
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        future.add_done_callback(lambda f: self.loads.get(name) is f and self.loads.pop(name))
        self.loads[name] = future
        return future

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def known(self) -> set:
        """The models a drain may name: planned, retired (dropped by the plan, still running), or ever counted
        in flight (a request may still be on one the plan dropped)."""
        return set(self.models) | set(self.retired) | {n for n, c in self.in_flight.items() if c > 0}

    def is_draining(self, name: str) -> bool:
        until = self.draining.get(name)
        if until is not None and time.monotonic() >= until:
            del self.draining[name]
            return False
        return until is not None

    async def drain(self, names: list, seconds: float) -> dict:
        """The keeper is about to reload ``names`` (together: none lapses while another is waited for): new
        requests for them are refused (503, Retry-After) until resume(), or DRAIN_HOLD_SECONDS past this wait;
        waits at most ``seconds`` for the requests in flight on them to end. How many are still in flight, per
        model."""
        start = time.monotonic()
        end = start + seconds
        for name in names:
            self.draining[name] = end + DRAIN_HOLD_SECONDS
        before = {name: self.in_flight.get(name, 0) for name in names}
        while any(self.in_flight.get(name, 0) > 0 for name in names) and time.monotonic() < end:
            await asyncio.sleep(POLL_SECONDS)
        left = {name: self.in_flight.get(name, 0) for name in names}
        for name in names:
            if left[name] == 0:
                self.draining[name] = time.monotonic() + DRAIN_HOLD_SECONDS
            log(f"{name}: drained for a reload: {before[name]} request(s) in flight, {left[name]} after "
                f"{time.monotonic() - start:.1f} s")
        return left

    def resume(self, names: list) -> None:
        for name in names:
            if self.draining.pop(name, None) is not None:
                log(f"{name}: admitted again")

    def _enter(self, name: str) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.last_used[name] = time.time()

    def leave(self, name: str) -> None:
        self.in_flight[name] -= 1
        self.last_used[name] = time.time()
        self.freed.set()

    async def keep_pinned(self) -> None:
        """At start, and then every PIN_CHECK_SECONDS: what is resident brought within the plan's budget
        (fit_budget), and a pinned model the router does not hold (not loaded
        yet, its child crashed, or the keeper unloaded it for new weights) is loaded, room made for it like
        for a request; after a failed load, later and later (up to 10 minutes), so a broken one does not
        unload the others every round. Until the router first answers, every second."""
        answered = False
        while True:
            try:
                self.refresh()
                statuses = await self.router.statuses(full=True)
                answered = True
                await self.fit_budget()
                for name in sorted(self.pinned):
                    status = statuses.get(name)
                    if status is None or status.get("value") in RUNNING:
                        if status is not None and status.get("value") in READY:
                            self.pin_failures.pop(name, None)
                        continue
                    failures, after = self.pin_failures.get(name, (0, 0.0))
                    if time.monotonic() < after:
                        continue
                    if status.get("failed"):
                        failures += 1
                    self.pin_failures[name] = (failures, time.monotonic() + min(600.0, PIN_CHECK_SECONDS * 2 ** failures))
                    log(f"pinned {name} is {status.get('value')}: loading it")
                    await self.admit(name)
                    self.leave(name)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the check never stops: one failed round is logged
                if answered:  # (until the router first answers, it is starting)
                    log(f"pinned check: {error!r}")
            await asyncio.sleep(PIN_CHECK_SECONDS if answered else 1.0)

    async def _gone(self, victim: str) -> None:
        """Waits until the victim's child has exited (the router reads it loaded until then)."""
        deadline = time.monotonic() + UNLOAD_SECONDS
        try:
            while True:
                statuses = await self.router.statuses()
                if statuses.get(victim) not in RUNNING:
                    self.evictions[victim] = self.evictions.get(victim, 0) + 1
                    return
                if time.monotonic() > deadline:
                    raise Refusal(503, f"{victim} did not stop within {UNLOAD_SECONDS:.0f} s; try again",
                                  "unavailable_error")
                await asyncio.sleep(POLL_SECONDS)
        finally:
            self.unloading.discard(victim)
            self.freed.set()

    async def _watch_load(self, name: str, started: float, future) -> None:
        """Settles the load's future: loaded (timed for /metrics), failed (counted), or gone."""
        deadline = started + LOAD_SECONDS
        seen_loading = False
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(POLL_SECONDS)
                try:
                    status = (await self.router.statuses(full=True)).get(name, {})
                except Refusal:
                    continue
                value = status.get("value")
                if value == "loading":
                    seen_loading = True
                elif value in READY:
                    self.swaps.setdefault(name, [0, 0.0])
                    self.swaps[name][0] += 1
                    self.swaps[name][1] += time.monotonic() - started
                    future.set_result(None)
                    return
                elif status.get("failed"):
                    self.failed_loads[name] = self.failed_loads.get(name, 0) + 1
                    log(f"{name} failed to load (exit code {status.get('exit_code')})")
                    future.set_exception(Refusal(500, f"model name={name} failed to load", "server_error"))
                    return
                elif seen_loading or value is None:
                    future.set_exception(Refusal(503, f"{name} was unloaded while it loaded; try again",
                                                 "unavailable_error"))
                    return
            future.set_exception(Refusal(503, f"{name} did not load within {LOAD_SECONDS:.0f} s; try again",
                                         "unavailable_error"))
        finally:
            if not future.done():
                future.set_exception(Refusal(503, f"the load of {name} was not followed to its end; try again",
                                             "unavailable_error"))
            if self.loads.get(name) is future:
                del self.loads[name]

    def metrics(self) -> str:
        statuses = self.last_statuses
        lines = []

        def family(name, kind, help_text, samples):
            lines.append(f"# HELP inference_plane_router_{name} {help_text}")
            lines.append(f"# TYPE inference_plane_router_{name} {kind}")
            for labels, value in samples:
                label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"inference_plane_router_{name}{{{label_text}}} {value}" if label_text
                             else f"inference_plane_router_{name} {value}")

        family("model_resident", "gauge", "1 while the router holds the model (loading, loaded or asleep).",
               [({"model": n}, int(statuses.get(n) in RUNNING)) for n in self.models])
        family("model_pinned", "gauge", "1 for a model loaded at start and never unloaded to make room.",
               [({"model": n}, int(n in self.pinned)) for n in self.models])
        family("model_planned_vram_bytes", "gauge", "The plan's VRAM for the model when resident.",
               [({"model": n}, int(m["vram_gib"] * 2**30)) for n, m in self.models.items()])
        family("model_requests_in_flight", "gauge", "Requests for the model between admission and the end of the answer.",
               [({"model": n}, c) for n, c in self.in_flight.items()])
        family("evictions_total", "counter", "Models unloaded to make room for another.",
               [({"model": n}, c) for n, c in self.evictions.items()])
        family("failed_loads_total", "counter", "Loads the router reported failed.",
               [({"model": n}, c) for n, c in self.failed_loads.items()])
        reasons = {**unserved(), **{n: "reloading" for n in list(self.draining) if self.is_draining(n)}}
        family("model_unserved", "gauge", "1 for a listed model not offered now, by why: larger_than_planned "
               "(never offered), refused (the Hub said no), fetching, unreachable, reloading (new settings or "
               "weights: its requests in flight finish first).",
               [({"model": n, "reason": why}, 1) for n, why in sorted(reasons.items()) if n in self.models])
        lines.append("# HELP inference_plane_router_swap_seconds From a load's admission (room made) until the "
                     "router said the model was loaded.")
        lines.append("# TYPE inference_plane_router_swap_seconds summary")
        for n, (count, seconds) in self.swaps.items():
            lines.append(f'inference_plane_router_swap_seconds_sum{{model="{n}"}} {round(seconds, 3)}')
            lines.append(f'inference_plane_router_swap_seconds_count{{model="{n}"}} {count}')
        vram_budget = self.budget.vram_gib if self.budget.vram_gib is not None else 0
        family("vram_budget_bytes", "gauge", "The VRAM the plan gives the router's models (0: none planned on a GPU).",
               [({}, int(vram_budget * 2**30))])
        family("resident_planned_vram_bytes", "gauge", "The plan's VRAM of the resident models, summed.",
               [({}, int(sum(m["vram_gib"] for n, m in self.models.items() if statuses.get(n) in RUNNING) * 2**30))])
        lines.append("# HELP inference_plane_router_admission_wait_seconds Requests that waited for room to be made, "
                     "and how long.")
        lines.append("# TYPE inference_plane_router_admission_wait_seconds summary")
        lines.append(f"inference_plane_router_admission_wait_seconds_sum {round(self.waits[1], 3)}")
        lines.append(f"inference_plane_router_admission_wait_seconds_count {self.waits[0]}")
        return "\n".join(lines) + "\n"
