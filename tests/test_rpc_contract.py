"""The rendered split (models.<key>.rpc) on llama.cpp's real binaries (issue #47): two ggml-rpc-servers started with
the rendered helpers' arguments and llama-server with the rendered main server's, on loopback. What each device
holds is llama.cpp's own report, held to the plan's figures; then a helper dies and comes back, and the shipped
wait (incluster/rpc_wait.py) and a restarted main server do what components/rpc.py says they do."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import plain_values, run_values
from lab.contract.real_shape import expected_weights_bytes, write_real_shape
from lab.bench.measure_rpc import wait_port
from lab.contract.server import free_port, request, stop, without

ROOT = Path(__file__).resolve().parent.parent
BUFFER = re.compile(r"(?P<device>\S+) (?P<kind>model|KV|compute) buffer size = +(?P<mib>[0-9.]+) MiB")
TOLERANCE = 0.05


def split_values() -> dict:
    """cpu-cluster's cluster with one Qwen3-1.7B split over two helpers and a main server on a CPU: three nodes."""
    values = copy.deepcopy(plain_values("cpu-cluster"))
    values["node_pools"]["minipc"]["nodes"] = 3
    values["models"] = {"chat": {
        "role": "chat", "name": "split-chat", "hf_repo": "Qwen/Qwen3-1.7B-GGUF:Q4_K_M",
        "image": "registry.lan:5000/inference-plane/llama-rpc:b10729-cpu", "backend": "cpu", "node_pool": "minipc",
        "weights": f"{expected_weights_bytes('qwen3-1.7b', 'Q4_K_M') / 2**20:.2f}Mi", "gpu_layers": 0, "threads": 2,
        "ctx_size": 4096, "parallel": 1, "cache_ram_mib": 0, "webui": False,
        "resources": {"cpu_request": "1", "cpu_limit": "2"},
        "rpc": {"helpers": [{"node_pool": "minipc", "threads": 1}, {"node_pool": "minipc", "threads": 1}],
                "link": {"rtt_ms": 0.1, "gbps": 10}},
    }}
    return values


def rendered(run, name: str) -> dict:
    return next(r.inputs for r in run.kubernetes() if r.type.endswith(":Deployment") and r.inputs["metadata"]["name"] == name)


def start_helper(binary_dir: Path, args: list[str], port: int, cache: Path, log: Path) -> subprocess.Popen:
    local = list(args)
    local[local.index("-H") + 1] = "127.0.0.1"
    local[local.index("-p") + 1] = str(port)
    env = {**os.environ, "LLAMA_CACHE": str(cache)}
    proc = subprocess.Popen([str(binary_dir / "ggml-rpc-server"), *local], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=env)
    if not wait_port(port, time.monotonic() + 20):
        raise AssertionError(f"ggml-rpc-server did not listen: {log.read_text()[-500:]}")
    return proc


def start_main(binary: Path, args: list[str], model: Path, endpoints: str, port: int, log: Path) -> subprocess.Popen:
    local = without(args, {"--hf-repo": 1, "--host": 1, "--port": 1, "--rpc": 1})
    cmd = [str(binary), "-m", str(model), "--rpc", endpoints, *local, "--host", "127.0.0.1", "--port", str(port),
           "--no-warmup", "-lv", "4"]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_listening(proc: subprocess.Popen, log: Path, seconds: float = 240) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        text = log.read_text(errors="replace")
        if "listening on" in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"llama-server did not come up (exit {proc.poll()}): {log.read_text(errors='replace')[-800:]}")


def rpc_wait(endpoints: str, seconds: int) -> subprocess.CompletedProcess:
    env = {"RPC_HELPERS": endpoints, "RPC_WAIT_SECONDS": str(seconds), "PATH": os.environ.get("PATH", "")}
    return subprocess.run([sys.executable, "-B", "-E", "-s", str(ROOT / "incluster" / "rpc_wait.py")], env=env,
                          capture_output=True, text=True, timeout=seconds + 30)


def test_the_rendered_split_holds_what_the_plan_says_and_recovers_from_a_helper_restart(binary, tmp_path):
    run = run_values(split_values(), stack="rpc-cpu")
    plan = run.outputs["capacity_plan"]["servers"]["chat"]
    split = plan["split"]
    main_args = rendered(run, "split-chat")["spec"]["template"]["spec"]["containers"][0]["args"]
    helper_args = [rendered(run, f"split-chat-rpc-{i}")["spec"]["template"]["spec"]["containers"][0]["args"] for i in range(2)]
    model = write_real_shape("qwen3-1.7b", tmp_path / "qwen3-1.7b.gguf", "Q4_K_M")
    ports = [free_port(), free_port()]
    caches = [tmp_path / f"cache-{i}" for i in range(2)]
    helpers = [start_helper(binary.parent, helper_args[i], ports[i], caches[i], tmp_path / f"helper-{i}.log") for i in range(2)]
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    main_port = free_port()
    main = None
    try:
        main = start_main(binary, main_args, model, endpoints, main_port, tmp_path / "main.log")
        text = wait_listening(main, tmp_path / "main.log")
        reports: dict[str, dict[str, float]] = {}
        for m in BUFFER.finditer(text):
            reports.setdefault(m["device"], {}).setdefault(m["kind"], 0.0)
            reports[m["device"]][m["kind"]] += float(m["mib"])
        # Each helper, as llama.cpp names its buffers (RPC<index on that server>[host:port]).
        for index, port in enumerate(ports):
            device = next(v for k, v in reports.items() if k.endswith(f"[127.0.0.1:{port}]"))
            planned = split["helpers"][index]["memory"]
            figures = {"model": planned["weights_gib"] * 1024, "KV": planned["kv_gib"] * 1024,
                       "compute": planned["overhead_gib"] * 1024}
            for kind, mib in figures.items():
                print(f"rpc helper {index} {kind}: plan {mib:.1f} MiB, llama.cpp {device[kind]:.1f} MiB")
                assert mib == pytest.approx(device[kind], rel=TOLERANCE), (index, kind)
            assert sum(figures.values()) == pytest.approx(sum(device.values()), rel=TOLERANCE)
        # The main server on a CPU: the input embedding and its compute buffer.
        host = reports["CPU_Mapped"]["model"] + reports["CPU"]["compute"]
        mine = split["main"]["memory"]
        assert (mine["weights_gib"] + mine["overhead_gib"]) * 1024 == pytest.approx(host, rel=TOLERANCE)
        answer = request(f"http://127.0.0.1:{main_port}/completion", {"prompt": "hi", "n_predict": 4}, timeout=120)
        assert answer.status == 200
        # The tensor cache (-c, rendered): a helper keeps what it was sent by hash, tensors over 10 MiB
        # (ggml-rpc.cpp), here the output layer on the last helper.
        assert any((caches[1] / "rpc").iterdir())

        # A helper dies: llama-server aborts at its next use of it (ggml-rpc.cpp RPC_STATUS_ASSERT), so the pod's
        # container exits and the kubelet restarts it.
        stop(helpers[0])
        try:
            request(f"http://127.0.0.1:{main_port}/completion", {"prompt": "hello", "n_predict": 4}, timeout=30)
        except OSError:
            pass
        main.wait(timeout=120)
        assert main.returncode != 0
        # The restarted pod's wait names the helper that does not answer, and fails past its deadline.
        waited = rpc_wait(endpoints, 4)
        assert waited.returncode == 1 and f"127.0.0.1:{ports[0]}" in waited.stderr and f"127.0.0.1:{ports[1]}" not in waited.stderr
        # The helper comes back (same arguments, same cache): the wait passes and the main server serves again.
        helpers[0] = start_helper(binary.parent, helper_args[0], ports[0], caches[0], tmp_path / "helper-0b.log")
        assert rpc_wait(endpoints, 30).returncode == 0
        main = start_main(binary, main_args, model, endpoints, main_port, tmp_path / "main-2.log")
        wait_listening(main, tmp_path / "main-2.log")
        assert request(f"http://127.0.0.1:{main_port}/completion", {"prompt": "again", "n_predict": 4}, timeout=120).status == 200
    finally:
        if main is not None and main.poll() is None:
            stop(main)
        for helper in helpers:
            if helper.poll() is None:
                stop(helper)


def test_what_crosses_the_link_per_generated_token_is_what_the_plan_counts(binary, tmp_path):
    """The link term of the split's decode (engines/llamacpp_rpc.py token_bytes: per token and RPC device, the
    hidden state and the mask up, the device's output back, one answer waited for) held to what the rendered split
    really sends: each helper behind lab/bench/link_relay.py, which counts bytes and reads the RPC commands. Three
    requests with the same 300-token prompt, 1, 4 and 36 tokens generated; the later two find the prompt in the
    slot's cache, so the difference between them is 32 tokens of decode at a depth of 300-336 (KV cells 0-335 in use:
    a mask of 512 cells, llama-kv-cache.cpp get_n_kv pads to 256)."""
    import json
    import threading

    from engines.llamacpp_rpc import token_bytes
    from lab.bench.link_relay import Traffic, serve

    run = run_values(split_values(), stack="rpc-cpu")
    main_args = rendered(run, "split-chat")["spec"]["template"]["spec"]["containers"][0]["args"]
    helper_args = [rendered(run, f"split-chat-rpc-{i}")["spec"]["template"]["spec"]["containers"][0]["args"] for i in range(2)]
    split = run.outputs["capacity_plan"]["servers"]["chat"]["split"]
    # No GPU on the main server: every block and the output layer are on the helpers, the output on the last.
    assert split["main"]["blocks"] == 0 and [h["output"] for h in split["helpers"]] == [False, True]
    model = write_real_shape("qwen3-1.7b", tmp_path / "qwen3-1.7b.gguf", "Q4_K_M")
    ports, relays, traffic = [free_port(), free_port()], [free_port(), free_port()], [Traffic(), Traffic()]
    helpers = [start_helper(binary.parent, helper_args[i], ports[i], tmp_path / f"cache-{i}", tmp_path / f"helper-{i}.log")
               for i in range(2)]
    for i in range(2):
        listening = threading.Event()
        threading.Thread(target=serve, args=(("127.0.0.1", relays[i]), ("127.0.0.1", ports[i]), 0, 0, traffic[i], listening),
                         daemon=True).start()
        assert listening.wait(10)
    main_port, main = free_port(), None
    try:
        main = start_main(binary, main_args, model, ",".join(f"127.0.0.1:{p}" for p in relays), main_port, tmp_path / "main.log")
        wait_listening(main, tmp_path / "main.log")
        prompt = [100] * 300

        def generate(n: int) -> list[list[dict]]:
            """Each helper's rounds (what the main server sent until it had an answer, and the answer) on the
            connection that computes: the one with the most rounds."""
            marks = [t.mark() for t in traffic]
            answer = request(f"http://127.0.0.1:{main_port}/completion",
                             {"prompt": prompt, "n_predict": n, "ignore_eos": True, "cache_prompt": False}, timeout=300)
            assert answer.status == 200 and json.loads(answer.body)["timings"]["predicted_n"] == n
            return [max(t.since(m).values(), key=len) for t, m in zip(traffic, marks)]

        generate(1)  # the first request at a prompt length; not counted
        for device, rounds in enumerate(generate(36)):
            # The last 32 rounds are 32 tokens of decode at depths 304-335 (the first tokens' rounds follow the
            # prompt's); each is one answer waited for (GET_TENSOR) after a graph computed.
            decode = rounds[-32:]
            assert all(r["commands"].get("GET_TENSOR") == 1 for r in decode), decode
            assert all(r["commands"].get("GRAPH_RECOMPUTE", 0) + r["commands"].get("GRAPH_COMPUTE", 0) == 1 for r in decode)
            # The graph is reused (recomputed by id, not re-sent) while the mask's cells stay the same.
            resent = [r for r in decode if r["commands"].get("GRAPH_COMPUTE")]
            assert len(resent) <= 1, resent
            up, down = token_bytes(2048, 320, 151936 if split["helpers"][device]["output"] else 0)
            sent = sorted(r["up"] for r in decode if not r["commands"].get("GRAPH_COMPUTE"))
            received = sorted(r["down"] for r in decode)
            print(f"rpc helper {device} per token: plan up {up:.0f} down {down:.0f} B, relay up {sent[0]}-{sent[-1]} "
                  f"down {received[0]}-{received[-1]} B; graph re-sent {[r['up'] for r in resent]}")
            assert all(x == pytest.approx(up, rel=0.01) for x in sent), (device, sent)
            assert all(x == pytest.approx(down, rel=0.01) for x in received), (device, received)
    finally:
        if main is not None and main.poll() is None:
            stop(main)
        for helper in helpers:
            stop(helper)


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q4_K_S", "Q8_0"])
def test_a_whole_cpu_server_repacks_exactly_the_file_types_a_helper_is_planned_slower_for(binary, tmp_path, quant):
    """The split's CPU prefill pays CPU_HELPER_PREFILL because a CPU llama-server repacks these weights at load and a
    ggml-rpc-server, which offers its device's plain buffer only, does not (the split's blocks are reported in
    RPC<n>[host:port] buffers, above). Held to the real binary on this x86-64 host: the same file loaded whole shows
    a CPU_REPACK buffer exactly where the plan counts a helper slower."""
    from engines.llamacpp_rpc import cpu_helper_prefill

    model = write_real_shape("qwen3-1.7b", tmp_path / f"qwen3-1.7b-{quant}.gguf", quant)
    port = free_port()
    log = tmp_path / "whole.log"
    proc = subprocess.Popen([str(binary), "-m", str(model), "-t", "1", "-c", "512", "--host", "127.0.0.1", "--port",
                             str(port), "--no-warmup", "-lv", "4"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        text = wait_listening(proc, log)
    finally:
        stop(proc)
    repacked = {m["device"]: float(m["mib"]) for m in BUFFER.finditer(text) if m["kind"] == "model"}.get("CPU_REPACK", 0.0)
    assert (repacked > 0) == (cpu_helper_prefill(quant) < 1), (quant, repacked)
