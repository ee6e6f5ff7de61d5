"""llama.cpp is the oracle for memory: every llama.cpp server of every shipped stack is started (the
CPU build of the pinned release) with its rendered arguments on a GGUF of its model's real shape —
real hyperparameters and tensor table, all-zero weights in a sparse file (lab/contract/real_shape.py)
— and what llama.cpp reports allocating at load (its model, KV, recurrent-state and compute buffers)
is compared with the plan's figures for the same flags: each within 10%. A pod whose node memory
holds everything (CPU, iGPU, APU) must have a memory limit above what llama.cpp allocates.

GPU buffers (CUDA, Vulkan, ROCm) cannot be measured here: the plan's VRAM context and compute reserve
stay stated margins (docs/capacity-planning.md).
"""

from __future__ import annotations

import re
import time
from functools import lru_cache
from pathlib import Path

import pytest



from lab.llama_build import BuildError, build
from common.quantity import MIB, parse_quantity
from lab.contract.real_shape import write_real_shape
from lab.contract.repo_shapes import REPO_SHAPES
from lab.contract.server import free_port, log_until, without

TOLERANCE = 0.10
# llama.cpp's load log at -lv 4 (formats: src/llama-model.cpp, llama-kv-cache.cpp,
# llama-memory-recurrent.cpp, llama-context.cpp; each line may carry a timestamp prefix).
BUFFER = re.compile(r"(?P<kind>model|KV|RS|compute|output) buffer size = +(?P<mib>[0-9.]+) MiB")
# Flags dropped or replaced for a run on loopback without the pod's files; the rest run as rendered.
DROPPED = {"--hf-repo": 1, "--api-key-file": 1, "--host": 1, "--port": 1, "--threads": 1}


@lru_cache(maxsize=None)
def shape_file(preset: str) -> Path:
    folder = Path("/tmp") / "inference-plane-shapes"
    folder.mkdir(exist_ok=True)
    return write_real_shape(preset, folder / f"{preset}.gguf")


def llama_cpp_reports(args: list[str], model: Path) -> dict[str, float]:
    """MiB per buffer kind that llama-server allocates for these arguments (summed over buffers)."""
    try:
        binary = build()
    except BuildError as e:
        pytest.fail(str(e), pytrace=False)
    kept = without(args, DROPPED)
    # No warm-up pass (it would read every zero page) and no repacking into a second copy: neither
    # changes the buffers llama.cpp reserves.
    cmd = [str(binary), "-m", str(model), *kept, "--host", "127.0.0.1", "--port", str(free_port()), "--threads", "2",
           "--no-warmup", "--no-repack", "-lv", "4"]
    log = Path("/tmp") / f"oracle-{model.stem}-{time.monotonic_ns()}.log"
    text = log_until(cmd, log, "graph splits", 240)
    log.unlink()
    reports: dict[str, float] = {}
    for match in BUFFER.finditer(text):
        reports[match["kind"]] = reports.get(match["kind"], 0.0) + float(match["mib"])
    assert "compute" in reports, f"llama-server reported no compute buffer: {text[-800:]}"
    return reports


def cases():
    from test_llama_contract import servers

    return [c for c in servers() if _repo(c[2]["args"]) in REPO_SHAPES]


def _repo(args: list[str]) -> str:
    return args[args.index("--hf-repo") + 1].split(":")[0]


@pytest.mark.parametrize("case", cases(), ids=lambda c: f"{c[0]}/{c[1]}")
def test_the_plan_matches_what_llama_cpp_allocates(case):
    from engines.llamacpp_memory import llamacpp_estimate
    from config.catalog import facts_for
    from render.offline import run_stack

    stack, key, container, *_ = case
    run = run_stack(stack)
    model = run.config.models[key]
    facts = facts_for(model)
    reports = llama_cpp_reports(container["args"], shape_file(REPO_SHAPES[_repo(container["args"])]))
    # The plan for the same flags on a CPU (the build here): llama.cpp's buffers are all host buffers.
    plan = llamacpp_estimate(model, facts, "cpu")
    figures = {"model": plan.weights_gib * 1024, "KV": plan.kv_gib * 1024, "RS": plan.recurrent_gib * 1024,
               "compute": plan.overhead_gib * 1024}
    for kind, planned in figures.items():
        measured = reports.get(kind, 0.0)
        if measured == 0.0 and planned < 1:
            continue  # neither holds any (no recurrent state in a plain transformer)
        print(f"oracle {stack}/{key} {kind}: plan {planned:.1f} MiB, llama.cpp {measured:.1f} MiB "
              f"({(planned - measured) / measured:+.1%})")
        assert planned == pytest.approx(measured, rel=TOLERANCE), f"{kind}: plan {planned:.1f} MiB, llama.cpp {measured:.1f} MiB"
    pool = run.config.node_pools[model.node_pool]
    if not (pool.discrete() and model.uses_gpu(pool)):
        # Everything is in the node's memory: the limit must hold all llama.cpp allocates, and the
        # host-RAM caches (prompt cache, checkpoints) it fills later.
        plan_server = next(s for k, s in run.outputs["capacity_plan"]["servers"].items() if k == key)
        limit_mib = float(parse_quantity(plan_server["memory_limit"])) / MIB
        allocated = sum(reports.values()) + plan.host_caches_gib * 1024
        assert limit_mib >= allocated, f"memory limit {plan_server['memory_limit']} < {allocated:.0f} MiB allocated"

