"""Measure one model split over llama.cpp's RPC backend (issue #47): a ggml-rpc-server holding part of the layers
behind a shaped link (lab/bench/link_relay.py), llama-bench decoding and prefilling through it, and llama-server's
own report of what each device holds. The rows are what engines/llamacpp_rpc.py is checked against (make bench).

    python -m lab.bench.measure_rpc --bin DIR --jobs bench/jobs-rpc-h200.json --out results.json [--max-seconds N]

Each job: {"shape", "quant", "routing"?, "split": "remote/local" (llama.cpp's --tensor-split: RPC devices come first),
"links": [{"name", "gbps", "delay_ms"}], "args": [more llama-bench arguments], "server_ctx": N (0: no memory run),
"baseline": true to also run the model whole without RPC ("baseline_args": its own extra arguments), "per_depth":
false to run every depth in one llama-bench (one upload of the model over a slow link; the traffic not per depth)}.
For each link the relay is started, tools/link_probe.py measures it (what a user's `make link-profile` gives the
plan), then llama-bench runs through it. The rpc-server keeps a tensor cache (-c), so only the first load of a
shape crosses the shaped wire.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from lab.contract.real_shape import expected_weights_bytes, write_real_shape
from lab.contract.server import stop

RPC_PORT, RELAY_PORT, PROBE_PORT, PROBE_RELAY_PORT, SERVER_PORT = 50052, 50060, 50070, 50071, 50080
# llama.cpp's load report, one line per buffer: "<device> model buffer size = X MiB", "<device> KV buffer size =
# X MiB", "<device> compute buffer size = X MiB" (llama-model.cpp, llama-kv-cache.cpp, llama-context.cpp).
BUFFER_LINE = re.compile(r"(?:load_tensors|llama_kv_cache|sched_reserve|llama_context)?:?\s*(\S+)\s+(model|KV|compute) buffer size =\s*([\d.]+) MiB")


def wait_port(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    stop(proc, group=True)


def relay(port: int, to: int, link: dict, log: Path, stats: Path | None = None) -> subprocess.Popen:
    proc = _start([sys.executable, "-m", "lab.bench.link_relay", "--listen", f"127.0.0.1:{port}", "--to", f"127.0.0.1:{to}",
                   "--gbps", str(link.get("gbps", 0)), "--delay-ms", str(link.get("delay_ms", 0)),
                   *(["--stats", str(stats)] if stats else [])], log)
    wait_port(port, time.monotonic() + 10)
    return proc


def probe(link: dict, tmp: Path) -> dict:
    """What tools/link_probe.py measures through a relay of the same settings."""
    server = _start([sys.executable, str(ROOT / "tools" / "link_probe.py"), "serve", "--port", str(PROBE_PORT),
                     "--host", "127.0.0.1"], tmp / "probe.log")
    wait_port(PROBE_PORT, time.monotonic() + 10)
    shaped = relay(PROBE_RELAY_PORT, PROBE_PORT, link, tmp / "probe-relay.log")
    try:
        mib = 64 if (link.get("gbps") or 100) <= 3 else 256
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "link_probe.py"), "measure", "127.0.0.1", "--port",
                              str(PROBE_RELAY_PORT), "--pings", "300", "--mib", str(mib), "--json"],
                             capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr.strip()}
    finally:
        _stop(shaped)
        _stop(server)


def memory_report(bin_dir: Path, model: Path, endpoint: str, split: str, ctx: int, extra: list[str], tmp: Path,
                  deadline: float) -> dict:
    """llama-server's per-device buffers for the split (started, read, stopped)."""
    log = tmp / "server.log"
    server = _start([str(bin_dir / "llama-server"), "-m", str(model), "--rpc", endpoint, "-ts", split, "-ngl", "999",
                     "-c", str(ctx), "--port", str(SERVER_PORT), "--host", "127.0.0.1", "-np", "1", "-lv", "4", *extra], log)
    try:
        while time.monotonic() < deadline and server.poll() is None:
            if "llama_server: listening on" in log.read_text(errors="replace"):
                break
            time.sleep(0.5)
        text = log.read_text(errors="replace")
    finally:
        _stop(server)
    buffers: dict[str, dict[str, float]] = {}
    for device, kind, mib in BUFFER_LINE.findall(text):
        buffers.setdefault(device, {}).setdefault(kind, 0.0)
        buffers[device][kind] += float(mib)
    return {"buffers": buffers, "log_tail": text.splitlines()[-5:] if not buffers else []}


def _per_depth(args: list[str]) -> list[list[str]]:
    """llama-bench arguments split into one list per depth of "-d a,b,...": ["-d", "a"], ["-d", "b"], ..."""
    if "-d" not in args:
        return [args]
    i = args.index("-d")
    return [args[:i] + ["-d", depth] + args[i + 2:] for depth in args[i + 1].split(",")]


def _read_stats(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stats_delta(before: dict, after: dict) -> dict:
    """What crossed the relay between two of its counts: bytes each way, exchanges, commands (and their bytes)."""
    out = {key: after.get(key, 0) - before.get(key, 0) for key in ("up", "down", "exchanges")}
    for key in ("commands", "command_bytes"):
        was = before.get(key, {})
        out[key] = {name: n - was.get(name, 0) for name, n in after.get(key, {}).items() if n != was.get(name, 0)}
    return out


def run(bin_dir: Path, jobs: list[dict], out_path: Path, max_seconds: float, helpers: int = 1,
        helper_threads: int = 0) -> list[dict]:
    """helpers: ggml-rpc-servers, each behind its own relay of the job's link (a CPU build has no device of its own:
    its split needs two to be one); helper_threads: their -t (0: theirs)."""
    deadline = time.monotonic() + max_seconds
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rpc-") as name:
        tmp = Path(name)
        cache = tmp / "rpc-cache"
        cache.mkdir()
        os.environ["LLAMA_CACHE"] = str(cache)  # the helper's tensor cache (-c): $LLAMA_CACHE/rpc/
        servers = []
        for i in range(helpers):
            servers.append(_start([str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(RPC_PORT + i), "-c",
                                   *(["-t", str(helper_threads)] if helper_threads else [])], tmp / f"rpc-server-{i}.log"))
            if not wait_port(RPC_PORT + i, time.monotonic() + 30):
                raise RuntimeError("ggml-rpc-server did not listen: " + (tmp / f"rpc-server-{i}.log").read_text()[-400:])
        endpoints = ",".join(f"127.0.0.1:{RPC_PORT + i}" for i in range(helpers))
        relayed = ",".join(f"127.0.0.1:{RELAY_PORT + i}" for i in range(helpers))
        try:
            for job in jobs:
                routing = job.get("routing", "zero")
                extra = {"routing": routing} if routing != "zero" else {}
                path = write_real_shape(job["shape"], tmp / f"{job['shape']}-{job['quant']}.gguf", job["quant"], **extra)
                if job.get("server_ctx") and time.monotonic() < deadline:
                    report = memory_report(bin_dir, path, endpoints, job["split"], job["server_ctx"],
                                           job.get("server_args", []), tmp, min(deadline, time.monotonic() + 120))
                    rows.append({"kind": "memory", "shape": job["shape"], "quant": job["quant"], "split": job["split"],
                                 "ctx": job["server_ctx"], **report})
                    print(f"{job['shape']} memory: {report['buffers'] or report['log_tail']}", flush=True)
                if job.get("baseline") and time.monotonic() < deadline:
                    # The same model whole on this host, no RPC: what each node's share of the split is taken from.
                    for args in _per_depth(job["args"]):
                        cmd = [str(bin_dir / "llama-bench"), "-m", str(path), "-r", str(job.get("repetitions", 2)),
                               "-o", "json", *job.get("baseline_args", []), *args]
                        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10, deadline - time.monotonic()))
                        for r in json.loads(out.stdout) if out.returncode == 0 else []:
                            rows.append({"kind": "baseline", "shape": job["shape"], "quant": job["quant"],
                                         "n_prompt": r.get("n_prompt"), "n_gen": r.get("n_gen"), "depth": r.get("n_depth", 0),
                                         "tok_s": r.get("avg_ts"), "stddev": r.get("stddev_ts"), "threads": r.get("n_threads"),
                                         "backend": r.get("backends"), "build": r.get("build_number")})
                            print(f"{job['shape']:16} whole    d {r.get('n_depth', 0):5} {r.get('avg_ts'):9.2f} tok/s", flush=True)
                for link in job["links"]:
                    if time.monotonic() > deadline:
                        rows.append({"job": job["shape"], "link": link, "error": "out of time"})
                        continue
                    figures = probe(link, tmp)
                    stats = [tmp / f"relay-stats-{i}.json" for i in range(helpers)]
                    shaped = [relay(RELAY_PORT + i, RPC_PORT + i, link, tmp / f"relay-{i}.log", stats[i]) for i in range(helpers)]
                    started = time.monotonic()
                    results, error, traffic = [], None, {}
                    try:
                        # One llama-bench per depth, so what crossed the link (the relay's counts: bytes, and
                        # GRAPH_COMPUTE against GRAPH_RECOMPUTE, whether the graph is re-sent) is known per depth.
                        for args in (_per_depth(job["args"]) if job.get("per_depth", True) else [job["args"]]):
                            before = [_read_stats(f) for f in stats]
                            cmd = [str(bin_dir / "llama-bench"), "-m", str(path), "--rpc", relayed,
                                   "-ts", job["split"], "-r", str(job.get("repetitions", 2)), "-o", "json", *args]
                            out = subprocess.run(cmd, capture_output=True, text=True,
                                                 timeout=max(10, deadline - time.monotonic()))
                            time.sleep(0.5)  # the relay writes its counts every 0.2 s
                            depth = args[args.index("-d") + 1] if "-d" in args else "0"
                            traffic[depth] = [_stats_delta(b, _read_stats(f)) for b, f in zip(before, stats)]
                            if out.returncode != 0:
                                error = out.stderr.strip().splitlines()[-3:]
                                break
                            results += json.loads(out.stdout)
                    except subprocess.TimeoutExpired:
                        error = "timed out"
                    finally:
                        for proc in shaped:
                            _stop(proc)
                    for r in results:
                        rows.append({"kind": "speed", "shape": job["shape"], "quant": job["quant"], "routing": routing,
                                     "weights_bytes": expected_weights_bytes(job["shape"], job["quant"]), "split": job["split"],
                                     "link": link, "link_measured": figures, "n_prompt": r.get("n_prompt"),
                                     "n_gen": r.get("n_gen"), "depth": r.get("n_depth", 0), "tok_s": r.get("avg_ts"),
                                     "stddev": r.get("stddev_ts"), "ngl": r.get("n_gpu_layers"), "devices": r.get("devices"),
                                     "type_k": r.get("type_k"), "flash_attn": r.get("flash_attn"), "backend": r.get("backends"),
                                     "build": r.get("build_number"), "helpers": helpers,
                                     "traffic": traffic.get(str(r.get("n_depth", 0)))})
                        print(f"{job['shape']:16} {link['name']:8} {figures.get('rtt_ms')} ms {figures.get('gbps')} Gbit/s "
                              f"pp {r.get('n_prompt'):5} tg {r.get('n_gen'):3} d {r.get('n_depth', 0):5} {r.get('avg_ts'):9.2f} tok/s",
                              flush=True)
                    if error:
                        rows.append({"job": job["shape"], "link": link, "error": error})
                        print(f"{job['shape']} {link}: {error}", flush=True)
                    print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
                    out_path.write_text(json.dumps(rows, indent=1))
                path.unlink()
        finally:
            for i, server in enumerate(servers):
                _stop(server)
                rows.append({"kind": "rpc-server log",
                             "tail": (tmp / f"rpc-server-{i}.log").read_text(errors="replace").splitlines()[-30:]})
            out_path.write_text(json.dumps(rows, indent=1))
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="the folder with llama-bench, llama-server and ggml-rpc-server")
    parser.add_argument("--jobs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seconds", type=float, default=3600)
    parser.add_argument("--helpers", type=int, default=1, help="ggml-rpc-servers (a CPU build needs two for a split)")
    parser.add_argument("--helper-threads", type=int, default=0)
    args = parser.parse_args(argv)
    run(Path(args.bin), json.loads(Path(args.jobs).read_text()), Path(args.out), args.max_seconds, args.helpers,
        args.helper_threads)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
