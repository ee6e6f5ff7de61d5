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
import sys
import time
import urllib.parse

# What the router counts as holding a model (server-models.h is_running()).
RUNNING = ("loading", "loaded", "sleeping")
# Beside the plan's client paths (common.constants.ROUTER_CLIENT_PATHS): the scrape's.
SCRAPE_PATH = "/metrics"
MAX_HEADER_BYTES = 64 * 1024
# A chat request with a few images inlined as base64 stays far below this.
MAX_BODY_BYTES = 32 * 1024 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "content-length", "expect"}
# How long an unloaded child may take to exit: the router force-kills it after stop-timeout (10 s).
UNLOAD_SECONDS = 30.0
POLL_SECONDS = 0.1
# How often the pinned models are checked (and loaded again when the router lost one).
PIN_CHECK_SECONDS = float(os.environ.get("PIN_CHECK_SECONDS", "30"))


def log(message: str) -> None:
    print(f"admission: {message}", file=sys.stderr, flush=True)


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
        # Figures for /metrics.
        self.evictions: dict = {}
        self.failed_loads: dict = {}
        self.swaps: dict = {}  # count, seconds: admitted cold until loaded
        self.waits = [0, 0.0]  # admissions that had to make room: count, seconds
        self.last_statuses: dict = {}
        self.refresh()

    def refresh(self) -> None:
        """Reads the plan when its file changed (the kubelet swaps a ConfigMap's files in place). A model
        removed keeps its counters while requests for it are in flight."""
        stat = os.stat(self.plan_file)
        version = (stat.st_mtime_ns, stat.st_ino, stat.st_size)
        if version == self.plan_version:
            return
        with open(self.plan_file) as f:
            plan = json.load(f)
        self.plan_version = version
        self.models = plan["models"]
        self.vram_budget = plan.get("vram_budget_gib")
        self.ram_limit = plan["ram_limit_gib"]
        self.host_gib = plan.get("host_gib", 0.0)
        self.max_loaded = plan.get("max_loaded") or len(self.models)
        self.allowed_paths = frozenset(plan.get("allowed_paths", ())) | {SCRAPE_PATH}
        self.pinned = {name for name, m in self.models.items() if m.get("pinned")}
        for table, empty in ((self.in_flight, 0), (self.last_used, 0.0), (self.evictions, 0), (self.failed_loads, 0)):
            for name in self.models:
                table.setdefault(name, empty)
        for name in self.models:
            self.swaps.setdefault(name, [0, 0.0])
        log(f"plan: {len(self.models)} models, VRAM budget {self.vram_budget} GiB, RAM limit {self.ram_limit} GiB")

    def fits(self, names) -> bool:
        names = set(names)
        if len(names) > self.max_loaded:
            return False
        vram = sum(self.models[n]["vram_gib"] for n in names if n in self.models)
        ram = sum(self.models[n]["ram_gib"] for n in names if n in self.models) + self.host_gib
        return ((self.vram_budget is None or vram <= self.vram_budget + 1e-9)
                and math.ceil(ram - 1e-9) <= self.ram_limit)

    async def resident(self) -> tuple[set, dict]:
        statuses = await self.router.statuses()
        self.last_statuses = statuses
        # A model the router runs that the plan no longer lists (removed, not yet unloaded by the keeper)
        # is an eviction candidate like any other; its memory is no longer planned.
        running = {n for n, s in statuses.items() if s in RUNNING and n in self.in_flight}
        return running | {n for n, c in self.in_flight.items() if c > 0}, statuses

    async def admit(self, name: str) -> None:
        """Returns once ``name`` may go to the router, counted in flight; unloads idle models first if it
        would not fit. Cancelled (the client left) while waiting: nothing is counted."""
        if self.in_flight.get(name, 0) > 0:  # resident: its reservation cannot go while a request holds it
            self._enter(name)
            return
        started = time.monotonic()
        made_room = False
        await self.lock.acquire()
        try:
            while True:
                resident, statuses = await self.resident()
                if name not in statuses:
                    # Planned but not served yet: the keeper is still fetching it (the router reads a preset of
                    # the fetched models only). A 503 the gateway retries on its next tier, not the router's 400.
                    raise AdmissionError(503, f"model {name} is not on this server yet (its weights are being "
                                              "fetched); try again later")
                if name in resident:
                    break
                if self.fits(resident | {name}):
                    asyncio.get_running_loop().create_task(self._watch_load(name, started))
                    break
                victims = sorted((n for n in resident if self.in_flight.get(n, 0) == 0 and n not in self.pinned),
                                 key=lambda n: (self.last_used[n], n))
                if victims:
                    made_room = True
                    await self._unload(victims[0])
                    continue
                # Every resident model is busy or pinned: wait for a request to end, then look again.
                self.freed.clear()
                self.lock.release()
                try:
                    try:
                        await asyncio.wait_for(self.freed.wait(), 1.0)
                    except asyncio.TimeoutError:
                        pass
                finally:
                    await self.lock.acquire()
            self._enter(name)
        finally:
            self.lock.release()
        if made_room:
            self.waits[0] += 1
            self.waits[1] += time.monotonic() - started

    def _enter(self, name: str) -> None:
        self.in_flight[name] += 1
        self.last_used[name] = time.time()

    def leave(self, name: str) -> None:
        self.in_flight[name] -= 1
        self.last_used[name] = time.time()
        self.freed.set()

    async def keep_pinned(self) -> None:
        """Every PIN_CHECK_SECONDS: a pinned model the router does not hold (its child crashed, or the keeper
        unloaded it for new weights) is loaded again, room made for it like for a request."""
        while True:
            await asyncio.sleep(PIN_CHECK_SECONDS)
            try:
                self.refresh()
                statuses = await self.router.statuses()
                for name in sorted(self.pinned):
                    if name not in statuses or statuses[name] in RUNNING:
                        continue
                    log(f"pinned {name} is {statuses[name]}: loading it again")
                    await self.admit(name)
                    try:
                        status, body = await self.router.call("POST", "/models/load", json.dumps({"model": name}).encode())
                        if status != 200:
                            log(f"loading pinned {name} answered {status}: {body[:200]!r}")
                    finally:
                        self.leave(name)
            except (OSError, ValueError, AdmissionError) as e:
                log(f"pinned check: {e}")

    async def _unload(self, victim: str) -> None:
        log(f"unloading {victim} (least recently used idle) to make room")
        await self.router.unload(victim)
        deadline = time.monotonic() + UNLOAD_SECONDS
        while True:
            statuses = await self.router.statuses()
            if statuses.get(victim) not in RUNNING:
                break
            if time.monotonic() > deadline:
                raise AdmissionError(503, f"{victim} did not stop within {UNLOAD_SECONDS:.0f} s; try again")
            await asyncio.sleep(POLL_SECONDS)
        self.evictions[victim] = self.evictions.get(victim, 0) + 1

    async def _watch_load(self, name: str, started: float) -> None:
        """Times a cold load (admitted until the router says loaded) and counts a failed one."""
        deadline = started + 3600
        seen_loading = False
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            try:
                status = (await self.router.statuses(full=True)).get(name, {})
            except OSError:
                continue
            value = status.get("value")
            if value == "loading":
                seen_loading = True
            elif value in ("loaded", "sleeping"):
                self.swaps[name][0] += 1
                self.swaps[name][1] += time.monotonic() - started
                return
            elif status.get("failed"):
                self.failed_loads[name] += 1
                log(f"{name} failed to load (exit code {status.get('exit_code')})")
                return
            elif seen_loading or self.in_flight.get(name, 0) == 0:
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
        lines.append("# HELP inference_plane_router_swap_seconds From admitting a model that was not resident until "
                     "the router said it was loaded.")
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


class AdmissionError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RouterClient:
    """Small requests of the router's own (its model list, an unload), over the loopback."""

    def __init__(self, url: str, key: str):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.key = key

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Connection: close",
                    f"Content-Length: {len(body)}", "Content-Type: application/json"]
            if self.key:
                head.append(f"Authorization: Bearer {self.key}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            status, headers, rest = await read_head(reader, response=True)
            return status, await read_body(reader, headers, rest)
        finally:
            writer.close()

    async def statuses(self, full: bool = False) -> dict:
        status, body = await self.call("GET", "/models")
        if status != 200:
            raise AdmissionError(502, f"the router's model list answered {status}")
        data = json.loads(body)["data"]
        return {m["id"]: (m["status"] if full else m["status"]["value"]) for m in data}

    async def unload(self, name: str) -> None:
        status, body = await self.call("POST", "/models/unload", json.dumps({"model": name}).encode())
        # 400 "model is not running": it went on its own meanwhile, which is what was wanted.
        if status not in (200, 400):
            raise AdmissionError(502, f"the router answered {status} to unloading {name}: {body[:200]!r}")


async def read_head(reader, response: bool = False):
    """The start line and headers; returns (method, target, headers, leftover) or (status, headers, leftover)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("closed before the headers ended")
        data += chunk
        if len(data) > MAX_HEADER_BYTES and b"\r\n\r\n" not in data[:MAX_HEADER_BYTES]:
            raise AdmissionError(431, "request headers too large")
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    parts = lines[0].split(" ", 2)
    if response:
        return int(parts[1]), headers, rest
    if len(parts) != 3:
        raise AdmissionError(400, "malformed request line")
    return parts[0], parts[1], headers, rest


def header(headers, name: str):
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


async def read_body(reader, headers, rest: bytes) -> bytes:
    """A body framed by Content-Length or chunked (decoded); none otherwise."""
    if (header(headers, "transfer-encoding") or "").lower().endswith("chunked"):
        data, body = rest, b""
        while True:
            while b"\r\n" not in data:
                more = await reader.read(65536)
                if not more:
                    raise ConnectionError("closed inside a chunked body")
                data += more
            size_line, data = data.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(data) < size + 2:
                more = await reader.read(65536)
                if not more:
                    raise ConnectionError("closed inside a chunked body")
                data += more
            if size == 0:
                return body
            body += data[:size]
            data = data[size + 2:]
            if len(body) > MAX_BODY_BYTES:
                raise AdmissionError(413, "request body too large")
    length = header(headers, "content-length")
    if length is None:
        return rest
    length = int(length)
    if length > MAX_BODY_BYTES:
        raise AdmissionError(413, "request body too large")
    body = rest
    while len(body) < length:
        more = await reader.read(min(65536, length - len(body)))
        if not more:
            raise ConnectionError("closed inside the body")
        body += more
    return body[:length]


def model_of(method: str, target: str, body: bytes):
    """The model a request would make the router load, or None: a `model` query parameter (unless
    autoload=false), else the JSON body's `model` field."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    if "model" in query:
        return None if query.get("autoload") == ["false"] else query["model"][0]
    if method in ("POST", "PUT") and body[:1] in (b"{", b" ", b"\n", b"\r", b"\t"):
        try:
            value = json.loads(body).get("model")
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, str) else None
    return None


def answer(writer, status: int, payload: dict, extra: str = "") -> None:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 403: "Forbidden", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
              502: "Bad Gateway", 503: "Service Unavailable"}.get(status, "Error")
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                 f"Connection: close\r\n{extra}\r\n".encode() + body)


def error(writer, status: int, message: str) -> None:
    extra = "Retry-After: 5\r\n" if status == 503 else ""
    answer(writer, status, {"error": {"code": status, "message": message, "type": "admission_error"}}, extra)


class Proxy:
    def __init__(self, residency: Residency, router_url: str):
        parsed = urllib.parse.urlsplit(router_url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.residency = residency

    async def handle(self, reader, writer) -> None:
        try:
            await self._handle(reader, writer)
        except AdmissionError as e:
            error(writer, e.status, str(e))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as e:  # one request's failure never stops the proxy
            log(f"error: {e!r}")
            error(writer, 502, "admission proxy error")
        finally:
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                pass
            writer.close()

    async def _handle(self, reader, writer) -> None:
        method, target, headers, rest = await read_head(reader)
        body = await read_body(reader, headers, rest)
        path = urllib.parse.urlsplit(target).path
        self.residency.refresh()
        if path == SCRAPE_PATH and "model=" not in target:
            await self.residency.resident()
            text = self.residency.metrics().encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                         + str(len(text)).encode() + b"\r\nConnection: close\r\n\r\n" + text)
            return
        if path not in self.residency.allowed_paths:
            raise AdmissionError(403, f"{method} {path} is not served here: model management stays inside the pod")
        name = model_of(method, target, body)
        admitted = name if name in self.residency.models else None
        gone = asyncio.get_running_loop().create_task(client_gone(reader))
        try:
            if admitted is not None:
                admission = asyncio.get_running_loop().create_task(self.residency.admit(admitted))
                done, _ = await asyncio.wait({admission, gone}, return_when=asyncio.FIRST_COMPLETED)
                if admission not in done:  # the client left while it waited
                    admission.cancel()
                    try:
                        await admission
                    except (asyncio.CancelledError, Exception):
                        pass
                    if admission.cancelled() or admission.exception() is not None:
                        return
                    self.residency.leave(admitted)
                    return
                admission.result()
            try:
                await self._relay(method, target, headers, body, writer, gone)
            finally:
                if admitted is not None:
                    self.residency.leave(admitted)
        finally:
            gone.cancel()

    async def _relay(self, method, target, headers, body, writer, gone) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError as e:
            raise AdmissionError(502, f"the router is not answering: {e}")
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
                chunk = read.result()
                if not chunk:
                    return
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()


async def client_gone(reader) -> None:
    """Completes when the client closes its side (it sends nothing more after its request)."""
    while True:
        try:
            chunk = await reader.read(65536)
        except (ConnectionError, OSError):
            return
        if not chunk:
            return


def read_key(path) -> str:
    if not path:
        return ""
    with open(path) as f:  # the Secret's file may hold several keys, one per line: the first
        return next((line.strip() for line in f if line.strip()), "")


async def main() -> None:
    router_url = os.environ["ROUTER_URL"]
    residency = Residency(os.environ["ADMISSION_PLAN_FILE"], RouterClient(router_url, read_key(os.environ.get("ROUTER_AUTH_FILE"))))
    proxy = Proxy(residency, router_url)
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
