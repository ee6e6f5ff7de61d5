"""Reading a GGUF file's header: the fixed preamble, the key/value metadata and the tensor table,
from the start of a buffer (a mapped file or the first bytes fetched over HTTP), and the Model it
belongs to (one file, or the shards of a split file). No network and no interpretation here:
tools/gguf_facts.py finds the bytes, tools/gguf_derive.py turns the metadata into facts."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

# GGUF metadata value types (the GGUF spec's gguf_metadata_value_type).
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 65536  # numeric arrays up to this length are kept (per-layer values); longer ones skipped
_KEEP_STRINGS = 16  # string arrays are skipped past (tokenizer vocabularies), only short ones kept


class FactsError(Exception):
    """A problem with the input, reported as one line: what is wrong and how to fix it."""


class Truncated(Exception):
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
            raise Truncated()

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

    Raises FactsError when it is not a GGUF file, Truncated when ``buf`` ends inside the metadata;
    a buffer that ends inside the tensor table gives ``tensors=None``.
    """
    if len(buf) < 4:
        raise Truncated()
    magic = bytes(buf[:4])
    if magic != b"GGUF":
        raise FactsError(f"not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    if len(buf) < 8:
        raise Truncated()
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
    except Truncated:
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
