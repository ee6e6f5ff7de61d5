"""Monitoring: VictoriaMetrics scrapes and alert rules for the model servers and the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from common.constants import ENVOY_OWNING_GATEWAY_LABEL, PART_OF, PROJECT
from config.types import Observability, StackConfig
from engines import ServerBuild
from planning.capacity import CapacityPlan
from planning.startup import rollout_waits

from .dashboard import FILE_NAME as DASHBOARD_FILE, SIDECAR_LABEL, dashboard_config_map
from .gateway_routes import fallback_alerts
from .meta import selector, token

VM = "operator.victoriametrics.com/v1beta1"
# The AI gateway's ext_proc serves its GenAI metrics on this container port of the Envoy pods.
AIGW_METRICS_PORT = "aigw-admin"


@dataclass(frozen=True)
class MonitoringArgs:
    observability: Observability
    stack: StackConfig
    plan: CapacityPlan
    namespace: str
    # Each server as its engine builds it (engines.server_builds): metrics path, scrapes, credentials.
    builds: dict[str, ServerBuild]


# vmagent's endpoints role (as Prometheus's) labels each address with its readiness.
NOT_READY_DROP = {"action": "drop", "sourceLabels": ["__meta_kubernetes_endpoint_ready"], "regex": "false"}
# A container restarted within this window: a crash, never a planned start (which restarts nothing).
RESTART_WINDOW = "15m"


def alert_name(name: str, suffix: str) -> str:
    return "".join(part.capitalize() for part in name.split("-")) + suffix


def _minutes(seconds: int) -> str:
    return f"{-(-seconds // 60)}m"


def alert_rules(args: MonitoringArgs) -> list[dict]:
    """Every alert: a server down (a ready pod not answering its scrape), restarting, not ready past its
    start-up budget, queuing, and traffic falling back. A planned cold start fires none of them."""
    obs, stack, ns = args.observability, args.stack, args.namespace
    rules: list[dict] = []
    for key, model in stack.models.items():
        where = f'namespace="{ns}", service="{model.name}"'
        server = args.plan.servers[key]
        built = args.builds[key]
        # A router's per-model scrapes fail while their model is unloaded (optional): only the targets that
        # must answer count (a router's admission proxy, labelled so).
        required = [s for s in built.metrics_scrapes if not s.optional]
        if built.metrics_path is not None and required:
            up = where + "".join(f', {k}="{v}"' for k, v in required[0].labels.items()) if len(required) == 1 else where
            rules.append(
                {
                    "alert": alert_name(model.name, "Down"),
                    "expr": f"up{{{up}}} == 0",
                    "for": "5m",
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": f"{model.name} is not answering its metrics scrape"},
                }
            )
        rules.append(
            {
                "alert": alert_name(model.name, "Restarting"),
                "expr": f'increase(kube_pod_container_status_restarts_total{{namespace="{ns}", container="{model.name}"}}'
                        f"[{RESTART_WINDOW}]) > 0",
                "labels": {"severity": "critical"},
                "annotations": {"summary": f"{model.name}'s container restarted (a crash, an OOM kill or a failed "
                                           "liveness probe): each restart is a full model load"},
            }
        )
        kind = model.workload.kind
        if kind == "StatefulSet":
            ready = f'kube_statefulset_status_replicas_ready{{namespace="{ns}", statefulset="{model.workload_name}"}}'
            wanted = f'kube_statefulset_replicas{{namespace="{ns}", statefulset="{model.workload_name}"}}'
        else:
            ready = f'kube_deployment_status_replicas_available{{namespace="{ns}", deployment="{model.workload_name}"}}'
            wanted = f'kube_deployment_spec_replicas{{namespace="{ns}", deployment="{model.workload_name}"}}'
        rules.append(
            {
                "alert": alert_name(model.name, "NotReady"),
                "expr": f"{ready} < {wanted}",
                # Longer than a cold start may take: past this, it is not loading, it is stuck.
                "for": _minutes(rollout_waits(server.budget, kind, model.workload.replicas)[0]),
                "labels": {"severity": "warning"},
                "annotations": {"summary": f"{model.name} has been unready for longer than its start-up budget"},
            }
        )
        if built.admission is not None:
            rules += residency_rules(model.name, where, server)
        if built.reports_queue:
            rules.append(
                {
                    "alert": alert_name(model.name, "Queuing"),
                    "expr": f"llamacpp:requests_deferred{{{where}}} > 0",
                    "for": obs.queue_alert_after,
                    "labels": {"severity": "warning"},
                    "annotations": {"summary": f"requests wait for a free slot on {model.name}"},
                }
            )
    for route, local_name, fallbacks in fallback_alerts(stack, args.builds):
        rules.append(
            {
                "alert": alert_name(f"fallback-{route.backends[0].tier}", "") + "Active",
                "expr": (
                    "sum(rate(gen_ai_server_request_duration_seconds_count"
                    f'{{gen_ai_original_model="{route.model}", gen_ai_request_model!="{local_name}"}}[10m])) > 0'
                ),
                "for": obs.fallback_alert_after,
                "labels": {"severity": "warning", "model": route.model},
                "annotations": {
                    "summary": f"{route.model} is not served by {route.backends[0].tier}: requests fall back to {fallbacks}"
                },
            }
        )
    return rules


# A pinned model lost by the router is loaded again by the admission proxy within 30 s (its cold load
# included, at most the plan's swap): past this, it keeps failing.
PINNED_GRACE_MINUTES = 5
# Two failed loads of one model within this window: not a passing hiccup (the proxy retries a pinned one).
FAILED_LOADS_WINDOW = "15m"


def residency_rules(name: str, where: str, server) -> list[dict]:
    """A router behind its admission proxy (incluster/admission.py exports these series): a pinned
    model not resident, a model refused for being larger than planned, and repeated failed loads."""
    slowest = max((m.swap_seconds["cold"] for m in server.residency.models if m.pinned), default=0)
    return [
        {
            "alert": alert_name(name, "PinnedNotResident"),
            "expr": f"inference_plane_router_model_pinned{{{where}}} == 1 and on(model) "
                    f"inference_plane_router_model_resident{{{where}}} == 0",
            "for": _minutes(PINNED_GRACE_MINUTES * 60 + int(slowest)),
            "labels": {"severity": "warning"},
            "annotations": {"summary": f"{name}: the pinned model {{{{ $labels.model }}}} is not loaded (the proxy "
                                       "loads it again every 30 s; its loads fail)"},
        },
        {
            # The downloader offers no model whose files are larger than the plan counted (a size the stack
            # file got wrong can waste memory, never overrun the budget): the model is not served until fixed.
            "alert": alert_name(name, "ModelLargerThanPlanned"),
            "expr": f'inference_plane_router_model_unserved{{{where}{"," if where else ""}reason="larger_than_planned"}} == 1',
            "labels": {"severity": "warning"},
            "annotations": {"summary": f"{name}: {{{{ $labels.model }}}} is not offered: its files are larger than the "
                                       "plan counted (correct its weights or facts in the stack file)"},
        },
        {
            "alert": alert_name(name, "LoadsFailing"),
            "expr": f"increase(inference_plane_router_failed_loads_total{{{where}}}[{FAILED_LOADS_WINDOW}]) >= 2",
            "labels": {"severity": "warning"},
            "annotations": {"summary": f"{name}: {{{{ $labels.model }}}} failed to load twice within {FAILED_LOADS_WINDOW} "
                                       "(the router's log says why: missing files, out of memory)"},
        },
    ]


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(token("Monitoring"), name, None, opts)
        obs, stack, ns = args.observability, args.stack, args.namespace
        child = pulumi.ResourceOptions(parent=self)
        labels = dict(PART_OF)
        for key, model in stack.models.items():
            built = args.builds[key]
            path = built.metrics_path
            if path is None:
                continue
            # Ready endpoints only: llama.cpp answers 503 on every path, /metrics too, until its model is
            # loaded (tools/server/server-http.cpp), and the endpoints role lists a starting pod's address
            # as not ready; scraped, it would read as down for a whole planned cold start (the NotReady
            # alert covers a start that overruns its budget, Restarting a crash).
            endpoint: dict = {"port": "http", "path": path, "interval": obs.scrape_interval,
                              "relabelConfigs": [NOT_READY_DROP]}
            credentials = built.credentials
            if model.api_key is not None and credentials is not None:
                # /metrics is behind the API key. A Secret this program writes carries the first key
                # alone for the scrape (the key file may hold two during a rotation).
                key = credentials.metrics_token_key if model.api_key.from_config else model.api_key.secret_key
                endpoint["bearerTokenSecret"] = {"name": model.api_key.secret_name, "key": key}
            endpoints = []
            for scrape in built.metrics_scrapes:
                target = dict(endpoint)
                if scrape.params:
                    target["params"] = {k: list(v) for k, v in scrape.params.items()}
                if scrape.labels:
                    # Target labels: every series of this target carries them (the engine's own have none).
                    target["relabelConfigs"] = [NOT_READY_DROP] + [
                        {"action": "replace", "targetLabel": label, "replacement": value} for label, value in scrape.labels.items()]
                endpoints.append(target)
            k8s.apiextensions.CustomResource(
                f"{name}-scrape-{model.name}",
                api_version=VM,
                kind="VMServiceScrape",
                metadata={"name": model.name, "namespace": ns, "labels": labels},
                spec={"selector": {"matchLabels": selector(model.name)}, "discoveryRole": "endpoints", "endpoints": endpoints},
                opts=child,
            )
        if stack.gateway is not None:
            k8s.apiextensions.CustomResource(
                f"{name}-scrape-gateway",
                api_version=VM,
                kind="VMPodScrape",
                metadata={"name": f"{stack.gateway.name}-ai-gateway", "namespace": ns, "labels": labels},
                spec={
                    "namespaceSelector": {"matchNames": [stack.gateway.envoy_namespace]},
                    "selector": {"matchLabels": {ENVOY_OWNING_GATEWAY_LABEL: stack.gateway.name}},
                    "podMetricsEndpoints": [{"port": AIGW_METRICS_PORT, "path": "/metrics", "interval": obs.scrape_interval}],
                },
                opts=child,
            )
        # The plan beside the cluster: a dashboard for Grafana's sidecar (components/dashboard.py).
        k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            metadata={"name": f"{PROJECT}-dashboard", "namespace": ns, "labels": {**labels, **SIDECAR_LABEL},
                      "annotations": {"inference-plane/dashboard": f"{DASHBOARD_FILE}: the plan beside what the cluster "
                                      "does; Grafana's dashboard sidecar loads it (it must search this namespace)"}},
            data=dashboard_config_map(stack, args.plan, args.builds, ns, pulumi.get_stack()),
            opts=child,
        )
        k8s.apiextensions.CustomResource(
            f"{name}-alerts",
            api_version=VM,
            kind="VMRule",
            metadata={"name": PROJECT, "namespace": ns, "labels": labels},
            spec={"groups": [{"name": PROJECT, "rules": alert_rules(args)}]},
            opts=child,
        )
        self.register_outputs({})
