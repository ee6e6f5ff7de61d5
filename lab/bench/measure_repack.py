"""What a CPU helper of a split loses by not repacking its weights (issue #47): llama.cpp's CPU backend copies
some weight types into an interleaved layout at load (ggml-cpu/repack.cpp: on x86 with AVX2 Q4_0, Q4_K, IQ4_NL and
MXFP4; Q2_K with AVX-512), which its matrix products read faster. A ggml-rpc-server offers only its device's plain
buffer type, so weights it holds are never repacked. This runs llama-server on the same real-shape file with
repacking (its default) and without (`--no-repack`), and records prompt and decode speed from the server's own
timings.

    python -m lab.bench.measure_repack --bin DIR --out results.json [--shapes qwen3-1.7b:Q4_K_M,...] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lab.contract.real_shape import write_real_shape
from lab.contract.server import stop

PORT = 50095
PROMPT_WORDS = 60  # about 290 tokens with Qwen3's and Llama 3's vocabularies
GENERATE = 24
REPEATS = 3


def _post(path: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def _ready(deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def measure(bin_dir: Path, model: Path, threads: int, repack: bool, log: Path) -> list[dict]:
    """REPEATS requests of a fresh prompt each (no prompt cache): prompt and decode tokens/s per request."""
    cmd = [str(bin_dir / "llama-server"), "-m", str(model), "-t", str(threads), "-tb", str(threads),
           "--host", "127.0.0.1", "--port", str(PORT), "-c", "2048", "-np", "1", "--no-warmup",
           *([] if repack else ["--no-repack"])]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not _ready(time.monotonic() + 300):
            raise RuntimeError(f"llama-server did not become ready: {log.read_text()[-400:]}")
        rows = []
        for i in range(REPEATS):
            prompt = " ".join(f"w{i}x{j}" for j in range(PROMPT_WORDS))
            timings = _post("/completion", {"prompt": prompt, "n_predict": GENERATE, "ignore_eos": True,
                                            "cache_prompt": False}, 600)["timings"]
            rows.append({"prompt_n": timings["prompt_n"], "prompt_tok_s": round(timings["prompt_per_second"], 3),
                         "predicted_n": timings["predicted_n"], "decode_tok_s": round(timings["predicted_per_second"], 3)})
        return rows
    finally:
        stop(proc, group=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--shapes", default="qwen3-1.7b:Q4_K_M")
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="repack-") as name:
        tmp = Path(name)
        for item in args.shapes.split(","):
            shape, quant = item.split(":")
            model = write_real_shape(shape, tmp / f"{shape}-{quant}.gguf", quant)
            for threads in (int(t) for t in args.threads.split(",")):
                for repack in (True, False):
                    runs = measure(args.bin, model, threads, repack, tmp / "server.log")
                    rows.append({"shape": shape, "quant": quant, "threads": threads, "repack": repack, "runs": runs})
                    print(json.dumps(rows[-1]), flush=True)
            model.unlink()
    args.out.write_text(json.dumps({"what": "lab/bench/measure_repack.py: " + " ".join(argv), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
