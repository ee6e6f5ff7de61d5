"""lab/bench/pack_bench.py: a CUDA llama-bench packed on one lent machine and carried to the next. The parts must come
back through the device tool's limits, and a carried pack is used only whole and as packed."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import random
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from lab.bench import pack_bench

FOLDER = "llama-b10729-c3881f28ad7d-cuda"


@pytest.fixture()
def built(tmp_path):
    """A cache folder as lab/llama_build leaves it, its llama-bench a real ELF program (strip runs on it), and two
    vocab GGUFs of incompressible bytes, so the pack spans several parts."""
    binary = tmp_path / "cache" / FOLDER / "bin" / "llama-bench"
    binary.parent.mkdir(parents=True)
    shutil.copy2(shutil.which("true"), binary)
    vocab = []
    for index, name in enumerate(("ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf")):
        path = tmp_path / "vocab" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(random.Random(index).randbytes(64 * 1024))  # incompressible
        vocab.append(path)
    return binary, vocab


@pytest.mark.parametrize("filters", [True, False], ids=["this python's tarfile", "a tarfile without filters"])
def test_a_pack_comes_back_in_parts_the_device_returns_and_unpacks_to_a_program_that_runs(built, tmp_path,
                                                                                          monkeypatch, filters):
    """On a Python with tarfile's extraction filters and on one without (Debian 12's 3.11.2)."""
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    binary, vocab = built
    out = tmp_path / "out"
    manifest = pack_bench.pack(binary, vocab, out, part_bytes=20_000)
    files = sorted(p.name for p in out.iterdir())
    # What a call brings back: files named in letters, digits, '.', '_' and '-', at most 8 of them with the two
    # results a profile call writes beside them.
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    assert len(manifest["parts"]) >= 2 and all(part["bytes"] <= 20_000 for part in manifest["parts"])
    assert files == sorted([pack_bench.MANIFEST] + [part["name"] for part in manifest["parts"]])
    assert manifest["build"] == FOLDER

    dest = tmp_path / "unpacked"
    got = pack_bench.unpack(out, dest, FOLDER)
    assert subprocess.run([str(got)]).returncode == 0
    for path in vocab:
        assert (dest / "models" / path.name).read_bytes() == path.read_bytes()


def test_the_default_part_size_fits_what_comes_back_and_the_pack_what_travels():
    """16 MiB a file back; 64 MiB carried in all, the tracked tree and .soak beside the pack."""
    assert pack_bench.PART_BYTES <= 16 * 2**20
    assert pack_bench.MAX_PACK_BYTES + 14 * 2**20 <= 64 * 2**20
    # Parts and manifest within 8 files, with host-profile.json and speed.json.
    assert -(-pack_bench.MAX_PACK_BYTES // pack_bench.PART_BYTES) + 1 + 2 <= 8


def test_a_pack_that_could_not_travel_writes_nothing(built, tmp_path):
    binary, vocab = built
    out = tmp_path / "out"
    with pytest.raises(pack_bench.PackError, match=r"MiB packed, over the 0 MiB"):
        pack_bench.pack(binary, vocab, out, max_bytes=1000)
    assert not out.exists()


@pytest.mark.parametrize("spoil", ["flip a byte", "drop a part", "another build", "a member not named",
                                   "a name outside, in the manifest too"])
def test_a_carried_pack_not_whole_or_not_as_packed_is_refused_before_anything_is_unpacked(built, tmp_path, spoil):
    binary, vocab = built
    out = tmp_path / "out"
    manifest = pack_bench.pack(binary, vocab, out, part_bytes=20_000)
    build = FOLDER
    if spoil == "flip a byte":
        part = out / manifest["parts"][1]["name"]
        data = bytearray(part.read_bytes())
        data[100] ^= 0xFF
        part.write_bytes(bytes(data))
        expected = "sha256 is not the manifest's"
    elif spoil == "drop a part":
        (out / manifest["parts"][-1]["name"]).unlink()
        expected = "missing"
    elif spoil == "another build":
        build = "llama-b10730-0123456789ab-cuda"
        expected = "this checkout builds llama-b10730"
    else:
        # A pack whose hashes agree with its manifest but which holds a path outside the folder it unpacks to.
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo("../llama-bench")
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
        packed = lzma.compress(buffer.getvalue())
        for part in manifest["parts"]:
            (out / part["name"]).unlink()
        name = f"{pack_bench.NAME}.tar.xz.00"
        (out / name).write_bytes(packed)
        digest = hashlib.sha256(packed).hexdigest()
        manifest.update(sha256=digest, bytes=len(packed), parts=[{"name": name, "sha256": digest, "bytes": len(packed)}])
        if spoil == "a name outside, in the manifest too":
            manifest["members"] = ["../llama-bench"]
            expected = "not a plain file or folder inside"
        else:
            expected = "not the manifest's files"
        (out / pack_bench.MANIFEST).write_text(json.dumps(manifest))
    dest = tmp_path / "unpacked"
    with pytest.raises(pack_bench.PackError, match=expected):
        pack_bench.unpack(out, dest, build)
    assert not (dest / "llama-bench").exists() and not (tmp_path / "llama-bench").exists()


def test_the_command_line_says_one_line_and_exits_1_on_a_refused_pack(tmp_path, capsys):
    (tmp_path / pack_bench.MANIFEST).write_text("{")
    assert pack_bench.main(["unpack", "--from", str(tmp_path), "--to", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / pack_bench.MANIFEST) in err
