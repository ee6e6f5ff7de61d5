"""The prefetch init container, run for real: its rendered command and environment against a
stand-in Hub, then read back the way the engine reads it (huggingface_hub, HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_strix

from lab.contract.hub import COMMIT, hub_files
from lab.contract.pod_programs import pod_command, programs_under, write_programs

REPO = "peonist/qwen38-flash-next-w4b"
FILES = {
    "model-00001-of-00002.safetensors": os.urandom(300_000),
    "model-00002-of-00002.safetensors": os.urandom(200_000),
    "config.json": b'{"architectures": ["Qwen3NextForCausalLM"]}',
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}


@pytest.fixture(scope="module")
def init_container() -> tuple[dict, dict]:
    """The rendered strix-halo engine's prefetch init container, and the engine container."""
    run = run_strix()
    pod = run.one("StatefulSet", "halogen-flash").inputs["spec"]["template"]["spec"]
    PROGRAMS.update(config_map=run.one("ConfigMap", "halogen-flash-programs").inputs, pod=pod)
    (init,) = pod["initContainers"]
    return init, pod["containers"][0]


PROGRAMS: dict = {}  # the rendered programs ConfigMap and the pod that mounts it


def run_init(init: dict, root: Path, endpoint: str, **override: str) -> subprocess.CompletedProcess:
    """Its command with its environment; absolute paths land under root (the pod's volumes)."""
    env = {"PATH": os.environ["PATH"], "HF_ENDPOINT": endpoint}
    for item in init["env"]:
        value = item["value"]
        env[item["name"]] = str(root / value.lstrip("/")) if value.startswith("/") else value
    env["HF_REPO"] = REPO
    env.update(override)
    programs = write_programs(PROGRAMS["config_map"], PROGRAMS["pod"], programs_under(root))
    return subprocess.run(pod_command(init, programs), env=env, capture_output=True, text=True, timeout=60)


def engine_env(engine: dict, root: Path) -> dict:
    env = {}
    for item in engine.get("env") or []:
        value = item["value"]
        env[item["name"]] = str(root / value.lstrip("/")) if value.startswith("/") else value
    return env


def read_like_the_engine(engine: dict, root: Path) -> Path:
    """What huggingface_hub resolves offline with the engine container's own environment."""
    code = ("import sys; from huggingface_hub import snapshot_download; "
            f"print(snapshot_download({REPO!r}, revision='main'))")
    env = {"PATH": os.environ["PATH"], **engine_env(engine, root)}
    assert env["HF_HUB_OFFLINE"] == "1"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def test_the_prefetch_needs_nothing_from_pypi(init_container):
    """The init container runs the downloader from the pod's programs ConfigMap with the image's own Python:
    its files import nothing outside the standard library (and each other), and the namespace has no PyPI
    egress."""
    import ast

    from components.programs import PROGRAMS_DIR

    init, _ = init_container
    assert init["command"][0] == "python3" and init["command"][-1] == f"{PROGRAMS_DIR}/hub_download.py"
    files = {k: v for k, v in PROGRAMS["config_map"]["data"].items() if k.endswith(".py")}
    assert set(files) == {"hub_download.py", "hub.py"}
    own = {name[:-3] for name in files}
    for name, text in files.items():
        imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(text))
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert imported <= set(sys.stdlib_module_names) | own, (name, imported - set(sys.stdlib_module_names) - own)
    strix = run_strix()
    hosts = strix.config.namespace.model_hub_egress.hosts
    assert not {"pypi.org", "files.pythonhosted.org"} & set(hosts)


def test_prefetched_weights_are_found_offline_by_the_engine(init_container, tmp_path):
    init, engine = init_container
    log: list[str] = []
    with hub_files(REPO, FILES, log=log) as endpoint:
        done = run_init(init, tmp_path, endpoint)
        assert done.returncode == 0, done.stderr
        snapshot = read_like_the_engine(engine, tmp_path)
        assert snapshot.name == COMMIT
        for path, data in FILES.items():
            assert (snapshot / path).read_bytes() == data
        # A restart downloads nothing again: every blob is complete.
        before = len([r for r in log if "/resolve/" in r or "/cdn/" in r])
        again = run_init(init, tmp_path, endpoint)
        assert again.returncode == 0, again.stderr
        assert len([r for r in log if "/resolve/" in r or "/cdn/" in r]) == before
    # The layout the engine's cache variable points at: on the weights volume, not the scratch one.
    weights_mount = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "weights")
    assert str(snapshot).startswith(str(tmp_path / weights_mount.lstrip("/")))
    ref = snapshot.parent.parent / "refs" / "main"
    assert ref.read_text() == COMMIT  # no trailing newline: readers use it as a folder name


def test_an_interrupted_download_resumes(init_container, tmp_path):
    init, engine = init_container
    with hub_files(REPO, FILES) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0
    blobs = next(tmp_path.rglob("blobs"))
    big = max(blobs.iterdir(), key=lambda p: p.stat().st_size)
    data = big.read_bytes()
    big.unlink()
    (blobs / (big.name + ".incomplete")).write_bytes(data[:1000])  # a pod killed mid-download
    log: list[str] = []
    with hub_files(REPO, FILES, log=log) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0
    assert big.read_bytes() == data
    assert any(r.startswith("GET /cdn/") for r in log)
    assert read_like_the_engine(engine, tmp_path).name == COMMIT


def pinned(init: dict, commit: str) -> dict:
    return {**init, "env": [{**e, "value": commit} if e["name"] == "HF_REVISION" else e for e in init["env"]]}


def repo_cache(root: Path) -> Path:
    return next(root.rglob("models--peonist--qwen38-flash-next-w4b"))


def test_a_pinned_complete_commit_starts_without_the_hub_and_the_engine_reads_it(init_container, tmp_path):
    init, engine = init_container
    init = pinned(init, COMMIT)
    with hub_files(REPO, FILES) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0
    assert read_like_the_engine(engine, tmp_path).name == COMMIT  # the engine asks for main, offline
    # A claim filled earlier from main at another commit: the pin, not the old main, is what loads.
    (repo_cache(tmp_path) / "refs" / "main").write_text("b" * 40)
    log: list[str] = []
    with hub_files(REPO, FILES, log=log) as endpoint:
        again = run_init(init, tmp_path, endpoint)
    assert again.returncode == 0, again.stderr
    assert log == []  # not even asked
    assert read_like_the_engine(engine, tmp_path).name == COMMIT


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_pinned_commit_whose_files_are_damaged_is_fetched_again(init_container, tmp_path, damage):
    """The marker lists the files and sizes: a cache cleanup (hf cache delete) or a short write
    after a power cut sends the start back to the Hub instead of to a missing or short file."""
    init, engine = init_container
    init = pinned(init, COMMIT)
    with hub_files(REPO, FILES) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0
    blobs = repo_cache(tmp_path) / "blobs"
    big = max(blobs.iterdir(), key=lambda p: p.stat().st_size)
    data = big.read_bytes()
    if damage == "deleted":
        big.unlink()
    else:
        big.write_bytes(data[:1000])
    log: list[str] = []
    with hub_files(REPO, FILES, log=log) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0
    assert big.read_bytes() == data
    assert any(r.startswith("GET /cdn/") for r in log)


def test_a_tag_and_a_paged_listing_are_followed(init_container, tmp_path):
    init, engine = init_container
    log: list[str] = []
    with hub_files(REPO, FILES, log=log, page=1) as endpoint:
        done = run_init(pinned(init, "v1"), tmp_path, endpoint)
    assert done.returncode == 0, done.stderr
    assert sum(1 for r in log if "/tree/" in r) == len(FILES)  # one file per page
    snapshot = read_like_the_engine(engine, tmp_path)
    for path, data in FILES.items():
        assert (snapshot / path).read_bytes() == data


def test_a_branch_starts_from_its_last_complete_commit_when_the_hub_is_down(init_container, tmp_path):
    from lab.contract.server import free_port

    init, engine = init_container
    with hub_files(REPO, FILES) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0
    down = f"http://127.0.0.1:{free_port()}/"
    again = run_init(init, tmp_path, down)
    assert again.returncode == 0, again.stderr
    assert f"starting from {REPO}@{COMMIT}" in again.stdout
    assert read_like_the_engine(engine, tmp_path).name == COMMIT


@pytest.mark.parametrize("status, body, starts", [
    (503, b"busy", True),                       # an outage: start from the cache
    (200, b"<html>captive portal</html>", True),  # not JSON: the Hub is not what answered
    (401, b"{}", False),                        # the Hub answered: a wrong token is not an outage
])
def test_what_counts_as_the_hub_being_down(init_container, tmp_path, status, body, starts):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    init, _ = init_container
    with hub_files(REPO, FILES) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0

    class Broken(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        again = run_init(init, tmp_path, f"http://127.0.0.1:{server.server_address[1]}/")
    finally:
        server.shutdown()
        server.server_close()
    assert (again.returncode == 0) is starts, again.stderr


def test_a_download_never_finished_does_not_start_when_the_hub_is_down(init_container, tmp_path):
    from lab.contract.server import free_port

    init, _ = init_container
    with hub_files(REPO, FILES) as endpoint:
        assert run_init(init, tmp_path, endpoint).returncode == 0
    next(tmp_path.rglob(".prefetch-complete-*")).unlink()  # as if the pod died before the end
    again = run_init(init, tmp_path, f"http://127.0.0.1:{free_port()}/")
    assert again.returncode != 0
    assert "was never fetched completely" in again.stderr


def test_a_repo_larger_than_planned_is_not_fetched(init_container, tmp_path):
    """Sizes checked at run time (issue #43 item 5), for a single-model server: the rendered init container
    carries what the plan counted for the download (the stack's weights); a repo whose files are larger is not
    fetched at all and the start stops, saying both sizes; at its planned size it is."""
    init, _ = init_container
    planned = {e["name"]: e["value"] for e in init["env"]}["PLANNED_BYTES"]
    assert int(planned) == int(115.5 * 2**30)  # strix-halo's halogen-flash: weights 115.5Gi
    total = sum(len(data) for data in FILES.values())
    with hub_files(REPO, FILES) as endpoint:
        done = run_init(init, tmp_path, endpoint, PLANNED_BYTES=str(total // 2))
        assert done.returncode != 0 and "larger than the plan counted" in done.stderr and "not fetched" in done.stderr
        assert not list(tmp_path.rglob("blobs/*"))
        assert run_init(init, tmp_path, endpoint, PLANNED_BYTES=str(total)).returncode == 0
