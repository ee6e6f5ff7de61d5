"""The init container of a model split over nodes (models.<key>.rpc): the main server starts once every helper's
ggml-rpc-server accepts a connection.

Why: llama-server connects to each --rpc endpoint as it parses its arguments and aborts when one does not answer
("Failed to connect", ggml-rpc.cpp), so a main server that starts before its helpers crash-loops into the kubelet's
back-off, which reaches five minutes. ggml-rpc-server has no health endpoint: a TCP connection it accepts is what
upstream's own test of several helpers waits for. It serves one client at a time, so this connects
and closes at once, sending nothing.

What it reads: RPC_HELPERS, the helpers' host:port list (comma separated, as --rpc takes it); RPC_WAIT_SECONDS,
after which it exits 1 naming the helpers that never answered (the kubelet restarts it). Each attempt has a
deadline of CONNECT_SECONDS. Standard library only: a file of the server's programs ConfigMap."""

import os
import socket
import sys
import time

CONNECT_SECONDS = 3.0
POLL_SECONDS = 2.0
MAX_HELPERS = 16


def endpoints(text):
    """[(host, port)] from RPC_HELPERS; ValueError on anything else."""
    found = []
    for item in text.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"RPC_HELPERS: {item!r} is not host:port")
        found.append((host, int(port)))
    if not found or len(found) > MAX_HELPERS:
        raise ValueError(f"RPC_HELPERS: 1 to {MAX_HELPERS} helpers, not {len(found)}")
    return found


def answers(host, port):
    try:
        with socket.create_connection((host, port), timeout=CONNECT_SECONDS):
            return True
    except OSError:
        return False


def main():
    helpers = endpoints(os.environ["RPC_HELPERS"])
    deadline = time.monotonic() + float(os.environ["RPC_WAIT_SECONDS"])
    waiting = list(helpers)
    while True:
        waiting = [(host, port) for host, port in waiting if not answers(host, port)]
        if not waiting:
            print(f"rpc_wait: every helper answers ({', '.join(f'{h}:{p}' for h, p in helpers)})", flush=True)
            return 0
        if time.monotonic() > deadline:
            print(f"rpc_wait: no answer from {', '.join(f'{h}:{p}' for h, p in waiting)} within "
                  f"{os.environ['RPC_WAIT_SECONDS']} s; is each helper's pod running on its node?", file=sys.stderr,
                  flush=True)
            return 1
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
