"""The rendered alerting rules, run in a real rules engine: Prometheus's `promtool test rules`
(Debian's prometheus package; the Makefile installs it). Series are named and labelled as the real
components export them: llama.cpp's `llamacpp:requests_deferred` (the contract tests read it off the
real server), kube-state-metrics' deployment, statefulset and container-restart series, vmagent's `up`
for each scraped (ready) endpoint, and Envoy AI Gateway's `gen_ai_server_request_duration_seconds`.

For every stack with observability and every model server: a planned cold start, as long as the plan
allows, fires nothing; a start that overruns its budget fires NotReady; a crash fires Restarting; a
ready pod that stops answering its scrape fires Down; a queue fires Queuing; traffic leaving the local
tier fires its fallback alert."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import STACKS

PROMTOOL = shutil.which("promtool")


# The shipped router stack has no monitoring (a single k3s box); its router's alerts are tested with the
# cluster's monitoring and observability turned on.
OBSERVED = "+observability"


def rendered(stack: str):
    from conftest import run_stack_file, stack_file_config
    from render.manifests import manifests
    from render.offline import run_stack

    if stack.endswith(OBSERVED):
        config = stack_file_config(stack.removesuffix(OBSERVED))
        config["inference-plane:cluster"]["monitoring"] = {"namespace": "monitoring"}
        config["inference-plane:observability"] = {}
        run = run_stack_file(stack.removesuffix(OBSERVED), config)
    else:
        run = run_stack(stack)
    files = manifests(run)
    rules = [m for m in files.values() if m["kind"] == "VMRule"]
    return run, rules, [m for m in files.values() if m["kind"] == "VMServiceScrape"]


def scrapes_not_ready(scrapes: list[dict], service: str) -> bool:
    """Whether the rendered scrape of this server reads a pod that is not ready (vmagent's endpoints role
    lists such addresses with __meta_kubernetes_endpoint_ready="false"; a drop rule on it skips them)."""
    (scrape,) = [s for s in scrapes if s["metadata"]["name"] == service]
    return not all(any(r.get("action") == "drop" and r.get("sourceLabels") == ["__meta_kubernetes_endpoint_ready"]
                       and r.get("regex") == "false" for r in e.get("relabelConfigs") or [])
                   for e in scrape["spec"]["endpoints"])


CASES = [stack for stack in STACKS if rendered(stack)[1]] + ["rtx3090-library" + OBSERVED]


def required_target_labels(scrapes: list[dict], service: str) -> dict[str, str]:
    """The labels vmagent gives the target that must answer (the rendered scrape's endpoint without
    params; a router's per-model targets carry params and may fail): its relabel replacements."""
    (scrape,) = [s for s in scrapes if s["metadata"]["name"] == service]
    plain = [e for e in scrape["spec"]["endpoints"] if not e.get("params")]
    if len(plain) != 1:
        return {}
    return {r["targetLabel"]: r["replacement"] for r in plain[0].get("relabelConfigs") or [] if r.get("action") == "replace"}


def minutes(duration: str) -> int:
    unit = duration[-1]
    return int(duration[:-1]) * {"m": 1, "h": 60, "s": 0}[unit] + (int(duration[:-1]) // 60 if unit == "s" else 0)


def series(name: str, labels: dict[str, str], values: str) -> dict:
    return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def run_promtool(tmp_path: Path, groups: list[dict], tests: list[dict]) -> None:
    assert PROMTOOL, "promtool is not installed: `make test` installs Debian's prometheus package (promtool)"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    done = subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("stack", CASES)
def test_the_rules_are_valid_for_the_real_engine(tmp_path, stack):
    _, rules, _ = rendered(stack)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}))
    assert PROMTOOL, "promtool is not installed: `make test` installs Debian's prometheus package (promtool)"
    done = subprocess.run([PROMTOOL, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("stack", CASES)
def test_each_alert_fires_for_its_failure_and_none_during_a_planned_cold_start(tmp_path, stack):
    run, (rule,), scrapes = rendered(stack)
    groups = rule["spec"]["groups"]
    by_name = {r["alert"]: r for g in groups for r in g["rules"]}
    namespace = rule["metadata"]["namespace"]
    plan = run.outputs["capacity_plan"]["servers"]
    tests: list[dict] = []
    checked: set[str] = set()

    def expect(alert: str, at: int, labels: dict[str, str]) -> dict:
        checked.add(alert)
        found = by_name[alert]
        # An annotation's template, as the engine expands it for these labels.
        annotations = {k: v.replace("{{ $labels.model }}", labels.get("model", "")) for k, v in found.get("annotations", {}).items()}
        return {"eval_time": f"{at}m", "alertname": alert, "exp_alerts": [
            {"exp_labels": {**found.get("labels", {}), **labels}, "exp_annotations": annotations}]}

    def quiet(alert: str, at: int) -> dict:
        return {"eval_time": f"{at}m", "alertname": alert, "exp_alerts": []}

    for key, model in run.config.models.items():
        prefix = "".join(part.capitalize() for part in model.name.split("-"))
        mine = {name for name in by_name if name.startswith(prefix) and name[len(prefix):] in
                ("Down", "Restarting", "NotReady", "Queuing", "PinnedNotResident", "LoadsFailing", "ModelLargerThanPlanned")}
        # The start-up window the plan allows, from the plan itself; NotReady waits at least that long.
        budget = -(-plan[key]["budget"]["startup_seconds"] // 60)
        wait = minutes(by_name[prefix + "NotReady"]["for"])
        assert wait >= budget, f"{prefix}NotReady fires after {wait} min, inside the planned start of {budget} min"
        kind = model.workload.kind
        unit = {"namespace": namespace, ("statefulset" if kind == "StatefulSet" else "deployment"): model.workload_name}
        ready_name, wanted_name = (("kube_statefulset_status_replicas_ready", "kube_statefulset_replicas") if kind == "StatefulSet"
                                   else ("kube_deployment_status_replicas_available", "kube_deployment_spec_replicas"))
        pod = {"namespace": namespace, "pod": f"{model.workload_name}-0", "container": model.name}
        scraped = {"namespace": namespace, "service": model.name, "pod": pod["pod"], "job": model.name}
        if any(sc["metadata"]["name"] == model.name for sc in scrapes):
            scraped.update(required_target_labels(scrapes, model.name))
        total = wait + 30
        # 1. A planned cold start that ends just inside the window: llama.cpp answers 503 on /metrics until
        # its model is loaded, so a scrape of the not-ready pod reads 0; the rendered scrape decides whether
        # there is one.
        start = wait - 2
        while_starting = f"0x{start}" if any(s["metadata"]["name"] == model.name for s in scrapes) and \
            scrapes_not_ready(scrapes, model.name) else f"_x{start}"
        cold = [series(wanted_name, unit, f"1x{total}"),
                series(ready_name, unit, f"0x{start} 1x{total - start}"),
                series("kube_pod_container_status_restarts_total", pod, f"0x{total}"),
                series("up", scraped, f"{while_starting} 1x{total - start}"),
                series("llamacpp:requests_deferred", scraped, f"_x{start} 0x{total - start}")]
        residency = plan[key].get("residency")
        pinned = [name for name, m in (residency or {}).get("models", {}).items() if m["pinned"]]
        for name in (residency or {}).get("models", {}):
            # The admission proxy's series (names as tests/test_admission.py reads them off the real proxy):
            # during the start the pinned model is loading, which counts as resident.
            cold += [series("inference_plane_router_model_pinned", {**scraped, "model": name}, f"{int(name in pinned)}x{total}"),
                     series("inference_plane_router_model_resident", {**scraped, "model": name},
                            f"_x{start} {int(name in pinned)}x{total - start}"),
                     series("inference_plane_router_failed_loads_total", {**scraped, "model": name}, f"_x{start} 0x{total - start}")]
        tests.append({"interval": "1m", "input_series": cold, "alert_rule_test": [
            quiet(alert, at) for alert in sorted(mine) for at in (5, start - 1, start + 10)]})
        # 2. A start that never ends: NotReady once the window has passed, and not before.
        stuck = [series(wanted_name, unit, f"1x{total}"), series(ready_name, unit, f"0x{total}")]
        tests.append({"interval": "1m", "input_series": stuck, "alert_rule_test": [
            quiet(prefix + "NotReady", wait - 1), expect(prefix + "NotReady", wait + 2, unit)]})
        # 3. A crash: the container restarts.
        crash = [series("kube_pod_container_status_restarts_total", pod, "0x10 1x20")]
        tests.append({"interval": "1m", "input_series": crash, "alert_rule_test": [
            quiet(prefix + "Restarting", 9), expect(prefix + "Restarting", 12, pod)]})
        if prefix + "Down" in by_name:
            # 4. A ready pod that stops answering its scrape.
            down_for = minutes(by_name[prefix + "Down"]["for"])
            hung = [series("up", scraped, f"1x10 0x{down_for + 10}")]
            tests.append({"interval": "1m", "input_series": hung, "alert_rule_test": [
                quiet(prefix + "Down", 10 + down_for - 1), expect(prefix + "Down", 10 + down_for + 2, scraped)]})
        if prefix + "PinnedNotResident" in by_name:
            # 6. The pinned model lost and not loaded again; a failing load, twice within the window.
            grace = minutes(by_name[prefix + "PinnedNotResident"]["for"])
            first = {**scraped, "model": pinned[0]}
            lost = [series("inference_plane_router_model_pinned", first, f"1x{grace + 30}"),
                    series("inference_plane_router_model_resident", first, f"1x10 0x{grace + 20}")]
            other = {**scraped, "model": next(n for n in residency["models"] if n not in pinned)}
            failing = [series("inference_plane_router_failed_loads_total", other, "0x10 1x10 2x20")]
            tests.append({"interval": "1m", "input_series": lost + failing, "alert_rule_test": [
                quiet(prefix + "PinnedNotResident", 10 + grace - 1),
                expect(prefix + "PinnedNotResident", 10 + grace + 2, first),
                quiet(prefix + "LoadsFailing", 15), expect(prefix + "LoadsFailing", 22, other)]})
            # 7. A model the downloader refuses for files larger than planned (the proxy's series, as
            # tests/test_incluster_proxy.py reads it off the real proxy); a model still fetching is no alert.
            large = {**other, "reason": "larger_than_planned"}
            fetching = {**scraped, "model": pinned[0], "reason": "unreachable"}
            tests.append({"interval": "1m", "input_series": [
                series("inference_plane_router_model_unserved", large, "_x10 1x10"),
                series("inference_plane_router_model_unserved", fetching, "1x20")], "alert_rule_test": [
                quiet(prefix + "ModelLargerThanPlanned", 5), expect(prefix + "ModelLargerThanPlanned", 12, large)]})
        if prefix + "Queuing" in by_name:
            queue_for = minutes(by_name[prefix + "Queuing"]["for"])
            queued = [series("llamacpp:requests_deferred", scraped, f"0x5 2x{queue_for + 10}")]
            tests.append({"interval": "1m", "input_series": queued, "alert_rule_test": [
                quiet(prefix + "Queuing", 5 + queue_for - 1), expect(prefix + "Queuing", 5 + queue_for + 2, scraped)]})
    for alert, found in by_name.items():
        if not alert.endswith("Active"):
            continue
        # 5. Traffic for a route's model answered by another model than its local one: the fallback.
        original = found["labels"]["model"]
        local = found["expr"].split('gen_ai_request_model!="', 1)[1].split('"', 1)[0]
        fallback_for = minutes(found["for"])
        labels = {"gen_ai_original_model": original, "gen_ai_request_model": "remote/" + original}
        served = {"gen_ai_original_model": original, "gen_ai_request_model": local}
        tests.append({"interval": "1m", "input_series": [
            series("gen_ai_server_request_duration_seconds_count", served, f"0+5x{fallback_for + 40}"),
            series("gen_ai_server_request_duration_seconds_count", labels, f"0x10 0+3x{fallback_for + 30}")],
            "alert_rule_test": [quiet(alert, 10), expect(alert, 10 + fallback_for + 12, {})]})
    run_promtool(tmp_path, groups, tests)
    assert checked == set(by_name), f"alerts no scenario fires: {sorted(set(by_name) - checked)}"
