"""Print a model's ``facts:`` block (and ``weights:``) from its GGUF header.

    python tools/gguf_facts.py path/to/model.gguf
    python tools/gguf_facts.py org/Repo-GGUF[:QUANT]
    python tools/gguf_facts.py https://huggingface.co/org/repo/resolve/main/model.gguf

The output is YAML to paste under ``models.<key>`` in a stack file, for a model the built-in
catalog (planning/catalog.yaml) does not know. Only the header is read: the fixed preamble, the
key/value metadata and the tensor table. A partial download works as long as the metadata is
whole; without the tensor table the parameter count comes from ``general.size_label``.

For a Hub repo or URL only the first 8 MiB are fetched with an HTTP Range request, doubled up to
64 MiB while the header is longer. ``org/repo:QUANT`` is resolved through the Hub API's file list
(``https://huggingface.co/api/models/<repo>``): the .gguf whose name carries the quant, the first
shard of a split model. HF_TOKEN, when set, is sent to the Hub API and file host for gated repos;
HF_ENDPOINT overrides https://huggingface.co.

Errors: one line on stderr naming the input and the fix, exit status 2.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import struct
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

GIB = 2**30
MIB = 2**20
FIRST_FETCH = 8 * MIB
MAX_FETCH = 64 * MIB
DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp's --hf-repo picks when the tag is left out
HTTP_TIMEOUT_S = 60
USAGE = "usage: python tools/gguf_facts.py <path-to-.gguf | org/repo[:QUANT] | https URL>"

POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}

# Interleaved sliding-window attention that llama.cpp sets in code rather than reading from the
# GGUF: layer il uses the window when il % period < period - 1 (llama_hparams::set_swa_pattern).
# gemma2: period 2, gemma3: period 6 (src/llama-model.cpp); gpt-oss: 2 unless the GGUF carries
# <arch>.attention.sliding_window_pattern.
SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2}
# Hybrid archs whose attention layers llama.cpp places every N-th layer when the GGUF carries no
# <arch>.full_attention_interval (src/models/<arch>.cpp defaults).
FULL_ATTENTION_INTERVAL = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "minimax-01": 8}
# Archs whose sliding_window key llama.cpp ignores ("Phi SWA is currently disabled", PR #13676).
SWA_IGNORED = {"phi3"}

# GGUF metadata value types (the GGUF spec's gguf_metadata_value_type).
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 65536  # numeric arrays up to this length are kept (per-layer values); longer ones skipped
_KEEP_STRINGS = 16  # string arrays are skipped past (tokenizer vocabularies), only short ones kept

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class FactsError(Exception):
    """A problem with the input, reported as one line: what is wrong and how to fix it."""


class _Truncated(Exception):
    """The buffer ends before the structure being read does."""


# --- reading the header --------------------------------------------------------------------------


@dataclass
class Skipped:
    """An array that was stepped over rather than kept (e.g. a tokenizer vocabulary)."""

    count: int


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    def nbytes(self) -> Optional[int]:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        except (ValueError, KeyError):
            return None
        return self.elements // block * size


@dataclass
class Header:
    version: int
    tensor_count: int
    kv: dict[str, Any]
    tensors: Optional[list[Tensor]]  # None: the buffer ends inside the tensor table
    data_offset: Optional[int]  # where tensor data starts; None when the table is incomplete


class _Cursor:
    def __init__(self, buf: Any, endian: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.e = endian

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Truncated()

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(self.e + fmt)
        self._need(n)
        (value,) = struct.unpack_from(self.e + fmt, self.buf, self.pos)
        self.pos += n
        return value

    def skip(self, n: int) -> None:
        self._need(n)
        self.pos += n

    def string(self) -> str:
        n = self.unpack("Q")
        if n > 1 << 30:
            raise FactsError("a metadata string claims more than 1 GiB: the file is corrupt")
        self._need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.skip(self.unpack("Q"))

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("I")
            count = self.unpack("Q")
            if count > 1 << 40:
                raise FactsError("a metadata array claims an impossible length: the file is corrupt")
            if etype in _SCALAR:
                width = struct.calcsize(self.e + _SCALAR[etype])
                if count > _KEEP_ARRAY:
                    self.skip(count * width)
                    return Skipped(count)
                self._need(count * width)
                values = struct.unpack_from(f"{self.e}{count}{_SCALAR[etype]}", self.buf, self.pos)
                self.pos += count * width
                return list(values)
            if etype == _STRING:
                if count > _KEEP_STRINGS:
                    for _ in range(count):
                        self.skip_string()
                    return Skipped(count)
                return [self.string() for _ in range(count)]
            if etype == _ARRAY:
                for _ in range(count):
                    self.value(_ARRAY)
                return Skipped(count)
            raise FactsError(f"unknown metadata array type {etype} at byte {self.pos}: the file is corrupt")
        raise FactsError(f"unknown metadata value type {vtype} at byte {self.pos}: the file is corrupt")


def parse_header(buf: Any) -> Header:
    """Parse a GGUF header from the start of ``buf`` (bytes, mmap ...).

    Raises FactsError when it is not a GGUF file, _Truncated when ``buf`` ends inside the metadata;
    a buffer that ends inside the tensor table gives ``tensors=None``.
    """
    if len(buf) < 4:
        raise _Truncated()
    magic = bytes(buf[:4])
    if magic != b"GGUF":
        raise FactsError(f"not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    if len(buf) < 8:
        raise _Truncated()
    (version,) = struct.unpack_from("<I", buf, 4)
    endian = "<"
    if version & 0xFFFF == 0 and version != 0:  # a big-endian file reads as a huge little-endian number
        endian = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version < 2:
        raise FactsError(f"GGUF version {version} is too old (this reads v2 and v3); convert the model again")
    cur = _Cursor(buf, endian)
    cur.pos = 8
    tensor_count = cur.unpack("Q")
    kv_count = cur.unpack("Q")
    if tensor_count > 10_000_000 or kv_count > 1_000_000:
        raise FactsError("the header claims an impossible number of tensors or keys: the file is corrupt")
    kv: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cur.string()
        kv[key] = cur.value(cur.unpack("I"))
    tensors: list[Tensor] = []
    try:
        for _ in range(tensor_count):
            name = cur.string()
            n_dims = cur.unpack("I")
            if n_dims > 8:
                raise FactsError(f"tensor {name!r} claims {n_dims} dimensions: the file is corrupt")
            shape = tuple(cur.unpack("Q") for _ in range(n_dims))
            tensors.append(Tensor(name, shape, cur.unpack("I"), cur.unpack("Q")))
    except _Truncated:
        return Header(version, tensor_count, kv, None, None)
    alignment = kv.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = 32
    data_offset = -(-cur.pos // alignment) * alignment
    return Header(version, tensor_count, kv, tensors, data_offset)


def data_end(header: Header) -> Optional[int]:
    """The file size the tensor table implies (where the last tensor's data ends)."""
    if header.tensors is None or header.data_offset is None:
        return None
    end = header.data_offset
    for tensor in header.tensors:
        nbytes = tensor.nbytes()
        if nbytes is None:
            return None
        end = max(end, header.data_offset + tensor.offset + nbytes)
    return end


# --- one model: a file, or the shards of a split file ----------------------------------------------


@dataclass
class Shard:
    name: str
    header: Header
    size: Optional[int]  # the whole shard's size in bytes, when known
    partial: bool  # only the start of the file was read or exists


@dataclass
class Model:
    source: str  # what the user passed
    shards: list[Shard]
    comments: list[str] = field(default_factory=list)

    @property
    def first(self) -> Header:
        return self.shards[0].header


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
            except _Truncated:
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
        except _Truncated:
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


# --- from metadata to facts ------------------------------------------------------------------------


def _size_label(label: Any) -> tuple[Optional[float], Optional[float]]:
    """general.size_label ("8B", "30B-A3B", "568M", "8x7B") -> (total, active) in billions."""
    if not isinstance(label, str):
        return None, None
    scale = {"K": 1e-6, "M": 1e-3, "B": 1.0, "T": 1e3}

    def number(text: str) -> Optional[float]:
        match = re.fullmatch(r"(?:(\d+)x)?(\d+(?:\.\d+)?)([KMBT])", text.strip(), re.IGNORECASE)
        if match is None:
            return None
        value = float(match.group(2)) * scale[match.group(3).upper()]
        return value * int(match.group(1)) if match.group(1) else value

    total_text, _, active_text = label.partition("-A")
    return number(total_text), number(active_text) if active_text else None


def _round(value: float, digits: int = 4) -> float:
    """``digits`` significant digits, written without an exponent."""
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return round(value, decimals)


def _fmt(value: float) -> str:
    text = f"{_round(value):.10f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _per_layer(value: Any, layers: int) -> Optional[list[int]]:
    if isinstance(value, list):
        return [int(v) for v in value][:layers] + [0] * max(0, layers - len(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [int(value)] * layers
    return None


def _is_expert(name: str) -> bool:
    # ffn_{gate,up,down,gate_up}_exps.{weight,bias}; old per-expert tensors blk.N.ffn_gate.E.weight.
    return "_exps." in name or "_exps_" in name or re.search(r"\.ffn_(gate|up|down)\.\d+\.", name) is not None


def quant_name(file_type: Any) -> Optional[str]:
    if not isinstance(file_type, int):
        return None
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(file_type).name
    except ValueError:
        return None
    return re.sub(r"^(MOSTLY|ALL)_", "", name)


@dataclass
class Facts:
    facts: dict[str, Any]  # ModelFacts fields, in schema order
    comments: dict[str, str]  # field -> trailing comment
    weights_gib: Optional[float]
    header_comments: list[str]


def derive(model: Model) -> Facts:
    kv = model.first.kv
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise FactsError("no general.architecture in the GGUF metadata; is it a model (not a vocab or LoRA) file?")

    split_count = kv.get("split.count", 1)
    if model.first.tensor_count == 0 and not (isinstance(split_count, int) and split_count > 1):
        raise FactsError("the file holds no tensors (a vocab-only GGUF?); give the model's own .gguf")

    def key(name: str) -> Any:
        return kv.get(f"{arch}.{name}")

    layers = key("block_count")
    if not isinstance(layers, int) or layers <= 0:
        raise FactsError(f"no {arch}.block_count in the GGUF metadata; write models.<key>.facts by hand")
    notes: dict[str, str] = {}
    header_comments = list(model.comments)
    nextn = key("nextn_predict_layers")
    if isinstance(nextn, int) and 0 < nextn < layers:
        # MTP/NextN draft layers are appended after the trunk; llama.cpp gives them a KV cache only in
        # the draft context used for MTP speculative decoding.
        layers -= nextn
        notes["layers"] = f"block_count {layers + nextn} less {nextn} MTP layer(s), which hold KV only when drafting"

    # Attention heads, per layer where the file says so (hybrid models write 0 for recurrent layers).
    heads = _per_layer(key("attention.head_count"), layers)
    kv_heads_per_layer = _per_layer(key("attention.head_count_kv"), layers) or heads
    if heads is None or kv_heads_per_layer is None:
        raise FactsError(f"no {arch}.attention.head_count in the GGUF metadata; write models.<key>.facts by hand")
    has_attention = [n > 0 for n in kv_heads_per_layer]
    recurrent_layers = key("attention.recurrent_layers")
    interval = key("full_attention_interval")
    if not isinstance(interval, int):
        interval = FULL_ATTENTION_INTERVAL.get(arch)
    if isinstance(recurrent_layers, list):  # per layer: true for a linear-attention / recurrent layer
        has_attention = [a and not (il < len(recurrent_layers) and recurrent_layers[il])
                         for il, a in enumerate(has_attention)]
    elif isinstance(interval, int) and interval > 0:  # qwen3next / qwen35: every interval-th layer attends
        has_attention = [a and (il + 1) % interval == 0 for il, a in enumerate(has_attention)]
    shared = key("attention.shared_kv_layers")
    if isinstance(shared, int) and 0 < shared < layers:  # the last layers reuse earlier layers' KV
        has_attention = [a and il < layers - shared for il, a in enumerate(has_attention)]

    # Sliding-window layers: llama.cpp without --swa-full keeps only window-sized KV for them.
    window = key("attention.sliding_window")
    pattern = key("attention.sliding_window_pattern")
    swa: list[bool] = [False] * layers
    swa_note = ""
    if isinstance(window, int) and window > 0:
        if isinstance(pattern, list):
            swa = [bool(p) for p in pattern[:layers]] + [False] * max(0, layers - len(pattern))
        elif isinstance(pattern, int) or arch in SWA_PERIOD:
            period = pattern if isinstance(pattern, int) else SWA_PERIOD[arch]
            swa = [period == 0 or il % period < period - 1 for il in range(layers)]
        if arch in SWA_IGNORED:
            swa = [False] * layers
            swa_note = f"sliding_window {window} is ignored by llama.cpp for {arch}: every layer keeps full KV"
        elif not any(swa):
            swa_note = (f"sliding_window {window}, but which layers use it is not known here: all counted as full "
                        "attention (an over-count)")
    attention_layers = [il for il in range(layers) if has_attention[il]]
    full_layers = [il for il in attention_layers if not swa[il]]
    swa_layers = [il for il in attention_layers if swa[il]]
    if swa_layers:
        swa_note = (f"the other {len(swa_layers)} attention layers use a {window}-token sliding window: llama.cpp "
                    "keeps only window-sized KV for them unless --swa-full")

    kv_heads = max((kv_heads_per_layer[il] for il in attention_layers), default=max(heads))
    if len({kv_heads_per_layer[il] for il in attention_layers}) > 1:
        notes["kv_heads"] = "varies per layer: the largest is taken (an over-count)"

    head_dim = key("attention.key_length")
    head_dim_note = ""
    if not isinstance(head_dim, int) or head_dim <= 0:
        embedding = key("embedding_length")
        if not isinstance(embedding, int) or max(heads) <= 0:
            raise FactsError(f"neither {arch}.attention.key_length nor {arch}.embedding_length; write facts by hand")
        head_dim = embedding // max(heads)
        head_dim_note = f"embedding_length {embedding} / {max(heads)} heads"
    value_length = key("attention.value_length")
    if isinstance(value_length, int) and value_length > 0 and value_length != head_dim:
        head_dim_note = f"mean of key_length {head_dim} and value_length {value_length}"
        head_dim = -(-(head_dim + value_length) // 2)
    if head_dim_note:
        notes["head_dim"] = head_dim_note

    # Parameters: every tensor's elements, over every shard; else the size label.
    params, active = _count_parameters(model, kv, key, notes)

    facts: dict[str, Any] = {"params_b": params}
    if active is not None:
        facts["active_params_b"] = active
    facts["layers"] = layers
    if not attention_layers:
        notes["layers"] = "no attention layers found: the planner's KV estimate (all layers) is an over-count"
    elif len(full_layers) < layers and full_layers:
        facts["full_attention_layers"] = len(full_layers)
        if swa_layers and arch not in SWA_IGNORED:
            # The planner counts their window-sized KV from these two.
            facts["sliding_window"] = window
            facts["sliding_window_layers"] = len(swa_layers)
        if swa_note:
            notes["full_attention_layers"] = swa_note
    elif not full_layers:
        notes["layers"] = f"every attention layer is sliding-window ({window} tokens): the KV estimate over-counts"
    if swa_note and "full_attention_layers" not in notes:
        header_comments.append(swa_note)
    facts["kv_heads"] = kv_heads
    facts["head_dim"] = head_dim

    recurrent = _recurrent_state_mib(key, layers, len(attention_layers))
    if recurrent:
        facts["recurrent_state_mib"] = _round(recurrent, 3)
        notes["recurrent_state_mib"] = "conv + SSM state in f32 per slot, from the ssm.* keys (an estimate)"

    pooling = key("pooling_type")
    if isinstance(pooling, int):
        if pooling not in POOLING:
            raise FactsError(f"{arch}.pooling_type {pooling} is unknown (0-4); write facts by hand")
        facts["pooling"] = POOLING[pooling]

    sizes = [s.size for s in model.shards]
    weights = sum(sizes) / GIB if all(s is not None for s in sizes) else None  # type: ignore[misc]
    if weights is not None and any(s.partial for s in model.shards):
        header_comments.append("only part of the file was read: weights is the size its tensor table implies")
    return Facts(facts, notes, weights, header_comments)


def _count_parameters(model: Model, kv: dict[str, Any], key: Callable[[str], Any],
                      notes: dict[str, str]) -> tuple[float, Optional[float]]:
    label_total, label_active = _size_label(kv.get("general.size_label"))
    experts = key("expert_count")
    used = key("expert_used_count")
    moe = isinstance(experts, int) and experts > 1
    tables = [s.header.tensors for s in model.shards]
    count = kv.get("split.count", 1)
    whole = all(t is not None for t in tables) and (not isinstance(count, int) or len(model.shards) >= count)
    if whole:
        tensors = [t for table in tables for t in table]  # type: ignore[union-attr]
        if tensors:
            total = sum(t.elements for t in tensors)
            active = None
            if moe:
                expert = sum(t.elements for t in tensors if _is_expert(t.name))
                if expert and isinstance(used, int) and used > 0:
                    active = total - expert + expert * used / experts
                    notes["active_params_b"] = f"{used} of {experts} experts per token, from the tensor sizes"
                elif label_active:
                    notes["active_params_b"] = "from general.size_label"
                    return _round(total / 1e9), label_active
                else:
                    notes["active_params_b"] = "unknown: no expert tensors recognised; set it by hand"
            return _round(total / 1e9), _round(active / 1e9) if active is not None else None
    if label_total:
        notes["params_b"] = "from general.size_label (the tensor table was not read whole)"
        if moe and label_active:
            notes["active_params_b"] = "from general.size_label"
        return label_total, label_active if moe else None
    raise FactsError(
        "the tensor table is incomplete and there is no general.size_label, so the parameters cannot be counted; "
        "read the whole header (or all shards) or write params_b by hand"
    )


def _recurrent_state_mib(key: Callable[[str], Any], layers: int, attention_layers: int) -> float:
    """Mamba-style state per sequence, llama_hparams::n_embd_r/n_embd_s, f32: (d_conv - 1) x
    (d_inner + 2 n_group d_state) + d_state x d_inner values per recurrent layer."""
    d_conv, d_inner, d_state = key("ssm.conv_kernel"), key("ssm.inner_size"), key("ssm.state_size")
    if not all(isinstance(v, int) and v > 0 for v in (d_conv, d_inner, d_state)):
        return 0.0
    n_group = key("ssm.group_count")
    n_group = n_group if isinstance(n_group, int) and n_group > 0 else 0
    per_layer = (d_conv - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
    return (layers - attention_layers) * per_layer * 4 / MIB


# --- output ---------------------------------------------------------------------------------------


def render(model: Model, result: Facts) -> str:
    kv = model.first.kv
    arch = kv.get("general.architecture")
    quant = quant_name(kv.get("general.file_type"))
    names = ", ".join(s.name for s in model.shards)
    lines = [f"# {model.source}: {arch}, {names}"]
    if quant:
        lines.append(f"# quant {quant} (general.file_type {kv.get('general.file_type')})")
    else:
        lines.append("# quant: not recorded (no known general.file_type)")
    lines += [f"# {c}" for c in result.header_comments]
    lines.append("# paste under models.<key> in the stack file:")
    if result.weights_gib is not None:
        lines.append(f"weights: {math.ceil(result.weights_gib * 10 - 1e-9) / 10:.1f}Gi")
    else:
        lines.append("# weights: unknown, only part of the file was read (the planner uses params x bits per weight)")
    lines.append("facts:")
    for name, value in result.facts.items():
        text = _fmt(value) if isinstance(value, float) else str(value)
        comment = result.comments.get(name)
        lines.append(f"  {name}: {text}" + (f"  # {comment}" if comment else ""))
    for name, comment in result.comments.items():
        if name not in result.facts:
            lines.append(f"  # {name}: {comment}")
    return "\n".join(lines) + "\n"


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
