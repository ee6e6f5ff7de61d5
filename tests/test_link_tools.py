"""The link tools of a split over RPC (issue #47): tools/link_probe.py (make link-profile) measures what
lab/bench/link_relay.py shapes, on real sockets; incluster/rpc_wait.py reads only host:port lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.contract.server import free_port
from lab.bench.measure_rpc import wait_port

ROOT = Path(__file__).resolve().parent.parent


def test_the_probe_measures_the_rate_and_delay_the_relay_gives(tmp_path):
    server_port, relay_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "tools" / "link_probe.py"), "serve", "--host", "127.0.0.1",
                               "--port", str(server_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    relay = subprocess.Popen([sys.executable, "-m", "lab.bench.link_relay", "--listen", f"127.0.0.1:{relay_port}",
                              "--to", f"127.0.0.1:{server_port}", "--gbps", "0.4", "--delay-ms", "2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        # (Each wait connects and closes: the server answers one client at a time and drops a silent one.)
        assert wait_port(server_port, time.monotonic() + 10) and wait_port(relay_port, time.monotonic() + 10)
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "link_probe.py"), "measure", "127.0.0.1", "--port",
                              str(relay_port), "--pings", "20", "--mib", "16", "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        figures = json.loads(out.stdout)
        # 2 ms each way: a round trip no shorter than 4 ms; the wire's 0.4 Gbit/s, never more.
        assert figures["rtt_ms"] >= 4.0
        assert 0.2 <= figures["gbps"] <= 0.42
    finally:
        for proc in (relay, server):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_probe_says_what_to_run_when_nothing_listens():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "link_probe.py"), "measure", "127.0.0.1", "--port",
                          str(free_port()), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "is `link_probe.py serve` running there?" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("helpers", ["", "host", "host:", "host:0", "host:70000", "a:1,b", ",".join(["h:1"] * 17)])
def test_the_wait_refuses_anything_but_a_host_port_list(helpers):
    from incluster import rpc_wait  # standard library alone: importable as the program's module too
    with pytest.raises(ValueError):
        rpc_wait.endpoints(helpers)
    assert rpc_wait.endpoints("qwen3-235b-rpc-0:50052, x.ns.svc:1") == [("qwen3-235b-rpc-0", 50052), ("x.ns.svc", 1)]


def test_the_wait_gives_up_past_its_deadline_naming_the_silent_helper():
    port = free_port()
    env = {"RPC_HELPERS": f"127.0.0.1:{port}", "RPC_WAIT_SECONDS": "1", "PATH": os.environ.get("PATH", "")}
    out = subprocess.run([sys.executable, "-B", "-E", "-s", str(ROOT / "incluster" / "rpc_wait.py")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"127.0.0.1:{port}" in out.stderr


def test_the_probe_server_drops_a_stalled_an_oversized_and_a_garbled_client_and_keeps_serving(monkeypatch):
    """tools/link_probe.py serve faces whatever connects to its port on a node: a client that sends nothing is
    dropped after TIMEOUT_S, an announced transfer over MAX_BULK and an unknown opcode at once, and the next client
    is measured as usual."""
    import socket
    import struct
    import threading

    from tools import link_probe
    monkeypatch.setattr(link_probe, "TIMEOUT_S", 0.5)
    port = free_port()
    threading.Thread(target=link_probe.serve, args=(port, False, "127.0.0.1"), daemon=True).start()
    assert wait_port(port, time.monotonic() + 10)

    def closed_by_server(sock: socket.socket, seconds: float) -> bool:
        sock.settimeout(seconds)
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True

    stalled = socket.create_connection(("127.0.0.1", port))
    started = time.monotonic()
    assert closed_by_server(stalled, 5) and time.monotonic() - started < 3
    # From here a silent client would be kept 30 s: what closes these within 2 s is the check each one fails.
    monkeypatch.setattr(link_probe, "TIMEOUT_S", 30)
    oversized = socket.create_connection(("127.0.0.1", port))
    oversized.sendall(link_probe.BULK + struct.pack("!Q", link_probe.MAX_BULK + 1))
    assert closed_by_server(oversized, 2)
    garbled = socket.create_connection(("127.0.0.1", port))
    garbled.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert closed_by_server(garbled, 2)
    figures = link_probe.measure("127.0.0.1", port, 5, 1)
    assert figures["rtt_ms"] > 0 and figures["gbps"] > 0


def test_the_relay_reads_rpc_commands_across_chunk_edges_and_ignores_other_streams():
    """The relay's counts are what tests/test_rpc_contract.py holds the plan's per-token bytes to: commands whose
    header or data straddle chunks are counted once each, with their data bytes; a stream that does not begin with
    HELLO (the link probe's bulk bytes) is not read as commands at all."""
    from lab.bench.link_relay import RPC_COMMANDS, Traffic

    def command(name: str, data: bytes) -> bytes:
        return bytes([RPC_COMMANDS.index(name)]) + len(data).to_bytes(8, "little") + data

    stream = command("HELLO", b"\0" * 24) + command("SET_TENSOR", b"x" * 1000) + command("GRAPH_RECOMPUTE", b"\0" * 4) \
        + command("GET_TENSOR", b"\0" * 312)
    traffic = Traffic()
    for at in range(0, len(stream), 7):  # 7-byte chunks: every header is cut somewhere
        traffic.count(1, "up", stream[at:at + 7])
    traffic.count(1, "down", b"\0" * 100)
    traffic.count(1, "up", command("SET_TENSOR", b"y" * 10))
    counts = traffic.snapshot()
    assert counts["commands"] == {"HELLO": 1, "SET_TENSOR": 2, "GRAPH_RECOMPUTE": 1, "GET_TENSOR": 1}
    assert counts["command_bytes"]["SET_TENSOR"] == 1010 and counts["exchanges"] == 1
    rounds = traffic.since({})[1]
    assert [r["up"] for r in rounds] == [len(stream), 19] and [r["down"] for r in rounds] == [100, 0]
    other = Traffic()
    other.count(2, "up", bytes(64 << 10))
    assert other.snapshot()["commands"] == {} and other.snapshot()["up"] == 64 << 10


def test_the_relay_holds_a_sender_back_as_a_link_does():
    """A burst written into the relay is not taken at once: the writer waits about as long as the shaped wire needs
    for it, less what the wire and the sockets' buffers hold (WIRE_SLACK, RECEIVE_BUFFER and the kernel's own send
    buffer). A relay that took it at once let llama-bench's pre-timer restore cross the wire during its timed tokens
    (bench/results-rpc-cpu.json, run 1)."""
    import socket
    import threading

    from lab.bench.link_relay import serve

    sink_port, relay_port = free_port(), free_port()
    received = []

    def sink() -> None:
        with socket.create_server(("127.0.0.1", sink_port)) as server:
            while True:  # the port wait's connection first, then the relay's
                conn, _ = server.accept()
                with conn:
                    while data := conn.recv(1 << 16):
                        received.append(len(data))

    threading.Thread(target=sink, daemon=True).start()
    assert wait_port(sink_port, time.monotonic() + 10)
    listening = threading.Event()
    threading.Thread(target=serve, args=(("127.0.0.1", relay_port), ("127.0.0.1", sink_port), 0.16, 0.0, None, listening),
                     daemon=True).start()
    assert listening.wait(10)
    burst = 16 << 20  # 0.84 s on a 0.16 Gbit/s wire
    with socket.create_connection(("127.0.0.1", relay_port)) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
        started = time.monotonic()
        client.settimeout(30)
        client.sendall(bytes(burst))
        waited = time.monotonic() - started
    # The sender is released once all but the buffers' worth (well under 4 MiB here) has crossed the wire.
    assert waited >= (burst - (4 << 20)) * 8 / 0.16e9, waited
    deadline = time.monotonic() + 10
    while sum(received) < burst and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(received) == burst
