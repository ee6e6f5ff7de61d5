"""The link between two nodes as the RPC split's speed model reads it (node_pools.<pool>.link: round trip and
bandwidth; docs/rpc-split.md): run `serve` on one node and `measure HOST` on the other (`make link-profile
HOST=...`), then copy the printed figures into the stack file. Python's standard library only, so it runs from
a clone on any node.

    python3 tools/link_probe.py serve [--port 50070] [--once]
    python3 tools/link_probe.py measure HOST [--port 50070] [--pings 400] [--mib 256] [--json]

The round trip is the median of `--pings` exchanges of 64 bytes each way (TCP_NODELAY, as llama.cpp's RPC client
sets it), the bandwidth one transfer of `--mib` MiB, timed from its first byte sent to the server's answer that
it holds all of it. The server answers one client at a time, reads nothing but its own small framing (an opcode
byte and a length, at most MAX_BULK), and drops a client that stalls for TIMEOUT_S.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time

DEFAULT_PORT = 50070
TIMEOUT_S = 30.0
PING, BULK = b"P", b"B"
PING_BYTES = 64
MAX_BULK = 4 << 30  # the largest transfer the server accepts
CHUNK = 1 << 20


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        part = sock.recv(min(CHUNK, size - len(data)))
        if not part:
            raise ConnectionError("peer closed")
        data += part
    return bytes(data)


def _drain(sock: socket.socket, size: int) -> None:
    left = size
    buffer = bytearray(CHUNK)
    while left > 0:
        got = sock.recv_into(buffer, min(CHUNK, left))
        if not got:
            raise ConnectionError("peer closed")
        left -= got


def _serve_client(conn: socket.socket) -> None:
    conn.settimeout(TIMEOUT_S)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        try:
            op = conn.recv(1)
        except (TimeoutError, ConnectionError):
            return
        if not op:
            return
        if op == PING:
            conn.sendall(_recv_exact(conn, PING_BYTES))
        elif op == BULK:
            (size,) = struct.unpack("!Q", _recv_exact(conn, 8))
            if size > MAX_BULK:
                return
            _drain(conn, size)
            conn.sendall(b"K")
        else:
            return


def serve(port: int, once: bool, host: str = "0.0.0.0") -> int:
    with socket.create_server((host, port), reuse_port=False) as server:
        print(f"link_probe: listening on {host}:{port}", flush=True)
        while True:
            conn, peer = server.accept()
            with conn:
                try:
                    _serve_client(conn)
                except (OSError, ConnectionError) as error:
                    print(f"link_probe: {peer[0]}: {error}", file=sys.stderr)
            if once:
                return 0


def measure(host: str, port: int, pings: int, mib: int) -> dict:
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = bytes(PING_BYTES)
        times = []
        for _ in range(pings):
            started = time.perf_counter()
            sock.sendall(PING + payload)
            _recv_exact(sock, PING_BYTES)
            times.append(time.perf_counter() - started)
        size = mib << 20
        block = bytes(CHUNK)
        started = time.perf_counter()
        sock.sendall(BULK + struct.pack("!Q", size))
        left = size
        while left > 0:
            sock.sendall(block[:min(CHUNK, left)])
            left -= min(CHUNK, left)
        if _recv_exact(sock, 1) != b"K":
            raise ConnectionError("no acknowledgement of the transfer")
        seconds = time.perf_counter() - started
    rtt = statistics.median(times)
    return {"rtt_ms": round(rtt * 1e3, 4), "rtt_p90_ms": round(sorted(times)[int(len(times) * 0.9)] * 1e3, 4),
            "gbps": round(size * 8 / max(seconds - rtt, 1e-9) / 1e9, 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--once", action="store_true", help="answer one client, then exit")
    m = sub.add_parser("measure")
    m.add_argument("host")
    m.add_argument("--port", type=int, default=DEFAULT_PORT)
    m.add_argument("--pings", type=int, default=400)
    m.add_argument("--mib", type=int, default=256)
    m.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.verb == "serve":
        return serve(args.port, args.once, args.host)
    if not 1 <= args.pings <= 100_000 or not 1 <= args.mib <= MAX_BULK >> 20:
        print("link_probe: --pings 1-100000 and --mib 1-4096", file=sys.stderr)
        return 2
    try:
        figures = measure(args.host, args.port, args.pings, args.mib)
    except (OSError, ConnectionError) as error:
        print(f"link_probe: {args.host}:{args.port}: {error}; is `link_probe.py serve` running there?", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"link: {{rtt_ms: {figures['rtt_ms']}, gbps: {figures['gbps']}}}   # p90 round trip {figures['rtt_p90_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
