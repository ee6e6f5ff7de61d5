"""A TCP relay that behaves like a slower link: each direction delivers bytes no faster than --gbps and
--delay-ms after they left (a serialising wire plus its propagation delay), in order. Stands between llama-server
and a ggml-rpc-server where no `tc` exists (the GPU machine, the contract tests' loopback), so the RPC split is
measured over 1, 2.5 and 10 GbE and USB4-like links (issue #47). tools/link_probe.py measures what it gives.

    python -m lab.bench.link_relay --listen 127.0.0.1:50060 --to 127.0.0.1:50052 --gbps 1 --delay-ms 0.1

One thread per direction per connection: the shaping is timed with perf_counter, and a write is made when its
bytes have arrived; chunks are at most 64 KiB, so a chunk's own time on a 1 GbE wire is about 0.5 ms.

It also counts what crosses it (Traffic; --stats writes the counts as JSON): bytes each way; exchanges, the
times the far side answered after the near side had sent (a round trip the near side may wait on), each kept as a
round (what went up, what came back); and, where the near side speaks llama.cpp's RPC protocol, its commands by name (each request is | command, 1 byte | size, 8 bytes
little-endian | data |, ggml/src/ggml-rpc/ggml-rpc.cpp b10729). That is what engines/llamacpp_rpc.py's per-token
bytes and round trips are held to (tests/test_rpc_contract.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys
import threading
import time

CHUNK = 64 << 10
# What the wire takes from a sender beyond what is in flight on it (a switch's and a NIC's buffers), and the
# kernel's receive buffer on the relay's sockets: together about what a sender has queued on a real link beyond its
# own send buffer.
WIRE_SLACK = 256 << 10
RECEIVE_BUFFER = 128 << 10
# enum rpc_cmd, ggml-rpc.cpp b10729, in order (RPC_CMD_HELLO must be 14 there).
RPC_COMMANDS = ("ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "FREE_BUFFER", "BUFFER_CLEAR",
                "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE", "GET_DEVICE_MEMORY",
                "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE", "MEMSET_TENSOR")


ROUNDS_KEPT = 4096  # per connection, the latest


class _Requests:
    """Reads one connection's request stream as RPC commands, counting each command and its data bytes."""

    def __init__(self) -> None:
        self.header = b""
        self.left = 0
        self.rpc: bool | None = None  # known once the first command is read: a client always begins with HELLO

    def feed(self, data: bytes) -> list[tuple[str, int]]:
        """The commands whose headers complete in this chunk: (name, data bytes); none for a stream that is not
        llama.cpp's RPC (its first command is not HELLO, or a later one is unknown)."""
        found = []
        view = memoryview(data)
        while view and self.rpc is not False:
            if self.left:
                take = min(self.left, len(view))
                self.left -= take
                view = view[take:]
                continue
            need = 9 - len(self.header)
            self.header += bytes(view[:need])
            view = view[need:]
            if len(self.header) == 9:
                code, size = self.header[0], int.from_bytes(self.header[1:], "little")
                self.rpc = code < len(RPC_COMMANDS) and (self.rpc or RPC_COMMANDS[code] == "HELLO")
                if not self.rpc:
                    return []
                found.append((RPC_COMMANDS[code], size))
                self.header, self.left = b"", size
        return found


class Traffic:
    """Bytes each way (up: from the side that connects, down: back) and exchanges (down after up) over all
    connections, as the relay received them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.up = self.down = self.exchanges = self.connections = 0
        self.commands: collections.Counter = collections.Counter()
        self.command_bytes: collections.Counter = collections.Counter()
        self._last: dict[int, str] = {}
        self._requests: dict[int, _Requests] = collections.defaultdict(_Requests)
        # connection -> its rounds: {"up": bytes, "down": bytes, "commands": {name: count}}, a new one begun
        # whenever the near side sends after an answer.
        self.rounds: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=ROUNDS_KEPT))
        self._begun: collections.Counter = collections.Counter()

    def count(self, connection: int, direction: str, data: bytes) -> None:
        size = len(data)
        with self.lock:
            rounds = self.rounds[connection]
            if direction == "up":
                if not rounds or self._last.get(connection) == "down":
                    rounds.append({"up": 0, "down": 0, "commands": collections.Counter()})
                    self._begun[connection] += 1
                self.up += size
                rounds[-1]["up"] += size
                for name, nbytes in self._requests[connection].feed(data):
                    self.commands[name] += 1
                    self.command_bytes[name] += nbytes
                    rounds[-1]["commands"][name] += 1
            else:
                self.down += size
                if rounds:
                    rounds[-1]["down"] += size
                if self._last.get(connection) == "up":
                    self.exchanges += 1
            self._last[connection] = direction

    def mark(self) -> dict[int, int]:
        """Where each connection's rounds stand, for since()."""
        with self.lock:
            return dict(self._begun)

    def since(self, mark: dict[int, int]) -> dict[int, list[dict]]:
        """Each connection's rounds begun after the mark (at most ROUNDS_KEPT), oldest first."""
        with self.lock:
            out = {}
            for connection, begun in self._begun.items():
                new = min(begun - mark.get(connection, 0), len(self.rounds[connection]))
                if new > 0:
                    out[connection] = [dict(r, commands=dict(r["commands"])) for r in list(self.rounds[connection])[-new:]]
            return out

    def snapshot(self) -> dict:
        with self.lock:
            return {"up": self.up, "down": self.down, "exchanges": self.exchanges, "connections": self.connections,
                    "commands": dict(self.commands), "command_bytes": dict(self.command_bytes)}


def _sleep_until(when: float) -> None:
    while True:
        left = when - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left if left > 0.002 else 0)  # spin the last 2 ms: sleep() overshoots by ~0.1 ms


def _pump(src: socket.socket, dst: socket.socket, bytes_per_s: float, delay_s: float,
          count=lambda data: None) -> None:
    """src -> dst through the shaped wire: a reader stamps each chunk with its arrival, a writer waits for it. The
    reader takes no more than the wire holds (WIRE_SLACK beyond its rate x delay) ahead of the writer, so a sender
    is held back as a real link's TCP holds it: without that, a burst (llama-bench restoring a cached KV state
    before its timer starts) was taken at once and delivered during the timed tokens."""
    queue: collections.deque = collections.deque()
    ready = threading.Condition()
    done = []
    held = [0]  # bytes read and not yet delivered
    capacity = WIRE_SLACK + bytes_per_s * delay_s

    def reader() -> None:
        wire_free = 0.0
        try:
            while True:
                with ready:
                    while held[0] >= capacity and not done:
                        ready.wait()
                data = src.recv(CHUNK)
                if not data:
                    break
                count(data)
                now = time.perf_counter()
                start = max(now, wire_free)
                wire_free = start + (len(data) / bytes_per_s if bytes_per_s else 0.0)
                with ready:
                    queue.append((wire_free + delay_s, data))
                    held[0] += len(data)
                    ready.notify_all()
        except OSError:
            pass
        with ready:
            done.append(True)
            ready.notify()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        while True:
            with ready:
                while not queue and not done:
                    ready.wait()
                if not queue:
                    break
                arrive, data = queue.popleft()
            _sleep_until(arrive)
            dst.sendall(data)
            with ready:
                held[0] -= len(data)
                ready.notify_all()
    except OSError:
        pass
    with ready:
        done.append(True)
        ready.notify_all()
    for sock in (dst, src):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def serve(listen: tuple[str, int], target: tuple[str, int], gbps: float, delay_ms: float,
          traffic: Traffic | None = None, listening: threading.Event | None = None) -> None:
    rate = gbps * 1e9 / 8 if gbps > 0 else 0.0
    traffic = traffic or Traffic()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)  # inherited by each client's socket
        server.bind(listen)
        server.listen()
        print(f"link_relay: {listen[0]}:{listen[1]} -> {target[0]}:{target[1]} at {gbps or 'unlimited'} Gbit/s, "
              f"{delay_ms} ms each way", flush=True)
        if listening is not None:
            listening.set()
        while True:
            client, _ = server.accept()
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            upstream.connect(target)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with traffic.lock:
                traffic.connections += 1
                connection = traffic.connections
            for a, b, direction in ((client, upstream, "up"), (upstream, client, "down")):
                def count(data: bytes, direction: str = direction) -> None:
                    traffic.count(connection, direction, data)
                threading.Thread(target=_pump, args=(a, b, rate, delay_ms / 1e3, count), daemon=True).start()


def _write_stats(traffic: Traffic, path: str) -> None:
    last = None
    while True:
        now = traffic.snapshot()
        if now != last:
            with open(path + ".tmp", "w") as out:
                json.dump(now, out)
            os.replace(path + ".tmp", path)
            last = now
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--gbps", type=float, default=0.0, help="0: no rate limit")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one way")
    parser.add_argument("--stats", help="a file to keep the traffic counts in (JSON, rewritten as they change)")
    args = parser.parse_args(argv)
    traffic = Traffic()
    if args.stats:
        threading.Thread(target=_write_stats, args=(traffic, args.stats), daemon=True).start()
    serve(_address(args.listen), _address(args.to), args.gbps, args.delay_ms, traffic)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
