"""What the admission proxy adds to a request (make bench): the real router (the CPU build the tests use)
with the shipped library's rendered preset and flags, tiny models, and the rendered proxy in front; the
same requests straight to the router and through the proxy, timed to the last byte, medians printed.
Two kinds: a /tokenize of a resident model (the proxy's own cost: one admission, one extra loopback
connection) and a 16-token completion of a resident model."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    import tempfile

    from lab.llama_build import build
    from lab.contract.server import request
    from test_admission import TEST_KEY, plane

    binary = build()
    auth = {"Authorization": f"Bearer {TEST_KEY}"}
    with tempfile.TemporaryDirectory() as folder, plane(binary, Path(folder)) as p:
        name = "llama-3.1-8b"
        assert p.chat(name).status == 200  # resident from here on
        kinds = {"tokenize": ("/tokenize", {"model": name, "content": "hello there"}),
                 "completion 16 tokens": ("/completion", {"model": name, "prompt": "hi", "n_predict": 16, "temperature": 0})}
        for kind, (path, body) in kinds.items():
            times = {"router": [], "proxy": []}
            for _ in range(60):
                for where, base in (("router", p.router.base), ("proxy", p.base)):
                    started = time.perf_counter()
                    answer = request(base + path, body, auth)
                    times[where].append(time.perf_counter() - started)
                    assert answer.status == 200, answer.body[:200]
            direct, through = statistics.median(times["router"]), statistics.median(times["proxy"])
            print(f"admission proxy, {kind}: median {direct * 1000:.1f} ms straight to the router, {through * 1000:.1f} ms "
                  f"through the proxy (+{(through - direct) * 1000:.1f} ms), 60 requests each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
