"""A Grafana dashboard per stack, the plan beside what the cluster does: built with the Grafana
Foundation SDK's builders (its own types) and rendered as a ConfigMap for Grafana's dashboard sidecar
(the label `grafana_dashboard: "1"`; the sidecar must search this namespace, e.g. searchNamespace: ALL).

Every panel queries series the stack's own components export, each named as the real component names
it: llama.cpp's `llamacpp:*` (its /metrics, scraped per server), the admission proxy's
`inference_plane_router_*` (a router's residency), Envoy AI Gateway's `gen_ai_*`, kube-state-metrics'
pod series and the kubelet's cAdvisor `container_memory_working_set_bytes`; the plan's own figures
(predicted decode, the memory limit, the start-up budget, the VRAM budget) are constant lines beside
them (`vector(x)`), labelled `plan`. tests/test_dashboard.py holds it to that list."""

from __future__ import annotations

import json
from typing import Optional

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from config.types import StackConfig
from engines import ServerBuild
from planning.capacity import CapacityPlan

from .gateway_routes import fallback_alerts

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# The ConfigMap label Grafana's dashboard sidecar looks for (the grafana chart's default sidecar.dashboards.label).
SIDECAR_LABEL = {"grafana_dashboard": "1"}
FILE_NAME = "inference-plane.json"
WIDTH, HEIGHT = 12, 8


def _query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def _series(title: str, unit: str, description: str, queries: list[tuple[str, str]]) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).unit(unit).description(description).datasource(DATASOURCE)
             .height(HEIGHT).span(WIDTH))
    for index, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + index)))
    return panel


def _plan(value: float) -> str:
    return f"vector({value:g})"


def build_dashboard(stack: StackConfig, plan: CapacityPlan, builds: dict[str, ServerBuild], namespace: str,
                    stack_name: str) -> dict:
    """The dashboard's JSON model (a dict), built with the SDK's builders."""
    board = (dashboard.Dashboard(f"inference-plane: {stack_name}").uid(f"inference-plane-{stack_name}"[:40])
             .tags(["inference-plane"]).refresh("1m").time("now-6h", "now").timezone("browser")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")))
    for key, model in stack.models.items():
        server = plan.servers[key]
        where = f'namespace="{namespace}", service="{model.name}"'
        pods = f'namespace="{namespace}", pod=~"{server.workload}-.*"'
        board = board.with_row(dashboard.Row(f"{model.name} ({server.workload}, {server.replicas} replica"
                                             f"{'s' if server.replicas != 1 else ''})"))
        llamacpp = builds[key].exports_llamacpp_metrics
        if llamacpp and server.residency is not None:
            # A router's children are scraped one target per model, labelled with its name.
            decode = [(f"avg by (model) (llamacpp:predicted_tokens_seconds{{{where}}})", "measured {{model}}")]
            decode += [(_plan(m.decode_predicted_tok_s["half"]), f"plan {m.name}, half context")
                       for m in server.residency.models if m.decode_predicted_tok_s]
        elif llamacpp:
            decode = [(f"avg by (pod) (llamacpp:predicted_tokens_seconds{{{where}}})", "measured {{pod}}")]
            if server.decode_predicted_tok_s:
                decode += [(_plan(server.decode_predicted_tok_s["empty"]), "plan, empty context"),
                           (_plan(server.decode_predicted_tok_s["full"]), "plan, full context")]
        if llamacpp:
            board = board.with_panel(_series(
                "Decode speed: measured vs plan", "none",
                "llama.cpp's average generation speed since the last scrape (tok/s), beside the plan's prediction "
                "at an empty and a full context (docs/capacity-planning.md states its measured error).", decode))
            board = board.with_panel(_series(
                "Requests: processing and queued", "none",
                "Requests being generated and requests waiting for a free slot (the Queuing alert's series).",
                [(f"sum(llamacpp:requests_processing{{{where}}})", "processing"),
                 (f"sum(llamacpp:requests_deferred{{{where}}})", "queued")]))
        board = board.with_panel(_series(
            "Memory: used vs the pod's limit", "bytes",
            "The server container's working set (the kubelet's cAdvisor) beside the memory limit the plan set.",
            [(f'max by (pod) (container_memory_working_set_bytes{{{pods}, container="{model.name}"}})', "used {{pod}}"),
             (_plan(_bytes(server.memory_limit)), "plan: limit")]))
        board = board.with_panel(_series(
            "Start-up: time to ready vs budget", "s",
            "Seconds from the pod's start to its readiness (kube-state-metrics), beside the start-up window the plan "
            "allows (the startup probe; NotReady fires past it).",
            [(f"max by (pod) (kube_pod_status_ready_time{{{pods}}} - kube_pod_start_time{{{pods}}})", "took {{pod}}"),
             (_plan(server.budget.startup_seconds), "plan: budget")]))
        if server.residency is not None:
            board = _residency_panels(board, where, server)
    fallbacks = fallback_alerts(stack, builds) if stack.gateway is not None else []
    if fallbacks:
        board = board.with_row(dashboard.Row("Gateway"))
        # Per route: its requests sent upstream under another name than its local first tier's (the name the
        # first tier is sent, which may differ from the public one: a renamed local tier is not a fallback).
        board = board.with_panel(_series(
            "Share of each model's requests answered by a fallback tier", "percentunit",
            "Requests routed for a model but sent upstream under another name than its local first tier's "
            "(Envoy AI Gateway's gen_ai_server_request_duration_seconds).",
            [(f'sum(rate(gen_ai_server_request_duration_seconds_count{{gen_ai_original_model="{route.model}", '
              f'gen_ai_request_model!="{local}"}}[5m])) / sum(rate(gen_ai_server_request_duration_seconds_count'
              f'{{gen_ai_original_model="{route.model}"}}[5m]))', route.model) for route, local, _ in fallbacks]))
    return json.loads(JSONEncoder(sort_keys=True, indent=None).encode(board.build()))


def _residency_panels(board, where: str, server):
    residency = server.residency
    budget = residency.vram_budget_gib if residency.vram_budget_gib is not None else residency.ram_budget_gib
    board = board.with_panel(_series(
        "Router: planned memory of the resident models vs budget", "bytes",
        "What the admission proxy holds resident, in the plan's figures, beside the budget it may not exceed.",
        [(f"sum(inference_plane_router_resident_planned_vram_bytes{{{where}}})", "resident (planned)"),
         (_plan(budget * 2**30), "plan: budget")]))
    board = board.with_panel(_series(
        "Router: models resident", "none", "1 while the router holds the model (loading, loaded or asleep).",
        [(f"max by (model) (inference_plane_router_model_resident{{{where}}})", "{{model}}")]))
    board = board.with_panel(_series(
        "Router: unloads to make room, failed loads (per hour)", "none",
        "Models the admission proxy unloaded for another, and loads the router reported failed.",
        [(f"sum by (model) (increase(inference_plane_router_evictions_total{{{where}}}[1h]))", "unloaded {{model}}"),
         (f"sum by (model) (increase(inference_plane_router_failed_loads_total{{{where}}}[1h]))", "failed {{model}}")]))
    swaps = [(f"sum by (model) (rate(inference_plane_router_swap_seconds_sum{{{where}}}[1h])) / "
              f"sum by (model) (rate(inference_plane_router_swap_seconds_count{{{where}}}[1h]))", "measured {{model}}")]
    swaps += [(_plan(m.swap_seconds["warm"]), f"plan warm: {m.name}") for m in residency.models]
    board = board.with_panel(_series(
        "Router: swap time vs plan", "s", "Seconds from admitting a model not resident until it was loaded, "
        "beside the plan's warm swap (weights in the page cache) for each model.", swaps))
    board = board.with_panel(
        stat.Panel().title("Router: requests that waited for room (last hour)").datasource(DATASOURCE)
        .height(HEIGHT // 2).span(WIDTH).with_target(_query(
            f"sum(increase(inference_plane_router_admission_wait_seconds_count{{{where}}}[1h]))", "waited", "A")))
    return board


def _bytes(quantity: str) -> float:
    from common.quantity import parse_quantity

    return float(parse_quantity(quantity))


def dashboard_config_map(stack: StackConfig, plan: CapacityPlan, builds: dict[str, ServerBuild], namespace: str,
                         stack_name: str) -> Optional[dict]:
    """The ConfigMap's data: the dashboard's JSON under FILE_NAME."""
    return {FILE_NAME: json.dumps(build_dashboard(stack, plan, builds, namespace, stack_name), indent=2, sort_keys=True) + "\n"}
