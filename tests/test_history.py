"""Day-2 edits against the stack's last update (config/history.py): the program reads its own
`history` output back and, on every shipped stack, renaming a key or a server, moving a server
between pools and resizing a cache end in a safe outcome or a one-line refusal naming the way out.

Each edit runs twice through the program under the mock engine, as two `pulumi up`s would: the
first run's `history` output is what the engine answers the second run's readStackOutputs with.
What the update then does is read by the change preview (changes/, the provider's rules)."""

from __future__ import annotations

import copy
import re
from typing import Callable

import pulumi
import pytest

from changes import preview
from changes.provider import options_from_config
from conftest import STACKS
from render.offline import config_from_mapping, run_program
from conftest import stack_file_config

PREFIX = "inference-plane:"


def secrets_of(config: dict) -> dict[str, str]:
    return {k: f"{k}-value" for k, v in config.items() if isinstance(v, dict) and "secure" in v}


def run(stack: str, mapping: dict, previous=None):
    values, secret_keys = config_from_mapping(mapping)
    values.update(secrets_of(mapping))
    return run_program(values, secret_keys, stack=stack, previous=previous)


def two_updates(stack: str, change: Callable[[dict], None], with_history: bool = True):
    """(first run, second run, report of what the second `pulumi up` does)."""
    before_config = stack_file_config(stack)
    after_config = copy.deepcopy(before_config)
    change(after_config)
    before = run(stack, before_config)
    after = run(stack, after_config, previous=before.outputs["history"] if with_history else None)
    return before, after, preview(before, after, options_from_config(after_config))


def models(config: dict) -> dict:
    return config[PREFIX + "models"]


def rename_key(config: dict, old: str, new: str) -> None:
    """A models key renamed everywhere the config names it (the gateway's tiers and direct path)."""
    servers = models(config)
    config[PREFIX + "models"] = {(new if k == old else k): v for k, v in servers.items()}
    gateway = config.get(PREFIX + "gateway")
    if gateway:
        for tier in gateway.get("tiers", {}).values():
            if tier.get("local") == old:
                tier["local"] = new
        direct = gateway.get("llamacpp_embeddings")
        if direct and direct.get("model") == old:
            direct["model"] = new


def refused(stack: str, change: Callable[[dict], None]) -> str:
    before_config = stack_file_config(stack)
    after_config = copy.deepcopy(before_config)
    change(after_config)
    history = run(stack, before_config).outputs["history"]
    with pytest.raises(pulumi.RunError) as error:
        run(stack, after_config, previous=history)
    message = str(error.value)
    assert "\n" not in message.strip()
    assert message.startswith(f"Pulumi.{stack}.yaml: invalid stack config: ")
    return message


def untouched(report) -> None:
    """Nothing created, replaced or deleted: every object is found where it was."""
    assert [(e.kind, e.after.name if e.after else e.before.name, e.op) for e in report.changed()
            if e.op not in ("update",)] == []
    assert report.errors == []


@pytest.mark.parametrize("stack", STACKS)
def test_renaming_a_models_key_keeps_every_object(stack):
    key = next(iter(models(stack_file_config(stack))))
    before, after, report = two_updates(stack, lambda c: rename_key(c, key, f"{key}-renamed"))
    untouched(report)
    assert report.of_kind("already-exists") == [] and report.of_kind("gpu-pending") == []
    (component,) = [r for r in after.resources if r.name == f"{key}-renamed" and not r.custom]
    assert {"name": key} in component.aliases
    assert after.outputs["history"]["servers"][f"{key}-renamed"] == before.outputs["history"]["servers"][key]


def test_without_history_a_renamed_key_collides_as_before():
    """The old shape, kept as the failing example: with no record of the last update (a stack
    brought up by an older release), the renamed key's objects are created under names still taken."""
    _, _, report = two_updates("rtx4090", lambda c: rename_key(c, "chat", "assistant"), with_history=False)
    assert report.of_kind("already-exists")


def test_renaming_a_statefulset_server_is_refused_with_the_line_that_keeps_its_weights():
    message = refused("strix-halo", lambda c: models(c)["flash"].update(name="flash-engine"))
    assert message.endswith(
        "models.flash.name: renaming halogen-flash to flash-engine renames StatefulSet halogen-flash and its claims, so "
        "2 replicas fetch their weights again with every replica down; to keep the weights add "
        "models.flash.workload.name: halogen-flash (the Service and pods take the new name), or set "
        "models.flash.workload.name: flash-engine to rename and download again")


def test_the_way_out_keeps_the_claims():
    def rename_keeping(c):
        models(c)["flash"].update(name="flash-engine")
        models(c)["flash"]["workload"]["name"] = "halogen-flash"
    _, after, report = two_updates("strix-halo", rename_keeping)
    assert report.errors == [] and report.of_kind("redownload") == []
    (sts,) = after.find("StatefulSet")
    assert sts.inputs["metadata"]["name"] == "halogen-flash"


def test_renaming_a_deployment_server_restarts_it_in_place():
    _, _, report = two_updates("rtx4090", lambda c: models(c)["chat"].update(name="qwen-chat"))
    assert report.errors == [] and report.of_kind("gpu-pending") == [] and report.of_kind("already-exists") == []
    assert report.entry("Deployment", "qwen-chat").action.create_first is False


def with_second_pool(config: dict, key: str) -> None:
    """A second pool like the server's, and every server of that pool moved to it (servers that
    share a ReadWriteOnce claim must share a node: the capacity plan refuses splitting them)."""
    pools = config[PREFIX + "node_pools"]
    name = models(config)[key]["node_pool"]
    pools[f"{name}-b"] = copy.deepcopy(pools[name])
    for server in models(config).values():
        if server["node_pool"] == name:
            server["node_pool"] = f"{name}-b"


@pytest.mark.parametrize("stack, key, pinned", [
    ("strix-halo", "flash", "its per-replica claims of StatefulSet halogen-flash are pinned to ms-s1's nodes "
     "(local-path volumes"),
    ("rtx4090", "chat", "the shared claim llama-models is pinned to rtx4090's nodes (local-path volumes"),
])
def test_moving_a_server_off_its_node_local_claims_is_refused(stack, key, pinned):
    message = refused(stack, lambda c: with_second_pool(c, key))
    assert f"models.{key}.node_pool: moving " in message and pinned in message
    assert "its pods would stay Pending and every pulumi up fail at its timeout; keep node_pool:" in message


def test_moving_a_server_on_shared_network_storage_is_allowed():
    # homelab's cache is CephFS (ReadWriteMany): any node mounts it.
    _, after, report = two_updates("homelab", lambda c: with_second_pool(c, "chat"))
    assert report.errors == []
    assert after.outputs["history"]["servers"]["chat"]["node_pool"] == "iris-xe-b"


@pytest.mark.parametrize("stack", [s for s in STACKS if stack_file_config(s)[PREFIX + "model_cache"]["storage_class"] == "local-path"])
def test_growing_a_local_path_cache_is_refused(stack):
    def grow(c):
        c[PREFIX + "model_cache"]["size"] = "400Gi"
    message = refused(stack, grow)
    old = stack_file_config(stack)[PREFIX + "model_cache"]["size"]
    assert message.endswith(
        f"model_cache.size: {old} -> 400Gi: local-path volumes cannot grow (their StorageClass has no volume "
        f"expansion), so the resize is refused and every later pulumi up fails; keep size: {old}, or give "
        "model_cache.claim_name a new name for a new claim of 400Gi (its weights are fetched again)")


def test_a_new_claim_name_is_the_way_out():
    def grow_new(c):
        c[PREFIX + "model_cache"].update(size="400Gi", claim_name="llama-models-400")
    _, after, report = two_updates("rtx4090", grow_new)
    assert report.errors == []
    claims = {c.inputs["metadata"]["name"]: c.inputs for c in after.find("PersistentVolumeClaim")}
    assert claims["llama-models-400"]["spec"]["resources"]["requests"]["storage"] == "400Gi"


def test_growing_an_expandable_cache_goes_through_and_shrinking_any_is_refused():
    _, _, report = two_updates("homelab", lambda c: c[PREFIX + "model_cache"].update(size="500Gi"))
    assert report.errors == []
    message = refused("homelab", lambda c: c[PREFIX + "model_cache"].update(size="30Gi"))
    assert "the API server refuses to shrink a claim" in message


def test_edits_the_cluster_would_ignore_are_warned_by_the_program():
    def edit(c):
        models(c)["flash"]["workload"]["cache_volume"]["size"] = "300Gi"
        c[PREFIX + "model_cache"]["storage_class"] = "longhorn"
    _, after, _ = two_updates("strix-halo", edit)
    volume = [line for line in after.logs if line.startswith("models.flash.workload.cache_volume")]
    assert volume == [
        "models.flash.workload.cache_volume: size 256Gi -> 300Gi is not applied: a StatefulSet's claim template "
        "cannot change, so the program leaves it and halogen-flash's claims keep local-path 256Gi; to apply it, "
        "give the StatefulSet new claims (set models.flash.workload.name to a new name: weights are fetched again), "
        "or resize each claim by hand where its class allows expansion"]
    assert any(re.match(r"model_cache.storage_class local-path -> longhorn is not applied: a claim's class cannot "
                        r"change, so the program leaves claim llama-cpp-models on local-path", line) for line in after.logs)


def test_no_history_no_comparison():
    """Offline and on a first update nothing is compared: the same edit renders."""
    config = stack_file_config("strix-halo")
    models(config)["flash"].update(name="flash-engine")
    run("strix-halo", config)  # does not raise


def test_the_history_output_is_plain_and_carries_no_secret():
    first = run("rtx4090", stack_file_config("rtx4090"))
    assert "history" not in first.secret_outputs
    text = repr(first.outputs["history"])
    for value in secrets_of(stack_file_config("rtx4090")).values():
        assert value not in text
    assert first.outputs["history"]["model_cache"] == {"claim_name": "llama-models", "storage_class": "local-path",
                                                        "size": "40Gi"}


def test_a_setting_left_out_whose_default_moved_is_warned_with_what_the_last_update_ran(
):
    """The defaults became k3s'. The history records what each moved default resolved to; an update
    that leaves one out and would now get something else is told what the last update ran and the
    line that keeps it. A history from an older release records nothing: each setting left out is
    named with its former default."""
    config = stack_file_config("homelab")  # Cilium, Traefik in `ingress`, monitoring, rook-ceph, RWX: all set
    first = run("homelab", config)
    assert first.outputs["history"]["settings"] == {
        "cluster.cni": "cilium", "cluster.ingress.namespace": "ingress", "cluster.monitoring": "monitoring",
        "cluster.storage": "rook-ceph", "model_cache.access_mode": "ReadWriteMany"}
    left_out = copy.deepcopy(config)
    for key in ("cni", "monitoring"):
        left_out[PREFIX + "cluster"].pop(key)
    again = run("homelab", left_out, previous=first.outputs["history"])
    warned = [line for line in again.logs if "the last update ran with" in line]
    assert warned == [
        "cluster.cni is not set, so it is now the k3s default (networkpolicy); the last update ran with cilium; to keep "
        "that, set it (cni: cilium), else this update changes it",
        "cluster.monitoring is not set, so it is now the k3s default (none); the last update ran with monitoring; to "
        "keep that, set it (monitoring: {namespace: monitoring}), else this update changes it",
    ]
    # A default that did not move for this stack (rtx3060 ran networkpolicy already): nothing to say.
    rtx = stack_file_config("rtx3060")
    rtx_first = run("rtx3060", rtx)
    rtx_left = copy.deepcopy(rtx)
    rtx_left[PREFIX + "cluster"].pop("cni")
    assert not [l for l in run("rtx3060", rtx_left, previous=rtx_first.outputs["history"]).logs if "default" in l]
    # An older release's history: the former default is named, conditionally.
    old = {k: v for k, v in rtx_first.outputs["history"].items() if k != "settings"}
    (line,) = [l for l in run("rtx3060", rtx_left, previous=old).logs if "releases before the k3s defaults" in l]
    assert line == ("cluster.cni is not set: releases before the k3s defaults made that cilium (CiliumNetworkPolicy, the "
                    "model hub reached by name only); it is now networkpolicy; if the last update left it out too, set it "
                    "to keep what runs (cni: cilium)")


# --- a server leaving a router's card (issue #48 item 4, moving back) ------------------------------------------

def router_budget(run_) -> float:
    import json

    (files,) = [r.inputs for r in run_.find("ConfigMap") if r.inputs["metadata"]["name"] == "llama-library-files"]
    return json.loads(files["data"]["admission.json"])["vram_budget_gib"]


def test_a_server_leaving_a_routers_card_keeps_its_vram_until_the_next_update():
    """qwen14 (a server of its own on the router's time-sliced card) removed: its pods hold the card until the
    update deletes them, at its end, while the router's proxy would read a budget grown by qwen14's 8.99 GiB
    within a minute or two. With the last update's history the program keeps the router's budget for this
    update (and says so), and the next pulumi up grows it. Offline, with no history, it grows at once."""
    from conftest import router_move_configs

    _, with_server, _ = router_move_configs()
    without = copy.deepcopy(with_server)  # qwen14 removed, the library as it is (without qwen3-14b)
    without[PREFIX + "models"].pop("qwen14")
    gateway = without[PREFIX + "gateway"]
    gateway["tiers"].pop("qwen14")
    gateway["routes"] = [r for r in gateway["routes"] if r["model"] != "qwen3-14b"]
    first = run("rtx3090-library", with_server)
    held = router_budget(first)
    second = run("rtx3090-library", without, previous=first.outputs["history"])
    assert router_budget(second) == held
    (line,) = [l for l in second.logs if "stays" in l and "VRAM budget" in l]
    assert f"its VRAM budget stays {held:g} GiB in this update: qwen14 (" in line and "the next pulumi up" in line
    third = run("rtx3090-library", without, previous=second.outputs["history"])
    assert router_budget(third) > held + 8
    assert router_budget(run("rtx3090-library", without)) == router_budget(third)  # no history: at once


def test_moving_a_model_back_into_the_library_in_one_update_is_refused_with_the_way_out():
    """The move back in one step would give the router qwen14's memory while qwen14's pods still hold it: with the
    history, the model does not fit the budget kept for this update, and the refusal names why and the order."""
    from conftest import router_move_configs

    base, with_server, _ = router_move_configs()
    first = run("rtx3090-library", with_server)
    with pytest.raises(pulumi.RunError) as refused:
        run("rtx3090-library", base, previous=first.outputs["history"])
    message = str(refused.value)
    assert "models.library.on_demand.models.qwen3-14b: can never be loaded" in message
    assert "qwen14 (removed in this update: its pods hold the card until the update deletes them; run pulumi up " \
           "again after it to give the router their memory)" in message


def test_a_history_without_vram_warns_that_the_leaving_servers_memory_is_not_kept():
    """An older release's history does not say what a server held: the router's budget cannot be kept for it, and
    the program says so instead of keeping silent (found by a review)."""
    from conftest import router_move_configs

    _, with_server, _ = router_move_configs()
    first = run("rtx3090-library", with_server)
    old = copy.deepcopy(first.outputs["history"])
    for server in old["servers"].values():
        server.pop("vram_gib", None)
        server.pop("router", None)
    without = copy.deepcopy(with_server)
    without[PREFIX + "models"].pop("qwen14")
    gateway = without[PREFIX + "gateway"]
    gateway["tiers"].pop("qwen14")
    gateway["routes"] = [r for r in gateway["routes"] if r["model"] != "qwen3-14b"]
    second = run("rtx3090-library", without, previous=old)
    (line,) = [l for l in second.logs if "does not say how much VRAM" in l]
    assert line.startswith("models.qwen14: qwen14 leaves node pool rtx3090 in this update, beside a router")
