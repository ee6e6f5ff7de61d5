"""A router's models, fetched before it starts and offered by name only (models.<key>.on_demand).

Run for real: the rendered init container's command (hub_download.py, library mode) against a stand-in
Hub, checked file for file against what llama-server b10729 itself fetches for the same --hf-repo; then
the real router, with the rendered preset, arguments and environment, on the folder it wrote. Why the
folder and not llama.cpp's cache: a router lists every cache entry as a model of its own and loads it
with llama.cpp's defaults when asked by its cache name (ROUTER_FACTS.md, a), outside the plan.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest



from lab.llama_build import source_dir
from lab.contract.hub import hub_repos
from lab.contract.pod_programs import pod_command, programs_under, write_programs
from lab.contract.router import start_router
from lab.contract.tiny_model import write_tiny_model

STACK, KEY = "rtx3090-library", "library"
TEST_KEY = "library-contract-key-1"

# A repo laid out the way GGUF repos are, with the decoys llama.cpp's choice must step over: other
# quants, an imatrix file, a split copy of the quant in a subfolder, mmproj files of several widths.
DECOYS = {
    "README.md": b"readme",
    "imatrix-Q4_K_M.gguf": b"i" * 64,
    "Multi-Q8_0.gguf": b"a" * 128,
    "sub/Multi-Q4_K_M-00001-of-00002.gguf": b"b" * 128,
    "sub/Multi-Q4_K_M-00002-of-00002.gguf": b"c" * 128,
    "Multi-Q4_K_M.gguf": b"d" * 128,
    "mmproj-Multi-F16.gguf": b"e" * 32,
    "mmproj-Multi-Q8_0.gguf": b"f" * 32,
    "sub/mmproj-BF16.gguf": b"g" * 32,
}
# The same files listed in another order (the Hub's order decides between equal matches).
REORDERED = {name: DECOYS[name] for name in sorted(DECOYS, key=lambda n: ("sub/" in n, n))}


@pytest.fixture(scope="module")
def rendered() -> dict:
    """The library server's rendered pod (init container, router, keeper) and ConfigMap files."""
    from render.offline import run_stack

    return rendered_pod(run_stack(STACK))


def rendered_pod(run) -> dict:
    """A run's library server: its pod (init container, router, keeper) and its ConfigMaps' files."""
    from render.manifests import manifests

    model = run.config.models[KEY]
    files = list(manifests(run).values())
    (workload,) = [m for m in files if m["kind"] == "Deployment" and m["metadata"]["name"] == model.workload_name]
    (config_map,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-files"]
    (programs,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-programs"]
    pod = workload["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    containers = {c["name"]: c for c in pod["containers"]}
    container, keeper = pod["containers"][0], containers["library"]
    return {"init": init, "container": container, "keeper": keeper, "pod": pod, "files": config_map["data"], "programs": programs,
            "init_env": {e["name"]: e["value"] for e in init["env"]},
            "preset": config_map["data"]["models.ini"],
            # name -> org/repo:TAG (the rendered entries also say whether the projector is fetched).
            "library": {n: e["hf_repo"] for n, e in json.loads(config_map["data"]["library.json"]).items()},
            "mmproj": {n: e["mmproj"] for n, e in json.loads(config_map["data"]["library.json"]).items()},
            "names": list(model.on_demand.models)}


def env_under(items: list[dict], root: Path) -> dict[str, str]:
    """A container's environment with its absolute paths moved under ``root`` (the pod's volumes)."""
    return {item["name"]: str(root / item["value"].lstrip("/")) if item["value"].startswith("/") else item["value"]
            for item in items}


def write_files(rendered: dict, root: Path, library: dict[str, str] | None = None, preset: str | None = None,
                files: dict[str, str] | None = None) -> None:
    """The ConfigMap's files where the pod mounts them (under root): ``files`` (another render's) if given, the
    library and preset replaced if given (threads 1 in the preset: a 2-core machine runs several children)."""
    (mount,) = [m["mountPath"] for m in rendered["init"]["volumeMounts"] if m["name"].startswith("files-")]
    folder = root / mount.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    files = files if files is not None else rendered["files"]
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "models.ini").write_text(one_thread(preset if preset is not None else files["models.ini"]))
    write_programs(rendered["programs"], rendered["pod"], programs_under(root))
    if library is not None:
        (folder / "library.json").write_text(json.dumps(library))


def served_preset(rendered: dict, root: Path) -> Path:
    """Where the init container and the keeper write the preset the router reads (under root)."""
    return Path(env_under(rendered["init"]["env"], root)["SERVED_PRESET"])


def run_library(init: dict, root: Path, endpoint: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HF_ENDPOINT": endpoint, **env_under(init["env"], root)}
    return subprocess.run(pod_command(init, programs_under(root)), env=env, capture_output=True, text=True, timeout=120)


def library_folder(rendered: dict, root: Path) -> Path:
    return Path(env_under(rendered["init"]["env"], root)["LIBRARY_DIR"])


def fetched(log: list[str]) -> set[str]:
    """The repo paths a client downloaded (GET of a resolve URL; the CDN hop follows from it)."""
    return {line.split("/resolve/", 1)[1].split("/", 1)[1] for line in log if line.startswith("GET ") and "/resolve/" in line}


def llama_server_fetches(binary: Path, repo: str, tag: str, endpoint: str, tmp: Path) -> None:
    """llama-server -hf repo:tag against the stand-in Hub: it downloads, then fails to load the decoy
    bytes and exits (what it downloaded is in the Hub's log)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "LLAMA_CACHE": str(tmp / "cache"), "MODEL_ENDPOINT": endpoint}
    subprocess.run([str(binary), "--hf-repo", f"{repo}:{tag}", "--port", "0"], env=env, capture_output=True,
                   timeout=120)


@pytest.mark.parametrize("files", [DECOYS, REORDERED], ids=["split-listed-first", "single-listed-first"])
@pytest.mark.parametrize("tag", ["q4_k_m", "Q8_0"])
def test_the_files_fetched_are_the_files_llama_server_fetches(binary, rendered, tmp_path, files, tag):
    repo = "org/Multi-GGUF"
    server_log: list[str] = []
    with hub_repos({repo: files}, log=server_log) as endpoint:
        llama_server_fetches(binary, repo, tag, endpoint, tmp_path / "server")
    ours: list[str] = []
    write_files(rendered, tmp_path / "pod", {"multi": f"{repo}:{tag}"})
    with hub_repos({repo: files}, log=ours) as endpoint:
        done = run_library(rendered["init"], tmp_path / "pod", endpoint)
    assert done.returncode == 0, done.stderr
    assert fetched(ours) == fetched(server_log) != set()
    # The router's folder holds those files under their own names (shards and mmproj recognised by name).
    folder = library_folder(rendered, tmp_path / "pod") / "multi"
    assert sorted(p.name for p in folder.glob("*.gguf")) == sorted(p.rsplit("/", 1)[-1] for p in fetched(ours))
    assert all(p.resolve().is_file() for p in folder.glob("*.gguf"))


def test_a_projector_is_fetched_only_where_the_plan_counts_one(binary, rendered, tmp_path):
    """llama.cpp loads any mmproj file in a model's folder; the rendered library says which models'
    projectors the plan counted (gemma-3-12b's, from the catalog), and only those are fetched: a text-only
    entry gets what llama-server -hf fetches less the projector."""
    assert rendered["mmproj"] == {name: name == "gemma-3-12b" for name in rendered["names"]}
    repo = "org/Multi-GGUF"
    server_log: list[str] = []
    with hub_repos({repo: DECOYS}, log=server_log) as endpoint:
        llama_server_fetches(binary, repo, "Q4_K_M", endpoint, tmp_path / "server")
    projector = {p for p in fetched(server_log) if "mmproj" in p}
    assert len(projector) == 1
    for counted in (True, False):
        ours: list[str] = []
        root = tmp_path / f"pod-{counted}"
        write_files(rendered, root, {"multi": {"hf_repo": f"{repo}:Q4_K_M", "mmproj": counted}})
        with hub_repos({repo: DECOYS}, log=ours) as endpoint:
            assert run_library(rendered["init"], root, endpoint).returncode == 0
        expected = fetched(server_log) if counted else fetched(server_log) - projector
        assert fetched(ours) == expected
        names = {p.name for p in (library_folder(rendered, root) / "multi").glob("*.gguf")}
        assert any("mmproj" in n for n in names) == counted


def test_a_tag_no_file_matches_stops_the_start_naming_the_files_there_are(rendered, tmp_path):
    write_files(rendered, tmp_path, {"multi": "org/Multi-GGUF:IQ2_XXS"})
    with hub_repos({"org/Multi-GGUF": DECOYS}) as endpoint:
        done = run_library(rendered["init"], tmp_path, endpoint)
    assert done.returncode != 0
    assert "no GGUF file for tag IQ2_XXS" in done.stderr and "Multi-Q8_0.gguf" in done.stderr


def test_the_init_container_fills_the_folder_the_router_reads_on_the_same_volume(rendered):
    init, container, pod = rendered["init"], rendered["container"], rendered["pod"]
    init_env = {e["name"]: e["value"] for e in init["env"]}
    router_env = {e["name"]: e["value"] for e in container["env"]}
    assert init_env["LIBRARY_DIR"] == router_env["LLAMA_ARG_MODELS_DIR"]
    assert init_env["HF_LIBRARY"].startswith("/etc/") and list(rendered["library"]) == rendered["names"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["models"] == mounts["models"]
    assert init_env["LIBRARY_DIR"].startswith(mounts["models"] + "/") and init_env["HUB_CACHE"] == mounts["models"]
    # The router's own cache is an empty folder on the scratch volume, never on the weights' volume.
    assert router_env["LLAMA_CACHE"].startswith(mounts["scratch"] + "/")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "persistentVolumeClaim" in volumes["models"] and "emptyDir" in volumes["scratch"]
    # No section downloads: each model's files come from its folder.
    assert "hf-repo" not in rendered["preset"]


def rendered_scrapes() -> list[dict]:
    """The stack's VMServiceScrape endpoints, with monitoring turned on (the shipped file has none)."""
    from conftest import run_stack_file
    from test_router_gateway import SECRETS, monitored

    (scrape,) = run_stack_file(STACK, monitored(), SECRETS).find("VMServiceScrape")
    return scrape.inputs["spec"]["endpoints"]


def tiny_repos(rendered: dict, tmp_path: Path, names: list[str]) -> dict[str, dict[str, bytes]]:
    """A stand-in Hub repo per model: a tiny GGUF under a name its tag matches, and a README."""
    vocab = source_dir() / "models" / "ggml-vocab-llama-spm.gguf"
    repos: dict[str, dict[str, bytes]] = {}
    for seed, name in enumerate(names):
        repo, tag = rendered["library"][name].rsplit(":", 1)
        path = write_tiny_model(vocab, tmp_path / f"{name}.gguf", seed=seed)
        repos[repo] = {f"{repo.split('/')[1].removesuffix('-GGUF')}-{tag}.gguf": path.read_bytes(), "README.md": b"x"}
    return repos


def keeper_env_url(rendered: dict, base: str) -> str:
    """The rendered reload URL on this run's router (loopback, another port)."""
    url = {e["name"]: e["value"] for e in rendered["keeper"]["env"]}["RELOAD_URL"]
    return base + "/" + url.split("/", 3)[3]


def ask(router, name: str):
    """A chat as it reaches the router behind the admission proxy: the proxy has it loaded first (the rendered
    router loads nothing on its own, --no-models-autoload)."""
    router.load(name)
    return router.chat(name)


def one_thread(preset: str) -> str:
    """Threads 1: a 2-core machine runs several children (everything else is the rendered preset)."""
    return "\n".join("threads = 1" if line.startswith("threads =") else line for line in preset.splitlines()) + "\n"


def test_the_router_offers_exactly_the_listed_models_by_their_names(binary, rendered, tmp_path):
    names, library = rendered["names"], rendered["library"]
    root = tmp_path / "pod"
    write_files(rendered, root)
    with hub_repos(tiny_repos(rendered, tmp_path, names)) as endpoint:
        done = run_library(rendered["init"], root, endpoint)
    assert done.returncode == 0, done.stderr
    env = env_under(rendered["container"]["env"], root)
    # The router's --models-preset is the served preset the init container wrote (every model complete).
    args = rendered["container"]["args"]
    assert args[args.index("--models-preset") + 1] == rendered["init_env"]["SERVED_PRESET"]
    preset = served_preset(rendered, root).read_text()
    assert preset == one_thread(rendered["preset"])
    # The init container leaves the keeper a first heartbeat: the keeper's readiness probe (run as
    # rendered, its path under root) passes at once, so the pod is Ready as soon as the router is.
    probe = pod_command(rendered["keeper"]["readinessProbe"]["exec"], programs_under(root))
    assert subprocess.run(probe, env=env_under(rendered["keeper"]["env"], root), timeout=30).returncode == 0
    with start_router(binary, preset, args, {}, TEST_KEY, env=env) as router:
        models = router.models()
        # Every blob is in the volume's hub layout too, and none of it is offered under a cache name.
        assert sorted(m["id"] for m in models) == sorted(names)
        assert {m["source"] for m in models} == {"preset"}
        assert ask(router, names[1]).status == 200
        asked = router.chat(library[names[0]])
        assert asked.status == 400 and b"not found" in asked.body
        # The rendered scrapes, as the scraper sends them: the loaded model answers its metrics; the
        # others answer 400 and stay unloaded (a scrape must never evict a model in use).
        before = router.statuses()
        # The admission proxy's own target (no params) is the proxy's, tested with it (tests/test_admission.py).
        for endpoint in [e for e in rendered_scrapes() if e.get("params")]:
            name = endpoint["params"]["model"][0]
            query = "&".join(f"{k}={v}" for k, values in endpoint["params"].items() for v in values)
            answer = router.get(f"{endpoint['path']}?{query}")
            if before[name] == "loaded":
                assert answer.status == 200 and b"llamacpp:prompt_tokens_total" in answer.body
            else:
                assert answer.status == 400 and b"not loaded" in answer.body
        assert router.statuses() == before and before[names[1]] == "loaded"


def start_keeper(rendered: dict, root: Path, endpoint: str, router, log_path: Path,
                 env_extra: dict | None = None) -> subprocess.Popen:
    """The rendered keeper on this run's router: its env with paths under root, the served preset at
    the file this router reads, one-second rounds."""
    env = {"PATH": os.environ["PATH"], "HF_ENDPOINT": endpoint, **env_under(rendered["keeper"]["env"], root),
           "SERVED_PRESET": str(router.preset), "KEEP_SECONDS": "1", "RELOAD_URL": keeper_env_url(rendered, router.base)}
    key_file = root / "api-key"
    key_file.write_text(TEST_KEY + "\n")
    env["ROUTER_AUTH_FILE"] = str(key_file)
    env.update(env_extra or {})
    command = pod_command(rendered["keeper"], programs_under(root))
    (root / "tmp").mkdir(exist_ok=True)  # the scratch volume
    with open(log_path, "w") as log_file:
        return subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)


@contextlib.contextmanager
def filled_pod(binary, rendered: dict, root: Path, repos: dict):
    """The pod as it starts: its ConfigMap's files under root, the init container's fetch from the stand-in
    Hub, and the router on the served preset, its startup models up; yields (hub endpoint, router)."""
    from components.prefetch import CONTROL_DIR

    write_files(rendered, root)
    (root / CONTROL_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)  # the control volume (proxy, keeper)
    with hub_repos(repos) as endpoint:
        assert run_library(rendered["init"], root, endpoint).returncode == 0
        env = env_under(rendered["container"]["env"], root)
        with start_router(binary, served_preset(rendered, root).read_text(), rendered["container"]["args"], {},
                          TEST_KEY, env=env) as router:
                yield endpoint, router


def section_of(name: str) -> str:
    return f"[{name}]\nthreads = 1\nctx-size = 512\n"


def test_the_keeper_adds_and_removes_models_while_the_others_keep_running(binary, rendered, tmp_path):
    """Day 2 without a restart. The ConfigMap's files change: the keeper fetches what is new, removes
    what is gone, and has the router re-read its preset. A change made before the keeper started (the
    ConfigMap updated between the init container and the keeper) is applied at its start; one made
    while it runs, within a round. The model that was answering keeps its process throughout."""
    names = rendered["names"]
    kept, removed = names[1], names[-1]
    added = "tiny-extra"
    repos = tiny_repos(rendered, tmp_path, names)
    first_repo = next(iter(repos.values()))
    repos["org/Tiny-Extra-GGUF"] = {"Tiny-Extra-Q4_K_M.gguf": next(v for k, v in first_repo.items() if k.endswith(".gguf"))}
    root = tmp_path / "pod"
    with filled_pod(binary, rendered, root, repos) as (endpoint, router):
        assert ask(router, kept).status == 200
        before = router.children()
        # Change 1, before the keeper runs: the ConfigMap without the last model.
        smaller = {n: r for n, r in rendered["library"].items() if n != removed}
        write_files(rendered, root, smaller, rendered["preset"].split(f"[{removed}]")[0])
        log_path = tmp_path / "keeper.log"
        keeper = start_keeper(rendered, root, endpoint, router, log_path)
        try:
            wait_for_models(router, smaller, log_path)
            assert not (library_folder(rendered, root) / removed).exists()
            # Change 2, while it runs: a model added.
            write_files(rendered, root, {**smaller, added: "org/Tiny-Extra-GGUF:Q4_K_M"},
                        rendered["preset"].split(f"[{removed}]")[0] + section_of(added))
            wait_for_models(router, [*smaller, added], log_path)
            assert router.children() == before, log_path.read_text()  # the model that answered kept its process
            assert ask(router, added).status == 200 and ask(router, kept).status == 200
            # The rendered probe (its heartbeat path moved under root) passes while the keeper runs.
            probe = pod_command(rendered["keeper"]["livenessProbe"]["exec"], programs_under(root))
            assert subprocess.run(probe, env=env_under(rendered["keeper"]["env"], root), timeout=30).returncode == 0
        finally:
            keeper.kill()
            keeper.wait()
        log = log_path.read_text()
        assert "applying the library and its preset (at start)" in log and "(changed)" in log, log
        # A keeper that stopped beating fails the probe (the kubelet then restarts it).
        beat = root / "tmp" / "keeper-heartbeat"
        os.utime(beat, (time.time() - 1000, time.time() - 1000))
        assert subprocess.run(probe, timeout=30).returncode == 1


def test_a_model_that_cannot_be_fetched_keeps_none_of_the_others_from_the_router(binary, rendered, tmp_path):
    """A misspelt repo among the listed ones: the init container starts the router with the others and
    says which is missing; the router does not list it (a request for a listed model without files would
    evict a loaded one, then fail); the keeper applies the rest of a later edit and retries the typo
    rarely. Only when nothing at all can be fetched does the init container stop the start."""
    names = rendered["names"][:2]
    repos = tiny_repos(rendered, tmp_path, names)
    library = {names[0]: rendered["library"][names[0]], "typo": "org/No-Such-GGUF:Q4_K_M"}
    preset = rendered["preset"].split(f"[{rendered['names'][1]}]")[0] + section_of("typo")
    root = tmp_path / "pod"
    write_files(rendered, root, library, preset)
    with hub_repos(repos) as endpoint:
        done = run_library(rendered["init"], root, endpoint)
        assert done.returncode == 0, done.stderr
        assert "typo (org/No-Such-GGUF:Q4_K_M) is not served: refused: org/No-Such-GGUF answered 404" in done.stderr
        assert "starting without typo" in done.stdout
        served = served_preset(rendered, root).read_text()
        assert f"[{names[0]}]" in served and "[typo]" not in served
        status = json.loads((library_folder(rendered, root) / ".status.json").read_text())
        assert status["served"] == [names[0]] and list(status["missing"]) == ["typo"]
        env = env_under(rendered["container"]["env"], root)
        with start_router(binary, served, rendered["container"]["args"], {}, TEST_KEY, env=env) as router:
            assert sorted(router.statuses()) == [names[0]]
            # A later edit adds a good model beside the typo: the keeper serves it, leaves the typo out.
            write_files(rendered, root, {**library, names[1]: rendered["library"][names[1]]}, preset + section_of(names[1]))
            log_path = tmp_path / "keeper.log"
            keeper = start_keeper(rendered, root, endpoint, router, log_path)
            try:
                wait_for_models(router, [names[0], names[1]], log_path)
                assert ask(router, names[1]).status == 200
            finally:
                keeper.kill()
                keeper.wait()
            assert "not served yet: typo; trying again in 20 s" in log_path.read_text()
        # Nothing fetchable at all: the start stops, naming each model and why.
        write_files(rendered, root, {"typo": "org/No-Such-GGUF:Q4_K_M"}, section_of("typo"))
        stopped = run_library(rendered["init"], root, endpoint)
        assert stopped.returncode != 0 and "no listed model could be fetched" in stopped.stderr


def wait_for_models(router, names, log_path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while sorted(router.statuses()) != sorted(names) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(router.statuses()) == sorted(names), log_path.read_text()


def test_weights_changed_under_the_same_file_name_are_loaded_anew(binary, rendered, tmp_path):
    """A repo swap that keeps the file name: the router's reload compares only the section's settings
    and would keep the child on the old weights; the keeper unloads it, and the next request loads the
    new file (a new child)."""
    names = rendered["names"]
    target = names[1]
    repos = tiny_repos(rendered, tmp_path, names)
    repo, tag = rendered["library"][target].rsplit(":", 1)
    (file_name,) = [f for f in repos[repo] if f.endswith(".gguf")]
    vocab = source_dir() / "models" / "ggml-vocab-llama-spm.gguf"
    other = write_tiny_model(vocab, tmp_path / "other.gguf", seed=99).read_bytes()
    assert other != repos[repo][file_name]
    repos["org/Other-GGUF"] = {file_name: other, "README.md": b"x"}
    root = tmp_path / "pod"
    with filled_pod(binary, rendered, root, repos) as (endpoint, router):
        assert ask(router, target).status == 200
        old_children = set(router.children())
        write_files(rendered, root, {**rendered["library"], target: f"org/Other-GGUF:{tag}"})
        log_path = tmp_path / "keeper.log"
        keeper = start_keeper(rendered, root, endpoint, router, log_path)
        try:
            deadline = time.monotonic() + 60
            while "new weights under the same file names: unloaded" not in log_path.read_text():
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.5)
        finally:
            keeper.kill()
            keeper.wait()
        linked = library_folder(rendered, root) / target / file_name
        assert linked.read_bytes() == other
        # The keeper says so once the router answers the unload; the child exits after (7-14 ms idle, up to the
        # router's stop timeout): the status follows.
        router.wait_status(target, ("unloaded",), seconds=30)
        assert ask(router, target).status == 200
        # A new child for it (the others, e.g. the model loaded at start, keep theirs).
        assert set(router.children()) != old_children and len(router.children()) == len(old_children)


def test_a_model_larger_than_planned_is_never_offered(binary, rendered, tmp_path):
    """Sizes checked at run time (issue #43 item 5): the rendered library says how many bytes the plan counted
    for each model's files; a model whose real files (the Hub's listing, then the blob on the volume) are more
    than that is kept out of the router's folder and its served preset, said in the status the admission proxy
    exports, and the router really does not list it; the others are served. A plan that shrinks a model already
    on the volume removes it from the folder too."""
    assert all(entry["planned_bytes"] > 0 for entry in json.loads(rendered["files"]["library.json"]).values())
    names = rendered["names"][:2]
    repos = tiny_repos(rendered, tmp_path, names)
    sizes = {name: len(next(v for k, v in repos[rendered["library"][name].rsplit(":", 1)[0]].items() if k.endswith(".gguf")))
             for name in names}
    library = {names[0]: {"hf_repo": rendered["library"][names[0]], "mmproj": False, "planned_bytes": sizes[names[0]] * 2},
               names[1]: {"hf_repo": rendered["library"][names[1]], "mmproj": False, "planned_bytes": sizes[names[1]] // 2}}
    preset = rendered["preset"].split(f"[{rendered['names'][2]}]")[0]
    root = tmp_path / "pod"
    write_files(rendered, root, library, preset)
    with hub_repos(repos) as endpoint:
        done = run_library(rendered["init"], root, endpoint)
        assert done.returncode == 0, done.stderr
        assert f"{names[1]} ({rendered['library'][names[1]]}) is not served: refused: larger than planned" in done.stderr
        served = served_preset(rendered, root).read_text()
        assert f"[{names[0]}]" in served and f"[{names[1]}]" not in served
        assert not (library_folder(rendered, root) / names[1]).exists()
        status_path = Path(env_under(rendered["init"]["env"], root)["LIBRARY_STATUS"])
        status = json.loads(status_path.read_text())
        assert status["served"] == [names[0]] and status["missing"][names[1]].startswith("refused: larger than planned")
        env = env_under(rendered["container"]["env"], root)
        with start_router(binary, served, rendered["container"]["args"], {}, TEST_KEY, env=env) as router:
            assert sorted(router.statuses()) == [names[0]]
        # The plan shrinks the model that was served: the next fetch takes it out of the folder.
        library[names[0]]["planned_bytes"] = sizes[names[0]] // 2
        write_files(rendered, root, library, preset)
        done = run_library(rendered["init"], root, endpoint)
    assert done.returncode != 0 and "larger than planned" in done.stderr
    assert not (library_folder(rendered, root) / names[0]).exists()


def test_a_restart_with_a_model_added_waits_for_no_download(rendered, tmp_path):
    """Issue #48 item 1: a pod that starts with models on its volume (a restart, a library edit) serves them at
    once; the model just added is left to the keeper (a 503 with Retry-After until it is fetched). The init
    container does not ask the Hub at all; only on an empty volume (the first start) does it fetch first."""
    names = rendered["names"][:2]
    repos = tiny_repos(rendered, tmp_path, names)
    first = {names[0]: rendered["library"][names[0]]}
    preset = rendered["preset"].split(f"[{rendered['names'][2]}]")[0]
    root = tmp_path / "pod"
    write_files(rendered, root, first, preset)
    log: list[str] = []
    with hub_repos(repos, log=log) as endpoint:
        assert run_library(rendered["init"], root, endpoint).returncode == 0  # the first start: fetched first
        asked = len(log)
        assert asked > 0
        write_files(rendered, root, {**first, names[1]: rendered["library"][names[1]]}, preset)
        done = run_library(rendered["init"], root, endpoint)
    assert done.returncode == 0, done.stderr
    assert len(log) == asked, log[asked:]  # the restart asked the Hub nothing
    served = served_preset(rendered, root).read_text()
    assert f"[{names[0]}]" in served and f"[{names[1]}]" not in served
    status = json.loads(Path(env_under(rendered["init"]["env"], root)["LIBRARY_STATUS"]).read_text())
    assert status["served"] == [names[0]] and "the keeper fetches it" in status["missing"][names[1]]


def completion_stream(base: str, model: str, tokens: int) -> socket.socket:
    """A long streamed generation through the proxy (llama.cpp's own /completion: the tiny model's random text
    trips the OpenAI endpoints' output checks); the caller reads it."""
    # n_probs: each event carries the top 200 candidates (~18 KB), so 2000 tokens (~36 MB) outweigh every
    # buffer on the way (proxy, router, its child: more than 11 MB here). The grammar keeps the random model's text to letters and spaces, which
    # the server's output parser accepts (stray bytes end the stream with a 500).
    body = json.dumps({"model": model, "prompt": "count", "n_predict": tokens, "stream": True, "ignore_eos": True,
                       "temperature": 0, "seed": 0, "n_probs": 200, "grammar": "root ::= [a-z ]+"}).encode()
    host, port = base.removeprefix("http://").split(":")
    s = socket.socket()
    # A small window: while the test does not read, the answer backs up to the router and the request stays in
    # flight however fast the tiny model generates.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(120)
    s.connect((host, int(port)))
    s.sendall(f"POST /completion HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_KEY}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def test_a_settings_change_drains_its_model_so_no_request_in_flight_is_cut(binary, rendered, tmp_path):
    """Issue #48 item 2, on the real router: a model's settings change (its section of the preset) while a long
    generation on it streams through the admission proxy. The keeper drains that model at the proxy first (new
    requests for it: 503 with Retry-After; the one in flight runs to its last chunk), has the router re-read
    its preset (which unloads only that model), and resumes it: its next request loads the new settings. The
    other model's child keeps running throughout."""
    from lab.contract.pod_programs import admission_proxy
    from lab.contract.server import free_port, request

    names = rendered["names"]
    target, other = names[1], names[0]
    root = tmp_path / "pod"
    with filled_pod(binary, rendered, root, tiny_repos(rendered, tmp_path, names)) as (endpoint, router):
        proxy_spec = next(c for c in rendered["pod"]["containers"] if c["name"] == "admission")
        key_file = root / "api-key"
        key_file.write_text(TEST_KEY + "\n")
        control = root / "tmp" / "admission-control.sock"
        (root / "tmp").mkdir(exist_ok=True)
        env = {"PATH": os.environ["PATH"], **env_under(proxy_spec["env"], root), "LISTEN_PORT": str(free_port()),
               "LISTEN_HOST": "127.0.0.1", "ROUTER_URL": router.base, "ROUTER_AUTH_FILE": str(key_file),
               "ADMISSION_CONTROL": str(control)}
        with admission_proxy(proxy_spec, programs_under(root), env, tmp_path) as (base, _, proxy_log):
            log_path = tmp_path / "keeper.log"
            keeper = start_keeper(rendered, root, endpoint, router, log_path, {"ADMISSION_CONTROL": str(control)})
            try:
                wait_until(lambda: "re-read its preset" in log_path.read_text(), "the keeper's first round", log_path)
                auth = {"Authorization": f"Bearer {TEST_KEY}"}
                chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                assert request(base + "/v1/chat/completions", {"model": other, **chat}, auth, timeout=120).status == 200
                other_child = router.children()
                stream = completion_stream(base, target, 2000)
                data = b""
                while b"data: " not in data:
                    data += stream.recv(65536)
                # The edit: the target's context size (its section's last line overrides the one above it).
                preset = one_thread(rendered["preset"])
                head, rest = preset.split(f"[{target}]\n", 1)
                body, sep, tail = rest.partition("\n[")
                write_files(rendered, root, None, f"{head}[{target}]\n{body.rstrip()}\nctx-size = 1024\n" +
                            (f"\n[{tail}" if sep else ""))
                # Drained at the proxy while its generation still streams: a new request for it is a 503.
                def refused() -> bool:
                    answer = request(base + "/v1/chat/completions", {"model": target, **chat}, auth, timeout=30)
                    return answer.status == 503 and answer.headers.get("Retry-After") == "5"
                wait_until(refused, "the target was never drained", log_path)
                assert len(data) > 0 and not data.endswith(b"\r\n0\r\n\r\n")
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)  # now read the rest at full speed
                while not data.endswith(b"\r\n0\r\n\r\n"):
                    chunk = stream.recv(65536)
                    assert chunk, f"the stream was cut: {data[-300:]!r}"
                    data += chunk
                stream.close()
                # Every token arrived and the last event is the generation's own end, not an error: llama.cpp's final
                # event says it stopped at the limit with all 2000 tokens (one event a token; the last token may ride
                # in the final event, so 2000 or 2001 events: a full run once saw 2000).
                last = data.rsplit(b"data: ", 1)[1]
                assert data.startswith(b"HTTP/1.1 200") and data.count(b"data: ") in (2000, 2001), data[-300:]
                assert b'"stop":true' in last and b'"error"' not in last, last[-300:]
                assert b'"stop_type":"limit"' in last and b'"tokens_predicted":2000' in last, last[-300:]
                # The proxy drained while that request was in flight (the case this test is for).
                # (At least the stream: a probe of the test's own may have been in flight at that moment too.)
                drained = re.search(rf"{re.escape(target)}: drained for a reload: (\d+) request\(s\) in flight, 0 after",
                                    proxy_log.read_text())
                assert drained and int(drained.group(1)) >= 1, proxy_log.read_text()
                wait_until(lambda: f"keeper: {target}: drained" in log_path.read_text()
                           and log_path.read_text().count("re-read its preset") >= 2, "the keeper's reload", log_path)
                # Resumed: the next request loads the model anew, with the new settings; the other model's child
                # never stopped.
                wait_until(lambda: request(base + "/v1/chat/completions", {"model": target, **chat}, auth,
                                           timeout=120).status == 200, "the target was never admitted again", log_path)
                assert "ctx-size = 1024" in router.preset.read_text()
                assert set(other_child) <= set(router.children())
            finally:
                keeper.kill()
                keeper.wait()


def wait_until(condition, what: str, log_path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s\n{log_path.read_text()[-2000:]}"
        time.sleep(0.2)


# --- the change preview's statement for each library edit, held against the keeper and the real router -----

def _drop_14b(c: dict) -> None:
    library_models(c).pop("qwen3-14b")
    routes = c["inference-plane:gateway"]["routes"]
    routes[:] = [r for r in routes if r["model"] != "qwen3-14b"]


def _drop_the_pinned(c: dict) -> None:
    library_models(c).pop("qwen3-8b")
    library_models(c)["llama-3.1-8b"]["pinned"] = True
    routes = c["inference-plane:gateway"]["routes"]
    routes[:] = [r for r in routes if r["model"] != "qwen3-8b"]


def _move_pin(c: dict) -> None:
    library_models(c)["qwen3-8b"].pop("pinned")
    library_models(c)["llama-3.1-8b"]["pinned"] = True


LIBRARY_EDITS = {  # issue #48's edit kinds on rtx3090-library
    "a model's context": lambda c: library_models(c)["gemma-3-12b"].update(ctx_size=8192),
    "the pinned model's context": lambda c: library_models(c)["qwen3-8b"].update(ctx_size=8192),
    "a requant": lambda c: library_models(c)["llama-3.1-8b"].update(hf_repo="bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q5_K_M"),
    "a model removed": _drop_14b,
    "the pinned model removed": _drop_the_pinned,
    "a model added": lambda c: library_models(c).update({"qwen3-4b": {"hf_repo": "Qwen/Qwen3-4B-GGUF:Q4_K_M"}}),
    "the pin moved": _move_pin,
}


def library_models(config: dict) -> dict:
    return config["inference-plane:models"][KEY]["on_demand"]["models"]


@pytest.mark.parametrize("what", list(LIBRARY_EDITS))
def test_the_preview_says_which_models_a_library_edit_unloads_and_the_router_agrees(binary, tmp_path, what):
    """Issue #48 item 3: for each edit kind, the change preview's per-model statement (changes/library.py) is
    held against what happens: the pod runs the stack before the edit with every model loaded; the edited
    stack's ConfigMap files replace the mounted ones; the rendered keeper applies them to the real router.
    Exactly the models the preview says unload are no longer running (a dropped one is no longer listed), a
    model it says is added is listed, and every other model keeps its child."""
    import copy

    from changes import preview
    from changes.provider import options_from_config
    from conftest import run_stack_file, stack_file_config

    config = stack_file_config(STACK)
    edited = copy.deepcopy(config)
    LIBRARY_EDITS[what](edited)
    secrets = {k.split(":", 1)[1]: f"{k}-value" for k, v in config.items() if isinstance(v, dict) and "secure" in v}
    before_run, after_run = run_stack_file(STACK, config, secrets), run_stack_file(STACK, edited, secrets)
    report = preview(before_run, after_run, options_from_config(edited))
    assert not report.of_kind("restart") and not report.of_kind("downtime")
    effects = report.library[before_run.config.models[KEY].name]
    before, after = rendered_pod(before_run), rendered_pod(after_run)
    said_unloaded = sorted(e.model for e in effects if e.unloads)
    said_added = sorted(e.model for e in effects if e.change == "added")

    repos = every_tiny_repo(tmp_path, [before["library"], after["library"]])
    root = tmp_path / "pod"
    with filled_pod(binary, before, root, repos) as (endpoint, router):
        for name in before["names"]:
            router.load(name)
        children = set(router.children())
        # The edited stack's files where the kubelet puts them; the keeper applies them.
        write_files(before, root, files=after["files"])
        log_path = tmp_path / "keeper.log"
        keeper = start_keeper(before, root, endpoint, router, log_path)
        try:
            wait_until(lambda: "re-read its preset" in log_path.read_text(), "the keeper's round", log_path)
            statuses = router.statuses()
        finally:
            keeper.kill()
            keeper.wait()
        unloaded = sorted(n for n in before["names"] if statuses.get(n) != "loaded")
        assert unloaded == said_unloaded, (effects, statuses, log_path.read_text())
        assert sorted(set(statuses) - set(before["names"])) == said_added
        assert all(n not in statuses for n in said_unloaded if n not in after["names"])  # dropped: not listed
        kept = len(before["names"]) - len(unloaded)
        assert len(children & set(router.children())) == kept  # the others kept their processes


def every_tiny_repo(tmp_path: Path, libraries: list[dict[str, str]]) -> dict[str, dict[str, bytes]]:
    """A stand-in Hub repo per repo any of the libraries names, a tiny GGUF per tag (so a requant is other
    weights in the same repo)."""
    vocab = source_dir() / "models" / "ggml-vocab-llama-spm.gguf"
    repos: dict[str, dict[str, bytes]] = {}
    sources = sorted({source for library in libraries for source in library.values()})
    for seed, source in enumerate(sources):
        repo, tag = source.rsplit(":", 1)
        path = write_tiny_model(vocab, tmp_path / f"tiny-{seed}.gguf", seed=seed)
        repos.setdefault(repo, {"README.md": b"x"})[f"{repo.split('/')[1].removesuffix('-GGUF')}-{tag}.gguf"] = path.read_bytes()
    return repos


def test_a_server_moved_out_of_the_library_starts_once_the_router_has_made_room(binary, tmp_path):
    """Issue #48 item 4, on the real router with its rendered proxy and keeper: qwen3-14b moves out of the
    library to a server of its own on the shared card. Before the router's pod has the new plan, the moved
    server's rendered wait (incluster/room.py) holds it back (the router holds the pinned model and qwen3-14b,
    past the budget that leaves the new server room); once the new files are mounted, the keeper reloads,
    the proxy reads the smaller budget, and the wait lets the server start, and only then: at that moment
    what the router runs fits the new budget."""
    from lab.contract.pod_programs import admission_proxy
    from lab.contract.server import free_port, request
    from render.manifests import manifests

    from conftest import router_move_configs, run_stack_file

    base, moved, secrets = router_move_configs()
    before_run, after_run = run_stack_file(STACK, base, secrets), run_stack_file(STACK, moved, secrets)
    before, after = rendered_pod(before_run), rendered_pod(after_run)
    objects = list(manifests(after_run).values())
    (server,) = [m["spec"]["template"]["spec"] for m in objects if m["kind"] == "Deployment" and m["metadata"]["name"] == "qwen14"]
    (programs,) = [m for m in objects if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "qwen14-programs"]
    room = server["initContainers"][0]
    new_plan = json.loads(after["files"]["admission.json"])
    root = tmp_path / "pod"
    with filled_pod(binary, before, root, every_tiny_repo(tmp_path, [before["library"]])) as (endpoint, router):
        proxy_spec = next(c for c in before["pod"]["containers"] if c["name"] == "admission")
        (root / "api-key").write_text(TEST_KEY + "\n")
        env = {"PATH": os.environ["PATH"], **env_under(proxy_spec["env"], root), "LISTEN_PORT": str(free_port()),
               "LISTEN_HOST": "127.0.0.1", "ROUTER_URL": router.base, "ROUTER_AUTH_FILE": str(root / "api-key"),
               "PIN_CHECK_SECONDS": "1"}
        with admission_proxy(proxy_spec, programs_under(root), env, tmp_path) as (base_url, _, proxy_log):
            log_path = tmp_path / "keeper.log"
            keeper = start_keeper(before, root, endpoint, router, log_path)
            wait_log = tmp_path / "room.log"
            try:
                chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                auth = {"Authorization": f"Bearer {TEST_KEY}"}
                assert request(base_url + "/v1/chat/completions", {"model": "qwen3-14b", **chat}, auth,
                               timeout=120).status == 200
                published = Path(env_under(room["env"], root)["ROOM_STATUS"])
                wait_until(lambda: published.exists() and json.loads(published.read_text())["resident_vram_gib"]
                           > new_plan["vram_budget_gib"], "the keeper never published a full router", log_path)
                room_root = write_programs(programs, server, tmp_path / "room-programs")
                room_env = {"PATH": os.environ["PATH"], **env_under(room["env"], root), "ROOM_WAIT_SECONDS": "120",
                            "ROOM_BUDGET_FILE": str(room_root / "room.json")}
                with open(wait_log, "w") as out:
                    waiting = subprocess.Popen(pod_command(room, room_root), env=room_env, stdout=out,
                                               stderr=subprocess.STDOUT)
                time.sleep(4)
                assert waiting.poll() is None, wait_log.read_text()  # held back: the router is full
                assert "qwen3-14b" in router.running()
                # The new files mounted (the kubelet's refresh): the keeper and the proxy apply them.
                write_files(before, root, files=after["files"])
                assert waiting.wait(timeout=90) == 0, wait_log.read_text()
                running = router.running()
                held = sum(new_plan["models"].get(n, {"vram_gib": float("inf")})["vram_gib"] for n in running)
                assert held <= new_plan["vram_budget_gib"], (running, wait_log.read_text())
                assert "within its budget" in wait_log.read_text() and "waiting" in wait_log.read_text()
            finally:
                keeper.kill()
                keeper.wait()


def test_a_model_the_hub_refuses_is_not_listed_by_the_router_even_with_its_files_on_the_volume(binary, rendered, tmp_path):
    """A model fetched before whose repo the Hub now refuses (a rotated token, a repo gone gated or deleted): the
    keeper leaves it out of the served preset, and its folder too, since the router also lists every folder
    of its --models-dir and would load it there with llama.cpp's defaults, outside the plan (found by a review).
    Its blobs stay in the hub cache; the others keep serving."""
    names = rendered["names"][:2]
    library = {n: rendered["library"][n] for n in names}
    preset = rendered["preset"].split(f"[{rendered['names'][2]}]")[0]
    repos = tiny_repos(rendered, tmp_path, names)
    root = tmp_path / "pod"
    write_files(rendered, root, library, preset)
    gone_repo = library[names[1]].rsplit(":", 1)[0]
    with hub_repos(repos) as endpoint:
        assert run_library(rendered["init"], root, endpoint).returncode == 0
    assert (library_folder(rendered, root) / names[1]).is_dir()
    env = env_under(rendered["container"]["env"], root)
    with start_router(binary, served_preset(rendered, root).read_text(), rendered["container"]["args"], {}, TEST_KEY,
                      env=env) as router:
        assert sorted(router.statuses()) == sorted(names)
        with hub_repos({r: files for r, files in repos.items() if r != gone_repo}) as endpoint:
            log_path = tmp_path / "keeper.log"
            keeper = start_keeper(rendered, root, endpoint, router, log_path)
            try:
                wait_until(lambda: "not served yet" in log_path.read_text(), "the keeper's round", log_path)
                wait_for_models(router, [names[0]], log_path)
            finally:
                keeper.kill()
                keeper.wait()
        assert not (library_folder(rendered, root) / names[1]).exists()
        assert names[1] not in router.statuses()  # not even from --models-dir
        assert ask(router, names[0]).status == 200
