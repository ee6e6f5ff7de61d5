"""Models on demand behind the AI gateway and the scraper: every reference from a public model name to
the router resolves, names the router does not serve are refused, and each model is scraped on its own
without being loaded (the real router's answers to those scrapes: tests/test_router_library.py)."""

from __future__ import annotations

import copy

import pulumi
import pytest

from conftest import run_stack_file, stack_file_config

STACK = "rtx3090-library"
SECRETS = {"chat_api_key": "library-key-5e1d", "gateway_master_key": "master-0d9e", "openrouter_api_key": "or-key-2a44"}


def config() -> dict:
    return stack_file_config(STACK)


def gateway(c: dict) -> dict:
    return c["inference-plane:gateway"]


def objects(run, kind: str) -> list[dict]:
    return [r.inputs for r in run.find(kind)]


@pytest.fixture(scope="module")
def run():
    return run_stack_file(STACK, config(), SECRETS)


def preset_sections(run) -> list[str]:
    """The models the preset lists, read as the router reads it (incluster/preset.py, as the keeper does)."""
    from incluster import preset

    (config_map,) = [m for m in objects(run, "ConfigMap") if "models.ini" in m["data"]]
    parsed = preset.sections(config_map["data"]["models.ini"])
    return [name for name in parsed if name in preset.models(parsed)]  # in the preset's order


def test_each_model_is_routed_by_its_listed_name_to_the_router_then_to_openrouter(run):
    """Rule -> AIServiceBackend -> Backend -> Service -> the Deployment that runs the router: each public
    name reaches the router under a name its preset lists (any other answers 400, never retried), and
    OpenRouter under OpenRouter's name for the same model."""
    (route,) = objects(run, "AIGatewayRoute")
    ai = {b["metadata"]["name"]: b for b in objects(run, "AIServiceBackend")}
    backends = {b["metadata"]["name"]: b for b in objects(run, "Backend")}
    services = {s["metadata"]["name"]: s for s in objects(run, "Service")}
    (router,) = objects(run, "Deployment")
    sections = preset_sections(run)
    routed = {}
    for rule in route["spec"]["rules"]:
        public = rule["matches"][0]["headers"][0]["value"]
        local, remote = rule["backendRefs"]
        backend = backends[ai[local["name"]]["spec"]["backendRef"]["name"]]
        host = backend["spec"]["endpoints"][0]["fqdn"]
        service = services[host["hostname"].split(".")[0]]
        assert host["port"] == service["spec"]["ports"][0]["port"]
        assert service["spec"]["selector"].items() <= router["spec"]["template"]["metadata"]["labels"].items()
        routed[public] = local.get("modelNameOverride", public)
        assert (local["priority"], remote["priority"]) == (0, 1) and remote["name"] == "openrouter"
        assert remote["modelNameOverride"] != routed[public]  # the fallback alert tells them apart
    assert sorted(routed.values()) == sorted(sections) and set(routed) == set(routed.values())


def test_the_router_is_tried_once_then_openrouter(run):
    """One router replica: a request it fails (down, restarting, a 500 of a load racing an eviction)
    goes to OpenRouter on the retry; a 400 for a name it does not list is not retried."""
    (policy,) = objects(run, "BackendTrafficPolicy")
    retry = policy["spec"]["retry"]
    assert retry["numAttemptsPerPriority"] == 1 and retry["numRetries"] >= 1
    assert 500 in retry["retryOn"]["httpStatusCodes"] and 400 not in retry["retryOn"]["httpStatusCodes"]
    assert "loadBalancer" not in policy["spec"]  # no hash: the retry's priority step applies (envoy#9042)


def test_a_route_to_a_name_the_router_does_not_list_is_refused():
    c = config()
    gateway(c)["routes"].append({"model": "mistral-7b", "backends": [{"tier": "library"}]})
    with pytest.raises(pulumi.RunError, match=r"gateway.routes\[5\].backends\[0\].model: library serves on demand only "
                       r"qwen3-8b, llama-3.1-8b, gemma-3-12b, qwen3-14b, qwen3-30b-a3b, not 'mistral-7b'"):
        run_stack_file(STACK, c, SECRETS)
    # The same name given to the tier as one it lists is accepted.
    gateway(c)["routes"][-1]["backends"][0]["model"] = "qwen3-8b"
    run_stack_file(STACK, c, SECRETS)


def test_a_router_ahead_of_another_tier_in_catch_all_is_refused():
    c = config()
    gateway(c)["catch_all"] = ["library", "openrouter"]
    with pytest.raises(pulumi.RunError, match=r"gateway.catch_all\[0\]: library serves models on demand and answers 400 "
                       r"for any other name, which ends the request before openrouter is tried"):
        run_stack_file(STACK, c, SECRETS)
    gateway(c)["catch_all"] = ["openrouter", "library"]
    run_stack_file(STACK, c, SECRETS)


def monitored() -> dict:
    c = copy.deepcopy(config())
    c["inference-plane:cluster"]["monitoring"] = {"namespace": "monitoring"}
    c["inference-plane:observability"] = {}
    return c


def test_each_model_is_scraped_on_its_own_without_loading_it_and_labelled_with_its_name():
    run = run_stack_file(STACK, monitored(), SECRETS)
    (scrape,) = objects(run, "VMServiceScrape")
    proxy, *endpoints = scrape["spec"]["endpoints"]
    names = preset_sections(run)
    assert [e["params"]["model"] for e in endpoints] == [[n] for n in names]
    for endpoint, name in zip(endpoints, names):
        assert endpoint["params"]["autoload"] == ["false"] and endpoint["path"] == "/metrics"
        assert endpoint["relabelConfigs"] == [
            {"action": "drop", "sourceLabels": ["__meta_kubernetes_endpoint_ready"], "regex": "false"},
            {"action": "replace", "targetLabel": "model", "replacement": name}]
        assert endpoint["bearerTokenSecret"]["name"] == "llama-library-api-key"
    # The admission proxy's own /metrics (no ?model=): the one target that must answer.
    assert "params" not in proxy and proxy["path"] == "/metrics" and proxy["relabelConfigs"][-1] == {
        "action": "replace", "targetLabel": "scrape", "replacement": "admission"}
    (rules,) = objects(run, "VMRule")
    by_name = {r["alert"]: r for r in rules["spec"]["groups"][0]["rules"]}
    alerts = set(by_name)
    # A scrape of an unloaded model fails by design: "down" is the proxy's scrape alone.
    assert 'scrape="admission"' in by_name["LlamaLibraryDown"]["expr"] and "LlamaLibraryNotReady" in alerts
    assert {"LlamaLibraryPinnedNotResident", "LlamaLibraryLoadsFailing"} <= alerts
    # Queuing is per model: the series carry the model label the scrape adds.
    assert "LlamaLibraryQueuing" in alerts
