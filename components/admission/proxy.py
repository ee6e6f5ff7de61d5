"""The admission proxy in front of llama.cpp's router: a model is loaded only when it fits beside the
models already resident, in the memory the plan gave the router; the least recently used idle models
are unloaded first to make room. Standard library only: run with `python3 -c` in the router's pod,
listening on the server's port while the router listens on the pod's loopback.

Why (tests/contract/ROUTER_FACTS.md): b10729's router limits residency only by a count
(--models-max) and evicts by recency, so with models of different sizes a count safe for every set
leaves most of the card unused. Here the router's count is the number of models (it never evicts), and
this proxy is the only thing that unloads: before a request for a model that is not resident goes on,
it unloads idle models (least recently used first, never a pinned one, never one serving a request)
until the planned memory of what stays plus the new model fits the budget, and waits for each child to
exit (its memory is free only then). Admission decisions are taken one at a time; a request for a
resident model goes straight on.

Configuration (environment): ADMISSION_PLAN_FILE (JSON: budgets, each model's planned memory, the
client paths; written by the capacity plan into the server's ConfigMap and re-read whenever the kubelet
updates it, so a model added or removed restarts nothing), LISTEN_PORT, ROUTER_URL (the router on the
loopback), ROUTER_AUTH_FILE (its key, optional). Each request goes to the router on a connection of its own with `Connection: close`, and
the answer is relayed byte for byte (streams included) until the router closes it; a client that goes
away closes the router's connection, which cancels its generation.

It answers two paths itself: GET /metrics without a `model` parameter (residency, evictions, failed
loads, swap and admission times, in Prometheus' text format; the router's per-model /metrics?model=X
pass through) and nothing else. A model the plan lists but the router does not
serve yet (its weights still being fetched by the keeper) is answered 503 with Retry-After, which the
gateway retries on its next tier (the router itself would answer 400, which is not retried). Paths
outside the plan's client paths (the router's model management: download,
load, unload, delete) are refused with 403: model management stays inside the pod.
"""

import asyncio
import json
import math
import os
import time
import urllib.parse

try:  # as a package module (tests); run with `python3 -c`, framing.py's source comes first
    from .framing import (MAX_BODY_BYTES, MAX_HEADER_BYTES, HOP_BY_HOP, AdmissionError, Keys, client_gone, error,
                          header, log, read_body, read_head)
except ImportError:
    pass

# What the router counts as holding a model (server-models.h is_running()).
RUNNING = ("loading", "loaded", "sleeping")
# Beside the plan's client paths (common.constants.ROUTER_CLIENT_PATHS): the scrape's.
SCRAPE_PATH = "/metrics"
# How long an unloaded child may take to exit: the router force-kills it after stop-timeout (10 s).
UNLOAD_SECONDS = 30.0
POLL_SECONDS = 0.1
# How long a request waits for busy models to free room before a 503 (the gateway's next tier).
ADMIT_WAIT_SECONDS = float(os.environ.get("ADMIT_WAIT_SECONDS", "60"))
# How long a call to the router may take (its model list, an unload).
ROUTER_CALL_SECONDS = 10.0
# Request bodies held at once, all requests together (the container's limit is 512Mi).
MAX_HELD_BYTES = 160 * 1024 * 1024
# How often the pinned models are checked (and loaded again when the router lost one).
PIN_CHECK_SECONDS = float(os.environ.get("PIN_CHECK_SECONDS", "30"))


class Residency:
    """The proxy's view: requests in flight and recency per model, decided one admission at a time."""

    def __init__(self, plan_file: str, router: "RouterClient"):
        self.plan_file = plan_file
        self.plan_version = None
        self.router = router
        self.lock = asyncio.Lock()
        self.freed = asyncio.Event()
        self.in_flight: dict = {}
        self.last_used: dict = {}
        self.unloading: set = set()  # victims whose child has been told to stop and has not exited yet
        self.retired: dict = {}  # models the plan dropped, with their last figures, while the router runs them
        self.tasks: set = set()  # background tasks, referenced until done
        self.pin_failures: dict = {}  # pinned model -> (failures in a row, when to try again)
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
            with open(self.plan_file) as f:
                plan = json.load(f)
            models = {str(n): {"vram_gib": float(m["vram_gib"]), "ram_gib": float(m["ram_gib"]),
                               "pinned": bool(m.get("pinned"))} for n, m in plan["models"].items()}
            vram_budget = None if plan.get("vram_budget_gib") is None else float(plan["vram_budget_gib"])
            ram_limit, host_gib = float(plan["ram_limit_gib"]), float(plan.get("host_gib", 0.0))
            max_loaded = int(plan.get("max_loaded") or len(models))
            allowed = frozenset(str(p) for p in plan.get("allowed_paths", ())) | {SCRAPE_PATH}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            if strict:
                raise
            log(f"plan {self.plan_file} unreadable, keeping the last one: {e!r}")
            return
        for name in set(self.models) - set(models):
            self.retired[name] = self.models[name]
        for name in models:
            self.retired.pop(name, None)
        self.plan_version = version
        self.models, self.vram_budget, self.ram_limit, self.host_gib = models, vram_budget, ram_limit, host_gib
        self.max_loaded, self.allowed_paths = max_loaded, allowed
        self.pinned = {name for name, m in models.items() if m["pinned"]}
        for table, empty in ((self.in_flight, 0), (self.last_used, 0.0), (self.evictions, 0), (self.failed_loads, 0)):
            for name in models:
                table.setdefault(name, empty)
        for name in models:
            self.swaps.setdefault(name, [0, 0.0])
        log(f"plan: {len(models)} models, VRAM budget {vram_budget} GiB, RAM limit {ram_limit} GiB")

    def figures(self, name: str) -> dict:
        return self.models.get(name) or self.retired.get(name) or {"vram_gib": 0.0, "ram_gib": 0.0}

    def fits(self, names) -> bool:
        names = set(names)
        if len(names) > self.max_loaded:
            return False
        vram = sum(self.figures(n)["vram_gib"] for n in names)
        ram = sum(self.figures(n)["ram_gib"] for n in names) + self.host_gib
        return ((self.vram_budget is None or vram <= self.vram_budget + 1e-9)
                and math.ceil(ram - 1e-9) <= self.ram_limit)

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
        """Returns once ``name`` may go to the router, counted in flight: at once when it is resident, else
        once it fits, idle models unloaded first (least recently used; a retired one before any). Waits at
        most ADMIT_WAIT_SECONDS for busy models to free room, then 503 (the gateway retries on its next tier).
        Cancelled (the client left): nothing is counted and no lock is held."""
        if self.in_flight.get(name, 0) > 0 and name not in self.unloading:  # a request holds it resident
            self._enter(name)
            return
        started = time.monotonic()
        waited = False
        while True:
            victim = None
            async with self.lock:
                resident, statuses = await self.resident()
                if name not in statuses:
                    # Planned but not served yet: the keeper is still fetching it (the router reads a preset of
                    # the fetched models only). A 503 the gateway retries on its next tier, not the router's 400.
                    raise AdmissionError(503, f"model {name} is not on this server yet (its weights are being "
                                              "fetched); try again later")
                if name in resident and name not in self.unloading:
                    self._enter(name)
                    break
                if name not in self.unloading and self.fits(resident | {name}):
                    self._enter(name)
                    self._spawn(self._watch_load(name, time.monotonic()))
                    break
                candidates = [n for n in resident if self.in_flight.get(n, 0) == 0 and n not in self.pinned
                              and n not in self.unloading and statuses.get(n) in RUNNING]
                if candidates:
                    victim = min(candidates, key=lambda n: (n not in self.retired, self.last_used.get(n, 0.0), n))
                    self.unloading.add(victim)
                    log(f"unloading {victim} (least recently used idle) to make room for {name}")
                    try:
                        await self.router.unload(victim)
                    except BaseException:
                        self.unloading.discard(victim)
                        raise
                else:
                    self.freed.clear()
            waited = True
            if victim is not None:
                # Outside the lock: requests for resident models go on while the child exits.
                await self._gone(victim)
                continue
            if time.monotonic() - started > ADMIT_WAIT_SECONDS:
                raise AdmissionError(503, f"no room for {name}: every resident model has been busy for "
                                          f"{ADMIT_WAIT_SECONDS:.0f} s; try again later")
            try:
                await asyncio.wait_for(self.freed.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
        if waited:
            self.waits[0] += 1
            self.waits[1] += time.monotonic() - started

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _enter(self, name: str) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.last_used[name] = time.time()

    def leave(self, name: str) -> None:
        self.in_flight[name] -= 1
        self.last_used[name] = time.time()
        self.freed.set()

    async def keep_pinned(self) -> None:
        """Every PIN_CHECK_SECONDS: a pinned model the router does not hold (its child crashed, or the keeper
        unloaded it for new weights) is loaded again, room made for it like for a request; after a failed
        load, later and later (up to 10 minutes), so a broken one does not unload the others every round."""
        while True:
            await asyncio.sleep(PIN_CHECK_SECONDS)
            try:
                self.refresh()
                statuses = await self.router.statuses(full=True)
                for name in sorted(self.pinned):
                    status = statuses.get(name)
                    if status is None or status.get("value") in RUNNING:
                        if status is not None and status.get("value") in ("loaded", "sleeping"):
                            self.pin_failures.pop(name, None)
                        continue
                    failures, after = self.pin_failures.get(name, (0, 0.0))
                    if time.monotonic() < after:
                        continue
                    if status.get("failed"):
                        failures += 1
                    self.pin_failures[name] = (failures, time.monotonic() + min(600.0, PIN_CHECK_SECONDS * 2 ** failures))
                    log(f"pinned {name} is {status.get('value')}: loading it again")
                    await self.admit(name)
                    try:
                        code, body = await self.router.call("POST", "/models/load", json.dumps({"model": name}).encode())
                        if code != 200:
                            log(f"loading pinned {name} answered {code}: {body[:200]!r}")
                    finally:
                        self.leave(name)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the check never stops: one failed round is logged
                log(f"pinned check: {e!r}")

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
                    raise AdmissionError(503, f"{victim} did not stop within {UNLOAD_SECONDS:.0f} s; try again")
                await asyncio.sleep(POLL_SECONDS)
        finally:
            self.unloading.discard(victim)
            self.freed.set()

    async def _watch_load(self, name: str, started: float) -> None:
        """Times a load (from its admission until the router says loaded) and counts a failed one: a failure
        is counted only after the load was seen starting (a stale `failed` of an earlier load is not)."""
        deadline = started + 3600
        seen_loading = False
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            try:
                status = (await self.router.statuses(full=True)).get(name, {})
            except (OSError, AdmissionError):
                continue
            value = status.get("value")
            if value == "loading":
                seen_loading = True
            elif value in ("loaded", "sleeping"):
                self.swaps.setdefault(name, [0, 0.0])
                self.swaps[name][0] += 1
                self.swaps[name][1] += time.monotonic() - started
                return
            elif status.get("failed") and (seen_loading or self.in_flight.get(name, 0) == 0):
                self.failed_loads[name] = self.failed_loads.get(name, 0) + 1
                log(f"{name} failed to load (exit code {status.get('exit_code')})")
                return
            elif seen_loading:
                return

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
        lines.append("# HELP inference_plane_router_swap_seconds From a load's admission (room made) until the "
                     "router said the model was loaded.")
        lines.append("# TYPE inference_plane_router_swap_seconds summary")
        for n, (count, seconds) in self.swaps.items():
            lines.append(f'inference_plane_router_swap_seconds_sum{{model="{n}"}} {round(seconds, 3)}')
            lines.append(f'inference_plane_router_swap_seconds_count{{model="{n}"}} {count}')
        vram_budget = self.vram_budget if self.vram_budget is not None else 0
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


class RouterClient:
    """Small requests of the router's own (its model list, an unload), over the loopback."""

    def __init__(self, url: str, keys: Keys):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.keys = keys  # the server's key file: its first key is the proxy's own

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """One request; a router that does not answer within ROUTER_CALL_SECONDS, refuses the connection or
        closes it early is a 503 (it is starting or restarting: the gateway tries its next tier)."""
        try:
            return await asyncio.wait_for(self._call(method, path, body), ROUTER_CALL_SECONDS)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            raise AdmissionError(503, f"the router is not answering ({type(e).__name__}); try again") from None

    async def _call(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Connection: close",
                    f"Content-Length: {len(body)}", "Content-Type: application/json"]
            keys = self.keys.current()
            if keys:
                head.append(f"Authorization: Bearer {keys[0]}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            status, headers, rest = await read_head(reader, response=True)
            return status, await read_body(reader, headers, rest)
        finally:
            writer.close()

    async def statuses(self, full: bool = False) -> dict:
        status, body = await self.call("GET", "/models")
        if status != 200:  # 503 while it loads its preset at start
            raise AdmissionError(503, f"the router's model list answered {status}; try again")
        try:
            data = json.loads(body)["data"]
            return {m["id"]: (m["status"] if full else m["status"]["value"]) for m in data}
        except (ValueError, KeyError, TypeError) as e:
            raise AdmissionError(502, f"the router's model list could not be read: {e!r}") from None

    async def unload(self, name: str) -> None:
        status, body = await self.call("POST", "/models/unload", json.dumps({"model": name}).encode())
        # 400 "model is not running": it went on its own meanwhile, which is what was wanted.
        if status not in (200, 400):
            raise AdmissionError(502, f"the router answered {status} to unloading {name}: {body[:200]!r}")


# The paths on which the router loads the model a query names (GET /metrics?model=X; its other GETs with
# ?model= are answered without loading, and a POST takes only the body's model: server-models.cpp).
QUERY_MODEL_PATHS = frozenset({SCRAPE_PATH})


def model_of(method: str, path: str, query: dict, body: bytes):
    """The model the router would load for this request, as the router reads it, or None: a POST's JSON
    body `model`; a GET's `?model=` on QUERY_MODEL_PATHS unless autoload is off (anything but true/1)."""
    if method == "POST":
        if body[:1] not in (b"{", b" ", b"\n", b"\r", b"\t"):
            return None
        try:
            value = json.loads(body).get("model")
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, str) else None
    if method == "GET" and path in QUERY_MODEL_PATHS and "model" in query:
        autoload = query.get("autoload", ["true"])[0].lower()
        return query["model"][0] if autoload in ("true", "1") else None
    return None


class Proxy:
    def __init__(self, residency: Residency, router_url: str, keys: Keys):
        parsed = urllib.parse.urlsplit(router_url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.residency = residency
        self.keys = keys
        self.held = 0  # request body bytes held now, all requests together

    async def handle(self, reader, writer) -> None:
        started = [False]  # whether the router's answer has begun (then no status line of ours may follow)
        try:
            await self._handle(reader, writer, started)
        except AdmissionError as e:
            if not started[0]:
                error(writer, e.status, str(e))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left
        except Exception as e:  # one request's failure never stops the proxy
            log(f"error: {e!r}")
            if not started[0]:
                error(writer, 502, "admission proxy error")
        finally:
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                pass
            writer.close()

    async def _handle(self, reader, writer, started) -> None:
        method, target, headers, rest = await read_head(reader)
        split = urllib.parse.urlsplit(target)
        path, query = split.path, urllib.parse.parse_qs(split.query)
        self.residency.refresh()
        # Refused before the body is read: paths that are not the clients', and requests without the key
        # (the router exempts /health from its key; so does this).
        if path not in self.residency.allowed_paths:
            raise AdmissionError(403, f"{method} {path} is not served here: model management stays inside the pod")
        if path not in ("/health", "/v1/health") and not self.keys.allows(headers):
            raise AdmissionError(401, "Invalid API Key")
        length = header(headers, "content-length")
        size = int(length) if length and length.isdigit() else 0
        if self.held + size > MAX_HELD_BYTES:
            raise AdmissionError(503, "too many large requests held at once; try again")
        if (header(headers, "expect") or "").lower() == "100-continue" and size <= MAX_BODY_BYTES:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.held += size
        try:
            body = await read_body(reader, headers, rest)
            await self._serve(method, target, path, query, headers, body, reader, writer, started)
        finally:
            self.held -= size

    async def _serve(self, method, target, path, query, headers, body, reader, writer, started) -> None:
        if path == SCRAPE_PATH and "model" not in query:
            await self.residency.resident()
            text = self.residency.metrics().encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                         + str(len(text)).encode() + b"\r\nConnection: close\r\n\r\n" + text)
            return
        name = model_of(method, path, query, body)
        if name is not None and name not in self.residency.models:
            # Not planned (a model the plan dropped, until the keeper has the router forget it): never loaded
            # past the plan; the router's own answer for a name it does not serve.
            raise AdmissionError(400, f"model '{name}' not found")
        gone = asyncio.get_running_loop().create_task(client_gone(reader))
        admitted = False
        try:
            if name is not None:
                admission = asyncio.get_running_loop().create_task(self.residency.admit(name))
                done, _ = await asyncio.wait({admission, gone}, return_when=asyncio.FIRST_COMPLETED)
                if admission not in done:  # the client left while it waited
                    admission.cancel()
                    try:
                        await admission
                    except BaseException:  # noqa: B036 - cancelled or failed: nothing was counted
                        return
                    self.residency.leave(name)  # it was admitted just before the cancel
                    return
                admission.result()  # an AdmissionError (503 ...) is answered; nothing was counted
                admitted = True
            await self._relay(method, target, headers, body, writer, gone, started)
        finally:
            if admitted:
                self.residency.leave(name)
            gone.cancel()

    async def _relay(self, method, target, headers, body, writer, gone, started) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError as e:
            raise AdmissionError(503, f"the router is not answering ({type(e).__name__}); try again") from None
        try:
            head = [f"{method} {target} HTTP/1.1"]
            head += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP]
            head += [f"Content-Length: {len(body)}", "Connection: close"]
            up_writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            await up_writer.drain()
            while True:
                read = asyncio.get_running_loop().create_task(up_reader.read(65536))
                done, _ = await asyncio.wait({read, gone}, return_when=asyncio.FIRST_COMPLETED)
                if read not in done:  # the client left: closing the router's connection cancels its work
                    read.cancel()
                    return
                try:
                    chunk = read.result()
                except OSError:
                    chunk = b""
                if not chunk:
                    if not started[0]:
                        raise AdmissionError(503, "the router closed the connection without an answer; try again")
                    return
                started[0] = True
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()


async def main() -> None:
    router_url = os.environ["ROUTER_URL"]
    keys = Keys(os.environ.get("ROUTER_AUTH_FILE"))
    residency = Residency(os.environ["ADMISSION_PLAN_FILE"], RouterClient(router_url, keys))
    proxy = Proxy(residency, router_url, keys)
    server = await asyncio.start_server(proxy.handle, os.environ.get("LISTEN_HOST", "0.0.0.0"),
                                        int(os.environ["LISTEN_PORT"]), limit=MAX_HEADER_BYTES)
    log(f"listening on {os.environ['LISTEN_PORT']}, router at {router_url}, {len(residency.models)} models, "
        f"VRAM budget {residency.vram_budget} GiB, RAM limit {residency.ram_limit} GiB")
    keeper = asyncio.get_running_loop().create_task(residency.keep_pinned())
    async with server:
        await server.serve_forever()
    keeper.cancel()


if __name__ == "__main__":
    asyncio.run(main())
