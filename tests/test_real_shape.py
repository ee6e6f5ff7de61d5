"""Real-shape GGUF files (lab/contract/real_shape.py): each preset's file is written in well under
2 s, is full-size but sparse, and llama.cpp's own programs read it as the model it imitates.

`llama-fit-params -fitp on` prints one line per device and a Host line, "<name> <model> <context>
<compute> " in MiB (common/fit.cpp). It runs with --no-repack: on a CPU with repacked quant types
(Q4_K on x86 with AVX2) the repacked weights are counted in a CPU_REPACK buffer that the Host line
leaves out (seen here: qwen3-8b Host 1589 + CPU_REPACK 3199 MiB, printed only with -lv 4).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest



from lab.llama_build import BuildError, build
from lab.contract.gguf_layout import read_layout
from lab.contract.real_shape import PRESETS, expected_weights_bytes, tensor_table, write_real_shape

MiB = 1 << 20
HOST = re.compile(r"^Host (\d+) (\d+) (\d+) ?$", re.M)
# llama-bench loads and runs the weights: only the two smallest files (~0.6 and ~4.9 GB of zero pages)
SMALLEST = sorted(PRESETS, key=expected_weights_bytes)[:2]


def _program(name: str):
    try:
        return build(program=name)
    except BuildError as e:
        failure = str(e)
    pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="module")
def fit_params():
    return _program("llama-fit-params")


@pytest.fixture(scope="module")
def bench():
    return _program("llama-bench")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """preset -> (path, seconds to write); files are removed with the folder."""
    folder = tmp_path_factory.mktemp("real-shape")
    out = {}
    for preset in PRESETS:
        started = time.monotonic()
        path = write_real_shape(preset, folder / f"{preset}.gguf")
        out[preset] = (path, time.monotonic() - started)
    yield out
    for path, _ in out.values():
        path.unlink(missing_ok=True)  # also drops the zero pages llama-bench left in the page cache


@pytest.mark.parametrize("preset", PRESETS)
def test_the_file_is_the_shape_full_size_and_sparse(written, preset):
    path, seconds = written[preset]
    assert seconds < 2, f"{preset}: written in {seconds:.2f} s"
    kvs, tensors, data_start = read_layout(path)
    want = tensor_table(preset)
    assert [(n, ne, t) for n, ne, t, _ in tensors] == [(n, ne, t) for n, ne, t, _ in want]
    assert kvs["general.architecture"][1] == PRESETS[preset].arch
    assert kvs["tokenizer.ggml.tokens"][1][1] == PRESETS[preset].n_vocab
    padded = sum(-(-nbytes // 32) * 32 for *_, nbytes in want)
    st = os.stat(path)
    assert st.st_size == data_start + padded, "apparent size is header + tensor data"
    assert tensors[-1][3] + want[-1][3] <= padded
    assert st.st_blocks * 512 < 50 * MiB, f"{preset}: {st.st_blocks * 512 / MiB:.1f} MiB on disk"


@pytest.mark.parametrize("preset", PRESETS)
def test_llama_fit_params_reads_the_real_model_size(written, fit_params, preset):
    path, _ = written[preset]
    run = subprocess.run([str(fit_params), "-m", str(path), "-c", "4096", "-fitp", "on", "--no-repack"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    m = HOST.search(run.stdout)
    assert m, run.stdout
    model, context, compute = (int(x) for x in m.groups())
    expected = expected_weights_bytes(preset) / MiB
    assert abs(model - expected) <= 0.01 * expected, f"{preset}: Host model {model} MiB, wrote {expected:.1f} MiB"
    assert context > 0 and compute > 0


@pytest.mark.parametrize("preset", SMALLEST)
def test_llama_bench_runs_the_zero_weights(written, bench, preset):
    path, _ = written[preset]
    run = subprocess.run([str(bench), "-m", str(path), "-p", "16", "-n", "4", "-r", "1", "-t", "2", "-o", "json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout)
    rates = {(r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in results}
    assert rates.get((16, 0), 0) > 0 and rates.get((0, 4), 0) > 0, rates
    assert {r["model_size"] for r in results} == {expected_weights_bytes(preset)}
