"""llama.cpp is the oracle for a vision projector's memory: llama-server (the CPU build of the pinned
release) starts with `--mmproj` on a projector GGUF of the real shape of ggml-org/gemma-3-12b-it-GGUF's
mmproj-model-f16.gguf (lab/contract/real_shape_mmproj.py: real hyperparameters and tensor table, zero
weights, sparse), and what it reports for the projector at load is compared with the figures the
planner is to count for it: its weights and its compute buffer, each within 10 %.

What llama.cpp b10729 logs for the projector (tools/mtmd/clip.cpp, at -lv 4):
  - `load_hparams: model size: %.2f MiB`: the sum of the file's tensors, loaded into a backend buffer
    of its own (read from the file, not mapped): on the CPU, RAM on top of the text model's;
  - `get_dummy_batch: warmup with image size = N x N`: Gemma 3 warms up at its one image size, 896, and
    every image is resized to it and encoded alone (SigLIP has no batching), so the buffer reserved at
    load is the largest it gets;
  - `reserve_compute_meta: <buffer type> compute buffer size = %8.2f MiB`, the last per buffer type
    (with flash attention `auto` it reserves once with flash attention on, again with it off if the
    backend lacks it);
  - `warmup: flash attention is enabled|disabled`;
  - `[mtmd] estimated worst-case memory usage of mmproj is %.2f MiB`: what the server's --fit counts
    for the projector (tools/server/server-context.cpp), weights plus that compute buffer.
`auto` (the server's default, which the rendered servers keep) turns flash attention on for the
projector on the CPU; CUDA's flash attention takes its 72-wide heads (ggml-cuda/fattn.cu, tile kernel),
so `auto` turns it on there too. Off, the 16 heads' 4096 x 4096 attention scores are materialized:
the compute buffer is 9x larger.

The text model is Gemma 3 12B's width (3840, which the projector's output must equal) with one layer:
clip's buffers do not depend on the text model, and the full real-shape 12B (lab/contract/
real_shape_mmproj.py write_text_shape("gemma-3-12b")) gives the same lines, at 7 GB of zero pages more.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest



from lab.contract.real_shape_mmproj import expected_mmproj_bytes, write_mmproj, write_text_shape
from lab.contract.server import free_port, log_until

# The figures the planner counts for the projector that ggml-org/gemma-3-12b-it-GGUF ships
# (mmproj-model-f16.gguf) and its also-repos, as config/catalog.yaml carries them (MiB; llama-server
# b10729 measured them on the CPU: weights 814.60, compute 121.25 with flash attention, 1132.00 without).
# Weights: the whole F16 file's tensors. Compute: the buffer reserved for one 896 x 896 image with flash
# attention on (the default, `auto`, on CPU and CUDA).
from config.catalog import lookup

_PROJECTOR = lookup("ggml-org/gemma-3-12b-it-GGUF").mmproj
MEASURED_GEMMA3_MMPROJ_WEIGHTS_MIB = _PROJECTOR.weights_mib
MEASURED_GEMMA3_MMPROJ_COMPUTE_MIB = _PROJECTOR.compute_mib
# With flash attention off (`--flash-attn off`, or a backend without it): the compute buffer alone.
MEASURED_GEMMA3_MMPROJ_COMPUTE_NO_FA_MIB = _PROJECTOR.compute_no_fa_mib
TOLERANCE = 0.10

MODEL_SIZE = re.compile(r"load_hparams: model size: +(?P<mib>[0-9.]+) MiB")
WARMUP = re.compile(r"get_dummy_batch: warmup with image size = (?P<w>\d+) x (?P<h>\d+)")
COMPUTE = re.compile(r"reserve_compute_meta: +(?P<buft>\S+) compute buffer size = +(?P<mib>[0-9.]+) MiB")
FLASH = re.compile(r"warmup: flash attention is (?P<state>enabled|disabled)")
ESTIMATE = re.compile(r"estimated worst-case memory usage of mmproj is (?P<mib>[0-9.]+) MiB")
LOADED = "loaded multimodal model"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("projector")
    return (write_text_shape("gemma-3-12b-width", folder / "gemma-3-12b-width.gguf"),
            write_mmproj("gemma-3-12b", folder / "mmproj-model-f16.gguf"))


def projector_report(binary: Path, model: Path, mmproj: Path, flash_attn: str, log: Path) -> dict:
    """What llama-server logs for the projector while it loads, until the projector is loaded."""
    cmd = [str(binary), "-m", str(model), "--mmproj", str(mmproj), "--flash-attn", flash_attn,
           "--ctx-size", "4096", "--parallel", "1", "--threads", "2", "--no-repack",
           "--host", "127.0.0.1", "--port", str(free_port()), "-lv", "4"]
    text = log_until(cmd, log, LOADED, 90)
    assert LOADED in text, f"llama-server did not load the projector: {text[-1500:]}"
    compute: dict[str, float] = {}
    for m in COMPUTE.finditer(text):
        compute[m["buft"]] = float(m["mib"])  # the last line per buffer type
    warmup = WARMUP.findall(text)
    return {
        "weights": float(MODEL_SIZE.search(text)["mib"]),
        "warmup": (int(warmup[-1][0]), int(warmup[-1][1])),
        "compute": compute,
        "flash": FLASH.findall(text)[-1],
        "estimate": float(ESTIMATE.search(text)["mib"]),
    }


@pytest.mark.parametrize("flash_attn, flash, planned_compute", [
    ("auto", "enabled", MEASURED_GEMMA3_MMPROJ_COMPUTE_MIB),
    ("off", "disabled", MEASURED_GEMMA3_MMPROJ_COMPUTE_NO_FA_MIB),
], ids=["flash-attn-auto", "flash-attn-off"])
def test_the_gemma3_projector_holds_what_the_planner_counts(binary, files, tmp_path, flash_attn, flash,
                                                            planned_compute):
    model, mmproj = files
    report = projector_report(binary, model, mmproj, flash_attn, tmp_path / "server.log")
    print(f"projector gemma-3-12b --flash-attn {flash_attn}: {report}")

    # The weights are the file's tensors, which the shape writes exactly as published.
    assert report["weights"] == pytest.approx(expected_mmproj_bytes("gemma-3-12b") / 2**20, abs=0.01)
    assert report["weights"] == pytest.approx(MEASURED_GEMMA3_MMPROJ_WEIGHTS_MIB, rel=TOLERANCE)

    # One square image at the model's own size; on a CPU build, one compute buffer, in host memory.
    assert report["warmup"] == (896, 896)
    assert list(report["compute"]) == ["CPU"], report["compute"]
    assert report["flash"] == flash
    assert report["compute"]["CPU"] == pytest.approx(planned_compute, rel=TOLERANCE)

    # The server's own --fit counts for the projector exactly these two.
    assert report["estimate"] == pytest.approx(report["weights"] + report["compute"]["CPU"], abs=0.02)
