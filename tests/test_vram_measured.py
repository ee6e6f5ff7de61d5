"""The VRAM plan against what llama-server held on a real card (bench/results-vram-h200.json, written by
lab/bench/measure_vram.py on an NVIDIA H200 through bench/measure_device.sh): every llama.cpp server of every
shipped stack that offloads to a discrete card, and settings the stacks do not use (quants, micro-batches,
contexts, partial offload, experts in RAM, tied embeddings, embedding servers, vision projectors, 10 model
families). The record must be of today's rendered flags, and today's plan must hold to it."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT


from lab.bench.measure_vram import case_spec, shipped
from lab.bench.vram_error import MOST_UNDER_MIB, TOLERANCE, rows

RECORD = json.loads((ROOT / "bench" / "results-vram-h200.json").read_text())


def test_every_shipped_gpu_server_was_measured_with_the_flags_it_renders_today():
    recorded = {r["case"]: r for r in RECORD["rows"]}
    for origin in shipped():
        assert origin in recorded, f"{origin}: not measured on a card; run bench/measure_device.sh vram"
        today = case_spec(origin, origin, None)
        assert recorded[origin]["args"] == today["args"], f"{origin}: measured with other flags than it renders"
    for row in RECORD["rows"]:
        assert row["request_status"] == 200 and row["smi_after_request_mib"] > 0, row["case"]
        assert case_spec(row["case"], row["origin"], row["update"] or None)["args"] == row["args"], row["case"]


def test_the_plan_is_within_5_percent_of_the_card_and_never_far_below_it():
    table = rows()
    assert len(table) == len(RECORD["rows"]) >= 27
    for r in table:
        assert abs(r["error"]) <= TOLERANCE, f"{r['case']}: plan {r['planned_mib']:.0f} MiB, card {r['measured_mib']:.0f} MiB"
        assert r["under_mib"] <= MOST_UNDER_MIB, r["case"]


def test_a_router_reserves_the_most_the_plan_was_ever_below_the_card():
    from planning.memory import VRAM_PLAN_MOST_UNDER_GIB

    worst = max(r["under_mib"] for r in rows())
    assert worst / 1024 <= VRAM_PLAN_MOST_UNDER_GIB < worst / 1024 + 0.05


def test_the_parts_agree_with_llama_cpps_own_breakdown():
    """Not errors that cancel: the KV cache and recurrent state as llama.cpp reports them (CUDA0 KV and RS
    buffers) within 1 %, and the output layer on the card where llama.cpp put it (a tied table counted in
    VRAM and again in RAM)."""
    from engines import engine_of
    from lab.bench.measure_vram import model_of

    for row in RECORD["rows"]:
        model, pool = model_of(row["origin"], row["update"])
        estimate, _ = engine_of(model).estimate(model, pool, "test")
        cuda = {}
        for buft, kind, mib in row["buffers"]:
            if buft == "CUDA0":
                cuda[kind] = cuda.get(kind, 0.0) + mib
        assert estimate.vram.kv_gib * 1024 == pytest.approx(cuda["KV"], rel=0.01), row["case"]
        assert estimate.vram.recurrent_gib * 1024 == pytest.approx(cuda.get("RS", 0.0), rel=0.01, abs=1), row["case"]
    tied = next(r for r in RECORD["rows"] if r["case"] == "qwen3-1.7b")
    host = sum(mib for buft, kind, mib in tied["buffers"] if buft == "CPU_Mapped" and kind == "model")
    card = sum(mib for buft, kind, mib in tied["buffers"] if buft == "CUDA0" and kind == "model")
    # Qwen3-1.7B ties its output to the embedding: the card holds the whole file (1,101,457,408 bytes), and
    # RAM the table again (Q6_K, as llama-quantize types a tied table: 210 bytes per 256 values).
    assert card == pytest.approx(1101457408 / 2**20, rel=0.001)
    assert host == pytest.approx(151936 * 2048 * 210 / 256 / 2**20, rel=0.001)


def test_the_catalog_facts_the_vram_plan_reads_are_the_real_shapes():
    """Each measured repo's catalog entry agrees with the real shape it was measured as (lab/contract/real_shape.py,
    from the model's config.json): width, vocabulary, FFN width, query and KV heads, and whether the output layer is
    tied to the embedding (no output.weight) — the facts the VRAM and decode plans read."""
    from lab.contract.real_shape import PRESETS
    from lab.contract.real_shape_mmproj import TEXT

    from config.catalog import lookup
    from lab.contract.repo_shapes import REPO_SHAPES

    for repo, name in REPO_SHAPES.items():
        shape = PRESETS[name] if name in PRESETS else TEXT[name].shape
        facts = lookup(repo)
        assert (facts.embedding_length, facts.vocab_size, facts.kv_heads, facts.attention_heads) == (
            shape.n_embd, shape.n_vocab, shape.n_head_kv, shape.n_head), repo
        assert (facts.output_layer == "tied") == shape.tied, repo
        if not shape.n_expert:
            assert facts.feed_forward_length == shape.n_ff, repo
