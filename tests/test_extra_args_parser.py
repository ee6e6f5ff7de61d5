"""extra_args in the forms the pinned llama-server's own parser takes (issue #43 item 1): every form the
config accepts is parsed by the real b10729 binary (it then stops at the missing model, not at an argument),
and every form refused for its shape is one the binary itself stops at. A stack that renders therefore
never stops its server at start over an argument."""
from __future__ import annotations

import subprocess

import pytest

from engines.llamacpp_flags import extra_args_problems

ACCEPTED = [
    ["--temp", "0.7"], ["--seed", "-1"], ["--temp", "-0.5"], ["--top-k", "40", "--top-p", "0.9"], ["--jinja"],
    ["--chat-template-kwargs", '{"enable_thinking": false}'], ["--reasoning-format", "deepseek"], ["--ignore-eos"],
    ["--samplers", "top_k;top_p;temperature"], ["-n", "256"],
]
REFUSED_FORMS = [
    ["--temp=0.5"], ["--ignore-eos=true"], ["--temp", "--top-k", "40"], ["--chat-template-kwargs", "--jinja"],
]


def parse(binary, extra: list[str]) -> str:
    """What the real server says before it would serve: its argument error, or the model it cannot load."""
    done = subprocess.run([str(binary), "-m", "/nonexistent/model.gguf", "--port", "0", *extra],
                          capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


@pytest.mark.parametrize("extra", ACCEPTED, ids=lambda e: " ".join(e))
def test_what_the_config_accepts_the_pinned_parser_takes(binary, extra):
    assert extra_args_problems(extra, "x", frozenset()) == []
    out = parse(binary, extra)
    assert "invalid argument" not in out and "error while handling argument" not in out, out[-400:]
    assert "failed to load model" in out, out[-400:]


@pytest.mark.parametrize("extra", REFUSED_FORMS, ids=lambda e: " ".join(e))
def test_what_the_config_refuses_for_its_form_the_pinned_parser_stops_at(binary, extra):
    problems = extra_args_problems(extra, "models.chat.extra_args", frozenset())
    assert problems and all(where.startswith("models.chat.extra_args[") for where, _ in problems), problems
    out = parse(binary, extra)
    assert "invalid argument" in out or "error while handling argument" in out, out[-400:]
    assert "failed to load model" not in out
