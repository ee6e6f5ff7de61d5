"""Measure what llama-server holds on a GPU, for the VRAM plan (engines/llamacpp_memory.py): every
llama.cpp server of every shipped stack that offloads to a discrete card (a router's models as the
single-model servers its children run), and more shapes and settings than the stacks use (CASES), each
started with the command line the plan renders on a GGUF of its model's real shape (sparse, zero weights:
lab/contract/real_shape.py; llama.cpp allocates the same for zeros). Recorded per server: the card's
memory the process holds by nvidia-smi, after the load and after one request of a full micro-batch
(the compute pools grow on first use), and llama.cpp's own breakdown at -lv 4 (model, KV, recurrent,
compute buffers per buffer type).

    .venv/bin/python -m lab.bench.measure_vram --spec-out .vram/spec.json          # here: what the plan renders
    python3 -m lab.bench.measure_vram --spec .vram/spec.json --binary B --out DIR  # on the GPU machine

lab/bench/vram_error.py compares the plan with the recorded results; tests/test_vram_measured.py holds the
plan to them. A server split over N cards is measured on one (gpus: 1): one machine has one card here.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from lab.contract.repo_shapes import REPO_PROJECTORS, REPO_SHAPES
from lab.contract.server import stop

# Beyond the shipped servers: (case, the shipped server it varies, the settings changed). Chosen to vary
# what the VRAM plan depends on: tied and untied embeddings, width and depth, quant, context and
# micro-batch (compute buffer), partial offload, experts in RAM, a hybrid, embedding servers, projectors.
CASES = [
    ("qwen3-1.7b", "rtx4090/chat", {"hf_repo": "Qwen/Qwen3-1.7B-GGUF:Q4_K_M", "ctx_checkpoints": None, "weights": None}),
    ("qwen3-8b-ub2048", "rtx3090-library/library/qwen3-8b", {"ubatch_size": 2048}),
    ("qwen3-8b-ub128", "rtx3090-library/library/qwen3-8b", {"ubatch_size": 128}),
    ("qwen3-8b-64k-f16kv", "rtx3090-library/library/qwen3-8b", {"ctx_size": 65536, "cache_type_k": None, "cache_type_v": None}),
    ("qwen3-32b", "rtx3090-library/library/qwen3-14b", {"hf_repo": "Qwen/Qwen3-32B-GGUF:Q4_K_M"}),
    ("llama-3.1-8b-q8", "rtx3090-library/library/llama-3.1-8b", {"hf_repo": "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q8_0"}),
    ("llama-3.1-8b-f16", "rtx3090-library/library/llama-3.1-8b", {"hf_repo": "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:F16"}),
    ("llama-3.1-8b-ngl20", "rtx3090-library/library/llama-3.1-8b", {"gpu_layers": 20}),
    ("llama-3.3-70b-1card", "dual-3090/chat", {"gpus": 1}),
    ("qwen3-30b-a3b-gpu", "rtx3060/chat", {"cpu_moe_layers": None}),
    ("qwen3-30b-a3b-moe12", "rtx3060/chat", {"cpu_moe_layers": 12}),
    ("qwen3.6-35b-a3b-moe20", "rtx4090/chat", {"cpu_moe_layers": 20}),
    ("qwen3-embedding-8b", "rtx4090/embed", {"hf_repo": "Qwen/Qwen3-Embedding-8B-GGUF:Q8_0", "weights": None}),
    ("gemma-3-4b-vision", "rtx3090-library/library/gemma-3-12b", {"hf_repo": "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"}),
    ("gemma-3-27b-vision", "rtx3090-library/library/gemma-3-12b", {"hf_repo": "ggml-org/gemma-3-27b-it-GGUF:Q4_K_M"}),
    ("llama-3.2-3b", "rtx3090-library/library/llama-3.1-8b", {"hf_repo": "bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M"}),
    ("mistral-nemo-12b", "rtx3090-library/library/qwen3-14b", {"hf_repo": "bartowski/Mistral-Nemo-Instruct-2407-GGUF:Q4_K_M"}),
    ("mistral-small-24b-q6", "rtx3090-library/library/qwen3-14b",
     {"hf_repo": "unsloth/Mistral-Small-3.2-24B-Instruct-2506-GGUF:Q6_K", "ctx_size": 32768}),
]
# Rendered flags that name the pod's files or sockets: replaced for a run on loopback.
DROPPED = {"--hf-repo": 1, "--api-key-file": 1, "--host": 1, "--port": 1}
BUFFER = re.compile(r"(?P<buft>[A-Za-z0-9_]+) (?P<kind>model|KV|RS|compute|output) buffer size = +(?P<mib>[0-9.]+) MiB")


# --- here, with the venv: what the plan renders ------------------------------------------------------------

def model_of(origin: str, update: dict | None = None):
    """The ModelServer a case runs: a shipped server (stack/key, or stack/key/model for a router's model),
    with `update` applied."""
    from render.offline import run_stack

    stack, key, *child = origin.split("/")
    run = run_stack(stack)
    model = run.config.models[key]
    if child:
        model = model.as_single(child[0])
    if update:
        model = model.model_copy(update=update)
    return model, run.config.node_pools[model.node_pool]


def shipped() -> list[str]:
    """Every shipped llama.cpp server that offloads to a discrete card, as stack/key[/model]."""
    from render.offline import run_stack

    origins = []
    for stack in sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml")):
        run = run_stack(stack)
        for key, model in run.config.models.items():
            pool = run.config.node_pools[model.node_pool]
            if model.engine != "llamacpp" or not pool.discrete() or not model.uses_gpu(pool):
                continue
            if model.on_demand is not None:
                origins += [f"{stack}/{key}/{name}" for name in model.on_demand.models]
            else:
                origins.append(f"{stack}/{key}")
    return origins


def case_spec(case: str, origin: str, update: dict | None) -> dict:
    from engines import engine_of
    from config.catalog import facts_for

    model, _ = model_of(origin, update)
    if model.gpus > 1:  # one card here: the server as it would run on one
        update = {**(update or {}), "gpus": 1}
        model = model.model_copy(update={"gpus": 1})
    args = engine_of(model).args(model)
    repo, _, quant = model.hf_repo.partition(":")
    if repo not in REPO_SHAPES:
        raise SystemExit(f"measure_vram: no real shape for {repo} ({case}); add it to lab/contract/repo_shapes.py")
    from lab.contract.server import without

    kept = without(args, DROPPED)
    return {"case": case, "origin": origin, "update": update or {}, "shape": REPO_SHAPES[repo], "quant": quant,
            "mmproj": REPO_PROJECTORS.get(repo) if facts_for(model).mmproj is not None else None,
            "embedding": model.role == "embedding", "ubatch": model.ubatch_size or 512, "args": kept}


def specs() -> list[dict]:
    out = [case_spec(origin, origin, None) for origin in shipped()]
    out += [case_spec(case, origin, update) for case, origin, update in CASES]
    return out


# --- on the GPU machine: no venv, gguf on the path ---------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smi_process_mib(pid: int) -> float | None:
    """The card's memory nvidia-smi says this process holds (MiB); None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return 0.0


def post(url: str, body: dict, timeout: float = 300) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def write_shape(spec: dict, folder: Path) -> tuple[Path, Path | None]:
    from lab.contract.real_shape import PRESETS, write_real_shape

    path = folder / f"{spec['shape']}-{spec['quant']}.gguf"
    mmproj = None
    if not path.exists():
        if spec["shape"] in PRESETS:
            write_real_shape(spec["shape"], path, spec["quant"] or None)
        else:
            import lab.contract.real_shape_mmproj as mm

            mm.write_text_shape(spec["shape"], path)
    if spec["mmproj"]:
        import lab.contract.real_shape_mmproj as mm

        mmproj = folder / f"mmproj-{spec['mmproj']}.gguf"
        if not mmproj.exists():
            mm.write_mmproj(spec["mmproj"], mmproj)
    return path, mmproj


def measure(spec: dict, binary: str, folder: Path, deadline: float) -> dict:
    model, mmproj = write_shape(spec, folder)
    port = free_port()
    cmd = [binary, "-m", str(model), *(["--mmproj", str(mmproj)] if mmproj else []), *spec["args"],
           "--host", "127.0.0.1", "--port", str(port), "-lv", "4"]
    log = folder / f"{spec['case'].replace('/', '_')}.log"
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    row = {"case": spec["case"], "cmd": cmd[3:] if not mmproj else cmd[5:]}
    try:
        while not healthy(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                row["error"] = f"not ready (exit {proc.poll()}): " + " | ".join(log.read_text().splitlines()[-5:])
                return row
            time.sleep(0.2)
        row["load_s"] = round(time.monotonic() - started, 1)
        row["smi_loaded_mib"] = smi_process_mib(proc.pid)
        # One request whose prompt fills a micro-batch: the compute graph at its largest.
        words = " ".join(f"w{i}" for i in range(spec["ubatch"]))
        if spec["embedding"]:
            row["request_status"] = post(f"http://127.0.0.1:{port}/v1/embeddings", {"input": words[: 3 * spec["ubatch"]]})
        else:
            row["request_status"] = post(f"http://127.0.0.1:{port}/completion", {"prompt": words, "n_predict": 8})
        row["smi_after_request_mib"] = smi_process_mib(proc.pid)
    finally:
        stop(proc, 30, group=True)
    text = log.read_text(errors="replace")
    row["buffers"] = [[m["buft"], m["kind"], float(m["mib"])] for m in BUFFER.finditer(text)]
    row["buffer_lines"] = [line.strip()[-160:] for line in text.splitlines() if "buffer size" in line][:40]
    offloaded = re.search(r"offloaded (\d+)/(\d+) layers", text)
    row["offloaded"] = offloaded.group(0) if offloaded else None
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec-out", help="write the cases as rendered here and stop")
    parser.add_argument("--spec", help="measure the cases written by --spec-out")
    parser.add_argument("--binary", help="llama-server (CUDA build)")
    parser.add_argument("--out", help="folder for vram.json and the servers' logs")
    parser.add_argument("--only", help="comma-separated cases")
    parser.add_argument("--max-seconds", type=float, default=400)
    args = parser.parse_args(argv)
    if args.spec_out:
        Path(args.spec_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.spec_out).write_text(json.dumps(specs(), indent=1))
        print(f"measure_vram: {len(json.loads(Path(args.spec_out).read_text()))} cases in {args.spec_out}")
        return 0
    if not (args.spec and args.binary and args.out):
        parser.error("--spec, --binary and --out (or --spec-out)")
    deadline = time.monotonic() + args.max_seconds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = Path("/tmp/vram-shapes")
    folder.mkdir(exist_ok=True)
    cases = json.loads(Path(args.spec).read_text())
    if args.only:
        cases = [c for c in cases if c["case"] in args.only.split(",")]
    rows = []
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil_which("nvidia-smi") else None
    for spec in cases:
        if time.monotonic() > deadline - 20:
            rows.append({"case": spec["case"], "error": "out of time"})
            continue
        row = measure(spec, args.binary, folder, min(deadline, time.monotonic() + 240))
        rows.append(row)
        print(f"{spec['case']:44} loaded {row.get('smi_loaded_mib')} MiB, after a request {row.get('smi_after_request_mib')} MiB"
              f" {row.get('error', '')}", flush=True)
        for path in folder.glob("*.log"):
            (out / path.name).write_text(path.read_text(errors="replace"))
            path.unlink()
        # (Json written after every case: a call cut short keeps what it measured.)
        (out / "vram.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    return 0


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
