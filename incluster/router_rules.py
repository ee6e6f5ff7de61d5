"""What llama.cpp's router (b10729, with its vendored cpp-httplib 0.54.1) reads from a request, for the
admission proxy in front of it (admission_proxy.py): the one parser that decides which model a request
names, and so what may load.

The proxy re-frames every request it passes on (h11 on both sides), so the router reads exactly the
request line, headers and body the proxy decided on. What is left to agree on is how each reads the
parts that matter: the API key, the query (?model=, ?autoload=, ?reload=) and the body's `model`. For
each, the proxy accepts only forms that both read the same way, and refuses the rest with 400 before
anything is loaded or unloaded; it never guesses. The router itself runs with --no-models-autoload, so
even a request both misread could not make it load a model: only the proxy's own /models/load does.

Facts (tools/server/ and vendor/cpp-httplib/ at b10729; lab/contract/ROUTER_FACTS.md):
- the key: --api-key-file's lines, each as std::getline reads it (split at \\n only, nothing stripped),
  except empty ones and those starting with '#' (common/arg.cpp); a request's key is its Authorization
  header, else its X-Api-Key header, less an exact "Bearer " prefix, compared byte for byte; /health and
  /v1/health need none (server-http.cpp middleware_validate_api_key);
- the query: every parameter, the last of a repeated name winning (server-http.cpp get_params);
  `autoload` on only for exactly "true" or "1" (server-models.cpp is_autoload); any non-empty `reload`
  on GET /models or /v1/models re-reads the preset; a POST with a form-urlencoded body has its body's
  fields read as parameters too (httplib.cpp, the form-urlencoded branch);
- the body: a POST's body parsed by nlohmann::json (which skips a UTF-8 byte-order mark), its top-level
  `model` taken when it is a string (server-common.h json_value); a multipart/form-data POST has its
  form fields turned into that JSON (server-http.cpp);
- the limits: at most 100 header lines, each at most 8192 bytes with its CRLF, a request target of at
  most 8192 bytes, a body of at most 100 MiB (httplib.h CPPHTTPLIB_*).

Standard library only: this file runs in the router's pod."""

from __future__ import annotations

import codecs
import hmac
import json
import math
import re

# cpp-httplib 0.54.1 (the router's): past these it refuses the request.
HEADER_MAX_COUNT = 100
HEADER_MAX_LENGTH = 8192  # one header line, "name: value\r\n"
URI_MAX_LENGTH = 8192

# Served without the key (server-http.cpp get_public_endpoints, less the web UI's assets, not routed here).
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# Of the client paths, those the router serves on GET; every other one is a POST.
GET_PATHS = frozenset({"/health", "/v1/health", "/v1/models"})
# The router's own model management and per-child state, which a client never reaches through the proxy.
MANAGEMENT_PATHS = ("/models", "/props", "/slots", "/lora-adapters", "/cors-proxy", "/tools", "/v1/stream",
                    "/v1/chat/completions/control")
# The per-model scrape: GET /metrics?model=X, passed on; without ?model= the proxy answers it itself.
SCRAPE_PATH = "/metrics"
# GET /models: what the router counts as holding a model (server-models.h is_running()), and as serving it;
# read by the admission proxy and by the keeper.
RUNNING = ("loading", "loaded", "sleeping")
READY = ("loaded", "sleeping")

# A path and a query the proxy reads exactly as the router does: no escapes, no '+', no separators other
# than '&' and '=' (so there is nothing to decode, and nothing two parsers could decode differently).
_PATH = re.compile(r"/[A-Za-z0-9._~/-]*")
_PARAMETER = re.compile(r"([A-Za-z0-9._~-]+)(?:=([A-Za-z0-9._~:-]*))?")
# Bodies the router reads as JSON (whatever the Content-Type says, it parses the body) and the proxy
# passes on as application/json: a form-urlencoded one (curl -d) would otherwise have its body read as
# query parameters too.
JSON_MEDIA_TYPES = frozenset({"", "application/json", "text/plain", "application/x-www-form-urlencoded"})
_BOM = codecs.BOM_UTF8
_VALIDATE_SLICE = 1 << 20


class Refusal(Exception):
    """A request the proxy answers itself, before anything is admitted: its status and message."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def read_key_file(data: bytes) -> tuple[bytes, ...]:
    """The keys of a key file, as llama-server's --api-key-file reads them."""
    return tuple(line for line in data.split(b"\n") if line and not line.startswith(b"#"))


def given_key(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The key a request gives, as the router reads it; one header of each name at most (the router
    takes the first, which is not something to rely on)."""
    authorization = [value for name, value in headers if name == b"authorization"]
    api_key = [value for name, value in headers if name == b"x-api-key"]
    if len(authorization) > 1 or len(api_key) > 1:
        raise Refusal(400, "send the API key once: more than one Authorization or X-Api-Key header")
    key = authorization[0] if authorization else b""
    if not key:
        key = api_key[0] if api_key else b""
    return key[len(b"Bearer "):] if key.startswith(b"Bearer ") else key


def authorized(keys: tuple[bytes, ...], headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the router would accept the request's key (no keys: every request). Every key is compared,
    each in constant time, so the answer's timing does not tell which key came close."""
    if not keys:
        return True
    key = given_key(headers)
    matched = False
    for candidate in keys:
        matched |= hmac.compare_digest(key, candidate)
    return matched


def split_target(target: str) -> tuple[str, dict[str, str]]:
    """The path and the query parameters of a request target, when both read them alike; else a 400."""
    if len(target) > URI_MAX_LENGTH:
        raise Refusal(414, f"request target longer than {URI_MAX_LENGTH} bytes")
    path, _, query = target.partition("?")
    if not _PATH.fullmatch(path) or "#" in target:
        raise Refusal(400, "the path has characters this server does not read (escapes, spaces, a fragment)")
    parameters: dict[str, str] = {}
    for part in query.split("&") if query else ():
        match = _PARAMETER.fullmatch(part)
        if match is None:
            raise Refusal(400, "the query has a parameter this server does not read (escapes, '+', empty parts)")
        name, value = match.group(1), match.group(2) or ""
        if name in parameters:
            raise Refusal(400, f"the query names {name!r} twice")
        parameters[name] = value
    return path, parameters


def route(method: str, path: str, parameters: dict[str, str], client_paths: frozenset) -> None:
    """Refuses what the router must not be asked by a client: a path outside the client paths (model
    management: 403; anything else: 404, naming the paths served), the wrong method (405), a query that
    would load, reload or route (403), or any other query parameter (400)."""
    if path != SCRAPE_PATH and path not in client_paths:
        if any(path == p or path.startswith(p + "/") for p in MANAGEMENT_PATHS):
            raise Refusal(403, f"{method} {path}: model management stays inside the pod", "permission_error")
        raise Refusal(404, f"{method} {path} is not served here; this server's paths: {', '.join(sorted(client_paths))}",
                      "not_found_error")
    wanted = "GET" if path in GET_PATHS or path == SCRAPE_PATH else "POST"
    if method != wanted:
        raise Refusal(405, f"{path} answers {wanted}, not {method}")
    for name, value in parameters.items():
        if path == SCRAPE_PATH and name == "model":
            continue
        if path == SCRAPE_PATH and name == "autoload" and value in ("false", "0"):
            continue
        if name in ("autoload", "reload", "model"):
            raise Refusal(403, f"?{name}= is the router's model management, which stays inside the pod",
                          "permission_error")
        raise Refusal(400, f"{path} takes no query parameter {name!r}")


# A header value as cpp-httplib 0.54.1 takes it (httplib.cpp fields::is_field_content): visible characters and
# obs-text, with spaces and tabs inside; h11 also lets other control characters through, the router does not.
_FIELD_VALUE = re.compile(rb"([\x21-\x7e\x80-\xff]([\x20\x09\x21-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")


def check_head(headers: list[tuple[bytes, bytes]], target: str) -> None:
    """The router's limits and rules, on the head as the proxy will send it (the proxy's own headers included):
    a request it would refuse is refused here, before anything is unloaded."""
    if len(headers) > HEADER_MAX_COUNT:
        raise Refusal(431, f"more than {HEADER_MAX_COUNT} headers")
    for name, value in headers:
        if len(name) + len(value) + 4 > HEADER_MAX_LENGTH:
            raise Refusal(431, f"a header line longer than {HEADER_MAX_LENGTH} bytes ({name.decode('latin-1')})")
        if not _FIELD_VALUE.fullmatch(value):
            raise Refusal(400, f"the {name.decode('latin-1')} header holds a control character")
        if name == b"content-encoding" and value.lower() != b"identity":
            raise Refusal(415, "a compressed request body is not accepted here: send it uncompressed")
    if len(target) > URI_MAX_LENGTH:
        raise Refusal(414, f"request target longer than {URI_MAX_LENGTH} bytes")


def media_type(headers: list[tuple[bytes, bytes]]) -> str:
    types = [value for name, value in headers if name == b"content-type"]
    if len(types) > 1:
        raise Refusal(400, "more than one Content-Type header")
    kind = types[0].split(b";", 1)[0].strip().lower().decode("latin-1") if types else ""
    if kind.startswith("multipart/"):
        raise Refusal(400, "multipart bodies are not accepted here (the router reads their form fields as the "
                           "request): send the request as JSON")
    if kind not in JSON_MEDIA_TYPES:
        raise Refusal(415, f"Content-Type {kind} is not accepted here: send the request as application/json")
    return kind


def json_values_bound(body: bytes) -> int:
    """An upper bound on the JSON values and keys in a body (each follows '[', '{', ',' or ':', or is the
    first): what bounds the objects a parse creates, counted at C speed before any is."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + body.count(b":") + 1


class _Named:
    """What the parse keeps of one JSON object: the values of its `model` keys (usually none)."""

    __slots__ = ("models",)

    def __init__(self, models: tuple):
        self.models = models


_UNNAMED = _Named(())


def _object(pairs: list) -> _Named:
    models = tuple(value for key, value in pairs if key == "model")
    return _Named(models) if models else _UNNAMED


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> None:
    """A number nlohmann::json can hold: one past a double's range (1e999, or an integer of 400 digits) is its
    parse error 406, so the router would refuse the body. Nothing is kept."""
    if math.isinf(float(text)):
        raise ValueError(f"the number {text[:20]}... is out of range")


_SURROGATE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u([dD][89abAB][0-9a-fA-F]{2}|[dD][c-fC-F][0-9a-fA-F]{2})")


def _surrogates_paired(body: bytes) -> bool:
    """Every \\uD800-\\uDBFF escape followed at once by a \\uDC00-\\uDFFF one, and no low one alone: what
    nlohmann::json requires (its parse error 101); Python's json would take a lone one."""
    expect_low_at = None
    for match in _SURROGATE.finditer(body):
        start = match.start() + len(match.group(1))
        high = match.group(2)[1:2].lower() in (b"8", b"9", b"a", b"b")
        if expect_low_at is not None:
            if start != expect_low_at or high:
                return False
            expect_low_at = None
        elif high:
            expect_low_at = match.end()
        else:
            return False
    return expect_low_at is None


def body_model(body: bytes, max_values: int) -> str:
    """The model a POST body names, read as the router reads it, or a Refusal. Memory stays within a
    small multiple of the body: it is parsed as Latin-1 (one byte a character; JSON's syntax is ASCII, so
    the structure is the same), numbers are not built, every object but its `model` values is dropped
    as soon as it is read, and the values a body may hold are bounded first."""
    if body.startswith(_BOM):
        raise Refusal(400, "a JSON body starting with a byte-order mark is not accepted here: send it without")
    if json_values_bound(body) > max_values:
        raise Refusal(413, f"the body holds more than {max_values} JSON values")
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        for start in range(0, len(body), _VALIDATE_SLICE):
            decoder.decode(body[start:start + _VALIDATE_SLICE])
        decoder.decode(b"", final=True)
        if b"\\u" in body and not _surrogates_paired(body):
            raise ValueError("an unpaired surrogate escape (\\uD800-\\uDFFF)")
        parsed = json.loads(body.decode("latin-1"), object_pairs_hook=_object, parse_int=_finite,
                            parse_float=_finite, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise Refusal(400, "the body is not UTF-8") from None
    except RecursionError:
        raise Refusal(400, "the body's JSON is nested too deeply") from None
    except ValueError as error:
        raise Refusal(400, f"the body is not JSON: {error}") from None
    if not isinstance(parsed, _Named):
        raise Refusal(400, "the body is not a JSON object")
    if len(parsed.models) > 1:
        raise Refusal(400, "the body names 'model' more than once")
    model = parsed.models[0] if parsed.models else None
    if not isinstance(model, str) or not model:
        raise Refusal(400, "model name is missing from the request")
    # Past ASCII, a character here is a UTF-8 byte or an escape's: no model name of the plan has any, so such a
    # name is one the router does not serve either (the caller answers it as not found).
    return model
