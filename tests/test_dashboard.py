"""The per-stack Grafana dashboard (components/dashboard.py): built with the Grafana Foundation SDK and
read back by the SDK's own dashboard model unchanged; the plan's figures beside the cluster's series;
every series a panel queries is one the stack's components export (llama.cpp's names are checked off
the real server by tests/test_llama_contract.py, the admission proxy's off the real proxy by
tests/test_admission.py; the rest are kube-state-metrics', cAdvisor's and Envoy AI Gateway's)."""

from __future__ import annotations

import json
import re

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from common.quantity import parse_quantity
from test_alert_rules import CASES, rendered

# Series the dashboard may query, by who exports them. llama.cpp's and the proxy's are checked against
# the real programs (see the docstring); these three are named in their projects' documentation.
KUBE_STATE_METRICS = {"kube_pod_status_ready_time", "kube_pod_start_time"}
CADVISOR = {"container_memory_working_set_bytes"}
AI_GATEWAY = {"gen_ai_server_request_duration_seconds_count"}
FUNCTIONS = {"avg", "sum", "max", "by", "rate", "increase", "vector", "pod", "model", "gen_ai_original_model"}


def dashboard_of(stack: str) -> tuple[dict, dict, object]:
    run, _, _ = rendered(stack)
    from render.manifests import manifests

    (config_map,) = [m for m in manifests(run).values() if m["kind"] == "ConfigMap"
                     and m["metadata"]["name"] == "inference-plane-dashboard"]
    return config_map, json.loads(config_map["data"]["inference-plane.json"]), run


def series_names(board: dict) -> set[str]:
    names = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r'vector\([^)]*\)|\{[^}]*\}|"[^"]*"|\[[^\]]*\]', "", target["expr"])
            names |= {n for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if n not in FUNCTIONS}
    return names


def exported(name: str) -> bool:
    return (name.startswith("llamacpp:") or name.startswith("inference_plane_router_")
            or name in KUBE_STATE_METRICS | CADVISOR | AI_GATEWAY)


@pytest.mark.parametrize("stack", CASES)
def test_the_dashboard_is_the_sdks_own_model_and_queries_only_exported_series(stack):
    config_map, board, _ = dashboard_of(stack)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(board))) == board
    # The check can fail: a field the SDK's model does not know does not survive the round trip.
    bad = json.loads(json.dumps(board))
    bad["panels"][1]["colour"] = "red"
    assert json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(bad))) != bad
    names = series_names(board)
    assert names and all(exported(n) for n in names), sorted(n for n in names if not exported(n))
    assert all(t["datasource"]["uid"] == "${datasource}" for p in board["panels"] for t in p.get("targets", []))


@pytest.mark.parametrize("stack", CASES)
def test_each_server_shows_the_plan_beside_what_happens(stack):
    """Per server: the memory limit, the start-up budget and (where predicted) the decode speed are the
    plan's own figures, each beside the series that measures it, filtered to that server."""
    _, board, run = dashboard_of(stack)
    plan = run.outputs["capacity_plan"]["servers"]
    for key, model in run.config.models.items():
        server = plan[key]
        rows = [i for i, p in enumerate(board["panels"]) if p["type"] == "row" and p["title"].startswith(model.name + " ")]
        assert len(rows) == 1, model.name
        start = rows[0] + 1
        end = next((i for i in range(start, len(board["panels"])) if board["panels"][i]["type"] == "row"), len(board["panels"]))
        panels = {p["title"]: p for p in board["panels"][start:end]}
        memory = panels["Memory: used vs the pod's limit"]["targets"]
        assert f'container="{model.name}"' in memory[0]["expr"]
        assert memory[1]["expr"] == f"vector({float(parse_quantity(server['memory_limit'])):g})"
        startup = panels["Start-up: time to ready vs budget"]["targets"]
        assert startup[1]["expr"] == f"vector({server['budget']['startup_seconds']:g})"
        decode = panels.get("Decode speed: measured vs plan")
        if decode is not None:
            assert f'service="{model.name}"' in decode["targets"][0]["expr"]
            predicted = server.get("decode_predicted_tok_s")
            if predicted and not server.get("residency"):
                shown = [float(t["expr"].removeprefix("vector(").removesuffix(")")) for t in decode["targets"][1:]]
                assert shown == pytest.approx([predicted["empty"], predicted["full"]], abs=0.01)  # plan.json: 2 decimals
        if server.get("residency"):
            budget = panels["Router: planned memory of the resident models vs budget"]["targets"]
            assert budget[1]["expr"] == f"vector({server['residency']['vram_budget_gib'] * 2**30:g})"
            swaps = panels["Router: swap time vs plan"]["targets"][1:]
            assert [t["expr"] for t in swaps] == [f"vector({m['swap_seconds']['warm']:g})"
                                                  for m in server["residency"]["models"].values()]


@pytest.mark.parametrize("stack", CASES)
def test_every_panel_query_parses_as_promql(tmp_path, stack):
    """Each panel's expression, handed to Prometheus' own parser (promtool checks it as a recording rule's;
    VictoriaMetrics' MetricsQL takes PromQL): issue #45 item 3 found a label compared with a label, which
    neither parses. The fallback panel's series are per route, against the name its local tier is sent."""
    import subprocess

    import yaml

    from test_alert_rules import PROMTOOL

    _, board, run = dashboard_of(stack)
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    assert exprs
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert PROMTOOL, "promtool is not installed: `make test` installs Debian's prometheus package (promtool)"
    done = subprocess.run([PROMTOOL, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    fallback = [e for e in exprs if "gen_ai_original_model" in e]
    routes = [r for r in (run.config.gateway.routes if run.config.gateway else []) if len(r.backends) > 1
              and run.config.gateway.tiers[r.backends[0].tier].local]
    assert len(fallback) == len(routes)


def test_a_server_of_another_engine_gets_no_llama_cpp_panels():
    """Issue #45 item 5: an OpenAI-compatible engine's row drew llama.cpp's series, which it never exports."""
    from engines import engine_of

    _, board, run = dashboard_of("strix-halo")
    others = [m for m in run.config.models.values() if not engine_of(m).exports_llamacpp_metrics(m)]
    assert others
    for model in others:
        queries = [t["expr"] for p in board["panels"] for t in p.get("targets", []) if f'service="{model.name}"' in t["expr"]]
        assert not [q for q in queries if "llamacpp:" in q], model.name
