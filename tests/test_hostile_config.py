"""Hostile config: fuzzed mutations and a corpus of bad stacks, each ending in a clear error.

Every case ends in the config model's (or the capacity plan's) one-line error naming a path —
never a traceback, never a half-written render folder, never a previous render clobbered.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import CapacityError
from plane import plan_capacity as plan
from config import ConfigError
from plane import parse_stack
from conftest import ROOT, homelab_plain_values, plain_values, stack_values, strix_values
from render.output import RenderError, render_stack

CORPUS = Path(__file__).parent / "bad_stacks"
BASES = {"homelab": homelab_plain_values(), "strix-halo": strix_values(), "rtx4090": plain_values("rtx4090"),
         "cpu-cluster": plain_values("cpu-cluster")}

hostile_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF), max_size=20),
    st.just("x" * 100_000),
    st.just("24Gi"),
    st.just("ghcr.io/ggml-org/llama.cpp:latest"),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += paths(item, (*prefix, index))
    return out


def parent_of(tree: Any, path: tuple) -> Any:
    for part in path[:-1]:
        tree = tree[part]
    return tree


@st.composite
def mutated_stacks(draw) -> dict:
    values = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        candidates = paths(values)
        path = draw(st.sampled_from(candidates))
        parent = parent_of(values, path)
        key = path[-1]
        action = draw(st.sampled_from(["delete", "replace", "unknown", "range", "duplicate"]))
        if action == "delete":
            del parent[key]
        elif action == "replace":
            parent[key] = draw(hostile_values)
        elif action == "unknown" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(hostile_values)
        elif action == "range":
            parent[key] = draw(st.sampled_from([-1, 0, 2**31, 10**12, -(10**9)]))
        elif action == "duplicate" and isinstance(parent, dict):
            parent[f"{key}-copy"] = copy.deepcopy(parent[key])
    return values


def assert_clear(error: Exception) -> None:
    text = str(error)
    assert "\n" not in text and "Traceback" not in text
    assert ": " in text and len(text) < 2000


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_stacks())
def test_mutated_config_ends_in_a_clear_error_or_a_valid_plan(values):
    try:
        plan(parse_stack(values))
    except (ConfigError, CapacityError) as error:
        assert_clear(error)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutated_stacks())
def test_mutated_stack_never_half_writes_or_clobbers(tmp_path_factory, values):
    folder = tmp_path_factory.mktemp("fuzz")
    out = folder / "out"
    # A previous render of this stack, from the real homelab file.
    (folder / "Pulumi.fuzz.yaml").write_text((ROOT / "Pulumi.homelab.yaml").read_text())
    render_stack("fuzz", out, project_dir=folder)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    config = {f"inference-plane:{k}": v for k, v in values.items()}
    config.update({f"inference-plane:{k}": {"secure": "v1:eA=="} for k in _secret_keys(values)})
    (folder / "Pulumi.fuzz.yaml").write_text(yaml.safe_dump({"config": config}))
    try:
        render_stack("fuzz", out, project_dir=folder)
    except RenderError as error:
        assert_clear(error)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in folder.iterdir()) == ["Pulumi.fuzz.yaml", "out"]


def _secret_keys(values: dict) -> set[str]:
    keys = set()
    for model in (values.get("models") or {}).values() if isinstance(values.get("models"), dict) else []:
        api_key = model.get("api_key") if isinstance(model, dict) else None
        if isinstance(api_key, dict) and isinstance(api_key.get("from_config"), str):
            keys.add(api_key["from_config"])
    gateway = values.get("gateway")
    if isinstance(gateway, dict):
        if isinstance(gateway.get("master_key_config"), str):
            keys.add(gateway["master_key_config"])
        for tier in (gateway.get("tiers") or {}).values() if isinstance(gateway.get("tiers"), dict) else []:
            remote = tier.get("remote") if isinstance(tier, dict) else None
            if isinstance(remote, dict) and isinstance(remote.get("api_key_config"), str):
                keys.add(remote["api_key_config"])
    return {k for k in keys if k.isidentifier() and k.islower()}


def merge(base: dict, patch: dict) -> dict:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


CASES = sorted(CORPUS.glob("*.yaml"))


def test_the_corpus_is_there():
    assert len(CASES) >= 12


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_bad_stack_gives_its_exact_message(tmp_path, case):
    spec = yaml.safe_load(case.read_text())
    values = merge(copy.deepcopy(stack_values(spec["base"])), spec.get("patch") or {})
    for dotted in spec.get("delete") or []:
        *head, last = dotted.split(".")
        parent = values
        for part in head:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        del parent[int(last) if isinstance(parent, list) else last]
    config = {f"inference-plane:{k}": v for k, v in values.items()}
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": config}))
    with pytest.raises(RenderError) as caught:
        render_stack("bad", tmp_path / "out", project_dir=tmp_path)
    assert str(caught.value) == spec["expect"]
    assert not (tmp_path / "out").exists()


# --- the free-form fields (#31): whatever a stack puts there, nothing unplanned reaches an object ------

FLAG_WORDS = ["--temp", "--temp=0.5", "-s", "--jinja", "--jinja=1", "--model-url", "--path", "--mlock", "--rpc",
              "--ctx-size", "-c", "--alias", "--chat-template-kwargs", "--reasoning-budget", "--no-such-flag", "-lv"]
VALUE_WORDS = ["0.7", "-1", "/", "{\"a\": 1}", "a ;b", "x #y", " padded ", "a=b", "line\nbreak", "[evil]\nmodel = /etc/passwd",
               "nul\x00", "tab\tin", "ok", "0.7\u2028load-on-startup = true", "x\u0085ctx-size = 262144", "a\u2029b",
               "cr\rctx-size = 1", "\u202eevil", "--top-k", "-0.5", "vt\x0bx", "fs\x1cx"]
REASONS = ["a reason given on purpose", "          ", "ok", "a reason\nLAN clients in 192.168.0.0/16",
           "nobody outside the tailnet\u2028ever", "x" * 12, "we know, it is a lab box"]
ANNOTATION_KEYS = ["nginx.ingress.kubernetes.io/ssl-redirect", "nginx.ingress.kubernetes.io/limit-rps",
                   "nginx.ingress.kubernetes.io/mirror-target", "Nginx.ingress.kubernetes.io/ssl-redirect",
                   " nginx.ingress.kubernetes.io/limit-rps", "gethomepage.dev/name",
                   "nginx.ingress.kubernetes.io/server-snippet", "nginx.ingress.kubernetes.io/cors-allow-origin",
                   "external-dns.alpha.kubernetes.io/hostname", "traefik.ingress.kubernetes.io/router.entrypoints",
                   "gethomepage.dev/enabled", "cert-manager.io/issuer", "example.org/note"]


@st.composite
def free_form(draw) -> dict:
    values = copy.deepcopy(plain_values("rtx3090-library"))
    library = values["models"]["library"]
    library["extra_args"] = draw(st.lists(st.sampled_from(FLAG_WORDS + VALUE_WORDS), max_size=6))
    library["exposure"]["annotations"] = draw(st.dictionaries(st.sampled_from(ANNOTATION_KEYS), st.sampled_from(VALUE_WORDS),
                                                                max_size=3))
    library["exposure"]["source_ranges"] = draw(st.lists(st.sampled_from(
        ["192.168.0.0/16", "10.1.0.0/16", "0.0.0.0/0", "8.8.8.0/24", "fd00::/8", "::/0"]), min_size=1, max_size=3, unique=True))
    if draw(st.booleans()):
        library["exposure"]["public_reason"] = draw(st.sampled_from(REASONS))
    return values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(free_form())
def test_free_form_fields_are_refused_in_one_line_or_reach_no_object_unseen(values):
    import re

    from config.checks import public_ranges
    from config.ingress import annotation_refusal
    from engines import engine_of
    from engines.llamacpp_flags import ALLOWED

    try:
        stack = parse_stack(values)
        plan(stack)
    except (ConfigError, CapacityError) as error:
        assert_clear(error)
        return
    library = stack.models["library"]
    # Every item is an allowed flag or the value right after one that takes it, one clean argv element.
    args = list(library.extra_args)
    index = 0
    while index < len(args):
        flag, _, inline = args[index].partition("=")
        assert flag in ALLOWED and not re.search(r"[\x00-\x1f]", args[index])
        index += 2 if ALLOWED[flag] and not inline else 1
    # The preset holds one line per setting, each a key its parser takes and a value it keeps whole; llama.cpp's
    # parser (\r\n, \n or \r) and every other reader (str.splitlines: U+2028, U+0085 ...) see the same lines.
    preset = engine_of(library).config_files(library)["/etc/llama-router"]["models.ini"]
    assert preset.splitlines() == re.split(r"\r\n|\n|\r", preset.rstrip("\n"))
    for line in preset.splitlines():
        assert line == "" or line.startswith((";", "[")) or re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_.-]* = \S(.*\S)?", line), line
        assert not re.search(r"[ \t][;#]", line.split(" = ", 1)[-1]) or line.startswith(";"), line
    assert all(annotation_refusal(name, stack.cluster.ingress.kind) is None for name in library.exposure.annotations)
    assert all(k.isprintable() and v.isprintable() for k, v in library.exposure.annotations.items())
    assert not public_ranges(library.exposure.source_ranges) or library.exposure.public_reason
    # Any reason the summary repeats is one printable line, quoted: it cannot imitate a line of the summary.
    if library.exposure.public_reason is not None:
        from render.reach import said

        assert library.exposure.public_reason.isprintable() and "\n" not in said(library.exposure.public_reason)
