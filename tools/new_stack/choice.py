"""The choice: each candidate built into a stack, validated and planned by the program's own planner;
the largest chat model that fits and decodes fast enough, then the best embedding model beside it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from common.errors import CapacityError, ConfigError
from config.catalog import lookup
from planning.capacity import USABLE_DECODE_TOK_S
from tools.new_stack.candidates import CHAT_CANDIDATES, EMBED_CANDIDATES, Candidate, ChatSetup, params_b
from tools.new_stack.hardware import Cluster, Hardware
from tools.new_stack.stack_file import build_config, stack_values

MIN_CTX = 8192  # a usable context: a chat with some history, a pasted page
CTX_CHOICES = (32768, 16384, MIN_CTX)  # tried longest first, for the chosen model
MIN_DECODE_TOK_S = USABLE_DECODE_TOK_S  # a reading pace, predicted at half the context (the plan's own line)
# On a discrete card a chat at reading pace is not what its owner bought it for: 20 tok/s (predicted at
# half the context) passes over a huge model spilled into RAM (gpt-oss-120b at ~10 tok/s on a 24 GiB card)
# for one the card holds (Qwen3.6-35B-A3B at ~100).
MIN_DECODE_TOK_S_GPU = 20.0
EMBED_SHARE = 1 / 8  # the embedding server's share of what a node offers


def decode_floor(hw: Hardware) -> float:
    return MIN_DECODE_TOK_S_GPU if hw.discrete else MIN_DECODE_TOK_S


@dataclass
class Outcome:
    setup: Optional[ChatSetup]
    plan: Any = None
    problem: str = ""  # why it was not taken
    tok_s: Optional[float] = None


def plan_of(hw: Hardware, cluster: Cluster, chat: ChatSetup, embed: Candidate) -> tuple[Any, str]:
    """(the plan, "") or (None, why it does not fit)."""
    from plane import parse_stack, plan_capacity

    config = build_config(hw, cluster, chat, embed, cache_size=4096)
    try:
        plan = plan_capacity(parse_stack(stack_values(config)))
    except (ConfigError, CapacityError) as error:
        return None, str(error)
    if plan.warnings:
        return None, plan.warnings[0]
    return plan, ""


def placements(hw: Hardware, candidate: Candidate) -> Iterator[tuple[int, Optional[int]]]:
    """(gpu_layers, cpu_moe_layers), fastest first."""
    facts = lookup(candidate.repo)
    if hw.gpu == "none":
        yield 0, None
        return
    yield 99, None
    if not hw.discrete:
        return
    if facts.expert_params_b:
        for n in range(1, facts.layers + 1):
            yield 99, n
    else:
        for ngl in range(facts.layers, 0, -1):
            yield ngl, None


def half_tok_s(plan: Any) -> Optional[float]:
    predicted = plan.servers["chat"].decode_predicted_tok_s
    return predicted["half"] if predicted else None


def cache_types(hw: Hardware) -> tuple[str, ...]:
    """The KV cache types tried at each placement, in order: f16 first (faster at depth where measured,
    engines/llamacpp_speed.py Q8_0_KV_SLOWER_PCT_H200), q8_0 on a discrete card only where an f16 cache does not
    fit it (half the bytes)."""
    return ("f16", "q8_0") if hw.discrete else ("f16",)


def fitting(hw: Hardware, cluster: Cluster, candidate: Candidate, ctx: int, gpu_layers: int, cpu_moe: Optional[int],
            embed: Candidate) -> tuple[Optional[ChatSetup], Any, str]:
    """(setup, plan, "") with the first cache type that fits at this context and placement, else (None, None, why
    the last did not)."""
    problem = ""
    for cache in cache_types(hw):
        setup = ChatSetup(candidate, ctx, gpu_layers, cpu_moe, cache)
        plan, problem = plan_of(hw, cluster, setup, embed)
        if plan is not None:
            return setup, plan, ""
    return None, None, problem


def try_chat(hw: Hardware, cluster: Cluster, candidate: Candidate, embed: Candidate) -> Outcome:
    """The longest context at which this model fits and decodes at a reading pace, at its fastest
    placement (with an f16 cache where it fits, else q8_0); else the fastest fitting setup (marked slow by its
    tok_s), or why none fits."""
    last_problem = ""  # at the shortest context: the least this model needs
    slowest_ok: Optional[Outcome] = None
    for ctx in CTX_CHOICES:
        for gpu_layers, cpu_moe in placements(hw, candidate):
            setup, plan, problem = fitting(hw, cluster, candidate, ctx, gpu_layers, cpu_moe, embed)
            if plan is None:
                last_problem = problem
                continue
            outcome = Outcome(setup, plan, tok_s=half_tok_s(plan))
            if outcome.tok_s is None or outcome.tok_s >= decode_floor(hw):
                return outcome
            if slowest_ok is None or outcome.tok_s > (slowest_ok.tok_s or 0):
                slowest_ok = outcome
            break  # the fastest placement at this context is too slow: try a shorter context
    return slowest_ok or Outcome(None, problem=last_problem)


@dataclass
class Choice:
    chat: ChatSetup
    embed: Candidate
    plan: Any
    slow: bool
    passed_over: list[str] = field(default_factory=list)


class NoFit(Exception):
    pass


def choose(hw: Hardware, cluster: Cluster) -> Choice:
    """The largest chat model that fits and decodes at a reading pace (else the fastest that fits),
    then the best embedding model that fits beside it in its share of the node."""
    smallest_embed = EMBED_CANDIDATES[-1]
    passed_over: list[str] = []
    fallback: Optional[Outcome] = None
    chosen: Optional[Outcome] = None
    for candidate in sorted(CHAT_CANDIDATES, key=params_b, reverse=True):
        outcome = try_chat(hw, cluster, candidate, smallest_embed)
        if outcome.setup is None:
            passed_over.append(f"{candidate.short} does not fit ({_short_problem(outcome.problem)})")
            continue
        if outcome.tok_s is not None and outcome.tok_s < decode_floor(hw):
            passed_over.append(f"{candidate.short} fits but is predicted at {outcome.tok_s:.1f} tok/s")
            if fallback is None or (outcome.tok_s or 0) > (fallback.tok_s or 0):
                fallback = outcome
            continue
        chosen = outcome
        break
    slow = False
    if chosen is None:
        if fallback is None:
            raise NoFit(passed_over[-1] if passed_over else "no candidates")
        chosen, slow = fallback, True
    budget = hw.offers_gib() * EMBED_SHARE
    for embed in EMBED_CANDIDATES:
        plan, _ = plan_of(hw, cluster, chosen.setup, embed)
        if plan is not None and (plan.servers["embed"].need_gib <= budget or embed == smallest_embed):
            return Choice(chosen.setup, embed, plan, slow, passed_over)
    raise NoFit("the chat model fits with no embedding model beside it")  # smallest_embed was planned above


def _short_problem(problem: str) -> str:
    """A planner problem without its heading, path and remedy: what does not fit, with the numbers."""
    text = problem.split(": ", 1)[-1]  # "capacity plan does not fit: "
    text = text.split(": ", 1)[-1] if re.match(r"^[a-z_]+\.[A-Za-z0-9_.\-]+: ", text) else text  # the config path
    text = text.split("; ", 1)[0]
    return text[:200] + ("..." if len(text) > 200 else "")
