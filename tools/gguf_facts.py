"""Print a model's ``facts:`` block (and ``weights:``) from its GGUF header.

    python tools/gguf_facts.py path/to/model.gguf
    python tools/gguf_facts.py org/Repo-GGUF[:QUANT]
    python tools/gguf_facts.py https://huggingface.co/org/repo/resolve/main/model.gguf

The output is YAML to paste under ``models.<key>`` in a stack file, for a model the built-in
catalog (config/catalog.yaml) does not know. Only the header is read: the fixed preamble, the
key/value metadata and the tensor table. A partial download works as long as the metadata is
whole; without the tensor table the parameter count comes from ``general.size_label``.

For a Hub repo or URL only the first 8 MiB are fetched with an HTTP Range request, doubled up to
64 MiB while the header is longer. ``org/repo:QUANT`` is resolved through the Hub API's file list
(``https://huggingface.co/api/models/<repo>``): the .gguf whose name carries the quant, the first
shard of a split model. HF_TOKEN, when set, is sent to the Hub API and file host for gated repos;
HF_ENDPOINT overrides https://huggingface.co.

Errors: one line on stderr naming the input and the fix, exit status 2.
"""

# This module finds the bytes (a local file and its shards, the Hub, a URL) and runs the command;
# tools/gguf_header.py parses the header, tools/gguf_derive.py turns its metadata into the facts.

from __future__ import annotations

import json
import mmap
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: only tools/ is on the path
    sys.path.insert(0, str(ROOT))

from tools.gguf_derive import derive, render  # noqa: E402 - after the path edit above
from tools.gguf_header import FactsError, Model, Shard, Truncated, data_end, parse_header

MIB = 2**20
FIRST_FETCH = 8 * MIB
MAX_FETCH = 64 * MIB
DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp's --hf-repo picks when the tag is left out
HTTP_TIMEOUT_S = 60
USAGE = "usage: python tools/gguf_facts.py <path-to-.gguf | org/repo[:QUANT] | https URL>"

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


# --- one model: a file, or the shards of a split file ----------------------------------------------


def _read_local(path: Path) -> Shard:
    try:
        handle = path.open("rb")
    except IsADirectoryError:
        raise FactsError(f"{path} is a directory; give the .gguf file inside it") from None
    except OSError as exc:
        raise FactsError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise FactsError("the file is empty, not a GGUF file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            try:
                header = parse_header(view)
            except Truncated:
                raise FactsError(
                    f"the file ends ({size} bytes) inside its GGUF metadata; download more of it (the first 64 MiB "
                    "hold the header of any model) or the whole file"
                ) from None
    end = data_end(header)
    if header.tensors is None:
        return Shard(path.name, header, None, partial=True)
    if end is not None and size < end:  # a partial download: the tensor table still tells the full size
        return Shard(path.name, header, end, partial=True)
    return Shard(path.name, header, size, partial=False)


def _shard_names(name: str, count: int) -> Optional[list[str]]:
    match = _SPLIT.search(name)
    if match is None:
        return None
    width = len(match.group(1))
    stem = name[: match.start()]
    return [f"{stem}-{i:0{width}d}-of-{count:0{width}d}.gguf" for i in range(1, count + 1)]


def read_local_model(path: Path, source: str) -> Model:
    first = _read_local(path)
    model = Model(source, [first])
    count = first.header.kv.get("split.count", 1)
    if isinstance(count, int) and count > 1:
        names = _shard_names(path.name, count)
        if names is None:
            model.comments.append(f"split into {count} files whose names are not -0000N-of-0000M: read this one only")
            return model
        model.shards = []
        for name in names:
            shard_path = path.with_name(name)
            if shard_path.name == path.name:
                model.shards.append(first)
            elif shard_path.is_file():
                model.shards.append(_read_local(shard_path))
            else:
                model.comments.append(f"shard {name} is not beside {path.name}: counted from the first shard's metadata")
                model.shards = [first]
                break
    return model


# --- the network: Hub API and HTTP Range -----------------------------------------------------------


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _request(url: str, headers: Optional[dict[str, str]] = None) -> urllib.request.Request:
    request = urllib.request.Request(url, headers={"User-Agent": "inference-plane-gguf-facts/1", **(headers or {})})
    token = os.environ.get("HF_TOKEN")
    if token and urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(_endpoint()).netloc:
        # Not re-sent on a redirect to the file CDN (which takes a signed URL instead).
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    return request


def _http_problem(exc: Exception, what: str) -> FactsError:
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code in (401, 403):
            return FactsError(f"{what}: HTTP {exc.code}, a gated or private repo; accept its licence and set HF_TOKEN")
        if exc.code == 404:
            return FactsError(f"{what}: HTTP 404, no such repo or file; check the spelling (org/Repo-GGUF)")
        return FactsError(f"{what}: HTTP {exc.code}; try again later or download the .gguf and pass its path")
    reason = getattr(exc, "reason", exc)
    return FactsError(f"{what}: cannot connect ({reason}); download the .gguf and pass its path instead")


def _http_json(url: str) -> Any:
    """GET a JSON document (the Hub API)."""
    try:
        with urllib.request.urlopen(_request(url), timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310 - https only
            return json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _http_problem(exc, url) from None


def _http_range(url: str, length: int) -> tuple[bytes, Optional[int]]:
    """The first ``length`` bytes of ``url`` and the whole file's size (None when not told)."""
    try:
        request = _request(url, {"Range": f"bytes=0-{length - 1}"})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310 - https only
            total: Optional[int] = None
            content_range = response.headers.get("Content-Range", "")
            match = re.match(r"bytes \d+-\d+/(\d+)", content_range)
            if match:
                total = int(match.group(1))
            elif response.status == 200 and response.headers.get("Content-Length"):
                total = int(response.headers["Content-Length"])  # the server ignored Range: read only what we need
            return response.read(length), total
    except (urllib.error.URLError, OSError) as exc:
        raise _http_problem(exc, url) from None


def _read_remote(url: str, name: str) -> Shard:
    """Fetch the start of ``url``, doubling from FIRST_FETCH to MAX_FETCH until the header is whole."""
    length = FIRST_FETCH
    while True:
        data, total = _http_range(url, length)
        whole = (total is not None and len(data) >= total) or len(data) < length
        try:
            header = parse_header(data)
        except Truncated:
            header = None
        if header is not None and (header.tensors is not None or whole or length >= MAX_FETCH):
            break
        if whole:
            raise FactsError(f"{name} ends ({len(data)} bytes) inside its GGUF metadata: the file on the server is incomplete")
        if length >= MAX_FETCH:
            raise FactsError(
                f"{name}: the GGUF metadata is longer than {MAX_FETCH // MIB} MiB; download the file and pass its path"
            )
        length *= 2
    end = data_end(header)
    size = total if total is not None else end
    return Shard(name, header, size, partial=size is None)


def _is_shard_one(name: str) -> bool:
    match = _SPLIT.search(name)
    return match is None or int(match.group(1)) == 1


def pick_gguf(files: Sequence[str], quant: Optional[str], repo: str) -> str:
    """The repo file llama.cpp would load for ``repo:quant``: a .gguf (not an mmproj) whose name
    carries the quant as a whole word, case-insensitive; the first shard of a split model."""
    ggufs = sorted(
        f for f in files
        if f.lower().endswith(".gguf") and not f.rsplit("/", 1)[-1].lower().startswith("mmproj") and _is_shard_one(f)
    )
    if not ggufs:
        raise FactsError(f"{repo} holds no .gguf model file; is it the GGUF repo (often named ...-GGUF)?")

    def carrying(tag: str) -> list[str]:
        pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9_])", re.IGNORECASE)
        return [f for f in ggufs if pattern.search(f)]

    if quant:
        matches = carrying(quant)
        if not matches:
            names = ", ".join(f.rsplit("/", 1)[-1] for f in ggufs[:12])
            raise FactsError(f"no .gguf in {repo} carries the quant {quant}; pick one of: {names}")
    else:
        matches = carrying(DEFAULT_QUANT) or ggufs
    return min(matches, key=lambda f: (len(f.rsplit("/", 1)[-1]), f))


def _file_url(repo: str, filename: str) -> str:
    return f"{_endpoint()}/{repo}/resolve/main/{urllib.parse.quote(filename)}"


def read_repo_model(spec: str) -> Model:
    repo, _, quant = spec.partition(":")
    info = _http_json(f"{_endpoint()}/api/models/{repo}")
    siblings = [s.get("rfilename", "") for s in info.get("siblings", []) if isinstance(s, dict)]
    chosen = pick_gguf(siblings, quant or None, repo)
    model = Model(spec, [_read_remote(_file_url(repo, chosen), chosen)])
    if not quant:
        model.comments.append(f"no :QUANT given: took {chosen} (llama.cpp's default is {DEFAULT_QUANT})")
    else:
        model.comments.append(f"{repo}:{quant} -> {chosen}")
    _remote_shards(model, lambda name: _file_url(repo, name), chosen)
    return model


def read_url_model(url: str) -> Model:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        raise FactsError("only https URLs are fetched; use https:// or download the file and pass its path")
    path = parts.path.replace("/blob/", "/resolve/", 1)  # a Hub page link -> the file itself
    url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
    model = Model(url, [_read_remote(url, name)])
    base = url.rsplit("/", 1)[0]
    _remote_shards(model, lambda shard: f"{base}/{urllib.parse.quote(shard)}", name)
    return model


def _remote_shards(model: Model, url_of: Callable[[str], str], chosen: str) -> None:
    count = model.first.kv.get("split.count", 1)
    if not isinstance(count, int) or count <= 1:
        return
    directory, _, name = chosen.rpartition("/")
    names = _shard_names(name, count)
    if names is None:
        model.comments.append(f"split into {count} files with unusual names: read the first only")
        return
    prefix = f"{directory}/" if directory else ""
    model.shards = [model.shards[0]] + [_read_remote(url_of(prefix + n), n) for n in names[1:]]


# --- the command ----------------------------------------------------------------------------------


_REPO_SPEC = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(:[-A-Za-z0-9_.]+)?$")


def load(source: str) -> Model:
    if source.startswith(("https://", "http://")):
        return read_url_model(source)
    path = Path(source).expanduser()
    if path.exists():
        return read_local_model(path, source)
    if _REPO_SPEC.fullmatch(source) and not source.lower().endswith(".gguf"):
        return read_repo_model(source)
    raise FactsError("no such file; give a path to a .gguf file, a Hub repo as org/Repo-GGUF[:QUANT], or an https URL")


def facts_text(source: str) -> str:
    model = load(source)
    return render(model, derive(model))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(args) != 1:
        print(f"gguf_facts: expected one input; {USAGE}", file=sys.stderr)
        return 2
    source = args[0]
    try:
        sys.stdout.write(facts_text(source))
    except FactsError as exc:
        message = " ".join(str(exc).split())
        print(f"gguf_facts: {source}: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
