"""A soak of llama.cpp's real router on a GPU (issue #30 item 7; docs/models-on-demand.md, "Measured on
a GPU"): for every shipped stack whose plan has a router (`capacity_plan.servers.<key>.residency`), the
rendered preset and flags over real-shape GGUFs, >= 200 chat requests in a seeded random model order
(sequential streams, concurrent bursts, streams the client cancels), the card's memory sampled
throughout. It records the peak VRAM, every load, swap and eviction, every failure, and compares them
with the plan: the budget, each resident set's planned VRAM, each model's swap_seconds (warm, cold).

    make router-soak                                   # on a GPU machine: renders, builds CUDA llama-server
    python -m lab.bench.router_soak --spec-out SPEC.json   # render only (needs the project's venv)
    python -m lab.bench.router_soak --spec SPEC.json --binary PATH/llama-server --out DIR   # soak only

What is substituted, nothing else: each model's weights are a sparse real-shape GGUF
(lab/contract/real_shape.py; gemma-3-12b and its projector from real_shape_mmproj.py when present),
laid out as the init container lays the library out (--models-dir, one folder per public name); the
router listens on loopback on a free port with a generated key; the preset and key paths point into a
work folder. Every flag, section and environment value is the rendered one. Time-bounded: traffic
stops after --traffic-seconds, the whole run after --max-seconds (partial results are written).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]

from lab.contract.repo_shapes import REPO_PROJECTORS, REPO_SHAPES
from lab.bench.soak_report import report, summary_lines
from lab.bench.soak_watch import (CardMemory, LogTail, ProcessMemory, Result, Statuses, chat, get, have_gpu, now,
                        post)

RESULTS = ROOT / "bench" / "results"
RUNNING = ("loading", "loaded", "sleeping")


# --- what the plan renders ---------------------------------------------------------------------------

def router_specs(stacks: Optional[list[str]] = None) -> list[dict]:
    """Every router of every (or the named) shipped stack, as rendered: its Deployment's args and env,
    its preset ConfigMap (models.ini, library.json) and its plan's residency."""
    from render.manifests import manifests
    from render.offline import run_stack

    names = stacks or sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    specs = []
    for stack in names:
        run = run_stack(stack)
        servers = (run.outputs.get("capacity_plan") or {}).get("servers", {})
        files = list(manifests(run).values())
        for key, plan in servers.items():
            if not plan.get("residency"):
                continue
            model = run.config.models[key]
            (deployment,) = [m for m in files if m["kind"] == "Deployment" and m["metadata"]["name"] == model.workload_name]
            (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == model.name]
            (config_map,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-files"]
            (proxy,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "admission"]
            (programs,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-programs"]
            specs.append({
                "proxy": proxy, "programs": programs, "pod_spec": deployment["spec"]["template"]["spec"],
                "admission": json.loads(config_map["data"]["admission.json"]),
                "stack": stack, "key": key, "name": model.name, "image": container["image"], "args": container["args"],
                "env": {e["name"]: e.get("value") for e in container.get("env", [])},
                "models_ini": config_map["data"]["models.ini"], "library": json.loads(config_map["data"]["library.json"]),
                "residency": plan["residency"], "commit": commit + ("+dirty" if dirty else ""),
            })
    return specs


# --- the library folder ------------------------------------------------------------------------------

def source_of(entry) -> str:
    """A library.json entry's org/repo:TAG: the entry itself, or its `hf_repo` (with `mmproj` beside it)."""
    return entry["hf_repo"] if isinstance(entry, dict) else entry


def shape_of(name: str, entry) -> tuple[str, str, Optional[str]]:
    """(real-shape name, quant, projector or None) for a library entry: `name: org/repo:TAG`, or
    `name: {hf_repo: org/repo:TAG, mmproj: bool}` where the library says whether a projector is fetched
    (otherwise: the repos known to ship one, which the init container links beside the model)."""
    repo, _, tag = source_of(entry).partition(":")
    shape = REPO_SHAPES.get(repo, name)
    projector = REPO_PROJECTORS.get(repo)
    if isinstance(entry, dict) and "mmproj" in entry:
        projector = (projector or shape) if entry["mmproj"] else None
    return shape, tag or "", projector


def write_library(library: dict, folder: Path, dense: set[str]) -> dict[str, dict]:
    """One subfolder per public name holding its model GGUF (and projector), as --models-dir reads them.
    Sparse (a hole for the data) except the models in `dense`, whose zeros are written for real so that
    a load after dropping the page cache reads them from disk."""
    from lab.contract.real_shape import PRESETS, densify, expected_weights_bytes, write_real_shape

    try:
        import lab.contract.real_shape_mmproj as mm
    except ImportError:
        mm = None
    files = {}
    for name, entry in library.items():
        source = source_of(entry)
        shape, quant, projector = shape_of(name, entry)
        sub = folder / name
        sub.mkdir(parents=True, exist_ok=True)
        repo = source.partition(":")[0]
        path = sub / f"{repo.rsplit('/', 1)[-1].removesuffix('-GGUF')}-{quant or 'default'}.gguf"
        if shape in PRESETS:
            write_real_shape(shape, path, quant or None)
            weights = expected_weights_bytes(shape, quant or None)
        elif mm is not None and shape in getattr(mm, "TEXT", {}):
            mm.write_text_shape(shape, path)
            weights = sum(row[3] for row in mm.text_table(shape))
        else:
            raise SystemExit(f"router_soak: no real shape for {name} ({source}); add it to lab/contract/real_shape.py "
                             "and lab/contract/repo_shapes.py")
        entry = {"file": str(path), "shape": shape, "quant": quant, "weights_bytes": weights, "mmproj": None}
        if projector and mm is not None and projector in getattr(mm, "PROJECTORS", {}):
            mmproj = mm.write_mmproj(projector, sub / "mmproj-model-f16.gguf")
            entry["mmproj"] = {"file": str(mmproj), "bytes": mm.expected_mmproj_bytes(projector)}
        elif projector:
            entry["mmproj"] = {"file": None, "missing": "lab/contract/real_shape_mmproj.py not importable"}
        if name in dense:
            densify(path)
        entry["dense"] = name in dense
        files[name] = entry
    return files


def read_through(paths: list[Path]) -> float:
    """Read every file once (the page cache then holds it, as on a node that has served it before)."""
    started = now()
    for p in paths:
        with open(p, "rb") as f:
            while f.readinto(bytearray(16 << 20)):
                pass
    return now() - started


def drop_caches() -> Optional[str]:
    """sync and drop the page cache; None when done, else why not."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return None
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def cached_mib() -> Optional[int]:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) // 1024
    return None


# --- the traffic -------------------------------------------------------------------------------------

def traffic(names: list[str], limit: int, requests: int, seed: int, locality: float, burst_every: int, burst: int,
            cancels: int) -> list[tuple[str, list[str]]]:
    """The seeded order: ("one", [model]) sequential streams, ("burst", [models]) concurrent requests,
    ("cancel", [model]) streams the client closes early. A sequential request goes, with probability
    `locality`, to one of the `limit` models used last (a resident one, under LRU), else to any model."""
    rng = random.Random(seed)
    steps: list[tuple[str, list[str]]] = []
    recent: list[str] = []
    count, next_burst = 0, burst_every or requests + 1
    cancel_at = sorted(rng.sample(range(5, max(6, requests - 5)), min(cancels, max(0, requests - 10))))
    while count < requests:
        if count >= next_burst:
            models = [rng.choice(names) for _ in range(burst)]
            steps.append(("burst", models))
            next_burst += burst_every
        else:
            models = [rng.choice(recent) if recent and rng.random() < locality else rng.choice(names)]
            cancel = bool(cancel_at) and count >= cancel_at[0]
            if cancel:
                cancel_at.pop(0)
            steps.append(("cancel" if cancel else "one", models))
        count += len(models)
        for m in models:
            recent = [m] + [r for r in recent if r != m]
        recent = recent[:max(1, limit)]
    return steps


def local_args(args: list[str], port: int, preset: Path, key_file: Path) -> list[str]:
    """The rendered args with loopback host, this run's port, preset and key file (router.py's rule)."""
    from lab.contract.router import local_args as contract_local_args
    return contract_local_args(args, port, preset, key_file, api_key=key_file.read_text().strip())


def running(port: int, key: str) -> list[str]:
    status, body = get(port, key, "/models", timeout=10)
    if status != 200:
        return []
    return sorted(m["id"] for m in json.loads(body)["data"] if (m.get("status") or {}).get("value") in RUNNING)


def wait_until(predicate, seconds: float, period: float = 0.1) -> bool:
    deadline = now() + seconds
    while now() < deadline:
        if predicate():
            return True
        time.sleep(period)
    return False


def soak(spec: dict, binary: Path, options: argparse.Namespace, work: Path) -> dict:
    names = list(spec["library"])
    # The most models the admission proxy lets be resident at once (the router's own count is above it).
    limit = spec["residency"]["most_resident"]
    dense = set(options.cold.split(",")) & set(names) if options.cold else set()
    run_started = now()
    hard_stop = run_started + options.max_seconds
    out: dict = {"spec": {k: spec[k] for k in ("stack", "key", "name", "image", "args", "env", "commit")},
                 "plan": spec["residency"], "options": vars(options) | {"binary": str(binary)}}
    print(f"[soak] {spec['stack']}/{spec['key']}: {len(names)} models, up to {limit} resident; writing the library", flush=True)
    models_dir = work / "models"
    t = now()
    out["files"] = write_library(spec["library"], models_dir, dense)
    out["setup"] = {"write_seconds": round(now() - t, 1)}
    every = [Path(f["file"]) for f in out["files"].values()] + [Path(f["mmproj"]["file"]) for f in out["files"].values()
                                                                  if f["mmproj"] and f["mmproj"].get("file")]
    out["setup"]["read_through_seconds"] = round(read_through(every), 1)
    preset = work / "preset.ini"
    preset.write_text(spec["models_ini"])  # every listed model is on disk: the served preset is the rendered one
    key = "soak-" + os.urandom(6).hex()
    key_file = work / "api-key"
    key_file.write_text(key + "\n")
    from lab.contract.server import free_port
    port, proxy_port = free_port(), free_port()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work / "home"), **{k: v for k, v in spec["env"].items() if v is not None}}
    env["LLAMA_ARG_MODELS_DIR"] = str(models_dir)
    env["LLAMA_CACHE"] = str(work / "empty-cache")
    env.pop("XDG_CACHE_HOME", None)
    for name in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        if name in os.environ:
            env[name] = os.environ[name]
    (work / "home").mkdir(exist_ok=True)
    (work / "empty-cache").mkdir(exist_ok=True)
    command = [str(binary), *local_args(spec["args"], port, preset, key_file)]
    out["router_command"] = command
    gpu = have_gpu()
    card = CardMemory() if gpu else None
    time.sleep(2.5)
    baseline = [m for _, m in card.samples] if card else []
    out["gpu"] = {"baseline_mib": sorted(baseline)[len(baseline) // 2] if baseline else None}
    log = work / "router.log"
    logf = open(log, "wb")
    proc = subprocess.Popen(command, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=work)
    tail = LogTail(log).start()
    procs = ProcessMemory().start() if gpu else None
    statuses: Optional[Statuses] = None
    results: list[Result] = []
    cold: list[dict] = []
    # The admission proxy in front of it, as the pod runs it (its rendered command and plan): the
    # requests go to it; the samplers and the cold-swap unloads go to the router itself.
    plan_file = work / "admission.json"
    plan_file.write_text(json.dumps(spec["admission"]))
    proxy_log = open(work / "proxy.log", "wb")
    from lab.contract.pod_programs import pod_command, write_programs
    programs = write_programs(spec["programs"], spec["pod_spec"], work / "programs")
    proxy = subprocess.Popen(pod_command(spec["proxy"], programs),
                             stdout=proxy_log, stderr=subprocess.STDOUT, env={
                                 "PATH": "/usr/bin:/bin", "ADMISSION_PLAN_FILE": str(plan_file), "LISTEN_PORT": str(proxy_port),
                                 "LISTEN_HOST": "127.0.0.1", "ROUTER_URL": f"http://127.0.0.1:{port}",
                                 "ROUTER_AUTH_FILE": str(key_file)})
    try:
        if not wait_until(lambda: proc.poll() is None and _health(port) and _health(proxy_port), 60):
            raise SystemExit(f"router_soak: the router did not answer /health in 60 s (exit {proc.poll()}); log: {log}")
        out["router_up_seconds"] = round(now() - run_started, 1)
        statuses = Statuses(port, key).start()
        # A pinned model loads at start: wait for it, so that the first request does not race its load.
        pinned = [m for m, p in spec["residency"]["models"].items() if p.get("pinned")]
        out["pinned_loaded"] = wait_until(lambda: set(pinned) <= set(running(port, key)) and not any(
            st.startswith("loading") for st in (statuses.samples[-1][1] if statuses.samples else {"": "loading"}).values()), 120)
        steps = traffic(names, limit, options.requests, options.seed, options.locality, options.burst_every,
                        options.burst, options.cancels)
        deadline = min(now() + options.traffic_seconds, hard_stop - 60)
        index = 0
        for kind, models in steps:
            if now() > deadline or proc.poll() is not None:
                out["traffic_stopped_early"] = f"after {index} requests ({'router exited' if proc.poll() is not None else 'time'})"
                break
            timeout = max(5.0, min(options.request_timeout, deadline + 30 - now()))
            if kind == "burst":
                batch = [Result(index + i, m, "concurrent", stream=False, max_tokens=8) for i, m in enumerate(models)]
                before = running(port, key)
                wait = min(timeout, options.burst_timeout)
                threads = [threading.Thread(target=chat, args=(proxy_port, key, r, wait)) for r in batch]
                for r, th in zip(batch, threads):
                    r.resident_before = before
                    th.start()
                for th in threads:
                    th.join(wait + 5)
                results += batch
            else:
                r = Result(index, models[0], "cancel" if kind == "cancel" else "sequential", stream=True,
                           max_tokens=256 if kind == "cancel" else random.Random(options.seed + index).randint(4, 16))
                r.resident_before = running(port, key)
                chat(proxy_port, key, r, timeout, cancel_after=3 if kind == "cancel" else None)
                results.append(r)
            index += len(models)
            if index % 20 < len(models):
                ok = sum(1 for x in results if x.ok)
                print(f"[soak] {index} requests, {ok} answered 200, {now() - run_started:.0f} s", flush=True)
        out["traffic_seconds"] = round(now() - run_started - out["router_up_seconds"], 1)
        if dense and proc.poll() is None:
            cold = cold_swaps(port, key, {m: out["files"][m] for m in sorted(dense)}, hard_stop)
    finally:
        for sampler in (statuses, procs, tail):
            if sampler is not None:
                sampler.stop()
        proxy.terminate()
        proxy.wait(timeout=10)
        proxy_log.close()
        out["proxy_log"] = (work / "proxy.log").read_text(errors="replace").splitlines()[-200:]
        kids = _children(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        logf.close()
        tail.sample()  # the last lines (children's exits at shutdown)
        if card is not None:
            time.sleep(1.0)
            card.stop()
    out["router_exit"] = proc.returncode
    out["log_lines"] = tail.lines
    return report(out, results, cold, card.samples if card else [], procs.samples if procs else [],
                  statuses.samples if statuses else [], tail.samples, run_started, limit)


def _health(port: int) -> bool:
    try:
        return get(port, "", "/health", timeout=2)[0] == 200
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    from lab.contract.router import child_pids
    return child_pids(pid)


def cold_swaps(port: int, key: str, models: dict[str, dict], hard_stop: float) -> list[dict]:
    """For each model: unload everything, read its files into the page cache and load it (warm), unload
    it, drop the page cache, load it again (cold: read from disk). Each load goes into an empty card,
    first token timed. (The read before the warm load matters: an earlier model's drop emptied the cache.)"""
    found = []
    for i, (name, files) in enumerate(models.items()):
        if now() > hard_stop - 45:
            found.append({"model": name, "skipped": "out of time"})
            break
        row: dict = {"model": name}
        for phase in ("warm", "cold"):
            for other in running(port, key):
                post(port, key, "/models/unload", {"model": other})
            if not wait_until(lambda: not running(port, key), 60):
                row[phase] = {"error": f"models still running: {running(port, key)}"}
                continue
            if phase == "warm":
                paths = [Path(files["file"])] + ([Path(files["mmproj"]["file"])] if (files.get("mmproj") or {}).get("file") else [])
                row["read_into_cache_s"] = round(read_through(paths), 1)
            if phase == "cold":
                row["cached_mib_before_drop"] = cached_mib()
                row["drop_caches"] = drop_caches() or "done"
                row["cached_mib_after_drop"] = cached_mib()
            r = Result(10_000 + 2 * i + (phase == "cold"), name, phase, stream=True, max_tokens=4)
            chat(port, key, r, timeout=max(10.0, hard_stop - 20 - now()))
            row[phase] = {"status": r.status, "first_token_s": r.first_token_s, "error": r.error or None}
        found.append(row)
    return found


# --- the command line --------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", action="append", help="a shipped stack (default: every stack with a router)")
    parser.add_argument("--spec-out", help="render only: write the routers' specs as JSON here and stop")
    parser.add_argument("--spec", help="soak only: read the specs written by --spec-out (no render, no venv needed)")
    parser.add_argument("--binary", help="llama-server (default: lab/llama_build.py's; LLAMA_CPP_BACKEND=cuda for the GPU)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for router-soak-<stack>-<key>.json and the router log")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--locality", type=float, default=0.6, help="share of sequential requests sent to a resident model")
    parser.add_argument("--burst-every", type=int, default=12, help="a concurrent burst every N requests")
    parser.add_argument("--burst", type=int, default=3, help="requests per burst, to random models")
    parser.add_argument("--cancels", type=int, default=6, help="streams the client closes after 3 chunks")
    parser.add_argument("--cold", default="qwen3-8b,qwen3-30b-a3b",
                        help="models written dense and loaded once more after dropping the page cache ('' for none)")
    parser.add_argument("--request-timeout", type=float, default=120)
    parser.add_argument("--burst-timeout", type=float, default=20,
                        help="per concurrent request: b10729 can leave one unanswered (ROUTER_FACTS.md b), counted as failed")
    parser.add_argument("--traffic-seconds", type=float, default=330)
    parser.add_argument("--max-seconds", type=float, default=540, help="the whole soak of one router, setup included")
    parser.add_argument("--work", help="work folder (default: a temp folder, removed after)")
    options = parser.parse_args(argv)
    if options.spec:
        specs = json.loads(Path(options.spec).read_text())
    else:
        specs = router_specs(options.stack)
        if options.spec_out:
            Path(options.spec_out).parent.mkdir(parents=True, exist_ok=True)
            Path(options.spec_out).write_text(json.dumps(specs, indent=1))
            print(f"[soak] {len(specs)} router(s): {', '.join(s['stack'] + '/' + s['key'] for s in specs)} -> {options.spec_out}")
            return 0
    if options.stack:
        specs = [s for s in specs if s["stack"] in options.stack]
    if not specs:
        print("router_soak: no shipped stack renders a router (capacity_plan.servers.<key>.residency)", file=sys.stderr)
        return 2
    binary = Path(options.binary).resolve() if options.binary else None
    if binary is None:
        from lab.llama_build import build
        binary = build()
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    outdir = Path(options.out)
    outdir.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        work = Path(options.work) if options.work else Path(tempfile.mkdtemp(prefix="router-soak-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            result = soak(spec, binary, options, work)
        finally:
            stem = f"router-soak-{spec['stack']}-{spec['key']}"
            if (work / "router.log").exists():
                shutil.copy(work / "router.log", outdir / f"{stem}.log")
            if not options.work:
                shutil.rmtree(work, ignore_errors=True)
        result["meta"] = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, "lab/bench/router_soak.py", *argv]),
            "llama_cpp": [line for line in (version.stdout + version.stderr).splitlines() if "version" in line or "built" in line],
            "gpu": _gpu_name(), "host": platform.node(), "cpus": os.cpu_count(),
        }
        (outdir / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
        print("\n".join(summary_lines(result)), flush=True)
        print(f"[soak] wrote {outdir / (stem + '.json')}", flush=True)
    return 0


def _gpu_name() -> Optional[str]:
    if not have_gpu():
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30)
    return q.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
