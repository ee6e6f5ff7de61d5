"""The AI routes' content: the rules that match a public model name to its tiers in priority
order, and the BackendTrafficPolicy that decides how a failed request moves between them."""

from __future__ import annotations

import re
from typing import Optional

from common.errors import ConfigError
from config.gateway import GatewayConfig, Route
from config.types import StackConfig
from engines import ServerBuild

MODEL_HEADER = "x-ai-eg-model"
# AIGatewayRoute accepts at most 15 rules (one slot is the controller's route-not-found rule).
MAX_RULES_PER_ROUTE = 15


def rule_name(model: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return slug or "model"


def object_ref(group: str, kind: str, name: str) -> dict:
    return {"group": group, "kind": kind, "name": name}


def backend_refs(route_backends, gateway: GatewayConfig, builds: dict[str, ServerBuild], public_model: Optional[str]) -> list[dict]:
    """Priority-ordered backendRefs; each tier gets the model name it knows the model by."""
    refs = []
    for priority, backend in enumerate(route_backends):
        tier_name = backend if isinstance(backend, str) else backend.tier
        override = None if isinstance(backend, str) else backend.model
        tier = gateway.tiers[tier_name]
        if override is None and tier.local is not None and public_model is not None:
            override = builds[tier.local].served_model(public_model)
        ref: dict = {"name": tier_name, "priority": priority}
        if override is not None and override != public_model:
            ref["modelNameOverride"] = override
        refs.append(ref)
    return refs


def route_rules(gateway: GatewayConfig, builds: dict[str, ServerBuild], kind: str = "chat") -> list[dict]:
    """The AIGatewayRoute rules of one kind, in order: one per public model, then (chat) the catch-all.
    Chat and embedding rules live on separate routes: their retry policies differ."""
    timing = {
        # Generation length is unbounded at the route (AI Gateway's own default is a 60 s cut). No
        # rule streamIdleTimeout: AI Gateway 1.1 makes it Envoy's per-try idle timeout, which re-runs
        # a non-streamed completion on the next tier once it has been silent that long. The route's
        # idle limit is completion_idle_timeout, on its BackendTrafficPolicy.
        "timeouts": {"request": "0s"},
    }
    rules = []
    for route in gateway.routes:
        if route.kind != kind:
            continue
        rules.append(
            {
                "name": rule_name(route.model),
                "matches": [{"headers": [{"type": "Exact", "name": MODEL_HEADER, "value": route.model}]}],
                "backendRefs": backend_refs(route.backends, gateway, builds, route.model),
                **timing,
            }
        )
    if gateway.catch_all and kind == "chat":
        rules.append(
            {
                "name": "catch-all",
                # A regular-expression match (not an empty one): Exact rules still win on
                # precedence, and it does not tie with the controller's route-not-found rules.
                "matches": [{"headers": [{"type": "RegularExpression", "name": MODEL_HEADER, "value": ".*"}]}],
                "backendRefs": backend_refs(gateway.catch_all, gateway, builds, None),
                **timing,
            }
        )
    return rules


def split_rules(rules: list[dict]) -> list[list[dict]]:
    return [rules[i : i + MAX_RULES_PER_ROUTE] for i in range(0, len(rules), MAX_RULES_PER_ROUTE)] or [[]]


def hashed_rules(gw: GatewayConfig, stack: StackConfig, rules: list[dict]) -> list[str]:
    """The rules session affinity cannot take a fallback from: one tier (no fallback to skip), a local one
    with more than one replica to choose between."""
    return [rule["name"] for rule in rules if len(rule["backendRefs"]) == 1
            and gw.local_replicas({rule["backendRefs"][0]["name"]}, stack.models) > 1]


def embedding_routes(gateway: GatewayConfig) -> list[Route]:
    return [r for r in gateway.routes if r.kind == "embedding"]


def traffic_policy_spec(gw: GatewayConfig, stack: StackConfig, route_name: str, rules: list[dict],
                        status_codes: list[int], hashed: Optional[list[str]] = None) -> dict:
    """One AI route's BackendTrafficPolicy: the route's idle limit and the retry that walks the
    priorities; with ``hashed`` (rule names), the same for those rules alone plus session affinity.
    Envoy Gateway (>= v1.6) lets a policy target an HTTPRoute rule by its name (sectionName; AI Gateway
    v1.1 names each generated rule after the AIGatewayRoute's, ai_gateway_route.go newHTTPRoute), and a
    rule's policy replaces the route's for that rule instead of merging, so it repeats the retry and
    the timeout."""
    retry = gw.retry
    tiers = {ref["name"] for rule in rules for ref in rule["backendRefs"]}
    replicas = gw.local_replicas(tiers, stack.models)
    target = object_ref("gateway.networking.k8s.io", "HTTPRoute", route_name)
    spec: dict = {"targetRefs": [target] if not hashed else [{**target, "sectionName": rule} for rule in hashed]}
    if hashed:
        # A conversation stays on the replica that holds its KV cache, only on a rule with one tier:
        # Envoy's hash balancers (Maglev here) ignore the retry's priority step (envoyproxy/envoy#9042,
        # thread_aware_lb_impl.cc never asks determinePriorityLoad), so a hashed rule would leave its
        # first tier only once all its endpoints are gone, and never reach a remote fallback on a 429/5xx.
        spec["loadBalancer"] = {
            "type": "ConsistentHash",
            "consistentHash": {"type": "Headers", "headers": [{"name": gw.session_header}]},
        }
    # The controller generates an HTTPRoute of the same name; this policy targets it. One
    # policy per route carries both settings: two of one kind on one target do not merge.
    spec |= {
        # The route's own idle limit: a non-streamed completion is silent until done, and the
        # listener's stream_idle_timeout would otherwise end it (Envoy Gateway >= 1.8 maps this
        # to the route's idle_timeout). No per-try timeout: it would re-run long completions.
        "timeout": {"http": {"streamIdleTimeout": gw.completion_idle_timeout}},
        # Envoy Gateway gives every retry the previous-hosts predicate (5 host selections,
        # internal/xds/translator/route.go v1.8.3), so a retry reaches another local replica;
        # one attempt per local replica before the next priority (previous_priorities). No
        # circuit breaker: its overflow 503 is Envoy's own, never retried and never failed over
        # (retry_state_impl.cc), so it would turn a busy card into errors, not a spill.
        "retry": {
            # Enough for the rule with the most tiers to reach its last (config.gateway: retries).
            "numRetries": gw.retries(max((len({ref.get("priority", 0) for ref in rule["backendRefs"]}) for rule in rules),
                                         default=1), retry.attempts_per_priority or replicas),
            "numAttemptsPerPriority": retry.attempts_per_priority or replicas,
            "retryOn": {
                "triggers": ["connect-failure", "refused-stream", "reset", "retriable-status-codes"],
                "httpStatusCodes": list(status_codes),
            },
            "perRetry": {"backOff": {"baseInterval": "100ms", "maxInterval": "2s"}},
        },
    }
    return spec


def fallback_alerts(stack: StackConfig, builds: dict[str, ServerBuild]) -> list[tuple]:
    """(route, name sent to its local first tier, fallbacks described) for every route whose first
    tier is local and has a fallback; raises ConfigError where the alert could not tell them apart.

    AI Gateway labels a request with the model name it sent upstream (gen_ai_request_model: the
    backend's modelNameOverride); gen_ai_provider_name is the API schema ("openai") for every
    OpenAI-compatible backend, so it cannot tell a local tier from a remote one."""
    gateway = stack.gateway
    found, problems = [], []
    for index, route in enumerate(gateway.routes if gateway is not None else []):
        first = gateway.tiers[route.backends[0].tier]
        if first.local is None or len(route.backends) < 2:
            continue
        sent = [ref.get("modelNameOverride") or route.model for ref in backend_refs(route.backends, gateway, builds, route.model)]
        local_name, fallback_names = sent[0], sent[1:]
        if local_name in fallback_names:
            other = route.backends[1 + fallback_names.index(local_name)].tier
            problems.append((
                f"gateway.routes.{index}.backends.0.model",
                f"tier {route.backends[0].tier} is sent {local_name!r}, as tier {other} is, so the fallback alert "
                "cannot tell them apart; give the local tier a distinct model name (llama.cpp answers any)",
            ))
            continue
        fallbacks = ", ".join(f"{b.tier} ({'local' if gateway.tiers[b.tier].local else 'remote'})" for b in route.backends[1:])
        found.append((route, local_name, fallbacks))
    if problems:
        raise ConfigError(problems)
    return found
