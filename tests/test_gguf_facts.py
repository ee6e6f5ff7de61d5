"""tools/gguf_facts.py (facts from a GGUF header) and config.catalog (the built-in facts).

Every GGUF here is written by the gguf package's writer with known hyperparameters; the expected
facts are computed from what was written, never copied from the tool's output. No network: the Hub
and HTTP Range paths run against fakes of the two functions that would reach the network.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import yaml
from gguf import GGUFReader, GGUFWriter, PoolingType

from config.types import ModelFacts
from tools import gguf_facts
from config.catalog import CatalogError, catalog, facts_for, lookup, parse_catalog

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
F16 = 1  # general.file_type MOSTLY_F16


# --- writing tiny GGUF files ------------------------------------------------------------------------


class Tiny:
    """A GGUF written by GGUFWriter: its metadata plus float32 tensors of the given shapes. Keeps
    the shapes so a test can count parameters itself."""

    def __init__(self, path: Path, arch: str) -> None:
        self.path = path
        self.writer = GGUFWriter(str(path), arch)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.rng = np.random.default_rng(0)

    def tensor(self, name: str, *shape: int) -> None:
        self.shapes[name] = shape
        self.writer.add_tensor(name, self.rng.standard_normal(shape, dtype=np.float32))

    def elements(self, predicate=lambda name: True) -> int:
        return sum(math.prod(s) for n, s in self.shapes.items() if predicate(n))

    def write(self) -> Path:
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()
        return self.path


def dense(tmp_path: Path, *, layers=3, embd=64, heads=8, kv_heads=2, key_length=16, vocab=40,
          size_label: Optional[str] = None, name="dense.gguf", long_vocab: int = 0) -> Tiny:
    """A llama-style model. key_length differs from embd/heads so the test sees which one is used."""
    model = Tiny(tmp_path / name, "llama")
    w = model.writer
    w.add_block_count(layers)
    w.add_embedding_length(embd)
    w.add_context_length(4096)
    w.add_feed_forward_length(2 * embd)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(key_length)
    w.add_value_length(key_length)
    w.add_file_type(F16)
    if size_label:
        w.add_size_label(size_label)
    if long_vocab:  # a long string array, as a tokenizer vocabulary makes the real metadata long
        w.add_token_list([f"token-{i:06d}" for i in range(long_vocab)])
    model.tensor("token_embd.weight", vocab, embd)
    model.tensor("output_norm.weight", embd)
    model.tensor("output.weight", vocab, embd)
    q, kvd = heads * key_length, kv_heads * key_length
    for i in range(layers):
        model.tensor(f"blk.{i}.attn_norm.weight", embd)
        model.tensor(f"blk.{i}.attn_q.weight", q, embd)
        model.tensor(f"blk.{i}.attn_k.weight", kvd, embd)
        model.tensor(f"blk.{i}.attn_v.weight", kvd, embd)
        model.tensor(f"blk.{i}.attn_output.weight", embd, q)
        model.tensor(f"blk.{i}.ffn_gate.weight", 2 * embd, embd)
        model.tensor(f"blk.{i}.ffn_up.weight", 2 * embd, embd)
        model.tensor(f"blk.{i}.ffn_down.weight", embd, 2 * embd)
    return model


def run(source: Any) -> tuple[int, str, str]:
    """The CLI in a subprocess, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "tools/gguf_facts.py", *([str(source)] if source is not None else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    return proc.returncode, proc.stdout, proc.stderr


def facts_of(output: str) -> dict[str, Any]:
    document = yaml.safe_load(output)
    ModelFacts.model_validate(document["facts"])  # what a stack file would accept
    return document


def weights_of(size: int) -> str:
    return f"{math.ceil(size / GIB * 10) / 10:.1f}Gi"


def header_and_kv_length(path: Path) -> int:
    """Where the key/value metadata ends, according to the gguf package's own reader."""
    reader = GGUFReader(path)
    return max(f.offset + sum(int(p.nbytes) for p in f.parts) for f in reader.fields.values())


# --- gguf_facts: local files --------------------------------------------------------------------------


def test_dense_model_facts_match_what_was_written(tmp_path):
    model = dense(tmp_path)
    path = model.write()
    code, out, err = run(path)
    assert code == 0, err
    doc = facts_of(out)
    facts = doc["facts"]
    assert facts["layers"] == 3
    assert facts["kv_heads"] == 2
    assert facts["head_dim"] == 16  # key_length, not embedding_length / heads (8)
    assert facts["params_b"] == pytest.approx(model.elements() / 1e9, rel=1e-3)
    assert "active_params_b" not in facts and "full_attention_layers" not in facts and "pooling" not in facts
    assert doc["weights"] == weights_of(path.stat().st_size)
    assert f"quant F16 (general.file_type {F16})" in out


def test_moe_active_parameters_from_expert_tensors(tmp_path):
    experts, used, layers, embd, ff = 8, 2, 2, 32, 48
    model = Tiny(tmp_path / "moe.gguf", "qwen3moe")
    w = model.writer
    w.add_block_count(layers)
    w.add_embedding_length(embd)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(8)
    w.add_expert_count(experts)
    w.add_expert_used_count(used)
    w.add_file_type(F16)
    model.tensor("token_embd.weight", 50, embd)
    model.tensor("output.weight", 50, embd)
    for i in range(layers):
        model.tensor(f"blk.{i}.attn_q.weight", 32, embd)
        model.tensor(f"blk.{i}.attn_k.weight", 16, embd)
        model.tensor(f"blk.{i}.attn_v.weight", 16, embd)
        model.tensor(f"blk.{i}.attn_output.weight", embd, 32)
        model.tensor(f"blk.{i}.ffn_gate_inp.weight", experts, embd)  # the router: always read
        model.tensor(f"blk.{i}.ffn_gate_exps.weight", experts, ff, embd)
        model.tensor(f"blk.{i}.ffn_up_exps.weight", experts, ff, embd)
        model.tensor(f"blk.{i}.ffn_down_exps.weight", experts, embd, ff)
    path = model.write()
    code, out, err = run(path)
    assert code == 0, err
    facts = facts_of(out)["facts"]
    expert = model.elements(lambda n: "_exps." in n)
    total = model.elements()
    assert facts["params_b"] == pytest.approx(total / 1e9, rel=1e-3)
    assert facts["active_params_b"] == pytest.approx((total - expert + expert * used / experts) / 1e9, rel=1e-3)
    assert facts["active_params_b"] < facts["params_b"]
    assert (facts["layers"], facts["kv_heads"], facts["head_dim"]) == (layers, 2, 8)


@pytest.mark.parametrize("pooling, name", [(PoolingType.CLS, "cls"), (PoolingType.MEAN, "mean"), (PoolingType.LAST, "last")])
def test_embedding_model_pooling(tmp_path, pooling, name):
    model = Tiny(tmp_path / "embed.gguf", "bert")
    w = model.writer
    w.add_block_count(2)
    w.add_embedding_length(48)
    w.add_head_count(6)  # no head_count_kv: every head is a KV head; no key_length: 48 / 6
    w.add_pooling_type(pooling)
    model.tensor("token_embd.weight", 30, 48)
    for i in range(2):
        model.tensor(f"blk.{i}.attn_qkv.weight", 3 * 48, 48)
    path = model.write()
    code, out, err = run(path)
    assert code == 0, err
    facts = facts_of(out)["facts"]
    assert facts["pooling"] == name
    assert (facts["layers"], facts["kv_heads"], facts["head_dim"]) == (2, 6, 8)


def test_header_and_metadata_only_file(tmp_path):
    """A download cut right after the metadata: no tensor table, so params come from the size label
    and the weights are not known."""
    model = dense(tmp_path, size_label="1.5B", layers=4)
    full = model.write()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[: header_and_kv_length(full)])
    code, out, err = run(cut)
    assert code == 0, err
    doc = facts_of(out)
    assert doc["facts"]["params_b"] == 1.5
    assert (doc["facts"]["layers"], doc["facts"]["kv_heads"], doc["facts"]["head_dim"]) == (4, 2, 16)
    assert "weights" not in doc and "weights: unknown" in out


def test_file_cut_after_the_tensor_table_still_knows_its_size(tmp_path):
    model = dense(tmp_path)
    full = model.write()
    data = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])  # tensor table whole, half the tensor data
    code, out, err = run(cut)
    assert code == 0, err
    doc = facts_of(out)
    assert doc["facts"]["params_b"] == pytest.approx(model.elements() / 1e9, rel=1e-3)
    assert doc["weights"] == weights_of(len(data))


def test_cut_inside_the_metadata_is_one_line_exit_2(tmp_path):
    full = dense(tmp_path).write()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[: header_and_kv_length(full) - 5])
    code, out, err = run(cut)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(cut) in err and "download more" in err


def test_partial_file_without_size_label_cannot_count_parameters(tmp_path):
    full = dense(tmp_path).write()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[: header_and_kv_length(full)])
    code, _, err = run(cut)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "params_b" in err


def test_hybrid_model_attention_layers_and_recurrent_state(tmp_path):
    layers, interval, conv, inner, state, groups = 8, 4, 4, 64, 16, 2
    model = Tiny(tmp_path / "hybrid.gguf", "qwen3next")
    w = model.writer
    w.add_block_count(layers)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(32)
    w.add_full_attention_interval(interval)
    w.add_ssm_conv_kernel(conv)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(state)
    w.add_ssm_group_count(groups)
    model.tensor("token_embd.weight", 20, 64)
    path = model.write()
    code, out, err = run(path)
    assert code == 0, err
    facts = facts_of(out)["facts"]
    attention = sum(1 for il in range(layers) if (il + 1) % interval == 0)
    per_layer_values = (conv - 1) * (inner + 2 * groups * state) + state * inner
    assert facts["full_attention_layers"] == attention == 2
    assert facts["recurrent_state_mib"] == pytest.approx((layers - attention) * per_layer_values * 4 / 2**20, rel=1e-2)


def test_per_layer_kv_head_array(tmp_path):
    """Hybrid files that write head_count_kv per layer, 0 for the recurrent layers."""
    per_layer = [0, 4, 0, 0, 4, 0]
    model = Tiny(tmp_path / "jamba.gguf", "jamba")
    w = model.writer
    w.add_block_count(len(per_layer))
    w.add_embedding_length(64)
    w.add_head_count(8)
    w.add_head_count_kv(per_layer)
    model.tensor("token_embd.weight", 20, 64)
    code, out, err = run(model.write())
    assert code == 0, err
    facts = facts_of(out)["facts"]
    assert facts["full_attention_layers"] == sum(1 for n in per_layer if n > 0)
    assert facts["kv_heads"] == max(per_layer)
    assert facts["head_dim"] == 64 // 8


def test_recurrent_layer_array_and_mtp_layers(tmp_path):
    """attention.recurrent_layers marks linear-attention layers; nextn_predict_layers are MTP layers
    appended after the trunk, not part of it."""
    trunk, mtp = 6, 1
    recurrent = [True, True, False, True, True, False, False]  # the last entry is the MTP layer
    model = Tiny(tmp_path / "mtp.gguf", "qwen35")
    w = model.writer
    w.add_block_count(trunk + mtp)
    w.add_uint32("qwen35.nextn_predict_layers", mtp)
    w.add_array("qwen35.attention.recurrent_layers", recurrent)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(32)
    model.tensor("token_embd.weight", 20, 64)
    code, out, err = run(model.write())
    assert code == 0, err
    facts = facts_of(out)["facts"]
    assert facts["layers"] == trunk
    assert facts["full_attention_layers"] == sum(1 for r in recurrent[:trunk] if not r)
    assert "MTP" in out


def test_vocab_only_file_is_refused(tmp_path):
    model = Tiny(tmp_path / "vocab.gguf", "llama")
    model.writer.add_block_count(2)
    model.writer.add_head_count(4)
    model.writer.add_token_list(["a", "b", "c"])
    code, _, err = run(model.write())
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no tensors" in err


@pytest.mark.parametrize("arch, layers, window, pattern, period", [
    ("gemma3", 12, 512, None, 6),  # llama.cpp sets Gemma 3's 5:1 pattern in code
    ("gpt-oss", 6, 128, 2, 2),     # gpt-oss's period as written in the file
])
def test_sliding_window_layers_are_not_full_attention(tmp_path, arch, layers, window, pattern, period):
    model = Tiny(tmp_path / f"{arch}.gguf", arch)
    w = model.writer
    w.add_block_count(layers)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(16)
    w.add_sliding_window(window)
    if pattern is not None:
        w.add_sliding_window_pattern(pattern)
    model.tensor("token_embd.weight", 20, 64)
    code, out, err = run(model.write())
    assert code == 0, err
    facts = facts_of(out)["facts"]
    assert facts["full_attention_layers"] == sum(1 for il in range(layers) if il % period == period - 1)
    assert f"{window}-token sliding window" in out and "--swa-full" in out


def test_missing_file_exit_2_one_line(tmp_path):
    missing = tmp_path / "nope.gguf"
    code, out, err = run(missing)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert str(missing) in err and "give a path" in err


def test_not_a_gguf_exit_2_one_line(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is not a model\n" * 100)
    code, out, err = run(bogus)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert str(bogus) in err and "not a GGUF file" in err


@pytest.mark.parametrize("args", [[], ["a", "b"]])
def test_wrong_argument_count_exit_2(args, capsys):
    assert gguf_facts.main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "usage" in err


def test_directory_exit_2(tmp_path, capsys):
    assert gguf_facts.main([str(tmp_path)]) == 2
    assert "directory" in capsys.readouterr().err


def test_split_model_counts_every_shard(tmp_path):
    """Shards of a split file: the parameters and the size are the sum over all of them."""
    first = dense(tmp_path, name="m-00001-of-00002.gguf")
    first.writer.add_uint16("split.no", 0)
    first.writer.add_uint16("split.count", 2)
    p1 = first.write()
    second = Tiny(tmp_path / "m-00002-of-00002.gguf", "llama")
    second.writer.add_uint16("split.no", 1)
    second.writer.add_uint16("split.count", 2)
    second.tensor("blk.9.extra.weight", 64, 64)
    p2 = second.write()
    out = gguf_facts.facts_text(str(p1))
    doc = facts_of(out)
    assert doc["facts"]["params_b"] == pytest.approx((first.elements() + second.elements()) / 1e9, rel=1e-3)
    assert doc["weights"] == weights_of(p1.stat().st_size + p2.stat().st_size)


# --- gguf_facts: Hub repos and URLs (network faked) -----------------------------------------------


def test_pick_gguf_by_quant():
    files = [
        "README.md",
        "mmproj-model-f16.gguf",
        "Qwen3-8B-Q4_K_M.gguf",
        "Qwen3-8B-IQ4_K_M.gguf",
        "Qwen3-8B-Q4_K_S.gguf",
        "Qwen3-8B-UD-Q4_K_XL.gguf",
        "Qwen3-8B-Q8_0.gguf",
        "BF16/Qwen3-8B-BF16-00002-of-00002.gguf",
        "BF16/Qwen3-8B-BF16-00001-of-00002.gguf",
    ]
    assert gguf_facts.pick_gguf(files, "q4_k_m", "r") == "Qwen3-8B-Q4_K_M.gguf"  # not IQ4_K_M, any case
    with pytest.raises(gguf_facts.FactsError, match="carries the quant Q4_K;"):
        gguf_facts.pick_gguf(files, "Q4_K", "r")
    assert gguf_facts.pick_gguf(files, "Q4_K_XL", "r") == "Qwen3-8B-UD-Q4_K_XL.gguf"
    assert gguf_facts.pick_gguf(files, "BF16", "r") == "BF16/Qwen3-8B-BF16-00001-of-00002.gguf"
    assert gguf_facts.pick_gguf(files, None, "r") == "Qwen3-8B-Q4_K_M.gguf"  # llama.cpp's default tag
    with pytest.raises(gguf_facts.FactsError, match="no .gguf model file"):
        gguf_facts.pick_gguf(["README.md", "mmproj-f16.gguf"], None, "r")


class FakeHub:
    """Stands in for the Hub API and HTTP Range: serves local files, records the lengths asked for."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.requests: list[tuple[str, int]] = []

    def json(self, url: str) -> Any:
        assert url.startswith("https://huggingface.co/api/models/")
        return {"siblings": [{"rfilename": name} for name in self.files] + [{"rfilename": "README.md"}]}

    def range(self, url: str, length: int) -> tuple[bytes, Optional[int]]:
        name = url.split("/resolve/main/", 1)[1]
        self.requests.append((name, length))
        data = self.files[name].read_bytes()
        return data[:length], len(data)


def test_repo_with_quant_fetches_only_the_header(tmp_path, monkeypatch):
    model = dense(tmp_path, long_vocab=3000)  # metadata of ~50 KiB
    path = model.write()
    hub = FakeHub({"Tiny-Q8_0.gguf": tmp_path / "other.gguf", "Tiny-F16.gguf": path})
    monkeypatch.setattr(gguf_facts, "_http_json", hub.json)
    monkeypatch.setattr(gguf_facts, "_http_range", hub.range)
    monkeypatch.setattr(gguf_facts, "FIRST_FETCH", 4096)
    monkeypatch.setattr(gguf_facts, "MAX_FETCH", 1 << 20)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    out = gguf_facts.facts_text("org/Tiny-GGUF:f16")
    doc = facts_of(out)
    assert doc["facts"]["params_b"] == pytest.approx(model.elements() / 1e9, rel=1e-3)
    assert doc["weights"] == weights_of(path.stat().st_size)
    lengths = [length for _, length in hub.requests]
    assert lengths[0] == 4096 and all(b == 2 * a for a, b in zip(lengths, lengths[1:]))  # doubling
    assert lengths[-1] < path.stat().st_size  # never the whole file
    assert all(name == "Tiny-F16.gguf" for name, _ in hub.requests)


def test_header_longer_than_the_fetch_limit(tmp_path, monkeypatch):
    path = dense(tmp_path, long_vocab=3000).write()
    hub = FakeHub({"Tiny-F16.gguf": path})
    monkeypatch.setattr(gguf_facts, "_http_json", hub.json)
    monkeypatch.setattr(gguf_facts, "_http_range", hub.range)
    monkeypatch.setattr(gguf_facts, "FIRST_FETCH", 1024)
    monkeypatch.setattr(gguf_facts, "MAX_FETCH", 8192)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert gguf_facts.main(["org/Tiny-GGUF:F16"]) == 2


def test_https_url_input(tmp_path, monkeypatch):
    path = dense(tmp_path).write()
    hub = FakeHub({"dense.gguf": path})
    monkeypatch.setattr(gguf_facts, "_http_range", hub.range)
    out = gguf_facts.facts_text("https://huggingface.co/org/Tiny-GGUF/blob/main/dense.gguf")
    assert facts_of(out)["facts"]["layers"] == 3
    assert hub.requests[0][0] == "dense.gguf"  # the /blob/ page link was turned into /resolve/


def test_unreachable_hub_is_one_line(monkeypatch, capsys):
    def refuse(url: str) -> Any:
        raise gguf_facts._http_problem(OSError("network is unreachable"), url)

    monkeypatch.setattr(gguf_facts, "_http_json", refuse)
    assert gguf_facts.main(["org/Model-GGUF:Q4_K_M"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "org/Model-GGUF:Q4_K_M" in err and "pass its path" in err


# --- the catalog ------------------------------------------------------------------------------------


def test_every_catalog_entry_validates():
    entries = yaml.safe_load((ROOT / "config" / "catalog.yaml").read_text())
    assert len(entries) >= 30
    for repo, entry in entries.items():
        assert entry.get("source"), repo
        fields = {k: v for k, v in entry.items() if k not in ("source", "note", "also")}
        ModelFacts.model_validate(fields)
    known = catalog()
    for repo, entry in entries.items():
        assert repo in known
        for alias in entry.get("also", []):
            assert known[alias] is known[repo]


def test_the_shipped_models_facts_match_their_real_shapes():
    """The catalog's facts for every model a shipped stack runs agree with the tensor table of its real
    shape (lab/contract/real_shape.py), the file llama.cpp loads in tests/test_memory_oracle.py."""
    import math

    from lab.contract.real_shape import PRESETS, tensor_table

    for repo, preset in [("ggml-org/Qwen3.6-35B-A3B-GGUF", "qwen3.6-35b-a3b"), ("ggml-org/Qwen3-30B-A3B-GGUF", "qwen3-30b-a3b"),
                         ("Qwen/Qwen3-Embedding-0.6B-GGUF", "qwen3-embedding-0.6b"),
                         ("Qwen/Qwen3-Embedding-8B-GGUF", "qwen3-embedding-8b"),
                         ("bartowski/Llama-3.3-70B-Instruct-GGUF", "llama-3.3-70b")]:
        facts, shape = catalog()[repo], PRESETS[preset]
        table = tensor_table(preset)
        params = sum(math.prod(ne) for _, ne, _, _ in table) / 1e9
        experts = sum(math.prod(ne) for name, ne, _, _ in table if "_exps" in name) / 1e9
        assert facts.params_b == pytest.approx(params, rel=0.03), repo
        assert (facts.expert_params_b or 0) == pytest.approx(experts, abs=0.01), repo
        assert (facts.layers, facts.kv_heads, facts.head_dim) == (shape.n_layer, shape.n_head_kv, shape.head_dim), repo
        assert (facts.embedding_length, facts.vocab_size) == (shape.n_embd, shape.n_vocab), repo
        if shape.n_expert:
            assert (facts.experts_used, facts.expert_feed_forward_length) == (shape.n_expert_used, shape.n_ff_exp), repo
        else:
            assert facts.feed_forward_length == shape.n_ff, repo


def test_gemma3_and_gpt_oss_count_only_global_layers():
    """llama.cpp's default (no --swa-full): window-sized KV for the sliding layers."""
    for repo, layers, period in [("ggml-org/gemma-3-27b-it-GGUF", 62, 6), ("ggml-org/gemma-3-1b-it-GGUF", 26, 6),
                                 ("ggml-org/gpt-oss-20b-GGUF", 24, 2), ("ggml-org/gpt-oss-120b-GGUF", 36, 2)]:
        facts = catalog()[repo]
        assert facts.layers == layers
        assert facts.full_attention_layers == sum(1 for il in range(layers) if il % period == period - 1)


def _server(hf_repo: str):
    from plane import parse_stack
    from conftest import homelab_plain_values

    chat = parse_stack(homelab_plain_values()).models["chat"]
    return chat.model_copy(update={"hf_repo": hf_repo, "facts": None})


def test_facts_for_resolves_by_repo_with_and_without_quant():
    expected = catalog()["Qwen/Qwen3-8B-GGUF"]
    assert facts_for(_server("Qwen/Qwen3-8B-GGUF:Q4_K_M")) is expected
    assert lookup("Qwen/Qwen3-8B-GGUF") is expected
    assert lookup("Qwen/Qwen3-8B-GGUF:Q8_0") is expected
    assert lookup("qwen/qwen3-8b-gguf") is expected  # Hub names are case-insensitive
    assert facts_for(_server("nobody/Unknown-GGUF:Q4_K_M")) is None
    own = ModelFacts(params_b=1, layers=2, kv_heads=1, head_dim=64)
    assert facts_for(_server("Qwen/Qwen3-8B-GGUF:Q4_K_M").model_copy(update={"facts": own})) is own


def test_also_repos_resolve_to_the_same_facts():
    assert facts_for(_server("unsloth/Qwen3-8B-GGUF:Q4_K_M")) is catalog()["Qwen/Qwen3-8B-GGUF"]
    assert facts_for(_server("unsloth/gemma-3-27b-it-GGUF:Q4_K_M")) is catalog()["ggml-org/gemma-3-27b-it-GGUF"]
    assert lookup("bartowski/mistralai_Mistral-Small-3.1-24B-Instruct-2503-GGUF") is catalog()[
        "unsloth/Mistral-Small-3.2-24B-Instruct-2506-GGUF"]


@pytest.mark.parametrize("text, names", [
    ("org/A-GGUF:\n  params_b: -1\n  layers: 2\n  kv_heads: 1\n  head_dim: 8\n  source: x\n", ["org/A-GGUF", "params_b"]),
    ("org/A-GGUF:\n  params_b: 1\n  layers: 2\n  kv_heads: 1\n  head_dim: 8\n  source: x\n  colour: red\n",
     ["org/A-GGUF", "colour"]),
    ("org/A-GGUF:\n  params_b: 1\n  layers: 2\n  kv_heads: 1\n  source: x\n", ["org/A-GGUF", "head_dim"]),
    ("org/A-GGUF:\n  params_b: 1\n  layers: 2\n  kv_heads: 1\n  head_dim: 8\n", ["org/A-GGUF", "source"]),
    ("org/A-GGUF:\n  params_b: 1\n  layers: 2\n  kv_heads: 1\n  head_dim: 8\n  source: x\n  also: [org/A-GGUF]\n",
     ["org/A-GGUF", "also[0]"]),
    ("org/A-GGUF:Q4_K_M:\n  params_b: 1\n  layers: 2\n  kv_heads: 1\n  head_dim: 8\n  source: x\n", ["org/A-GGUF:Q4_K_M"]),
])
def test_malformed_catalog_entry_names_repo_and_field(text, names):
    with pytest.raises(CatalogError) as caught:
        parse_catalog(text, where="test.yaml")
    message = str(caught.value)
    assert all(name in message for name in names), message


def test_importing_the_catalog_reads_nothing():
    code = ("import sys, config.catalog as c; "
            "assert 'yaml' not in sys.modules and not c._CACHE; "
            "c.catalog(); assert c._CACHE; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
