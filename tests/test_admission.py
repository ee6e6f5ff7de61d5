"""The admission proxy (incluster/admission_proxy.py) in front of the real router (b10729), both run from
the shipped library stack's rendered pod: the router's container args, the proxy's rendered command run
from the rendered programs ConfigMap (lab/contract/pod_programs.py), and the ConfigMap's admission.json.
Only what cannot exist here is substituted (lab/contract/router.py): each model is a tiny GGUF under its
public name, loopback ports, the key file. The plan's figures are the real ones (6.2-12.3 GiB per model, a
23 GiB card): what is tested is that the proxy keeps the router's resident set within them, whatever the
order, concurrency, cancellation or form of the requests (issue #42: each way a request could be read
differently by the proxy and the router is tried here against the real router)."""
from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest



from lab.contract.pod_programs import admission_proxy, write_programs
from lab.contract.router import start_router
from lab.contract.server import free_port, request
from test_router_contract import SUBSTITUTED, TEST_KEY, tiny_models

STACK, KEY = "rtx3090-library", "library"


def rendered() -> dict:
    from render.manifests import manifests
    from render.offline import run_stack

    run = run_stack(STACK)
    model = run.config.models[KEY]
    files = list(manifests(run).values())
    (deployment,) = [m for m in files if m["kind"] == "Deployment" and m["metadata"]["name"] == model.workload_name]
    (config_map,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-files"]
    (programs,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-programs"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    preset = "\n".join(f"{line.split('=')[0].strip()} = {SUBSTITUTED[line.split('=')[0].strip()]}"
                       if line.split("=")[0].strip() in SUBSTITUTED else line
                       for line in config_map["data"]["models.ini"].splitlines()) + "\n"
    policies = [m for m in files if m["kind"] == "BackendTrafficPolicy"]
    routes = [m for m in files if m["kind"] == "AIGatewayRoute"]
    return {"policies": policies, "routes": routes, "programs": programs, "pod": deployment["spec"]["template"]["spec"],
            "router": containers[model.name], "proxy": containers["admission"], "preset": preset,
            "plan": json.loads(config_map["data"]["admission.json"]), "names": list(model.on_demand.models)}


SPEC = rendered()


class Plane:
    """The router and its proxy, as the pod runs them; requests go to the proxy."""

    def __init__(self, router, base: str, proc: subprocess.Popen, log: Path):
        self.router, self.base, self.proc, self.log = router, base, proc, log

    def chat(self, model: str, max_tokens: int = 4, timeout: float = 120):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                "temperature": 0, "top_k": 1, "seed": 0}
        return request(self.base + "/v1/chat/completions", body, {"Authorization": f"Bearer {TEST_KEY}"}, timeout=timeout)

    def metrics(self) -> dict[str, float]:
        answer = request(self.base + "/metrics", None, {"Authorization": f"Bearer {TEST_KEY}"})
        assert answer.status == 200
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in answer.body.decode().splitlines()
                if line and not line.startswith("#")}

    def planned_vram(self, names) -> float:
        return sum(SPEC["plan"]["models"][n]["vram_gib"] for n in names)


@contextmanager
def plane(binary, folder, env_extra=None, plan=None, preset_extra="", proxy_env=None, key_file_text=None):
    models = tiny_models(folder, SPEC["names"])
    with start_router(binary, SPEC["preset"] + preset_extra, SPEC["router"]["args"], models, TEST_KEY, env=env_extra,
                      key_file_text=key_file_text) as router:
        work = router.work
        plan_file = work / "admission.json"
        plan_file.write_text(json.dumps(plan or SPEC["plan"]))
        key_file = work / "api-key"  # start_router's key file
        port = free_port()
        env = {e["name"]: e.get("value") for e in SPEC["proxy"]["env"]}
        env.update({"ADMISSION_PLAN_FILE": str(plan_file), "LISTEN_PORT": str(port), "LISTEN_HOST": "127.0.0.1",
                    # The downloader's status where the pod's scratch volume would be (the rendered path is /tmp).
                    "LIBRARY_STATUS": str(work / "library-status.json"),
                    "ADMISSION_CONTROL": str(work / "admission-control.sock"),
                    "ROUTER_URL": router.base, "ROUTER_AUTH_FILE": str(key_file), "PATH": os.environ["PATH"],
                    **(proxy_env or {})})
        programs = write_programs(SPEC["programs"], SPEC["pod"], work / "programs")
        with admission_proxy(SPEC["proxy"], programs, env, work) as (base, proc, log):
            # The proxy loads the pinned models after it starts listening; a test starts from that settled
            # state, where a snapshot taken during the load would race it (CI saw 'loading' for 'unloaded').
            for name, model in (plan or SPEC["plan"])["models"].items():
                if model["pinned"]:
                    router.wait_status(name, ("loaded",))
            yield Plane(router, base, proc, log)


@pytest.fixture
def gguf_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("admission-gguf")


def watch(p: Plane):
    """Samples the router's running models every 20 ms; returns (samples, stop)."""
    samples: list[list[str]] = []
    done = threading.Event()

    def poll():
        while not done.is_set():
            samples.append(p.router.running())
            time.sleep(0.02)

    t = threading.Thread(target=poll)
    t.start()

    def stop():
        done.set()
        t.join()
    return samples, stop


def assert_within_plan(p: Plane, samples):
    budget = SPEC["plan"]["vram_budget_gib"]
    assert samples, "the poller never read /models"
    over = [s for s in samples if p.planned_vram(s) > budget + 1e-9]
    assert not over, over[:3]
    pinned = [n for n, m in SPEC["plan"]["models"].items() if m["pinned"]]
    assert all(set(pinned) <= set(s) for s in samples), "a pinned model was unloaded"


def test_requests_in_any_order_keep_the_resident_set_within_the_plan_and_fill_past_a_count(binary, gguf_folder):
    """40 requests in a seeded random order, one at a time: each answered 200; at no sample does the
    router hold models whose planned VRAM exceeds the card's budget, and the pinned model never goes;
    three models are resident at once at some point (a count safe for every set allowed two); every
    unload is counted under the model unloaded."""
    rng = random.Random(7)
    order = [rng.choice(SPEC["names"]) for _ in range(40)]
    with plane(binary, gguf_folder) as p:
        samples, stop = watch(p)
        try:
            answers = [p.chat(name).status for name in order]
        finally:
            stop()
        assert answers == [200] * len(order)
        assert_within_plan(p, samples)
        assert max(len(s) for s in samples) == 3
        unloads = {n: 0 for n in SPEC["names"]}
        for before, after in zip(samples, samples[1:]):
            for n in set(before) - set(after):
                unloads[n] += 1
        metrics = p.metrics()
        evicted = {n: metrics[f'inference_plane_router_evictions_total{{model="{n}"}}'] for n in SPEC["names"]}
        assert evicted == unloads and sum(evicted.values()) > 0
        assert metrics['inference_plane_router_evictions_total{model="qwen3-8b"}'] == 0


def test_concurrent_requests_are_all_answered_first_time_within_the_plan(binary, gguf_folder):
    """Every model at once, three rounds: b10729's router alone answers some of these with 500 (it can
    evict a model it is about to proxy to, ROUTER_FACTS.md b); behind the proxy the router never evicts,
    and every request is answered 200 on its first try."""
    with plane(binary, gguf_folder) as p:
        samples, stop = watch(p)
        statuses: list[int] = []
        try:
            for _ in range(3):
                threads = [threading.Thread(target=lambda n=n: statuses.append(p.chat(n, timeout=300).status))
                           for n in SPEC["names"]]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=600)
        finally:
            stop()
        assert statuses == [200] * 3 * len(SPEC["names"])
        assert_within_plan(p, samples)
        assert "evicting" not in p.router.log_text(), "the router evicted a model of its own"


def stream(base: str, model: str, max_tokens: int) -> socket.socket:
    # llama.cpp's own completion: the OpenAI endpoints check the tiny model's random text against the
    # template's output format and end the stream with an error.
    body = json.dumps({"model": model, "prompt": "count", "n_predict": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0, "seed": 0}).encode()
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(f"POST /completion HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_KEY}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def test_a_stream_arrives_as_it_is_generated_and_a_client_that_leaves_frees_its_model(binary, gguf_folder):
    """Server-sent events pass through unbuffered: the first event arrives long before the last. A client
    that closes mid-stream ends its request at the router (the child's slot goes idle) and the model is
    no longer held: a request that needs its room unloads it at once."""
    with plane(binary, gguf_folder) as p:
        big = max((n for n in SPEC["names"] if not SPEC["plan"]["models"][n]["pinned"]),
                  key=lambda n: SPEC["plan"]["models"][n]["vram_gib"])
        # Loaded first: the time to the first event is then the stream's own, not the load's (polled in 0.1 s steps).
        assert p.chat(big).status == 200
        s = stream(p.base, big, 400)
        started = time.monotonic()
        data, first = b"", None
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            if first is None and b"data: " in chunk:
                first = time.monotonic() - started
            data += chunk
        total = time.monotonic() - started
        s.close()
        # The whole chunked stream relayed to its last chunk (its final event is the tiny model's business:
        # b10729 ends some random-text streams with a format error event).
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n0\r\n\r\n"), data[-300:]
        assert data.count(b"data: ") > 100 and first is not None and first < total / 2, (first, total)
        # Now leave mid-stream: a long generation, closed after the first event.
        s = stream(p.base, big, 100_000)
        while b"data: " not in s.recv(65536):
            pass
        s.close()
        deadline = time.monotonic() + 10
        while p.metrics()[f'inference_plane_router_model_requests_in_flight{{model="{big}"}}'] != 0:
            assert time.monotonic() < deadline, "the proxy still counts the request of a client that left"
            time.sleep(0.05)
        # The router notices at its next write to the closed connection, and its child at the next after that.
        while any(slot["is_processing"] for slot in p.router.get(f"/slots?model={big}").json()):
            assert time.monotonic() < deadline + 20, "the router still generates for a client that left"
            time.sleep(0.1)
        # The pair that needs the big model's room: both answered at once (it is idle, so it is unloaded).
        others = sorted((n for n in SPEC["names"] if n != big and not SPEC["plan"]["models"][n]["pinned"]),
                        key=lambda n: -SPEC["plan"]["models"][n]["vram_gib"])
        for name in others[:2]:
            assert p.chat(name, timeout=60).status == 200
        assert big not in p.router.running()


def test_model_management_is_refused_at_the_pods_port_and_inference_paths_pass(binary, gguf_folder):
    """The router's load, unload, download and reload are any key holder's at its own port; at the pod's
    port (the proxy) they are refused, and the router is untouched. The client paths and the scrape pass."""
    name = next(n for n, m in SPEC["plan"]["models"].items() if not m["pinned"])
    auth = {"Authorization": f"Bearer {TEST_KEY}"}
    with plane(binary, gguf_folder) as p:
        before = p.router.statuses()
        for path, body in [("/models/load", {"model": name}), ("/models/unload", {"model": "qwen3-8b"}),
                           ("/models", {"model": "org/repo:Q4_K_M"})]:
            answer = request(p.base + path, body, auth)
            assert answer.status == 403 and b"model management stays inside the pod" in answer.body, path
        assert request(p.base + "/models?reload=1", None, auth).status == 403
        assert p.router.statuses() == before
        assert request(p.base + "/v1/models", None, auth).status == 200
        assert request(p.base + "/health", None, {}).status == 200
        assert request(p.base + "/v1/chat/completions", {"model": name, "messages": []}, {}).status == 401
        assert request(p.base + f"/metrics?model={name}&autoload=false", None, auth).status == 400  # not loaded
        assert p.router.statuses()[name] == "unloaded", "a scrape with autoload=false loaded a model"


def test_the_residency_metrics_are_valid_prometheus_text(binary, gguf_folder):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: `make test` installs Debian's prometheus package (promtool)"
    with plane(binary, gguf_folder) as p:
        assert p.chat("llama-3.1-8b").status == 200
        text = request(p.base + "/metrics", None, {"Authorization": f"Bearer {TEST_KEY}"}).body
        result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
        assert result.returncode == 0, result.stdout + result.stderr
        # The swap is timed by polling the router every 0.1 s: it may be counted just after the answer.
        deadline = time.monotonic() + 5
        while p.metrics()['inference_plane_router_swap_seconds_count{model="llama-3.1-8b"}'] != 1:
            assert time.monotonic() < deadline, "the load was never timed"
            time.sleep(0.05)
        metrics = p.metrics()
        assert metrics['inference_plane_router_model_resident{model="llama-3.1-8b"}'] == 1
        assert metrics['inference_plane_router_model_resident{model="qwen3-8b"}'] == 1
        assert metrics['inference_plane_router_model_resident{model="qwen3-14b"}'] == 0
        assert 0 < metrics['inference_plane_router_swap_seconds_sum{model="llama-3.1-8b"}'] < 30
        assert metrics["inference_plane_router_vram_budget_bytes"] == SPEC["plan"]["vram_budget_gib"] * 2**30


def test_a_model_not_fetched_yet_answers_a_503_the_gateway_retries_on_its_next_tier(binary, gguf_folder):
    """A model just added to the library is in the proxy's plan before the keeper has fetched it (the
    router serves a preset of the fetched models only, and would answer 400, which no retry takes): the
    proxy answers 503 with Retry-After and loads nothing; the rendered gateway retries a 503 once per
    priority, so the request goes to the route's next tier."""
    plan = json.loads(json.dumps(SPEC["plan"]))
    plan["models"]["qwen3-32b"] = dict(plan["models"]["llama-3.1-8b"])
    with plane(binary, gguf_folder, plan=plan) as p:
        before = p.router.statuses()
        assert "qwen3-32b" not in before
        answer = p.chat("qwen3-32b")
        assert answer.status == 503 and answer.headers.get("Retry-After") == "5", (answer.status, answer.headers)
        assert "is not on this server yet" in answer.json()["error"]["message"]
        assert p.router.statuses() == before
        assert p.chat("llama-3.1-8b").status == 200
    (policy,) = [m for m in SPEC["policies"] if m["spec"]["targetRefs"][0]["name"] == SPEC["routes"][0]["metadata"]["name"]]
    retry = policy["spec"]["retry"]
    assert 503 in retry["retryOn"]["httpStatusCodes"] and retry["numAttemptsPerPriority"] == 1 and retry["numRetries"] >= 1
    for rule in SPEC["routes"][0]["spec"]["rules"]:
        assert len(rule["backendRefs"]) >= 2 and sorted(b["priority"] for b in rule["backendRefs"])[:2] == [0, 1]


def test_a_lost_pinned_model_is_loaded_again_and_failed_loads_are_counted_as_the_alerts_read_them(binary, gguf_folder):
    """The pinned model's child gone (here: unloaded at the router's own port, as the keeper does for new
    weights): the proxy loads it again (checked every 30 s in the pod, every second here). A model whose
    load fails is counted under its name. Every series the rendered router alerts read is one the real
    proxy exports, with the labels they match on."""
    import re

    from test_alert_rules import OBSERVED, rendered as rendered_rules

    plan = json.loads(json.dumps(SPEC["plan"]))
    plan["models"]["broken-model"] = dict(plan["models"]["llama-3.1-8b"])
    plan["models"]["too-large"] = dict(plan["models"]["llama-3.1-8b"])
    with plane(binary, gguf_folder, plan=plan, preset_extra="\n[broken-model]\nmodel = /nonexistent/broken.gguf\n",
               proxy_env={"PIN_CHECK_SECONDS": "1"}) as p:
        # What the downloader writes for a model it refused (incluster/library.py), on the pod's scratch volume.
        (p.router.work / "library-status.json").write_text(json.dumps({"served": [], "missing": {
            "too-large": "refused: larger than planned: its files are 9.00 GiB, the plan counted 4.00 GiB"}}))
        (child,) = p.router.children()  # the pinned model's, loaded before the plane was handed over
        assert p.router.post("/models/unload", {"model": "qwen3-8b"}).status == 200
        # Loaded again by a new child: its 'unloaded' may last less than one poll (the proxy checks every second).
        deadline = time.monotonic() + 20
        while not (child not in p.router.children() and p.router.statuses()["qwen3-8b"] == "loaded"):
            assert time.monotonic() < deadline, "the pinned model was not loaded again"
            time.sleep(0.05)
        answer = p.chat("broken-model")
        assert answer.status == 500 and b"failed to load" in answer.body, answer.body[:200]
        deadline = time.monotonic() + 5
        while p.metrics()['inference_plane_router_failed_loads_total{model="broken-model"}'] != 1:
            assert time.monotonic() < deadline, "the failed load was never counted"
            time.sleep(0.05)
        exported = request(p.base + "/metrics", None, {"Authorization": f"Bearer {TEST_KEY}"}).body.decode()
    _, (rule,), _ = rendered_rules("rtx3090-library" + OBSERVED)
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"] if "inference_plane_router_" in r["expr"]]
    assert len(exprs) == 3
    for name in {n for e in exprs for n in re.findall(r"inference_plane_router_\w+", e)}:
        assert re.search(rf'^{name}\{{model="[^"]+"(,reason="[a-z_]+")?\}} ', exported, re.M), name
    assert 'inference_plane_router_model_unserved{model="too-large",reason="larger_than_planned"} 1' in exported
    # And every proxy series the stack's dashboard queries (components/dashboard.py).
    from test_dashboard import dashboard_of

    _, board, _ = dashboard_of("rtx3090-library" + OBSERVED)
    queried = {n for p in board["panels"] for t in p.get("targets", []) for n in re.findall(r"inference_plane_router_\w+", t["expr"])}
    assert len(queried) >= 5
    for name in queried:
        assert re.search(rf"^{name}[ {{]", exported, re.M), name


def test_a_request_the_router_would_refuse_unloads_nothing_and_the_body_names_the_model(binary, gguf_folder):
    """Review B2 and B3, against the real router: a request without the key is refused (401) before anything
    is admitted, so it unloads nothing; a POST's model is its body's (a ?model= beside it is refused, not
    read), and GET /health?model= loads nothing."""
    with plane(binary, gguf_folder) as p:
        assert p.chat("gemma-3-12b").status == 200 and p.chat("llama-3.1-8b").status == 200
        before = p.router.running()
        body = {"model": "qwen3-30b-a3b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert request(p.base + "/v1/chat/completions", body, {}).status == 401
        assert request(p.base + "/v1/chat/completions", body, {"Authorization": "Bearer wrong"}).status == 401
        assert p.router.running() == before
        answer = request(p.base + "/v1/chat/completions?model=qwen3-8b", body, {"Authorization": f"Bearer {TEST_KEY}"})
        assert answer.status == 403 and p.router.running() == before
        assert request(p.base + "/health?model=qwen3-14b", None, {}).status == 403
        assert request(p.base + "/v1/chat/completions", body, {"Authorization": f"Bearer {TEST_KEY}"}).status == 200
        running = p.router.running()
        assert "qwen3-30b-a3b" in running and p.planned_vram(running) <= SPEC["plan"]["vram_budget_gib"]


def raw_exchange(base: str, raw: bytes, timeout: float = 60) -> bytes:
    from test_incluster_proxy import read_answer

    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(raw)
        return read_answer(s)


def raw(method: str, target: str, body: bytes = b"", headers: dict | None = None, key: str | None = TEST_KEY) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: x", "Connection: close"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


FULL_CARD = ["qwen3-30b-a3b"]  # beside the pinned 8B, no other model fits without an unload
MULTIPART = (b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngemma-3-12b\r\n"
             b"--XyZ\r\nContent-Disposition: form-data; name=\"messages\"\r\n\r\n[]\r\n--XyZ--\r\n")
CHAT_GEMMA = json.dumps({"model": "gemma-3-12b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
# Each: a request b10729's router reads as naming gemma-3-12b (and, for some, as asking it to load it), which
# a proxy reading it otherwise would pass without making room (issue #42 item 1).
BYPASSES = {
    "multipart": raw("POST", "/v1/chat/completions", MULTIPART, {"Content-Type": "multipart/form-data; boundary=XyZ"}),
    "byte-order mark": raw("POST", "/v1/chat/completions", b"\xef\xbb\xbf" + CHAT_GEMMA, {"Content-Type": "application/json"}),
    "autoload on a POST": raw("POST", "/v1/chat/completions?autoload=1", CHAT_GEMMA),
    "autoload on a scrape": raw("GET", "/metrics?model=gemma-3-12b&autoload=1"),
    "repeated query model": raw("GET", "/metrics?model=qwen3-8b&model=gemma-3-12b&autoload=true"),
    "form fields": raw("POST", "/v1/chat/completions", b"autoload=1&model=gemma-3-12b",
                       {"Content-Type": "application/x-www-form-urlencoded"}),
    "lowercase bearer": raw("POST", "/v1/chat/completions", CHAT_GEMMA, {"Authorization": f"bearer {TEST_KEY}"}, key=None),
    "101 headers": raw("POST", "/v1/chat/completions", CHAT_GEMMA, {f"X-Pad-{i}": "x" for i in range(101)}),
    "preset reload": raw("GET", "/v1/models?reload=1"),
}


@pytest.mark.parametrize("case", sorted(BYPASSES))
def test_no_form_of_request_loads_past_the_budget_on_the_real_router(case, binary, gguf_folder):
    """On a full card, each request the real router would read as naming (or loading) a model that does not
    fit is refused by the proxy (400, 401, 403 or 431) and the router's resident set does not change: no load,
    no unload, nothing over the budget (sampled every 20 ms)."""
    with plane(binary, gguf_folder) as p:
        for name in FULL_CARD:
            assert p.chat(name).status == 200
        before = p.router.running()
        samples, stop = watch(p)
        try:
            answer = raw_exchange(p.base, BYPASSES[case])
            time.sleep(1.0)
        finally:
            stop()
        assert int(answer[9:12]) in (400, 401, 403, 431), answer[:300]
        assert_within_plan(p, samples)
        assert all(s == before for s in samples), samples[-1]


def test_the_key_file_is_read_as_llama_cpp_reads_it_by_both(binary, gguf_folder):
    """A key file in llama.cpp's own format (a `#` comment first, then the key): the router and the proxy
    read the same key (the comment is none), and the proxy's own calls (the pinned model's load) carry it."""
    text = f"# rotated 2026-12: the key below\n{TEST_KEY}\n"
    with plane(binary, gguf_folder, key_file_text=text) as p:
        comment = "# rotated 2026-12: the key below"
        assert request(p.base + "/v1/models", None, {"Authorization": f"Bearer {comment}"}).status == 401
        assert p.chat("llama-3.1-8b").status == 200


def test_a_client_that_stops_reading_a_stream_releases_its_model(binary, gguf_folder):
    """A client that asks for a long stream and stops reading is dropped once a write to it has waited the
    proxy's write deadline (2 s here; 30 s in the pod): the router's connection is closed (its generation
    cancelled) and the model is no longer held, so the next request that needs its room unloads it."""
    with plane(binary, gguf_folder, proxy_env={"HTTP_WRITE_SECONDS": "2"}) as p:
        s = stream(p.base, "qwen3-30b-a3b", 100_000)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deadline = time.monotonic() + 60
        while p.metrics()['inference_plane_router_model_requests_in_flight{model="qwen3-30b-a3b"}'] != 1:
            assert time.monotonic() < deadline, "the stream was never admitted"
            time.sleep(0.1)
        while p.metrics()['inference_plane_router_model_requests_in_flight{model="qwen3-30b-a3b"}'] != 0:
            assert time.monotonic() < deadline + 60, "a client that stopped reading still holds its model"
            time.sleep(0.2)
        s.close()
        assert p.chat("gemma-3-12b", timeout=120).status == 200
        assert "qwen3-30b-a3b" not in p.router.running()


def test_a_plan_with_a_smaller_budget_frees_the_card_on_the_real_router(binary, gguf_folder):
    """Issue #48 item 4: a model moved to a server of its own on this card shrinks the router's budget; the
    proxy frees the difference on its own round (the other server needs it now), on the real router: the idle
    model goes, the pinned one stays, and nothing past the new budget is admitted afterwards."""
    plan = SPEC["plan"]
    pinned = [n for n, m in plan["models"].items() if m["pinned"]]
    others = sorted((n for n in plan["models"] if n not in pinned), key=lambda n: plan["models"][n]["vram_gib"])
    with plane(binary, gguf_folder, proxy_env={"PIN_CHECK_SECONDS": "1", "ADMIT_WAIT_SECONDS": "2"}) as p:
        idle = others[0]
        assert p.chat(idle).status == 200 and set(p.router.running()) == {*pinned, idle}
        smaller = {**plan, "vram_budget_gib": round(p.planned_vram(pinned) + 0.05, 2)}
        (p.router.work / "admission.json").write_text(json.dumps(smaller))
        p.router.wait_status(idle, ("unloaded",), seconds=20)
        assert set(p.router.running()) == set(pinned)
        answer = p.chat(others[1])
        assert answer.status == 503 and set(p.router.running()) == set(pinned)  # no room under the new plan
