"""A TCP relay that behaves like a slower link: each direction delivers bytes no faster than --gbps and
--delay-ms after they left (a serialising wire plus its propagation delay), in order. Stands between llama-server
and a ggml-rpc-server where no `tc` exists (the GPU machine, the contract tests' loopback), so the RPC split is
measured over 1, 2.5 and 10 GbE and USB4-like links (issue #47). tools/link_probe.py measures what it gives.

    python -m lab.bench.link_relay --listen 127.0.0.1:50060 --to 127.0.0.1:50052 --gbps 1 --delay-ms 0.1

One thread per direction per connection: the shaping is timed with perf_counter, and a write is made when its
bytes have arrived; chunks are at most 64 KiB, so a chunk's own time on a 1 GbE wire is about 0.5 ms.
"""

from __future__ import annotations

import argparse
import collections
import socket
import sys
import threading
import time

CHUNK = 64 << 10


def _sleep_until(when: float) -> None:
    while True:
        left = when - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left if left > 0.002 else 0)  # spin the last 2 ms: sleep() overshoots by ~0.1 ms


def _pump(src: socket.socket, dst: socket.socket, bytes_per_s: float, delay_s: float) -> None:
    """src -> dst through the shaped wire: a reader stamps each chunk with its arrival, a writer waits for it."""
    queue: collections.deque = collections.deque()
    ready = threading.Condition()
    done = []

    def reader() -> None:
        wire_free = 0.0
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                now = time.perf_counter()
                start = max(now, wire_free)
                wire_free = start + (len(data) / bytes_per_s if bytes_per_s else 0.0)
                with ready:
                    queue.append((wire_free + delay_s, data))
                    ready.notify()
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
    except OSError:
        pass
    for sock in (dst, src):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def serve(listen: tuple[str, int], target: tuple[str, int], gbps: float, delay_ms: float) -> None:
    rate = gbps * 1e9 / 8 if gbps > 0 else 0.0
    with socket.create_server(listen) as server:
        print(f"link_relay: {listen[0]}:{listen[1]} -> {target[0]}:{target[1]} at {gbps or 'unlimited'} Gbit/s, "
              f"{delay_ms} ms each way", flush=True)
        while True:
            client, _ = server.accept()
            upstream = socket.create_connection(target)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b, rate, delay_ms / 1e3), daemon=True).start()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--gbps", type=float, default=0.0, help="0: no rate limit")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one way")
    args = parser.parse_args(argv)
    serve(_address(args.listen), _address(args.to), args.gbps, args.delay_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
