"""From a GGUF's metadata to the planner's facts: layers, KV heads and head size, which layers attend
(hybrid, sliding-window, shared-KV and MTP layers), parameters (total and active), recurrent state,
pooling and the weights' size; and the ``facts:`` block printed for a stack file."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tools.gguf_header import FactsError, Model

GIB = 2**30
MIB = 2**20

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
