"""A GGUF file's layout read without gguf-py's reader (its metadata and tensor table, from the first bytes),
and a real tokenizer copied from one of llama.cpp's vocab-only GGUFs into a file being written: what the
real-shape writers (real_shape.py, real_shape_mmproj.py) build their files around."""
from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter, TokenType


# --- tokenizer, copied from a vocab-only GGUF without re-encoding its 150k+ strings -------------------

_SCALAR = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}


class _Raw:
    """An array value already in GGUF's byte layout (item type, count, items)."""
    def __init__(self, payload: bytes) -> None:
        self.payload = payload


class _Writer(GGUFWriter):
    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None) -> bytes:
        if isinstance(val, _Raw):
            return (self._pack("I", vtype) if add_vtype else b"") + val.payload
        return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)


def _parse(buf: bytes) -> tuple[dict[str, tuple[GGUFValueType, Any]], list[tuple[str, tuple[int, ...], T, int]], int]:
    """A GGUF header: ({key: (type, value)}, [(tensor, ne, type, offset)], data start). Scalars are
    decoded; arrays are (item type, count, raw items, item end offsets for string arrays)."""
    if buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    _, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    off = 24

    def string(off: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", buf, off)
        return buf[off + 8:off + 8 + n], off + 8 + n

    kvs: dict[str, tuple[GGUFValueType, Any]] = {}
    for _ in range(n_kv):
        key, off = string(off)
        (vtype,) = struct.unpack_from("<I", buf, off)
        vtype = GGUFValueType(vtype)
        off += 4
        if vtype == GGUFValueType.ARRAY:
            sub, count = struct.unpack_from("<IQ", buf, off)
            sub = GGUFValueType(sub)
            off += 12
            start, ends = off, []
            if sub == GGUFValueType.STRING:
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", buf, off)
                    off += 8 + n
                    ends.append(off - start)
            else:
                off += count * struct.calcsize("<" + _SCALAR[sub])
            value: Any = (sub, count, buf[start:off], ends)
        elif vtype == GGUFValueType.STRING:
            raw, off = string(off)
            value = raw.decode("utf-8")
        else:
            (value,) = struct.unpack_from("<" + _SCALAR[vtype], buf, off)
            off += struct.calcsize("<" + _SCALAR[vtype])
        kvs[key.decode()] = (vtype, value)
    tensors = []
    for _ in range(n_tensors):
        name, off = string(off)
        (n_dims,) = struct.unpack_from("<I", buf, off)
        ne = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
        off += 4 + 8 * n_dims
        t, offset = struct.unpack_from("<IQ", buf, off)
        off += 12
        tensors.append((name.decode(), tuple(ne), T(t), offset))
    align = kvs.get("general.alignment", (None, 32))[1]
    return kvs, tensors, GGUFWriter.ggml_pad(off, align)


def read_layout(path: Path, limit: int = 64 << 20) -> tuple[dict[str, tuple[GGUFValueType, Any]], list[tuple[str, tuple[int, ...], T, int]], int]:
    """The header of a GGUF file (see _parse); reads at most `limit` bytes, never the tensor data."""
    with open(path, "rb") as f:
        return _parse(f.read(limit))


@lru_cache(maxsize=None)
def _read_vocab(path: Path) -> dict[str, tuple[GGUFValueType, Any]]:
    """tokenizer.* keys of a vocab-only GGUF (read once per process)."""
    kvs, _, _ = _parse(path.read_bytes())
    return {k: v for k, v in kvs.items() if k.startswith("tokenizer.")}


def _add_tokenizer(writer: GGUFWriter, vocab_gguf: Path, n_vocab: int) -> None:
    fields = _read_vocab(vocab_gguf)
    for key, (vtype, value) in fields.items():
        if key == "tokenizer.chat_template":
            continue
        if vtype != GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype)
            continue
        sub, count, raw, ends = value
        if key == "tokenizer.ggml.tokens":
            keep = min(count, n_vocab)
            items = raw[:ends[keep - 1]] + b"".join(
                struct.pack("<Q", len(s)) + s for s in (f"[PAD{i}]".encode() for i in range(count, n_vocab)))
            raw, count = items, n_vocab
        elif key == "tokenizer.ggml.token_type":
            types = np.frombuffer(raw, dtype=np.int32)[:n_vocab]
            pad = np.full(n_vocab - len(types), int(TokenType.UNUSED), dtype=np.int32)
            raw, count = np.concatenate([types, pad]).tobytes(), n_vocab
        elif key in ("tokenizer.ggml.scores",):
            width = struct.calcsize("<" + _SCALAR[sub])
            raw = raw[:n_vocab * width] + bytes(width * max(0, n_vocab - count))
            count = n_vocab
        writer.add_key_value(key, _Raw(struct.pack("<IQ", sub, count) + raw), GGUFValueType.ARRAY)


def vocab_dir() -> Path:
    """llama.cpp's models/ folder (vocab-only GGUFs) of the pinned build's source."""
    from lab.llama_build import source_dir
    return source_dir() / "models"
