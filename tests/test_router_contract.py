"""Contract tests of llama-server's router mode (models on demand) against the real pinned build.

The preset and the router's arguments come from router_cases(), the one place that says what to run;
the models are tiny random-weight GGUFs written at test time, one per model name. What the router does
(and what these tests hold it to) is written down with source citations in lab/contract/ROUTER_FACTS.md.
"""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest



from lab.llama_build import source_dir
from lab.contract.router import models_max, start_router, wait_gone
from lab.contract.tiny_model import write_tiny_model

TEST_KEY = "router-contract-key-1"


# What the rendered router runs with that these tests change, and why: each model's weights become a
# tiny GGUF (start_router), threads 1 (a 2-core machine runs several children), and --sleep-idle-seconds
# a few seconds (the rendered 600 s would make the idle test wait ten minutes). Everything else is the
# rendered preset and command line.
SUBSTITUTED = {"threads": "1"}
IDLE_SECONDS = "3"
# The first three models of each router's preset (its pinned ones among them when listed first): three
# models under the rendered limit exercise every eviction path; five made the run minutes longer.
MODELS_RUN = 3


def router_cases() -> list[tuple[str, str, list[str], list[str], str | None]]:
    """(id, preset_text, router args, model names, api key) for every router of every shipped stack:
    the preset from its rendered ConfigMap and the args from its rendered Deployment."""
    from render.manifests import manifests
    from render.offline import run_stack
    from conftest import STACKS

    found = []
    for stack in STACKS:
        try:
            run = run_stack(stack)
        except Exception:  # noqa: BLE001 - a stack that does not render fails its own tests
            continue
        files = list(manifests(run).values())
        for key, model in run.config.models.items():
            if model.on_demand is None:
                continue
            (workload,) = [m for m in files if m["kind"] == "Deployment" and m["metadata"]["name"] == model.workload_name]
            (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == model.name]
            (config_map,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-files"]
            preset = config_map["data"]["models.ini"]
            names = list(model.on_demand.models)[:MODELS_RUN]
            lines, section = [], None
            for line in preset.splitlines():
                if line.startswith("["):
                    section = line.strip("[] ")
                if section is not None and section not in names:
                    continue
                name = line.split("=", 1)[0].strip()
                lines.append(f"{name} = {SUBSTITUTED[name]}" if name in SUBSTITUTED else line)
            args = list(container["args"])
            if "--sleep-idle-seconds" in args:
                args[args.index("--sleep-idle-seconds") + 1] = IDLE_SECONDS
            # The router never evicts or loads on its own: no count, no autoload (the admission proxy decides).
            assert args[args.index("--models-max") + 1] == "0" and "--no-models-autoload" in args
            found.append((f"{stack}/{key}", "\n".join(lines) + "\n", args, names, TEST_KEY))
    return found


CASES = router_cases()


@pytest.fixture(scope="session")
def gguf_folder(tmp_path_factory, binary) -> Path:
    return tmp_path_factory.mktemp("router-gguf")


def tiny_models(folder: Path, names: list[str]) -> dict[str, Path]:
    vocab = source_dir() / "models" / "ggml-vocab-llama-spm.gguf"
    out = {}
    for seed, name in enumerate(names):
        path = folder / f"{name}.gguf"
        if not path.exists():
            write_tiny_model(vocab, path, seed=seed)
        out[name] = path
    return out


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def case(request, binary, gguf_folder):
    _, preset, args, names, key = request.param
    return binary, preset, args, tiny_models(gguf_folder, names), key


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_with_the_rendered_flags_the_router_neither_loads_nor_unloads_a_model_of_its_own(case):
    """What the admission proxy relies on: with --no-models-autoload a request for a model that is not
    running is answered 400 at once and loads nothing, unless it asks ?autoload=true (which is why the proxy
    refuses that parameter); with --models-max 0 every model loaded stays running (b10729 evicts only past
    a count, ROUTER_FACTS.md b); only an unload takes one away, and /models reads it running until its child
    has exited."""
    binary, preset, args, models, key = case
    assert models_max(args) == 0
    first = next(iter(models))
    with start_router(binary, preset, args, models, key) as router:
        answer = router.chat(first)
        assert answer.status == 400 and b"model is not loaded" in answer.body, answer.body[:200]
        assert router.running() == [] and router.children() == []
        answer = router.post("/v1/chat/completions?autoload=true", {"model": first, "messages": [], "max_tokens": 1})
        assert router.statuses()[first] in ("loading", "loaded"), "?autoload=true loads past --no-models-autoload"
        router.wait_status(first, ("loaded",))
        for name in models:
            router.load(name)
        for name in models:
            assert router.chat(name).status == 200
        assert router.running() == sorted(models)
        victim = next(iter(models))
        assert router.post("/models/unload", {"model": victim}).status == 200
        router.wait_status(victim, ("unloaded",))
        assert len(router.children()) == len(models) - 1, "the unloaded child has exited once /models says unloaded"


def test_idle_seconds_put_a_model_to_sleep_and_a_request_wakes_it(case):
    """--sleep-idle-seconds is passed on to every child: an idle child frees its model but its process
    stays, and the router shows it as "sleeping" (still counted against --models-max)."""
    binary, preset, args, models, key = case
    idle = flag(args, "--sleep-idle-seconds")
    if idle is None or int(idle) < 0:
        pytest.skip("no --sleep-idle-seconds")
    name = next(iter(models))
    with start_router(binary, preset, args, models, key) as router:
        router.load(name)
        assert router.chat(name).status == 200
        pids = router.children()
        assert len(pids) == 1
        router.wait_status(name, ("sleeping",), seconds=int(idle) + 60)
        assert router.children() == pids, "a sleeping model keeps its child process"
        assert name in router.running()
        answer = router.chat(name)
        assert answer.status == 200, answer.body[:200]
        assert router.statuses()[name] == "loaded"
        assert router.children() == pids


def test_the_api_key_guards_every_endpoint_but_health(case):
    binary, preset, args, models, key = case
    if key is None:
        pytest.skip("no API key")
    name = list(models)[-1]  # not loaded at start (a pinned model loads when the router starts)
    chat_body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    gets = ["/models", "/v1/models", "/props", f"/props?model={name}", f"/metrics?model={name}", f"/slots?model={name}"]
    posts = [("/v1/chat/completions", chat_body), ("/chat/completions", chat_body),
             ("/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 2}),
             ("/models/load", {"model": name}), ("/models/unload", {"model": name})]
    with start_router(binary, preset, args, models, key) as router:
        for path in ("/health", "/v1/health"):
            assert router.get(path, auth=False).status == 200, path
        wrong = {"Authorization": "Bearer not-the-key"}
        for path in gets:
            assert router.get(path, auth=False).status == 401, path
            assert router.get(path, auth=False, headers=wrong).status == 401, path
        for path, body in posts:
            assert router.post(path, body, auth=False).status == 401, path
            assert router.post(path, body, auth=False, headers=wrong).status == 401, path
        assert router.statuses()[name] == "unloaded", "a refused request must not load its model"
        # With the key (Bearer, or the X-Api-Key header): each answers.
        router.load(name)
        assert router.chat(name).status == 200
        assert router.post("/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 2, **{"temperature": 0}},
                           auth=False, headers={"X-Api-Key": key}).status == 200
        for path in gets:
            answer = router.get(path)
            assert answer.status == (200 if "/metrics" not in path or "--metrics" in args else 501), (path, answer.body[:200])
        assert router.post("/models/unload", {"model": name}).status == 200
        router.wait_status(name, ("unloaded",))
        assert router.post("/models/load", {"model": name}).status == 200
        router.wait_status(name, ("loaded",))


def test_metrics_are_per_model_through_the_router(case):
    binary, preset, args, models, key = case
    if "--metrics" not in args:
        pytest.skip("no --metrics")
    first, second = list(models)[:2]
    with start_router(binary, preset, args, models, key) as router:
        assert router.get("/metrics").status == 400, "the router has no metrics of its own: ?model= is required"
        # A scrape that must not load a model says so; one without autoload=false loads it.
        assert router.get(f"/metrics?model={second}&autoload=false").status == 400
        assert router.statuses()[second] == "unloaded"
        router.load(first)
        assert router.chat(first).status == 200
        answer = router.get(f"/metrics?model={first}")
        assert answer.status == 200
        text = answer.body.decode()
        assert "llamacpp:prompt_tokens_total" in text and "llamacpp:requests_processing" in text, text[:300]


def test_a_request_for_a_loading_model_is_held_until_it_is_up(case):
    """No 503 while a model loads: a request for a model the proxy has had loaded, which is still loading,
    waits (LLAMA_SERVER_DEBUG_FAKE_TIMING makes the router add 2 s to each load and each proxied request, so
    the wait is long enough to watch); /health stays 200 throughout."""
    binary, preset, args, models, key = case
    name = next(iter(models))
    with start_router(binary, preset, args, models, key, env={"LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}) as router:
        health: list[int] = []
        result = {}

        def ask():
            started = time.monotonic()
            router.load(name)
            result["answer"] = router.chat(name)
            result["seconds"] = time.monotonic() - started

        t = threading.Thread(target=ask)
        t.start()
        while t.is_alive():
            health.append(router.get("/health", auth=False).status)
            time.sleep(0.1)
        t.join()
        assert result["answer"].status == 200, result["answer"].body[:200]
        assert result["seconds"] >= 2
        assert set(health) == {200}


def test_a_model_that_cannot_load_shows_failed(case):
    """A load that fails: /models shows it unloaded with failed: true and the exit code (what the proxy reads
    to answer its waiting requests 500 and count the failure); an unknown name is a 400."""
    binary, preset, args, models, key = case
    broken = preset + "\n[broken-model]\nmodel = /nonexistent/broken.gguf\n"
    with start_router(binary, broken, args, models, key) as router:
        assert router.post("/models/load", {"model": "broken-model"}).status == 200
        deadline = time.monotonic() + 60
        while True:
            (entry,) = [m for m in router.models() if m["id"] == "broken-model"]
            if entry["status"].get("failed"):
                break
            assert time.monotonic() < deadline, entry
            time.sleep(0.1)
        assert entry["status"]["value"] == "unloaded" and entry["status"]["exit_code"] != 0
        assert router.chat("no-such-model").status == 400


def test_a_preset_change_needs_a_reload_not_a_restart_and_spares_running_models(case):
    binary, preset, args, models, key = case
    first, added = next(iter(models)), "added-model"
    with start_router(binary, preset, args, models, key) as router:
        router.load(first)
        assert router.chat(first).status == 200
        pids = router.children()
        router.write_preset(router.preset.read_text() + f"\n[{added}]\nmodel = {models[first]}\n")
        assert added not in router.statuses(), "the router does not watch the preset file"
        assert router.chat(added).status == 400
        statuses = router.statuses(reload=True)  # GET /models?reload=1 re-reads it
        assert statuses[added] == "unloaded"
        assert statuses[first] in ("loaded", "sleeping") and router.children() == pids
        router.load(added)
        assert router.chat(added).status == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopping_the_router_stops_its_models(case, sig):
    binary, preset, args, models, key = case
    with start_router(binary, preset, args, models, key) as router:
        for name in list(models)[:2]:
            router.load(name)
            assert router.chat(name).status == 200
        pids = router.children()
        assert pids
        router.proc.send_signal(sig)
        router.proc.wait(timeout=60)
        assert wait_gone(pids, seconds=30) == [], "children outlived the router"


def _ingress_paths(stack: str, service: str) -> list[tuple[str, str]]:
    from render.manifests import manifests
    from render.offline import run_stack

    files = list(manifests(run_stack(stack)).values())
    return [(p["pathType"], p["path"]) for m in files if m["kind"] == "Ingress"
            for rule in m["spec"]["rules"] for p in rule["http"]["paths"] if p["backend"]["service"]["name"] == service]


def test_the_routers_ingress_passes_every_inference_path_it_serves_and_none_of_its_management(case):
    """Every path the rendered Ingress routes is one the real router serves (not its 404), exact; the
    management endpoints the router really answers for any key holder (load, unload, the download at
    POST /models) are not among them."""
    binary, preset, args, models, key = case
    stack = next(c[0] for c in CASES if c[1] == preset).split("/")[0]
    paths = _ingress_paths(stack, "llama-library")
    assert paths and all(kind == "Exact" for kind, _ in paths)
    name = next(iter(models))
    messages = [{"role": "user", "content": "hi"}]
    bodies = {"/tokenize": {"model": name, "content": "hi"}, "/detokenize": {"model": name, "tokens": [1]},
              "/completion": {"model": name, "prompt": "hi", "n_predict": 1},
              "/completions": {"model": name, "prompt": "hi", "max_tokens": 1},
              "/v1/completions": {"model": name, "prompt": "hi", "max_tokens": 1},
              "/infill": {"model": name, "input_prefix": "a", "input_suffix": "b", "n_predict": 1},
              "/v1/responses": {"model": name, "input": "hi", "max_output_tokens": 1},
              "/responses": {"model": name, "input": "hi", "max_output_tokens": 1}}
    with start_router(binary, preset, args, models, key) as router:
        router.load(name)
        for _, path in paths:
            if path in ("/v1/models", "/health"):
                answer = router.get(path)
            else:
                answer = router.post(path, bodies.get(path, {"model": name, "messages": messages, "max_tokens": 1}))
            assert answer.status != 404, (path, answer.body[:200])
        # A client behind the Ingress sees each model's state at /v1/models (docs/models-on-demand.md).
        listed = {m["id"]: m["status"]["value"] for m in router.get("/v1/models").json()["data"]}
        assert set(listed) == set(models) and listed[name] == "loaded"
        # What the Ingress keeps out is real: any key holder may load and unload models here.
        assert router.post("/models/unload", {"model": name}).status == 200
        router.wait_status(name, ("unloaded",))
        assert router.post("/models/load", {"model": name}).status == 200
    routed = {path for _, path in paths}
    assert not routed & {"/models", "/models/load", "/models/unload", "/models/sse", "/slots", "/props", "/metrics",
                         "/lora-adapters", "/"}


def test_the_models_a_reload_unloads_are_those_the_keeper_drains(case):
    """incluster/preset.py says which running models a new preset reloads (the keeper drains exactly those
    through the admission proxy first, and the change preview names them): held against the real router's
    reload. A changed setting unloads its model; a comment, blanks or CRLF line ends unload nothing; a global
    [*] setting unloads every model it reaches, not one whose own section overrides it."""
    from incluster import preset

    binary, text, args, models, key = case
    names = list(models)[:3]
    with start_router(binary, text, args, models, key) as router:
        first = router.preset.read_text()
        own_top_k = at_section_end(first, names[2], "top-k = 40")
        edits = [  # (the preset the router runs, the new one, the models said to reload, those said removed)
            (first, at_section_end(first, names[0], "ctx-size = 1024"), [names[0]], []),
            (first, at_section_end(first, names[1], "; a note\n   \n# another").replace("\n", "\r\n"), [], []),
            (first, without_section(first, names[1]), [], [names[1]]),
            # A section given twice starts over (llama.cpp's loader): the second, shorter one is names[1]'s settings.
            (first, first + f"\n[{names[1]}]\nthreads = 1\n", [names[1]], []),
            (own_top_k, "[*]\ntop-k = 7\n" + own_top_k, None, []),
        ]
        for old, new, expected, expected_gone in edits:
            router.write_preset(old)
            router.statuses(reload=True)
            for name in names:
                router.load(name)
            said, gone = preset.reloaded(old, new), preset.removed(old, new)
            if expected is not None:
                assert said == sorted(expected)
            assert gone == expected_gone
            router.write_preset(new)
            statuses = router.statuses(reload=True)
            unloaded = sorted(n for n in names if statuses.get(n, "gone") != "loaded")
            assert unloaded == sorted(n for n in said + gone if n in names), (new, statuses)
            assert all(n not in statuses for n in gone), statuses  # forgotten, not only unloaded
        # The global edit reached the first two and spared the third (its own section sets top-k).
        assert names[0] in said and names[1] in said and names[2] not in said


def without_section(text: str, section: str) -> str:
    head, rest = text.split(f"[{section}]\n", 1)
    _, sep, tail = rest.partition("\n[")
    return head + (f"[{tail}" if sep else "")


def at_section_end(text: str, section: str, lines: str) -> str:
    """The preset with ``lines`` added as the last of a section's (a key there overrides one set before it)."""
    head, rest = text.split(f"[{section}]\n", 1)
    body, sep, tail = rest.partition("\n[")
    return f"{head}[{section}]\n{body.rstrip()}\n{lines}\n" + (f"\n[{tail}" if sep else "")
