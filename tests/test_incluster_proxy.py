"""The admission proxy as an attacker meets it (issue #42): the rendered rtx3090-library pod's proxy,
run from its rendered programs ConfigMap as the pod runs it (lab/contract/pod_programs.py), in front of
a stand-in router that reads requests as b10729's router does (lab/contract/fake_router.py) and records
every load, the peak planned VRAM it held, and every request that reached it which the router would have
refused or which asked it to manage models. The real router meets the same classes in
tests/test_admission.py; here there is room for thousands of requests, slow clients and bodies of the
largest size the proxy takes.

Deadlines are scaled down through HTTP_* variables the pod never sets (incluster/http_io.py)."""
from __future__ import annotations

import json
import os
import stat
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


from lab.contract.fake_router import FakeRouter
from lab.contract.pod_programs import admission_proxy, write_programs

KEY = "proxy-test-key"


def rendered() -> dict:
    from render.manifests import manifests
    from render.offline import run_stack

    run = run_stack("rtx3090-library")
    model = run.config.models["library"]
    files = list(manifests(run).values())
    (deployment,) = [m for m in files if m["kind"] == "Deployment" and m["metadata"]["name"] == model.workload_name]
    (programs,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-programs"]
    (config,) = [m for m in files if m["kind"] == "ConfigMap" and m["metadata"]["name"] == f"{model.name}-files"]
    spec = deployment["spec"]["template"]["spec"]
    (proxy,) = [c for c in spec["containers"] if c["name"] == "admission"]
    return {"spec": spec, "programs": programs, "proxy": proxy, "plan": json.loads(config["data"]["admission.json"])}


SPEC = rendered()
PLAN = SPEC["plan"]
BUDGET = PLAN["vram_budget_gib"]
NAMES = sorted(PLAN["models"])
PINNED = [n for n, m in PLAN["models"].items() if m["pinned"]]
UNPINNED = [n for n in NAMES if n not in PINNED]


class Proxy:
    def __init__(self, port: int, proc: subprocess.Popen, fake: FakeRouter, log: Path):
        self.port, self.proc, self.fake, self.log = port, proc, fake, log

    def connect(self, timeout: float = 10) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def exchange(self, raw: bytes, timeout: float = 10) -> bytes:
        """Sends ``raw`` and reads until the proxy closes or a whole answer has arrived."""
        with self.connect(timeout) as s:
            s.sendall(raw)
            return read_answer(s)

    def metrics(self) -> dict[str, float]:
        text = self.exchange(http("GET", "/metrics")).split(b"\r\n\r\n", 1)[1].decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def in_flight(self) -> dict[str, float]:
        prefix = 'inference_plane_router_model_requests_in_flight{model="'
        return {k[len(prefix):-2]: v for k, v in self.metrics().items() if k.startswith(prefix)}

    def rss_peak_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def read_answer(s: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return data
        if not chunk:
            return data
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep and not head.startswith(b"HTTP/1.1 100"):
            lengths = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
            if lengths and len(body) >= int(lengths[0]):
                return data
            if head.lower().find(b"transfer-encoding: chunked") >= 0 and body.endswith(b"0\r\n\r\n"):
                return data
        elif sep and head.startswith(b"HTTP/1.1 100"):
            data = body


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def http(method: str, target: str, body: bytes = b"", headers: dict | None = None, key: str | None = KEY) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: x"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chat(model, **extra) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


@contextmanager
def proxy_against(tmp: Path, env_extra: dict | None = None, key_file: str = f"# the first line is a comment\n{KEY}\n",
                  load_seconds: float = 0.05, plan: dict | None = None):
    plan = plan or PLAN
    root = write_programs(SPEC["programs"], SPEC["spec"], tmp / "programs")
    (tmp / "admission.json").write_text(json.dumps(plan))
    (tmp / "api-keys").write_text(key_file)
    with FakeRouter({n: m["vram_gib"] for n, m in plan["models"].items()}, [KEY.encode()], load_seconds) as fake:
        port = free_port()
        env = {e["name"]: e.get("value") for e in SPEC["proxy"]["env"]}
        env.update({"ADMISSION_PLAN_FILE": str(tmp / "admission.json"), "LISTEN_PORT": str(port), "LISTEN_HOST": "127.0.0.1",
                    "ADMISSION_CONTROL": str(tmp / "control.sock"),
                    "ROUTER_URL": f"http://127.0.0.1:{fake.port}", "ROUTER_AUTH_FILE": str(tmp / "api-keys"),
                    "PIN_CHECK_SECONDS": "1", "HTTP_HEAD_SECONDS": "2", "HTTP_IDLE_SECONDS": "1",
                    "HTTP_READ_STALL_SECONDS": "2", "HTTP_BODY_START_SECONDS": "2", "HTTP_WRITE_SECONDS": "2",
                    **(env_extra or {})})
        with admission_proxy(SPEC["proxy"], root, env, tmp) as (_, proc, log):
            proxy = Proxy(port, proc, fake, log)
            pinned = [n for n, m in plan["models"].items() if m["pinned"]]
            wait_for(lambda: all(fake.status[n] == "loaded" for n in pinned), "the pinned model was never loaded",
                     seconds=10 + 2 * load_seconds)  # a test's slow load (6 s) on a loaded machine
            yield proxy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, message: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def fill_the_card(proxy: Proxy) -> None:
    """The 30B resident beside the pinned 8B: no other model fits beside them without an unload."""
    assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat("qwen3-30b-a3b")))) == 200
    resident = [n for n, s in proxy.fake.status.items() if s == "loaded"]
    assert sorted(resident) == sorted(PINNED + ["qwen3-30b-a3b"])
    for name in set(NAMES) - set(resident):
        assert proxy.fake.resident_vram() + PLAN["models"][name]["vram_gib"] > BUDGET


# --- 1. one parser decides what loads ------------------------------------------------------------------

MULTIPART = (b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngemma-3-12b\r\n"
             b"--XyZ\r\nContent-Disposition: form-data; name=\"messages\"\r\n\r\n[]\r\n--XyZ--\r\n")

BYPASSES = {
    "multipart form naming a model": ("POST", "/v1/chat/completions", MULTIPART,
                                      {"Content-Type": "multipart/form-data; boundary=XyZ"}),
    "JSON after a byte-order mark": ("POST", "/v1/chat/completions", b"\xef\xbb\xbf" + chat("gemma-3-12b"),
                                     {"Content-Type": "application/json"}),
    "autoload asked on a POST": ("POST", "/v1/chat/completions?autoload=1", chat("gemma-3-12b"), {}),
    "autoload=true on a scrape": ("GET", "/metrics?model=gemma-3-12b&autoload=true", b"", {}),
    "repeated model on a scrape": ("GET", "/metrics?model=qwen3-8b&model=gemma-3-12b", b"", {}),
    "form fields that turn autoload on": ("POST", "/v1/chat/completions", b"autoload=1&model=gemma-3-12b",
                                          {"Content-Type": "application/x-www-form-urlencoded"}),
    "model named twice": ("POST", "/v1/chat/completions", b'{"model":"qwen3-8b","model":"gemma-3-12b"}', {}),
    "model key escaped twice": ("POST", "/v1/chat/completions", b'{"model":"qwen3-8b","mod\\u0065l":"gemma-3-12b"}', {}),
    "reload of the preset": ("GET", "/v1/models?reload=1", b"", {}),
    "percent-escaped management path": ("POST", "/models%2Fload", b'{"model":"gemma-3-12b"}', {}),
    "management path": ("POST", "/models/load", b'{"model":"gemma-3-12b"}', {}),
}


@pytest.mark.parametrize("case", sorted(BYPASSES))
def test_no_request_loads_a_model_the_proxy_did_not_admit(case, tmp_path):
    """Each way b10729's router and a naive proxy read a request differently (issue #42 item 1) is refused
    before anything loads or unloads: on a full card, the router sees no load, no unload and no request, and
    what it holds stays within the budget."""
    method, target, body, headers = BYPASSES[case]
    with proxy_against(tmp_path) as proxy:
        fill_the_card(proxy)
        before = (dict(proxy.fake.status), len(proxy.fake.loads), len(proxy.fake.served))
        answer = proxy.exchange(http(method, target, body, headers))
        assert status_of(answer) in (400, 403, 404), answer[:300]
        time.sleep(0.3)
        assert (dict(proxy.fake.status), len(proxy.fake.loads), len(proxy.fake.served)) == before
        assert proxy.fake.peak <= BUDGET + 1e-9 and not proxy.fake.violations


def test_a_body_is_read_for_its_model_the_way_the_router_reads_it(tmp_path):
    """What passes is read alike: the key as an escape, the model among nested objects of the same key,
    a form-urlencoded JSON body (curl -d) sent on as JSON, a text/plain one."""
    with proxy_against(tmp_path) as proxy:
        cases = [(b'{"mod\\u0065l":"qwen3-14b","messages":[{"model":"gemma-3-12b"}]}', {}, "qwen3-14b"),
                 (chat("llama-3.1-8b"), {"Content-Type": "application/x-www-form-urlencoded"}, "llama-3.1-8b"),
                 (chat("qwen3-8b"), {"Content-Type": "text/plain; charset=utf-8"}, "qwen3-8b")]
        for body, headers, expected in cases:
            answer = proxy.exchange(http("POST", "/v1/chat/completions", body, headers))
            assert status_of(answer) == 200 and json.loads(answer.split(b"\r\n\r\n", 1)[1])["model"] == expected
        assert proxy.fake.loads.count("autoload") == 0 and not proxy.fake.violations


# --- 2. denial of service: every input has a deadline and a limit --------------------------------------

def stream_request(model: str, size: int) -> bytes:
    return http("POST", "/v1/chat/completions", chat(model, stream_bytes=size))


def test_a_client_that_stops_reading_releases_its_model(tmp_path):
    """A client that asks for a long answer and never reads it is dropped once a write to it has waited
    WRITE_SECONDS (2 s here): its model is no longer in flight, so another request can unload it."""
    with proxy_against(tmp_path) as proxy:
        s = proxy.connect()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(stream_request("qwen3-30b-a3b", 256 * 1024 * 1024))
        wait_for(lambda: proxy.in_flight()["qwen3-30b-a3b"] == 1, "the stalled request was never admitted")
        wait_for(lambda: proxy.in_flight()["qwen3-30b-a3b"] == 0, "a stalled reader still holds its model", 15)
        s.close()
        for name in ("gemma-3-12b", "qwen3-14b"):
            assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(name)))) == 200
        assert proxy.fake.status["qwen3-30b-a3b"] == "unloaded"


def test_announced_bodies_that_never_come_block_nothing(tmp_path):
    """Five connections that announce 32 MiB bodies and send nothing hold no memory (only received bytes
    count), so every other POST is answered; each is dropped with 408 once its body stalls."""
    with proxy_against(tmp_path) as proxy:
        stalled = []
        for _ in range(5):
            s = proxy.connect()
            s.sendall(http("POST", "/v1/chat/completions")[:-len(b"Content-Length: 0\r\n\r\n")]
                      + f"Content-Length: {32 * 1024 * 1024}\r\n\r\n".encode())
            stalled.append(s)
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat("qwen3-8b")))) == 200
        for s in stalled:
            assert status_of(read_answer(s)) == 408
            s.close()


def chunked(pieces: list[bytes], headers: str = "") -> bytes:
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n{headers}"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_chunked_bodies_are_counted_and_bounded(tmp_path):
    """A chunked body is counted as it arrives: past 32 MiB it is refused (413) without being held whole,
    also when one chunk declares 1 GiB; a body of more than MAX_CHUNKS chunks is refused too (each chunk
    costs a parse). A chunked body of ordinary size passes."""
    with proxy_against(tmp_path) as proxy:
        assert status_of(proxy.exchange(chunked([chat("qwen3-8b")[:10], chat("qwen3-8b")[10:]]))) == 200
        with proxy.connect(30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                      + b"\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n")
            sent = 0
            try:
                while sent < 40 * 1024 * 1024:
                    s.sendall(b"x" * (1 << 20))
                    sent += 1 << 20
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = read_answer(s)
        assert status_of(answer) == 413 and b"larger than" in answer
        assert proxy.rss_peak_kib() < 200 * 1024
        answer = proxy.exchange(chunked([b" "] * 20000 + [chat("qwen3-8b")]), timeout=60)
        assert status_of(answer) == 413 and b"chunks" in answer


def test_idle_connections_cannot_crowd_out_health_or_requests(tmp_path):
    """1,100 idle sockets (past the proxy's connection limit and its reserve): the oldest idle one is
    dropped for each new connection, so /health and a chat are answered at once, and each idle socket is
    closed within the head deadline anyway. The proxy's descriptors stay bounded."""
    with proxy_against(tmp_path) as proxy:
        idle = []
        for _ in range(1100):
            try:
                idle.append(proxy.connect(5))
            except OSError:
                break
        assert len(idle) == 1100
        assert status_of(proxy.exchange(http("GET", "/health", key=None))) == 200
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat("qwen3-8b")))) == 200
        assert proxy.open_fds() < 400, proxy.open_fds()
        for s in idle:
            s.close()


def test_a_slow_head_is_dropped_and_costs_nothing(tmp_path):
    """A head sent a byte at a time, slower than the head deadline (2 s here), is dropped without an answer."""
    with proxy_against(tmp_path) as proxy:
        with proxy.connect() as s:
            started = time.monotonic()
            closed = False
            for byte in http("GET", "/v1/models"):
                try:
                    s.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                time.sleep(0.2)
                if time.monotonic() - started > 6:
                    break
            if not closed:
                s.settimeout(3)
                assert read_answer(s) == b""
        assert time.monotonic() - started < 8


def largest_bodies() -> dict[str, bytes]:
    """Bodies at the proxy's limits, shaped to cost the most memory when parsed: the most values, the most
    nested lists, the widest string (one non-ASCII character makes CPython hold a whole str at 4 bytes a
    character, were it decoded as UTF-8)."""
    limit = 32 * 1024 * 1024
    values = (1 << 20) - 16
    many = b'{"model":"qwen3-8b","x":[' + b",".join([b'"' + b"v" * 24 + b'"'] * values) + b"]}"
    lists = b'{"model":"qwen3-8b","x":[' + b",".join([b"[]"] * (values // 2)) + b"]}"  # each counts its '[' and ','

    wide = b'{"model":"qwen3-8b","x":"\xf0\x9f\x98\x80' + b"a" * (limit - 64) + b'"}'
    return {"many strings": many, "many lists": lists, "one wide string": wide}


def test_the_largest_bodies_the_proxy_takes_stay_within_its_memory_limit(tmp_path):
    """Three of the costliest bodies the proxy accepts, each parsed while the others are held: each is
    answered, and the proxy's peak resident memory stays under its container's limit (512Mi), with room
    to spare. A body with more JSON values than MAX_JSON_VALUES is refused before any is built."""
    limit_mib = int(SPEC["proxy"]["resources"]["limits"]["memory"].removesuffix("Mi"))
    with proxy_against(tmp_path) as proxy:
        bodies = largest_bodies()
        results: dict[str, int] = {}

        def send(name: str, body: bytes) -> None:
            results[name] = status_of(proxy.exchange(http("POST", "/v1/chat/completions", body), timeout=120))

        threads = [threading.Thread(target=send, args=item) for item in bodies.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert results == {name: 200 for name in bodies}
        peak_mib = proxy.rss_peak_kib() / 1024
        print(f"admission proxy peak RSS with the largest bodies: {peak_mib:.0f} MiB of {limit_mib} MiB")
        assert peak_mib < 0.75 * limit_mib
        too_many = b'{"model":"qwen3-8b","x":[' + b",".join([b"1"] * (1 << 20)) + b"]}"
        answer = proxy.exchange(http("POST", "/v1/chat/completions", too_many), timeout=60)
        assert status_of(answer) == 413 and b"JSON values" in answer


# --- 3. the router's rules, exactly ---------------------------------------------------------------------

def test_the_key_file_is_read_as_llama_cpp_reads_it(tmp_path):
    """A key file whose first line is a `#` comment (llama.cpp's own format): the comment is no key, the
    next line is, and the proxy's own calls to the router (the pinned model's load) carry it."""
    with proxy_against(tmp_path) as proxy:
        assert status_of(proxy.exchange(http("GET", "/v1/models", key="# the first line is a comment"))) == 401
        assert status_of(proxy.exchange(http("GET", "/v1/models"))) == 200
        assert proxy.fake.loads == ["proxy"] and not proxy.fake.violations


REFUSED_BY_THE_ROUTER = {
    "lowercase bearer": {"Authorization": f"bearer {KEY}"},
    "two spaces after Bearer": {"Authorization": f"Bearer  {KEY}"},
    "key in a second Authorization header": {"Authorization": "Bearer wrong", "authorization": f"Bearer {KEY}"},
    "101 headers": {f"X-Pad-{i}": "x" for i in range(101)},
    "a header line over 8192 bytes": {"X-Long": "x" * 8200},
}


@pytest.mark.parametrize("case", sorted(REFUSED_BY_THE_ROUTER))
def test_a_request_the_router_would_refuse_unloads_nothing(case, tmp_path):
    """On a full card, a request for a model that does not fit, which the router would refuse (its key as
    the router reads it, its header limits), is refused by the proxy before any model is unloaded."""
    headers = REFUSED_BY_THE_ROUTER[case]
    with proxy_against(tmp_path) as proxy:
        fill_the_card(proxy)
        before = dict(proxy.fake.status)
        raw = http("POST", "/v1/chat/completions", chat("gemma-3-12b"), headers,
                   key=None if "Authorization" in headers else KEY)
        assert status_of(proxy.exchange(raw)) in (400, 401, 431)
        time.sleep(0.3)
        assert proxy.fake.status == before and not proxy.fake.violations


def test_a_path_the_router_does_not_route_here_is_named_as_such(tmp_path):
    """/v1/embeddings on a chat library is not model management: 404, naming the paths this server serves;
    model management is 403; a client path with the wrong method is 405."""
    with proxy_against(tmp_path) as proxy:
        answer = proxy.exchange(http("POST", "/v1/embeddings", chat("qwen3-8b")))
        assert status_of(answer) == 404 and b"/v1/chat/completions" in answer and b"management" not in answer
        assert status_of(proxy.exchange(http("POST", "/models/unload", b'{"model":"qwen3-8b"}'))) == 403
        assert status_of(proxy.exchange(http("GET", "/v1/chat/completions"))) == 405


SMUGGLING = {
    "Content-Length and chunked": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two Content-Lengths": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
    "space before the colon": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length : 4\r\n\r\nabcd",
    "a bare CR in a header": b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n",
    "a transfer coding other than chunked": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                           b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(SMUGGLING))
def test_framing_the_router_could_read_otherwise_is_refused(case, tmp_path):
    """Heads whose framing two HTTP implementations may read differently are refused (400, or 501 for a
    transfer coding h11 does not implement) and the connection closed; nothing reaches the router. (An
    obsolete line fold h11 unfolds into one header, as RFC 9112 allows: the router gets it unfolded.)"""
    with proxy_against(tmp_path) as proxy:
        served = len(proxy.fake.served)
        answer = proxy.exchange(SMUGGLING[case])
        assert answer == b"" or status_of(answer) in (400, 501), answer[:200]
        assert len(proxy.fake.served) == served and not proxy.fake.violations


# --- 5. a property over requests: no bypass, counts back to zero, memory and descriptors bounded -------

PATHS = ["/v1/chat/completions"] * 4 + ["/metrics"] * 4 + ["/v1/completions", "/completion", "/tokenize", "/v1/models", "/health",
         "/models", "/models/load", "/models/unload", "/props", "/slots", "/v1/embeddings", "/v1//chat/completions",
         "/v1/chat/completions/", "/%761/models", "/v1/models/../models"]
# Weighted towards what could load a model: the scrape and chat paths, model names, autoload, a good key.
QUERY = st.lists(st.one_of(
    st.tuples(st.just("model"), st.sampled_from(NAMES)),
    st.tuples(st.just("model"), st.sampled_from(NAMES)),
    st.tuples(st.just("autoload"), st.sampled_from(["1", "true", "false", "0", ""])),
    st.tuples(st.sampled_from(["reload", "x", "model[]", "a+b", "Model"]), st.sampled_from(["", "1", "%31", "qwen3-14b"]))),
    max_size=4)
KEYS = st.sampled_from([f"Authorization: Bearer {KEY}"] * 6 + [f"X-Api-Key: {KEY}", f"Authorization: bearer {KEY}",
                        "Authorization: Bearer wrong", "", f"Authorization: {KEY}",
                        f"Authorization:\r\nX-Api-Key: {KEY}", f"Authorization: Bearer {KEY}\r\nX-Api-Key: wrong"])
TYPES = st.sampled_from(["", "Content-Type: application/json", "Content-Type: multipart/form-data; boundary=XyZ",
                         "Content-Type: application/x-www-form-urlencoded", "Content-Type: text/plain",
                         "Content-Type: application/xml"])
MODEL_VALUES = st.sampled_from(NAMES + ["", "nope", 7, None, ["qwen3-8b"], {"model": "qwen3-14b"}])
BODIES = st.one_of(
    st.builds(lambda m, extra: json.dumps({"model": m, **extra}).encode(), MODEL_VALUES,
              st.dictionaries(st.sampled_from(["messages", "stream", "autoload", "hold"]), st.sampled_from([[], 0.02, True, "x"]),
                              max_size=2)),
    st.sampled_from([b"", b"{", b"[]", b"null", MULTIPART, b"\xef\xbb\xbf" + chat("qwen3-14b"), b"autoload=1&model=gemma-3-12b",
                     b'{"model":"qwen3-8b","model":"gemma-3-12b"}', b'{"model":"qwen3-14b","x":NaN}', b"\xff\xfe{}",
                     b'{"model":"qwen3-14b","x":"\xc3\x28"}']),
)


@st.composite
def requests(draw):
    path = draw(st.sampled_from(PATHS))
    usual = "GET" if path in ("/metrics", "/v1/models", "/health") else "POST"
    method = draw(st.sampled_from([usual] * 6 + ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]))
    query = draw(QUERY)
    target = path + ("?" + "&".join(f"{k}={v}" for k, v in query) if query else "")
    body = draw(BODIES) if method in ("POST", "PUT") else b""
    head = [f"{method} {target} HTTP/1.1", "Host: x", draw(KEYS), draw(TYPES)]
    framing = draw(st.sampled_from(["length", "chunked", "expect", "none"]))
    if framing == "chunked":
        head.append("Transfer-Encoding: chunked")
        cut = draw(st.integers(0, len(body)))
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:cut], body[cut:]) if p) + b"0\r\n\r\n"
    else:
        if framing == "expect":
            head.append("Expect: 100-continue")
        if framing != "none" or body:
            head.append(f"Content-Length: {len(body)}")
        payload = body
    raw = ("\r\n".join(h for h in head if h) + "\r\n\r\n").encode("latin-1") + payload
    pieces = draw(st.integers(1, 4))
    leave_after = draw(st.sampled_from([None, None, None, 0.0, 0.05]))
    return raw, pieces, leave_after


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(requests(), min_size=1, max_size=4))
def test_no_request_breaks_the_budget_the_counts_or_the_proxy(proxy_for_property, batch):
    """Any mix of methods, paths, queries, keys, content types, bodies, framings, pacings and clients that
    leave early, a few at once: the router never holds more than the budget, never sees a request it
    would refuse or a management call from a client, and never loads anything on its own; afterwards no
    model is counted in flight, /health answers, and memory and descriptors stay bounded."""
    proxy = proxy_for_property

    def one(raw: bytes, pieces: int, leave_after) -> None:
        try:
            with proxy.connect(10) as s:
                step = max(1, len(raw) // pieces)
                for start in range(0, len(raw), step):
                    s.sendall(raw[start:start + step])
                    time.sleep(0.002)
                if leave_after is not None:
                    time.sleep(leave_after)
                    return
                s.settimeout(10)
                read_answer(s)
        except OSError:
            pass

    threads = [threading.Thread(target=one, args=r) for r in batch]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    fake = proxy.fake
    assert fake.peak <= BUDGET + 1e-9
    assert not fake.violations, fake.violations
    assert "autoload" not in fake.loads
    wait_for(lambda: not any(proxy.in_flight().values()), f"counts not back to zero: {proxy.in_flight()}")
    assert status_of(proxy.exchange(http("GET", "/health", key=None))) == 200
    assert proxy.rss_peak_kib() < 200 * 1024 and proxy.open_fds() < 64


@pytest.fixture(scope="module")
def proxy_for_property(tmp_path_factory):
    with proxy_against(tmp_path_factory.mktemp("property"), load_seconds=0.01) as proxy:
        yield proxy


# --- 4. races a review found (each test names its finding) ------------------------------------------

SMALL = {"models": {n: {"vram_gib": v, "ram_gib": 0.1, "pinned": False} for n, v in
                    {"A": 10, "B": 10, "C": 10, "D": 10, "E": 5}.items()},
         "vram_budget_gib": 25, "ram_budget_gib": 1000, "host_gib": 0.25, "max_loaded": None,
         "allowed_paths": ["/v1/chat/completions", "/v1/models", "/health"]}


def small_plan(budget: float, names: str) -> dict:
    plan = json.loads(json.dumps(SMALL))
    plan["vram_budget_gib"] = budget
    plan["models"] = {n: m for n, m in plan["models"].items() if n in names}
    return plan


def chat_status(proxy: Proxy, model: str, hold: float = 0.0, timeout: float = 60) -> int | None:
    try:
        return status_of(proxy.exchange(http("POST", "/v1/chat/completions", json.dumps({"model": model, "hold": hold}).encode()),
                                        timeout))
    except AssertionError:
        return None


def in_background(function, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(function(*args)))
    thread.start()
    return thread, result


def test_a_client_that_leaves_while_queued_frees_no_lock_and_leaks_no_request(tmp_path):
    """Review B1: a waiter cancelled while it took the admission lock back used to release the lock another
    admission held (two admissions at once, then a count that never fell)."""
    with proxy_against(tmp_path, plan=small_plan(25, "ABCDE")) as proxy:
        proxy.fake.unload_seconds = 3.0
        a = in_background(chat_status, proxy, "A", 2.0)
        b = in_background(chat_status, proxy, "B", 8.0)
        time.sleep(0.3)
        c = in_background(chat_status, proxy, "C")
        time.sleep(0.3)
        d = proxy.connect()
        d.sendall(http("POST", "/v1/chat/completions", json.dumps({"model": "D"}).encode()))
        a[0].join(30)
        time.sleep(0.5)
        d.close()  # leaves while queued
        time.sleep(0.2)
        e = chat_status(proxy, "E")
        for thread, _ in (b, c):
            thread.join(60)
        assert (e, c[1], b[1], a[1]) == (200, [200], [200], [200])
        wait_for(lambda: not any(proxy.in_flight().get(n, 0) for n in "ABCDE"), "a request is still counted", 15)
        assert proxy.fake.peak <= 25


def test_a_cold_request_behind_busy_models_gets_a_503_in_bounded_time(tmp_path):
    """Review B4: while the resident models stay busy, the request that needs their room is answered 503
    (the gateway's next tier) after ADMIT_WAIT_SECONDS (2 s here), and the busy ones are untouched."""
    with proxy_against(tmp_path, plan=small_plan(20, "ABC"), env_extra={"ADMIT_WAIT_SECONDS": "2"}) as proxy:
        busy = [in_background(chat_status, proxy, m, 6.0) for m in "AB"]
        wait_for(lambda: proxy.in_flight().get("A") == 1 and proxy.in_flight().get("B") == 1, "not busy")
        started = time.monotonic()
        status = chat_status(proxy, "C")
        waited = time.monotonic() - started
        for thread, _ in busy:
            thread.join(30)
        assert status == 503 and 2 <= waited < 4 and [r for _, r in busy] == [[200], [200]]
        assert proxy.fake.peak <= 20 and proxy.fake.status["C"] == "unloaded"


def test_a_model_dropped_from_the_plan_still_counts_until_the_router_lets_it_go(tmp_path):
    """Review C1: a model the plan no longer lists, still loaded, counted as 0 GiB; it keeps its last
    figures, goes first, and new requests for it are refused."""
    with proxy_against(tmp_path, plan=small_plan(20, "ABC")) as proxy:
        assert chat_status(proxy, "A") == 200 and chat_status(proxy, "B") == 200
        plan = small_plan(20, "BC")
        (tmp_path / "admission.json").write_text(json.dumps(plan) + " ")  # another size: a new file
        assert chat_status(proxy, "A") == 400
        assert chat_status(proxy, "C") == 200
        assert proxy.fake.peak <= 20 and proxy.fake.status["A"] == "unloaded" and proxy.fake.status["B"] == "loaded"


def test_a_router_that_is_down_is_a_503_and_a_bad_plan_keeps_the_last_one(tmp_path):
    """Review C2 and C3: a plan file that cannot be read keeps the last good one (requests go on); a router
    that does not answer is a 503 the gateway retries, not an empty reply."""
    with proxy_against(tmp_path, plan=small_plan(20, "AB")) as proxy:
        (tmp_path / "admission.json").write_text("{not json")
        assert chat_status(proxy, "A") == 200
        proxy.fake.server.shutdown()
        proxy.fake.server.server_close()
        assert chat_status(proxy, "B") == 503


def test_expect_100_continue_is_answered_before_the_body(tmp_path):
    """Review C4: a client that waits for 100 Continue (Go's transport behind Traefik, curl for large
    bodies) gets it once its head is accepted, and nothing when it is not (its key is wrong)."""
    with proxy_against(tmp_path, plan=small_plan(20, "AB")) as proxy:
        body = json.dumps({"model": "A"}).encode()
        with proxy.connect() as s:
            s.sendall(http("POST", "/v1/chat/completions", headers={"Expect": "100-continue"})[:-len(b"Content-Length: 0\r\n\r\n")]
                      + f"Content-Length: {len(body)}\r\n\r\n".encode())
            interim = s.recv(65536)
            s.sendall(body)
            final = read_answer(s)
        assert interim == b"HTTP/1.1 100 \r\n\r\n" and final.startswith(b"HTTP/1.1 200")
        refused = proxy.exchange(http("POST", "/v1/chat/completions", headers={"Expect": "100-continue"}, key="wrong")
                                 [:-len(b"Content-Length: 0\r\n\r\n")] + b"Content-Length: 10\r\n\r\n")
        assert status_of(refused) == 401


def test_a_model_the_downloader_refused_as_larger_than_planned_is_said_and_exported(tmp_path):
    """The downloader's status (incluster/library.py, on the pod's scratch volume): a model refused for files
    larger than planned is not on the router; a request for it is a 503 saying so (the gateway's next tier),
    and /metrics exports it under the reason the rendered alert reads (tests/test_alert_rules.py)."""
    status = tmp_path / "library-status.json"
    status.write_text(json.dumps({"served": ["qwen3-8b"], "missing": {
        "gemma-3-12b": "refused: larger than planned: its files are 9.10 GiB, the plan counted 0.50 GiB",
        "qwen3-14b": "the Hub is unreachable (timed out) and Qwen/Qwen3-14B-GGUF:Q4_K_M was never fetched completely"}}))
    with proxy_against(tmp_path, env_extra={"LIBRARY_STATUS": str(status)}) as proxy:
        for name in ("gemma-3-12b", "qwen3-14b"):
            del proxy.fake.status[name]
        answer = proxy.exchange(http("POST", "/v1/chat/completions", chat("gemma-3-12b")))
        assert status_of(answer) == 503 and b"larger than the plan counted" in answer
        answer = proxy.exchange(http("POST", "/v1/chat/completions", chat("qwen3-14b")))
        assert status_of(answer) == 503 and b"being fetched" in answer
        metrics = proxy.metrics()
        assert metrics['inference_plane_router_model_unserved{model="gemma-3-12b",reason="larger_than_planned"}'] == 1
        assert metrics['inference_plane_router_model_unserved{model="qwen3-14b",reason="unreachable"}'] == 1


# --- 6. what a review of the new proxy found (each test names its finding) -----------------------------

def test_a_get_with_a_body_is_refused_before_it_is_read(tmp_path):
    """Review 1: /health needs no key and a GET body was read: three keyless GETs announcing 32 MiB held every
    POST off, and enough of them filled /health's reserve. Now a GET (or any method but POST) with a body is a
    400 before a byte of it is read."""
    with proxy_against(tmp_path) as proxy:
        for framing in (f"Content-Length: {32 * 1024 * 1024}", "Transfer-Encoding: chunked"):
            with proxy.connect() as s:
                s.sendall(f"GET /health HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode() + b"x" * 1000)
                answer = read_answer(s)
            assert status_of(answer) == 400 and b"with a body" in answer
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat("qwen3-8b")))) == 200


def test_requests_for_a_model_whose_load_is_under_way_wait_for_it(tmp_path):
    """Review 2: the load's future was made after the router's answer to the load, so a second request for the
    same cold model, arriving meanwhile, went on to a model still loading (503 "Loading model")."""
    with proxy_against(tmp_path, load_seconds=0.5) as proxy:
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(chat_status(proxy, "qwen3-14b"))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [200] * 8 and proxy.fake.loads.count("proxy") == 2  # the pinned model's, then this one


REFUSED_BY_THE_ROUTERS_PARSERS = {
    "a control character in a header value": (http("POST", "/v1/chat/completions", chat("gemma-3-12b"),
                                                   {"X-Note": "a\x01b"}), 400),
    "a compressed body": (http("POST", "/v1/chat/completions", chat("gemma-3-12b"), {"Content-Encoding": "gzip"}), 415),
    "a number past a double": (http("POST", "/v1/chat/completions", b'{"model":"gemma-3-12b","x":1e999}'), 400),
    "an integer past a double": (http("POST", "/v1/chat/completions", b'{"model":"gemma-3-12b","x":' + b"9" * 400 + b"}"), 400),
    "a lone surrogate escape": (http("POST", "/v1/chat/completions", b'{"model":"gemma-3-12b","x":"\\ud800"}'), 400),
    "a lone low surrogate": (http("POST", "/v1/chat/completions", b'{"model":"gemma-3-12b","x":"a\\udc00"}'), 400),
}


@pytest.mark.parametrize("case", sorted(REFUSED_BY_THE_ROUTERS_PARSERS))
def test_what_the_routers_parsers_refuse_unloads_nothing(case, tmp_path):
    """Review 3: requests b10729 refuses (cpp-httplib's field rule, no Content-Encoding, nlohmann's numbers and
    surrogates) made the proxy unload and load first. On a full card they are refused with nothing changed."""
    raw, status = REFUSED_BY_THE_ROUTERS_PARSERS[case]
    with proxy_against(tmp_path) as proxy:
        fill_the_card(proxy)
        before = (dict(proxy.fake.status), len(proxy.fake.loads))
        assert status_of(proxy.exchange(raw)) == status
        time.sleep(0.3)
        assert (dict(proxy.fake.status), len(proxy.fake.loads)) == before


def test_a_paired_surrogate_and_an_escaped_backslash_pass():
    """The surrogate check reads escapes as JSON does: a pair passes, and so does the text \\ud800 after an
    escaped backslash (which is no escape)."""
    from incluster import router_rules  # standard library alone: importable as the program's module too
    assert router_rules.body_model(b'{"model":"m","x":"\\ud83d\\ude00"}', 100) == "m"
    assert router_rules.body_model(b'{"model":"m","x":"\\\\ud800"}', 100) == "m"
    assert router_rules.body_model(b'{"model":"m","x":1.5e300,"y":12345678901234567890}', 100) == "m"


def test_a_model_name_past_ascii_is_not_found_not_a_dropped_connection(tmp_path):
    """Review 4: an escaped CJK model name raised in the proxy and the connection was dropped unanswered."""
    with proxy_against(tmp_path) as proxy:
        answer = proxy.exchange(http("POST", "/v1/chat/completions", b'{"model":"\\u4e00"}'))
        assert status_of(answer) == 400 and b"not found" in answer


def test_a_running_model_no_plan_of_this_proxy_listed_is_unloaded_before_any_load(tmp_path):
    """Review 5: after a proxy restart with a plan that dropped a running model, it counted as 0 GiB and a load
    could pass the budget. Now it counts as filling everything: the next load unloads it first."""
    with proxy_against(tmp_path) as proxy:
        fill_the_card(proxy)
        plan = json.loads(json.dumps(PLAN))
        del plan["models"]["qwen3-30b-a3b"]
        proxy.proc.terminate()
        proxy.proc.wait(10)
    # A new proxy on the same router state: the 30B still running, unknown to its plan.
    with proxy_against(tmp_path / "again", plan=plan) as proxy:
        proxy.fake.vram["qwen3-30b-a3b"] = PLAN["models"]["qwen3-30b-a3b"]["vram_gib"]
        proxy.fake.status["qwen3-30b-a3b"] = "loaded"
        assert chat_status(proxy, "gemma-3-12b") == 200
        assert proxy.fake.status["qwen3-30b-a3b"] == "unloaded" and proxy.fake.peak <= BUDGET + 1e-9


# --- a model the keeper reloads is drained first (issue #48 item 2) -------------------------------------------

def control(sock: Path, target: str, document: dict | None = None, method: str = "POST", raw: bytes | None = None,
            timeout: float = 30) -> tuple[int, dict]:
    """One call on the proxy's control socket, as the keeper makes it (library.py: POST, a JSON body)."""
    body = json.dumps(document).encode() if document is not None else b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(raw if raw is not None else http(method, target, body, {"Content-Type": "application/json"}, key=None))
        answer = read_answer(s)
    return status_of(answer), json.loads(answer.split(b"\r\n\r\n", 1)[1] or b"{}")


def in_thread(call):
    """Runs call() in a thread; returns a function giving (its result, when it returned)."""
    box: dict = {}

    def run():
        box["result"] = call()
        box["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result(seconds: float = 30):
        thread.join(seconds)
        assert "result" in box, "still waiting"
        return box["result"], box["at"]
    return result


def test_a_model_being_reloaded_finishes_its_requests_and_takes_no_new_ones_until_resumed(tmp_path):
    """The keeper drains a model before the router reloads it (new settings or weights): the request in flight
    on it runs to its end, a new one for it is a 503 with Retry-After (the gateway's next tier) and counted
    as unserved (reloading), other models are served throughout, and after resume it is admitted again."""
    sock = tmp_path / "control.sock"
    model, other = UNPINNED[0], PINNED[0]
    with proxy_against(tmp_path, {"ADMISSION_CONTROL": str(sock)}) as proxy:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        held = in_thread(lambda: proxy.exchange(http("POST", "/v1/chat/completions", chat(model, hold=2.0)), timeout=30))
        wait_for(lambda: proxy.in_flight().get(model) == 1, "the held request was never admitted")
        drained = in_thread(lambda: control(sock, "/drain", {"models": [model], "seconds": 30}))
        wait_for(lambda: proxy.metrics().get(f'inference_plane_router_model_unserved{{model="{model}",reason="reloading"}}') == 1,
                 "the draining model is not counted unserved")
        refused = proxy.exchange(http("POST", "/v1/chat/completions", chat(model)))
        assert status_of(refused) == 503 and b"Retry-After: 5" in refused and b"being reloaded" in refused
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(other)))) == 200
        (answer, answered_at), ((status, document), drained_at) = held(), drained()
        assert status_of(answer) == 200 and answer.endswith(json.dumps({"model": model}).encode())
        assert (status, document) == (200, {"in_flight": {model: 0}, "unknown": []})
        assert drained_at >= answered_at - 0.2  # the drain answered once the request in flight had ended
        assert control(sock, "/resume", {"models": [model]}) == (200, {"resumed": [model], "unknown": []})
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(model)))) == 200
        assert not any("reloading" in k for k in proxy.metrics())


def test_a_drain_waits_no_longer_than_asked_and_lapses_without_the_keeper(tmp_path):
    """A request longer than the drain's wait: the keeper hears how many are still in flight and reloads anyway.
    A keeper that never says resume (it crashed) holds the model back no longer than DRAIN_HOLD_SECONDS."""
    sock = tmp_path / "control.sock"
    model = UNPINNED[0]
    # The hold (3 s) outlasts the drain (0.5 s) by the answer and the refused request's round trip, on a loaded machine.
    with proxy_against(tmp_path, {"ADMISSION_CONTROL": str(sock), "DRAIN_HOLD_SECONDS": "3"}) as proxy:
        held = in_thread(lambda: proxy.exchange(http("POST", "/v1/chat/completions", chat(model, hold=6.0)), timeout=30))
        wait_for(lambda: proxy.in_flight().get(model) == 1, "the held request was never admitted")
        started = time.monotonic()
        assert control(sock, "/drain", {"models": [model], "seconds": 0.5}) == (200, {"in_flight": {model: 1}, "unknown": []})
        assert time.monotonic() - started < 2
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(model)))) == 503
        assert status_of(held()[0]) == 200
        wait_for(lambda: status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(model)))) == 200,
                 "a drain the keeper never ended still refuses the model", seconds=8)


def test_models_drained_together_stay_drained_until_the_last_has_ended(tmp_path):
    """A preset edit that touches two models drains both in one call: the one with nothing in flight stays
    refused while the other's request runs on (here longer than DRAIN_HOLD_SECONDS), so neither is admitted
    again before the reload that follows the drain."""
    sock = tmp_path / "control.sock"
    idle, busy = UNPINNED[0], PINNED[0]
    with proxy_against(tmp_path, {"ADMISSION_CONTROL": str(sock), "DRAIN_HOLD_SECONDS": "1"}) as proxy:
        held = in_thread(lambda: proxy.exchange(http("POST", "/v1/chat/completions", chat(busy, hold=3.0)), timeout=30))
        wait_for(lambda: proxy.in_flight().get(busy) == 1, "the held request was never admitted")
        started = time.monotonic()
        drained = in_thread(lambda: control(sock, "/drain", {"models": [idle, busy], "seconds": 30}))
        time.sleep(2.0)  # past the idle model's hold, were it drained alone
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(idle)))) == 503
        assert drained()[0] == (200, {"in_flight": {idle: 0, busy: 0}, "unknown": []})
        assert time.monotonic() - started >= 2.0 and status_of(held()[0]) == 200
        assert control(sock, "/resume", {"models": [idle, busy]}) == (200, {"resumed": sorted([idle, busy]), "unknown": []})
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(idle)))) == 200


def test_a_smaller_budget_unloads_idle_models_at_once_and_busy_ones_once_they_finish(tmp_path):
    """Issue #48 item 4: a model moved from the router to a server of its own on the same card shrinks the
    router's budget. The proxy brings what is resident within the new plan by itself (the other server needs
    that memory now, not at the router's next load): idle models first, least recently used; a model serving
    a request only once it has finished."""
    vram = {n: PLAN["models"][n]["vram_gib"] for n in NAMES}
    pinned = sum(vram[n] for n in PINNED)
    pair = next((a, b) for a in UNPINNED for b in UNPINNED if a < b and pinned + vram[a] + vram[b] <= BUDGET)
    with proxy_against(tmp_path) as proxy:
        for name in pair:
            assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(name)))) == 200
        busy, idle = pair
        # Held past the idle model's unload (up to a pin round and a poll) and the 2 s below, on a loaded machine.
        held = in_thread(lambda: proxy.exchange(http("POST", "/v1/chat/completions", chat(busy, hold=8.0)), timeout=30))
        wait_for(lambda: proxy.in_flight().get(busy) == 1, "the held request was never admitted")
        # The new plan: room for the pinned models and the busy one only.
        smaller = {**PLAN, "vram_budget_gib": round(pinned + vram[busy] + 0.05, 2)}
        (tmp_path / "admission.json").write_text(json.dumps(smaller))
        wait_for(lambda: proxy.fake.status[idle] == "unloaded", "the idle model was not unloaded", seconds=5)
        assert proxy.fake.status[busy] == "loaded" and all(proxy.fake.status[n] == "loaded" for n in PINNED)
        # Then room for the pinned ones alone: the busy model goes once its request has ended, not before.
        (tmp_path / "admission.json").write_text(json.dumps({**PLAN, "vram_budget_gib": round(pinned + 0.05, 2)}))
        time.sleep(2.0)
        assert proxy.fake.status[busy] == "loaded" and proxy.in_flight().get(busy) == 1
        assert status_of(held()[0]) == 200
        wait_for(lambda: proxy.fake.status[busy] == "unloaded", "the busy model was not unloaded once idle", seconds=5)
        assert all(proxy.fake.status[n] == "loaded" for n in PINNED)


def test_a_model_the_plan_drops_is_drained_while_its_last_request_runs(tmp_path):
    """A model removed from the library: the proxy reads the new plan (the model unknown to new requests) while
    a request on it still runs; the keeper's drain of it waits for that request, so the reload that forgets
    the model cuts nothing."""
    sock = tmp_path / "control.sock"
    dropped = UNPINNED[0]
    with proxy_against(tmp_path, {"ADMISSION_CONTROL": str(sock)}) as proxy:
        held = in_thread(lambda: proxy.exchange(http("POST", "/v1/chat/completions", chat(dropped, hold=2.0)), timeout=30))
        wait_for(lambda: proxy.in_flight().get(dropped) == 1, "the held request was never admitted")
        smaller = {**PLAN, "models": {n: m for n, m in PLAN["models"].items() if n != dropped}}
        (tmp_path / "admission.json").write_text(json.dumps(smaller))
        wait_for(lambda: status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(dropped)))) == 400,
                 "the new plan was never read")
        # With a name the proxy knows nothing of in the same call (a model dropped and no longer running): the
        # others are drained all the same (a 400 for the whole call once let the reload cut a request).
        status, document = control(sock, "/drain", {"models": [dropped, "never-planned"], "seconds": 30})
        assert (status, document) == (200, {"in_flight": {dropped: 0}, "unknown": ["never-planned"]})
        assert status_of(held()[0]) == 200


@pytest.mark.parametrize("call, expected", [
    (dict(target="/drain", document={"models": [7], "seconds": 1}), (400, "each a model name")),
    (dict(target="/drain", document={"models": ["x" * 300], "seconds": 1}), (400, "each a model name")),
    (dict(target="/drain", document={"models": ["M"], "seconds": 99999}), (400, "seconds out of range")),
    (dict(target="/drain", document={"seconds": 1}), (400, "models")),
    (dict(target="/drain", document={"models": "M", "seconds": 1}), (400, "a list of model names")),
    (dict(target="/drain", document={"models": [], "seconds": 1}), (400, "a list of model names")),
    (dict(target="/models/load", document={"models": ["M"]}), (404, "POST /drain or /resume")),
    (dict(target="/drain", method="GET"), (404, "POST /drain or /resume")),
])
def test_the_control_socket_takes_the_keepers_two_calls_and_nothing_else(tmp_path, call, expected):
    sock = tmp_path / "control.sock"
    if call.get("document", {}).get("models") in (["M"], "M"):
        call["document"]["models"] = [UNPINNED[0]] if call["document"]["models"] == ["M"] else UNPINNED[0]
    with proxy_against(tmp_path, {"ADMISSION_CONTROL": str(sock)}) as proxy:
        status, document = control(sock, **call)
        assert status == expected[0] and expected[1] in document["error"]
        # Too large a body: refused before it is read, and the proxy serves on.
        big = http("POST", "/drain", b"x" * 10_000, {"Content-Type": "application/json"}, key=None)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(sock))
            s.sendall(big)
            assert status_of(read_answer(s)) == 413
        # The pod's port does not take them: the keeper's calls are not a client's.
        answer = proxy.exchange(http("POST", "/drain", json.dumps({"models": [UNPINNED[0]], "seconds": 1}).encode()))
        assert status_of(answer) == 404
        assert status_of(proxy.exchange(http("POST", "/v1/chat/completions", chat(UNPINNED[0])))) == 200


# --- the review's findings on the drain and the budget (each failed before its fix) ---------------------------

def test_a_request_waiting_for_room_when_its_model_is_drained_does_not_load_it(tmp_path):
    """A request for C that waits for room (A and B busy on a full card) is not yet counted in flight, so the
    drain answers at once; it must then be refused (503), never load C under the keeper's reload."""
    sock = tmp_path / "control.sock"
    with proxy_against(tmp_path, {"ADMISSION_CONTROL": str(sock)}, plan=small_plan(20, "ABC")) as proxy:
        busy = [in_background(chat_status, proxy, m, 3.0) for m in "AB"]
        wait_for(lambda: proxy.in_flight().get("A") == 1 and proxy.in_flight().get("B") == 1, "not busy")
        queued = in_background(chat_status, proxy, "C", 0.0)
        time.sleep(0.5)
        assert control(sock, "/drain", {"models": ["C"], "seconds": 30}) == (200, {"in_flight": {"C": 0}, "unknown": []})
        queued[0].join(30)
        assert queued[1] == [503] and "C" not in proxy.fake.served and proxy.fake.status["C"] == "unloaded"
        for thread, _ in busy:
            thread.join(30)


def test_a_model_always_busy_over_a_smaller_budget_is_drained_until_it_can_be_unloaded(tmp_path):
    """Overlapping requests keep a model from ever being idle: over a shrunk budget, the least recently used busy
    model takes no new request until its last one ends, is unloaded, and is admitted again."""
    with proxy_against(tmp_path, plan=small_plan(30, "ABC")) as proxy:
        for m in "AB":
            assert chat_status(proxy, m) == 200
        stop = time.monotonic() + 8
        answers: list = []

        def traffic(model: str) -> None:
            while time.monotonic() < stop:
                threading.Thread(target=lambda: answers.append(chat_status(proxy, model, 1.5))).start()
                time.sleep(0.5)  # a new request every 0.5 s, each 1.5 s long: always one in flight
        streams = [threading.Thread(target=traffic, args=(m,), daemon=True) for m in "AB"]
        for stream in streams:
            stream.start()
        time.sleep(1)
        (tmp_path / "admission.json").write_text(json.dumps(small_plan(10, "ABC")) + " ")
        wait_for(lambda: proxy.fake.resident_vram() <= 10, "the router stayed over the smaller budget", seconds=6)
        for stream in streams:
            stream.join(30)
        assert set(answers) <= {200, 503}  # refused with a retry hint, never cut


def test_the_room_status_stays_fresh_while_a_pinned_model_loads(tmp_path):
    """A pinned model's load (minutes for a large one) must not stop the status the servers sharing the card
    read: stale, it would read as no router at all."""
    plan = small_plan(25, "ABC")
    plan["models"]["A"]["pinned"] = True
    status = tmp_path / "room.json"
    with proxy_against(tmp_path, {"ROOM_STATUS": str(status), "ROOM_SECONDS": "0.5"}, plan=plan, load_seconds=6.0) as proxy:
        proxy.fake.status["A"] = "unloaded"  # the pinned model lost: the proxy loads it again, for 6 s
        ages = []
        for _ in range(14):
            time.sleep(0.5)
            ages.append(time.time() - json.loads(status.read_text())["at"])
        assert max(ages) < 2.5, ages
