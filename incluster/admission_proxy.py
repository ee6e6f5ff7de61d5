"""The admission proxy in front of llama.cpp's router: a model is loaded only when it fits beside the
models already resident, in the memory the plan gave the router; the least recently used idle models are
unloaded first to make room. It listens on the server's port; the router listens on the pod's loopback.

Why (lab/contract/ROUTER_FACTS.md): b10729's router limits residency only by a count (--models-max) and
evicts by recency, so with models of different sizes a count safe for every set leaves most of the card
unused. Here the router never loads a model on its own (--no-models-autoload, --models-max 0) and this
proxy is the only thing that loads or unloads: before a request for a model that is not resident goes on,
it unloads idle models (least recently used first, never a pinned one, never one serving a request) until
the planned memory of what stays plus the new model fits the budget (fit.py, the rule the plan checked),
waits for each child to exit (its memory is free only then), then has the router load the model
(POST /models/load) and waits until it is loaded. Admission decisions are taken one at a time; a request
for a resident model goes straight on. Pinned models are loaded at start and again whenever lost.

What a request names is read by router_rules.py, as the router reads it; a request whose model cannot be
read the same way (multipart, a byte-order mark, a repeated or loading query parameter) is refused before
anything happens. HTTP is h11's (http_io.py), with a deadline and a limit on every input.

Configuration (environment): ADMISSION_PLAN_FILE (JSON: budgets, each model's planned memory, the client
paths; written by the capacity plan into the server's ConfigMap and re-read whenever the kubelet updates
it, so a model added or removed restarts nothing), LISTEN_PORT, ROUTER_URL (the router on the loopback),
ROUTER_AUTH_FILE (its key file, optional: read once at start, as the router reads it), ADMISSION_CONTROL (the
keeper's control socket, optional: a model it reloads is drained first, class Control).

It answers two things itself: GET /metrics without `model` (residency, evictions, failed loads, swap and
admission times, in Prometheus' text format; the router's per-model /metrics?model=X pass through), and
every refusal. A model the plan lists but the router does not serve yet (its weights still being fetched
by the keeper) is answered 503 with Retry-After, which the gateway retries on its next tier. Paths of the
router's model management are refused with 403, other paths it does not route with 404.

Standard library and h11 only: run as a file of the server's programs ConfigMap (components/programs.py)."""

import asyncio
import json
import os
import resource
import urllib.parse

import h11

import http_io
import router_rules
from admission import ROUTER_CALL_SECONDS, Residency, RouterClient, log
from router_rules import Refusal

# How long the router may be silent while it answers (a long prompt is processed before the first token):
# its own --timeout default.
UPSTREAM_SILENCE_SECONDS = 3600.0
# A chat request with a few images inlined as base64 stays far below this.
MAX_BODY_BYTES = 32 * 1024 * 1024
# JSON values a body may hold (a 128k-token prompt given as token ids is 128k): what bounds the parse's objects.
MAX_JSON_VALUES = 1 << 20
# Request bodies held at once, all requests together. With the one parse at a time (about 3x its body plus
# 120 bytes a value) and the connections' buffers, the proxy stays near 220 MiB at worst (limit 512Mi;
# measured by tests/test_incluster_proxy.py).
MAX_HELD_BYTES = 96 * 1024 * 1024
# Connections served at once; past them, RESERVE_CONNECTIONS more answer only /health (the kubelet's probes).
MAX_CONNECTIONS = 256
RESERVE_CONNECTIONS = 16
HEALTH_HEAD_SECONDS = 2.0
# Every answer closes its connection: a client (Traefik, Envoy) that keeps an idle connection longer than
# the proxy would meet it closed as it sends the next request, and not every client retries that.
CLOSE = [("Connection", "close")]
# Headers never passed on (each side's framing is its own; h11 writes it).
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
                        b"upgrade", b"content-length", b"expect", b"host", b"content-type"})
REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Payload Too Large", 414: "URI Too Long", 415: "Unsupported Media Type",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 502: "Bad Gateway",
           503: "Service Unavailable"}


def connection_limit() -> int:
    """Connections at once: MAX_CONNECTIONS, or fewer where the file-descriptor limit is lower (each takes
    its socket and the router's, with room for the proxy's own calls and the reserve)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(4, min(MAX_CONNECTIONS, (soft - 64) // 2 - RESERVE_CONNECTIONS))


class Proxy:
    def __init__(self, residency: Residency, router_url: str, keys: tuple):
        parsed = urllib.parse.urlsplit(router_url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.residency = residency
        self.keys = keys
        self.held = 0  # request body bytes held now, all requests together
        self.connections = 0
        self.waiting: dict = {}  # connections waiting for a request head, oldest first
        self.limit = connection_limit()

    async def serve(self, reader, writer) -> None:
        """One connection: its requests in turn, kept alive between them. Past the connection limit, the
        connection that has waited longest for a request head is dropped to make room (idle or slow sockets
        cannot crowd out a request); when every one is serving a request, a few more answer only /health
        (the kubelet's probes must get through), and past those the new one is dropped."""
        self.connections += 1
        reserve = False
        client = http_io.ClientConnection(reader, writer)
        try:
            if self.connections > self.limit:
                idle = next(iter(self.waiting), None)  # the one that has waited longest for a head
                if idle is not None:
                    self.waiting.pop(idle)
                    idle.close()
                elif self.connections > self.limit + RESERVE_CONNECTIONS:
                    return
                else:
                    reserve = True
            self.waiting[client] = True
            first = True
            while True:
                try:
                    request = await client.next_request(first, HEALTH_HEAD_SECONDS if reserve else http_io.HEAD_SECONDS)
                except h11.RemoteProtocolError as error:  # a head h11 cannot read: answered, then closed
                    await self.refuse(client, error.error_status_hint, f"malformed request: {error}",
                                      "invalid_request_error")
                    return
                if request is None:
                    return
                first = False
                self.waiting.pop(client, None)
                if not await self.request(client, request, reserve):
                    return
                self.waiting[client] = True
        except (http_io.Closed, h11.ProtocolError):
            pass
        except Exception as error:  # one connection's failure never stops the proxy
            log(f"error: {error!r}")
        finally:
            self.connections -= 1
            self.waiting.pop(client, None)
            client.close()

    async def request(self, client: http_io.ClientConnection, request: h11.Request, reserve: bool) -> bool:
        """Serves one request; whether the connection may carry another."""
        state = {"started": False}
        try:
            await self._request(client, request, reserve, state)
        except Refusal as refusal:
            if state["started"]:
                return False
            await self.refuse(client, refusal.status, refusal.message, refusal.kind)
        except http_io.TooLarge as error:
            await self.refuse(client, error.status, str(error), "invalid_request_error")
        except http_io.TimedOut as error:
            await self.refuse(client, 408, str(error), "invalid_request_error")
        except h11.RemoteProtocolError as error:
            if not state["started"]:
                await self.refuse(client, error.error_status_hint, f"malformed request: {error}", "invalid_request_error")
            return False
        return client.h11.our_state is h11.DONE and client.h11.their_state is h11.DONE

    async def refuse(self, client, status: int, message: str, kind: str) -> None:
        body = json.dumps({"error": {"code": status, "message": message, "type": kind}}).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *CLOSE]
        if status == 503:
            headers.append(("Retry-After", "5"))
        try:
            await client.send(h11.Response(status_code=status, reason=REASONS.get(status, "Error"), headers=headers))
            await client.send(h11.Data(data=body))
            await client.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            pass  # an answer had begun: the connection is dropped

    async def _request(self, client, request: h11.Request, reserve: bool, state: dict) -> None:
        method, target = request.method.decode("ascii"), request.target.decode("ascii", "replace")
        headers = list(request.headers)
        names = [name for name, _ in headers]
        if b"transfer-encoding" in names and b"content-length" in names:
            # h11 takes the chunked framing (RFC 9112 allows it); the router refuses such a request: so does this.
            raise Refusal(400, "a request with both Content-Length and Transfer-Encoding is refused")
        if method != "POST" and (b"transfer-encoding" in names or
                                 any(name == b"content-length" and value != b"0" for name, value in headers)):
            # No GET the router serves reads a body; one that came with a body would hold memory (and a
            # connection slot, /health's included) without a key.
            raise Refusal(400, f"a {method} request with a body is not accepted")
        path, parameters = router_rules.split_target(target)
        if reserve and path not in router_rules.PUBLIC_PATHS:
            raise Refusal(503, "too many connections; try again", "unavailable_error")
        self.residency.refresh()
        router_rules.route(method, path, parameters, self.residency.allowed_paths)
        # Refused before the body is read: requests without a key the router takes (the router exempts
        # /health from its key; so does this).
        if path not in router_rules.PUBLIC_PATHS and not router_rules.authorized(self.keys, headers):
            raise Refusal(401, "Invalid API Key", "authentication_error")
        forwarded = [(name, value) for name, value in headers if name not in HOP_BY_HOP]
        if method == "POST":
            router_rules.media_type(headers)
            forwarded.append((b"content-type", b"application/json"))
        forwarded += [(b"host", f"{self.host}:{self.port}".encode()), (b"connection", b"close"),
                      (b"content-length", b"0")]
        router_rules.check_head(forwarded, target)
        lengths = [value for name, value in headers if name == b"content-length"]
        declared = int(lengths[0]) if lengths else None
        if declared is not None and declared > MAX_BODY_BYTES:
            raise http_io.TooLarge(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        if client.h11.they_are_waiting_for_100_continue:
            await client.send(h11.InformationalResponse(status_code=100, headers=[]))
        held = [0]

        def reserve_bytes(size: int) -> None:
            if self.held + size > MAX_HELD_BYTES:
                raise http_io.TooLarge(503, "too many large requests held at once; try again")
            self.held += size
            held[0] += size

        try:
            body = await client.body(MAX_BODY_BYTES, declared, reserve_bytes)
            # The model to admit: a POST's body names it. A scrape (GET /metrics?model=X) admits nothing: it must
            # not load a model (that would unload one in use), and the router answers it 400 unless X runs.
            name = router_rules.body_model(body, MAX_JSON_VALUES) if method == "POST" else None
            scraped = parameters.get("model") if path == router_rules.SCRAPE_PATH else None
            if path == router_rules.SCRAPE_PATH and scraped is None:
                await self.residency.resident()
                await self.answer(client, 200, "text/plain; version=0.0.4", self.residency.metrics().encode())
                return
            for named in (name, scraped):
                if named is not None and named not in self.residency.models:
                    # Not planned (a model the plan dropped, until the keeper has the router forget it): never
                    # loaded past the plan; the router's own answer for a name it does not serve.
                    raise Refusal(400, f"model '{named}' not found")
            forwarded[-1] = (b"content-length", str(len(body)).encode())
            await self._admit_and_relay(client, name, method, target, forwarded, body, state)
        finally:
            self.held -= held[0]

    async def answer(self, client, status: int, content_type: str, body: bytes) -> None:
        await client.send(h11.Response(status_code=status, reason=REASONS.get(status, "OK"),
                                       headers=[("Content-Type", content_type), ("Content-Length", str(len(body))), *CLOSE]))
        await client.send(h11.Data(data=body))
        await client.send(h11.EndOfMessage())

    async def _admit_and_relay(self, client, name, method, target, forwarded, body, state) -> None:
        gone = asyncio.get_running_loop().create_task(client.gone())
        admitted = False
        try:
            if name is not None:
                admission = asyncio.get_running_loop().create_task(self.residency.admit(name))
                done, _ = await asyncio.wait({admission, gone}, return_when=asyncio.FIRST_COMPLETED)
                if admission not in done:  # the client left while it waited
                    admission.cancel()
                    try:
                        await admission
                    except BaseException:  # noqa: B036 - cancelled or failed: nothing stays counted
                        raise http_io.Closed("the client left while its model was admitted") from None
                    self.residency.leave(name)  # it was admitted just before the cancel
                    raise http_io.Closed("the client left while its model was admitted")
                admission.result()  # a Refusal (503 ...) is answered; nothing stays counted
                admitted = True
            await self._relay(client, method, target, forwarded, body, gone, state)
        finally:
            if admitted:
                self.residency.leave(name)
            gone.cancel()
            # Its read ends before the connection's next one begins (one reader at a time).
            await asyncio.gather(gone, return_exceptions=True)

    async def _relay(self, client, method, target, forwarded, body, gone, state) -> None:
        upstream = http_io.Upstream(self.host, self.port)
        try:
            try:
                await upstream.open(h11.Request(method=method, target=target, headers=forwarded), body,
                                    ROUTER_CALL_SECONDS)
            except (OSError, asyncio.TimeoutError) as error:
                raise Refusal(503, f"the router is not answering ({type(error).__name__}); try again",
                              "unavailable_error") from None
            while True:
                step = asyncio.get_running_loop().create_task(upstream.next_event(UPSTREAM_SILENCE_SECONDS))
                done, _ = await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:  # the client left: closing the router's connection cancels its work
                    step.cancel()
                    raise http_io.Closed("the client left during the answer")
                try:
                    event = step.result()
                except (OSError, asyncio.TimeoutError, h11.ProtocolError) as error:
                    if not state["started"]:
                        raise Refusal(502, f"the router's answer broke off ({type(error).__name__})",
                                      "server_error") from None
                    raise http_io.Closed("the router's answer broke off") from None
                if isinstance(event, h11.Response):
                    state["started"] = True
                    headers = [(n, v) for n, v in event.headers if n not in HOP_BY_HOP or n in (b"content-length", b"content-type")]
                    headers += CLOSE
                    await client.send(h11.Response(status_code=event.status_code, reason=event.reason or b"",
                                                   headers=headers))
                elif isinstance(event, h11.Data):
                    await client.send(h11.Data(data=event.data))
                elif isinstance(event, h11.EndOfMessage):
                    await client.send(h11.EndOfMessage())
                    return
                elif isinstance(event, h11.ConnectionClosed):
                    if not state["started"]:
                        raise Refusal(503, "the router closed the connection without an answer; try again",
                                      "unavailable_error")
                    raise http_io.Closed("the router closed the connection inside its answer")
        finally:
            upstream.close()


# The keeper's calls (library.py): bodies are one small JSON object, and no drain waits longer than this.
CONTROL_BODY_BYTES = 4096
CONTROL_DRAIN_SECONDS_MAX = 3600.0
CONTROL_MODELS_MAX = 256
CONTROL_NAME_MAX = 256


class Control:
    """The keeper's calls, on a Unix socket in the pod's scratch volume (ADMISSION_CONTROL): no port, so
    nothing outside the pod reaches them. POST /drain {"models": [...], "seconds"}: refuse new requests for
    those models and answer once those in flight on them have ended (or ``seconds`` passed), with how many
    are left per model; POST /resume {"models": [...]}: admit them again. One request a connection, answered,
    then closed."""

    def __init__(self, residency: Residency):
        self.residency = residency

    async def serve(self, reader, writer) -> None:
        client = http_io.ClientConnection(reader, writer)
        try:
            request = await client.next_request(True)
            if request is None:
                return
            lengths = [value for name, value in request.headers if name == b"content-length"]
            declared = int(lengths[0]) if lengths else None
            if declared is not None and declared > CONTROL_BODY_BYTES:
                raise http_io.TooLarge(413, "a control body is one small JSON object")
            body = await client.body(CONTROL_BODY_BYTES, declared, lambda size: None)
            method, target = request.method.decode("ascii"), request.target.decode("ascii", "replace")
            if method != "POST" or target not in ("/drain", "/resume"):
                await _send_json(client, 404, {"error": "POST /drain or /resume"})
                return
            try:
                asked = json.loads(body)
                names, seconds = asked["models"], float(asked.get("seconds", 0))
                if not isinstance(names, list) or not names or len(names) > CONTROL_MODELS_MAX:
                    raise ValueError("models: a list of model names")
                if not all(isinstance(n, str) and 0 < len(n) <= CONTROL_NAME_MAX for n in names):
                    raise ValueError("models: each a model name")
                if not 0 <= seconds <= CONTROL_DRAIN_SECONDS_MAX:
                    raise ValueError(f"seconds out of range: {seconds}")
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                await _send_json(client, 400, {"error": str(error)[:200]})
                return
            # A model the plan just dropped may still have requests in flight: drained like the others. A name
            # this proxy knows nothing of (never planned, or dropped and no longer running) has nothing in
            # flight here: said back, and the others are drained all the same.
            known = self.residency.known()
            unknown = sorted({n for n in names if n not in known})
            names = sorted({n for n in names if n in known})
            if target == "/drain":
                left = await self.residency.drain(names, seconds) if names else {}
                await _send_json(client, 200, {"in_flight": left, "unknown": unknown})
            else:
                self.residency.resume(names)
                await _send_json(client, 200, {"resumed": names, "unknown": unknown})
        except http_io.TooLarge as error:
            await _send_json(client, error.status, {"error": str(error)})
        except (http_io.Closed, http_io.TimedOut, h11.ProtocolError):
            pass  # dropped: nothing the keeper sends
        except Exception as error:  # one call's failure never stops the proxy
            log(f"control: error: {error!r}")
        finally:
            client.close()


async def _send_json(client, status: int, document: dict) -> None:
    body = json.dumps(document).encode()
    await client.send(h11.Response(status_code=status, reason=REASONS.get(status, "OK"),
                                   headers=[("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                            *CLOSE]))
    await client.send(h11.Data(data=body))
    await client.send(h11.EndOfMessage())


async def main() -> None:
    router_url = os.environ["ROUTER_URL"]
    key_file = os.environ.get("ROUTER_AUTH_FILE")
    keys = ()
    if key_file:
        with open(key_file, "rb") as f:  # once, at start, as the router reads it
            keys = router_rules.read_key_file(f.read())
    residency = Residency(os.environ["ADMISSION_PLAN_FILE"], RouterClient(router_url, keys))
    proxy = Proxy(residency, router_url, keys)
    server = await asyncio.start_server(proxy.serve, os.environ.get("LISTEN_HOST", "0.0.0.0"),
                                        int(os.environ["LISTEN_PORT"]), limit=http_io.READ_SIZE, backlog=256)
    log(f"listening on {os.environ['LISTEN_PORT']}, router at {router_url}, {len(residency.models)} models, "
        f"VRAM budget {residency.budget.vram_gib} GiB, RAM budget {residency.budget.ram_gib} GiB, "
        f"{proxy.limit} connections (+{RESERVE_CONNECTIONS} for /health), {len(keys)} keys")
    control_path = os.environ.get("ADMISSION_CONTROL")
    if control_path:
        if os.path.exists(control_path):
            os.unlink(control_path)  # a socket left by the proxy's last run (the scratch volume outlives it)
        control = await asyncio.start_unix_server(Control(residency).serve, path=control_path, limit=http_io.READ_SIZE)
        os.chmod(control_path, 0o600)  # the pod's containers share one UID: the keeper's, no other
    else:
        control = None
    keeper = asyncio.get_running_loop().create_task(residency.keep_pinned())
    room = asyncio.get_running_loop().create_task(residency.keep_room())
    async with server:
        await server.serve_forever()
    keeper.cancel()
    room.cancel()
    if control is not None:
        control.close()


if __name__ == "__main__":
    asyncio.run(main())
