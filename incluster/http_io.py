"""HTTP/1.1 over asyncio for the admission proxy, on h11 (a pure-Python HTTP/1.1 state machine, shipped
beside this file at a pinned, hash-checked version: components/programs.py): h11 reads and writes the
protocol; this file adds what h11 leaves to its user, a deadline or a limit on every input.

- A request head whole within HEAD_SECONDS of the connection (or of its first byte after a kept-alive
  answer), and at most MAX_HEAD_BYTES; a kept-alive connection idle for IDLE_SECONDS is closed (the
  router's own keep-alive, cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND).
- A body within its deadline (BODY_START_SECONDS, then at least BODY_MIN_BYTES_PER_SECOND), with no gap
  of READ_STALL_SECONDS, of at most the caller's byte limit, counted as it arrives (chunked bodies too),
  and in at most MAX_CHUNKS chunks (each chunk costs a parse: a body of one-byte chunks would cost CPU
  seconds).
- Every write to a client drained within WRITE_SECONDS: a client that stops reading is dropped, and what
  it held (a model in flight) is released.

Standard library and h11 only: this file runs in the router's pod."""

from __future__ import annotations

import asyncio
import os

import h11


def _seconds(name: str, default: float) -> float:
    """A deadline; HTTP_<name> in the environment scales it down for a test (the pod sets none)."""
    return float(os.environ.get(f"HTTP_{name}", default))


HEAD_SECONDS = _seconds("HEAD_SECONDS", 10.0)
IDLE_SECONDS = _seconds("IDLE_SECONDS", 5.0)
BODY_START_SECONDS = _seconds("BODY_START_SECONDS", 10.0)
BODY_MIN_BYTES_PER_SECOND = 1 << 20
READ_STALL_SECONDS = _seconds("READ_STALL_SECONDS", 10.0)
WRITE_SECONDS = _seconds("WRITE_SECONDS", 30.0)
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNKS = 16384
READ_SIZE = 64 * 1024
# Pipelined bytes read while an answer is relayed (to notice a client that leaves), kept for the next request.
MAX_PIPELINED_BYTES = 64 * 1024


class Closed(Exception):
    """The client left, or stopped reading or writing within a deadline: the connection is dropped."""


class TooLarge(Exception):
    """A body past its limit (status 413), in bytes or chunks, or past what the proxy may hold (503)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class TimedOut(Exception):
    """A body that did not arrive within its deadline: 408."""


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class ClientConnection:
    """One client connection: its requests as h11 events, read and written within their deadlines."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.waiting_since = None  # loop time since it waits for a request head; None while serving one

    async def _feed(self, deadline: float, stall: float | None = None) -> None:
        left = deadline - _loop_time()
        if stall is not None:
            left = min(left, stall)
        if left <= 0:
            raise asyncio.TimeoutError
        try:
            data = await asyncio.wait_for(self.reader.read(READ_SIZE), left)
        except asyncio.TimeoutError:  # (an OSError too: caught first)
            raise
        except (ConnectionError, OSError) as error:
            raise Closed(f"read failed: {error!r}") from None
        self.h11.receive_data(data)

    async def next_request(self, first: bool, head_seconds: float = HEAD_SECONDS) -> h11.Request | None:
        """The next request's head; None when the client closed, idled out between requests, or did not
        send a whole head in time (the connection is then dropped without an answer)."""
        if not first:
            if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                return None
            self.h11.start_next_cycle()
        self.waiting_since = _loop_time()
        deadline = self.waiting_since + (head_seconds if first else IDLE_SECONDS)
        waiting = not first  # a kept-alive connection: its next head has a deadline of its own once it starts
        try:
            return await self._head(deadline, waiting, head_seconds)
        finally:
            self.waiting_since = None

    async def _head(self, deadline: float, waiting: bool, head_seconds: float) -> h11.Request | None:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                try:
                    await self._feed(deadline)
                except asyncio.TimeoutError:
                    return None
                if waiting:
                    waiting, deadline = False, _loop_time() + head_seconds
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                return event
            raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")

    async def body(self, limit: int, declared: int | None, reserve) -> bytes:
        """The request's body, at most ``limit`` bytes (``declared``: its Content-Length, if any);
        ``reserve(n)`` is called for each n bytes received, and raises TooLarge when the proxy holds too
        much already."""
        parts: list[bytes] = []
        size = chunks = 0
        expected = min(limit, declared if declared is not None else limit)
        deadline = _loop_time() + BODY_START_SECONDS + expected / BODY_MIN_BYTES_PER_SECOND
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                try:
                    await self._feed(deadline, READ_STALL_SECONDS)
                except asyncio.TimeoutError:
                    raise TimedOut("the request body did not arrive in time") from None
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                chunks += event.chunk_start
                if size > limit:
                    raise TooLarge(413, f"request body larger than {limit} bytes")
                if chunks > MAX_CHUNKS:
                    raise TooLarge(413, f"request body in more than {MAX_CHUNKS} chunks")
                reserve(len(event.data))
                parts.append(event.data)
                continue
            if isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            if isinstance(event, h11.ConnectionClosed):
                raise Closed("closed inside the body")
            raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")

    async def send(self, event) -> None:
        """One event to the client, drained within WRITE_SECONDS."""
        data = self.h11.send(event)
        if data:
            self.writer.write(data)
        try:
            await asyncio.wait_for(self.writer.drain(), WRITE_SECONDS)
        except asyncio.TimeoutError:  # (an OSError too: caught first)
            raise Closed("the client stopped reading") from None
        except (ConnectionError, OSError) as error:
            raise Closed(f"write failed: {error!r}") from None

    async def gone(self) -> None:
        """Completes when the client closes its side, or sends more than a pipelined request's worth while
        its answer is relayed (then the connection is not kept). Its bytes wait in h11 for the next cycle."""
        held = 0
        while True:
            try:
                data = await self.reader.read(READ_SIZE)
            except (ConnectionError, OSError):
                return
            if not data:
                return
            held += len(data)
            self.h11.receive_data(data)
            if held > MAX_PIPELINED_BYTES:
                return

    def close(self) -> None:
        try:
            self.writer.close()
        except (ConnectionError, OSError, RuntimeError):
            pass


class Upstream:
    """One exchange with the router over its own connection (`Connection: close`), read within deadlines."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)

    async def open(self, request: h11.Request, body: bytes, seconds: float) -> None:
        self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), seconds)
        for event in (request, h11.Data(data=body) if body else None, h11.EndOfMessage()):
            if event is None:
                continue
            for piece in self.h11.send_with_data_passthrough(event) or ():
                self.writer.write(piece)
        await asyncio.wait_for(self.writer.drain(), seconds)

    async def next_event(self, seconds: float):
        """The router's next event (Response, Data, EndOfMessage or ConnectionClosed), waiting at most
        ``seconds`` for bytes."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await asyncio.wait_for(self.reader.read(READ_SIZE), seconds)
            self.h11.receive_data(data)

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except (ConnectionError, OSError, RuntimeError):
                pass


async def call(host: str, port: int, method: str, target: str, headers: list[tuple[str, str]], body: bytes,
               seconds: float, max_bytes: int) -> tuple[int, bytes]:
    """A small request of the proxy's own to the router: its status and body, all within ``seconds``."""
    upstream = Upstream(host, port)

    async def exchange() -> tuple[int, bytes]:
        request = h11.Request(method=method, target=target, headers=[
            ("Host", f"{host}:{port}"), ("Connection", "close"), ("Content-Length", str(len(body))), *headers])
        await upstream.open(request, body, seconds)
        status, parts, size = 0, [], 0
        while True:
            event = await upstream.next_event(seconds)
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > max_bytes:
                    raise ValueError(f"the router's answer to {method} {target} is larger than {max_bytes} bytes")
                parts.append(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, b"".join(parts)

    try:
        return await asyncio.wait_for(exchange(), seconds)
    finally:
        upstream.close()
