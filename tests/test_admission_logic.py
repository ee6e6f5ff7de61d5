"""The admission proxy's own logic where timing matters (components/admission/proxy.py), in front of a
small fake router whose unloads take a set time: what the real router does is held by
tests/test_admission.py; here, the races a review found (each test names its finding) cannot return.
The fake answers as the router does where the proxy depends on it: GET /models, POST /models/unload
(the child exits after a delay, reading `loaded` until then), a chat that loads the body's model and
holds its answer `hold` seconds. It records the peak planned VRAM of what it held."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import types

from conftest import ROOT

PROXY = ROOT / "components" / "admission" / "proxy.py"


def load_proxy():
    """The proxy as the pod runs it: the rendered container's one source (framing.py, then proxy.py)."""
    from components.admission import proxy_source

    module = types.ModuleType("admission_proxy")
    exec(compile(proxy_source(), str(PROXY), "exec"), module.__dict__)
    return module


class FakeRouter:
    def __init__(self, vram: dict, unload_delay: float):
        self.vram, self.unload_delay = vram, unload_delay
        self.status = {n: "unloaded" for n in vram}
        self.peak = 0.0
        self.log: list = []

    async def handle(self, reader, writer):
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                data += chunk
            head, rest = data.split(b"\r\n\r\n", 1)
            lines = head.decode().split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in lines[1:]}
            while len(rest) < int(headers.get("content-length", 0)):
                rest += await reader.read(65536)
            path = target.split("?")[0]
            if path == "/models" and method == "GET":
                return self.reply(writer, 200, {"data": [{"id": k, "status": {"value": v}} for k, v in self.status.items()]})
            if path == "/health":
                return self.reply(writer, 200, {"status": "ok"})
            body = json.loads(rest or b"{}")
            model = body.get("model")
            if path == "/models/unload":
                self.log.append(("unload", model))
                if self.status.get(model) != "loaded":
                    return self.reply(writer, 400, {"error": "model is not running"})
                asyncio.get_running_loop().call_later(self.unload_delay, self.status.__setitem__, model, "unloaded")
                return self.reply(writer, 200, {"success": True})
            if model not in self.status:
                return self.reply(writer, 400, {"error": f"model '{model}' not found"})
            self.log.append(("chat", model))
            self.status[model] = "loaded"
            self.peak = max(self.peak, sum(self.vram[n] for n, s in self.status.items() if s == "loaded"))
            await asyncio.sleep(body.get("hold", 0))
            self.reply(writer, 200, {"model": model, "choices": []})
        finally:
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                pass
            writer.close()

    @staticmethod
    def reply(writer, status, payload):
        data = json.dumps(payload).encode()
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + data)


async def start(vram: dict, budget: float, unload_delay: float = 1.0, wait_seconds: float = 60):
    module = load_proxy()
    module.ADMIT_WAIT_SECONDS = wait_seconds
    fake = FakeRouter(vram, unload_delay)
    router = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    router_port = router.sockets[0].getsockname()[1]
    plan = {"models": {n: {"vram_gib": v, "ram_gib": 0.1, "pinned": False} for n, v in vram.items()},
            "vram_budget_gib": budget, "ram_limit_gib": 1000, "allowed_paths": ["/v1/chat/completions", "/health"]}
    fd, plan_file = tempfile.mkstemp(suffix=".json")
    os.write(fd, json.dumps(plan).encode())
    os.close(fd)
    keys = module.Keys(None)
    residency = module.Residency(plan_file, module.RouterClient(f"http://127.0.0.1:{router_port}", keys))
    proxy = module.Proxy(residency, f"http://127.0.0.1:{router_port}", keys)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, limit=module.MAX_HEADER_BYTES)
    return fake, residency, server.sockets[0].getsockname()[1], plan_file, router


def run(coroutine):
    """asyncio.run without its last step (set_event_loop(None)), which would leave the Pulumi-mock tests
    that run after these without the main thread's loop."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        pending = asyncio.all_tasks(loop)  # the proxy's load watchers, handlers of closed clients
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(_settle(pending))
        loop.close()


async def _settle(tasks) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


async def chat(port: int, model: str, hold: float = 0.0, extra: str = "") -> int | None:
    body = json.dumps({"model": model, "hold": hold}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{extra}Content-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def test_a_client_that_leaves_while_queued_frees_no_lock_and_leaks_no_request():
    """Review B1: a waiter cancelled while it took the admission lock back used to release the lock another
    admission held (two admissions at once, then a RuntimeError after counting, a count that never fell)."""
    async def scenario():
        fake, residency, port, _, _ = await start({"A": 10, "B": 10, "C": 10, "D": 10, "E": 5}, 25, unload_delay=3.0)
        a = asyncio.create_task(chat(port, "A", hold=2.0))
        b = asyncio.create_task(chat(port, "B", hold=8.0))
        await asyncio.sleep(0.3)
        c = asyncio.create_task(chat(port, "C"))
        await asyncio.sleep(0.3)
        d = asyncio.create_task(chat(port, "D"))
        assert await a == 200
        await asyncio.sleep(0.5)
        d.cancel()
        await asyncio.sleep(0.2)
        e = await chat(port, "E")
        results = (e, await c, await b)
        await asyncio.sleep(0.5)
        return fake, residency, results

    fake, residency, results = run(scenario())
    assert results == (200, 200, 200)
    assert {n: c for n, c in residency.in_flight.items() if c} == {}
    assert fake.peak <= 25


def test_a_cold_request_behind_busy_models_gets_a_503_in_bounded_time():
    """Review B4: while the resident models stay busy (steady traffic keeps their count above 0), the request
    that needs their room used to wait until its client gave up; now it is answered 503 (the gateway's next
    tier) after ADMIT_WAIT_SECONDS, and the busy ones are untouched."""
    async def scenario():
        fake, residency, port, _, _ = await start({"A": 10, "B": 10, "C": 10}, 20, wait_seconds=2)
        busy = [asyncio.create_task(chat(port, m, hold=6.0)) for m in ("A", "B")]
        await asyncio.sleep(0.5)
        started = asyncio.get_running_loop().time()
        status = await asyncio.wait_for(chat(port, "C"), 10)
        waited = asyncio.get_running_loop().time() - started
        return fake, status, waited, await asyncio.gather(*busy)

    fake, status, waited, busy = run(scenario())
    assert status == 503 and 2 <= waited < 4 and busy == [200, 200]
    assert fake.peak <= 20 and not any(entry[0] == "unload" for entry in fake.log)


def test_a_model_dropped_from_the_plan_still_counts_until_the_router_lets_it_go():
    """Review C1: a model the plan no longer lists, still loaded, counted as 0 GiB (30 GiB resident on a 20 GiB
    budget); now it keeps its last figures, goes first, and new requests for it are refused."""
    async def scenario():
        fake, residency, port, plan_file, _ = await start({"A": 10, "B": 10, "C": 10}, 20, unload_delay=0.3)
        assert await chat(port, "A") == 200 and await chat(port, "B") == 200
        plan = json.loads(open(plan_file).read())
        del plan["models"]["A"]
        with open(plan_file, "w") as f:
            f.write(json.dumps(plan) + " ")  # another size: the proxy sees a new file
        dropped = await chat(port, "A")
        status = await chat(port, "C")
        return fake, dropped, status

    fake, dropped, status = run(scenario())
    assert dropped == 400 and status == 200
    assert fake.peak <= 20 and ("unload", "A") in fake.log and ("unload", "B") not in fake.log


def test_a_router_that_is_down_is_a_503_and_a_bad_plan_keeps_the_last_one():
    """Review C2 and C3: an empty reply (not retried by the gateway) became a 503; a plan file that cannot
    be read no longer fails every request, /health included."""
    async def scenario():
        fake, residency, port, plan_file, router = await start({"A": 10, "B": 10}, 20)
        with open(plan_file, "w") as f:
            f.write("{not json")
        health = await chat(port, "A")
        router.close()
        await router.wait_closed()
        down = await chat(port, "B")
        return health, down, residency

    health, down, residency = run(scenario())
    assert health == 200 and set(residency.models) == {"A", "B"}
    assert down == 503


def test_expect_100_continue_is_answered_before_the_body():
    """Review C4: a client that waits for 100 Continue (Go's transport behind Traefik, curl for large
    bodies) got nothing until its own timeout."""
    async def scenario():
        _, _, port, _, _ = await start({"A": 10}, 20)
        body = json.dumps({"model": "A"}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode())
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        writer.write(body)
        await writer.drain()
        final = await reader.read()
        writer.close()
        return interim, final

    interim, final = run(scenario())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n" and final.startswith(b"HTTP/1.1 200")
