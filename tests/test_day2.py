"""Day-2 edits, run through the change preview (changes/, the provider's rules): each routine
edit of a running stack does what an operator expects. Every assertion here failed on the
program before the fixes (rename collided and waited for the GPU, a namespace move lost the
retained caches, a claim class change wedged the stack, a rotated key left a Secret gap)."""

from __future__ import annotations

import copy
from typing import Callable

import pytest

from changes import preview
from changes.provider import options_from_config
from common.errors import ConfigError
from conftest import router_move_configs, run_stack_file, stack_file_config


def edit(stack: str, change: Callable[[dict], None], secrets_after: dict[str, str] | None = None):
    """The report for one edit of a shipped stack, with the provider options its file sets."""
    before = stack_file_config(stack)
    after = copy.deepcopy(before)
    change(after)
    secrets = {k.split(":", 1)[1]: f"{k}-value" for k, v in before.items() if isinstance(v, dict) and "secure" in v}
    return preview(run_stack_file(stack, before, secrets),
                   run_stack_file(stack, after, {**secrets, **(secrets_after or {})}),
                   options_from_config(after))


def models(config: dict) -> dict:
    return config["inference-plane:models"]


def no_collision_or_wait(report) -> None:
    assert report.of_kind("already-exists") == []
    assert report.of_kind("gpu-pending") == []
    assert report.of_kind("claim-lost") == [] and report.of_kind("deleted-with-namespace") == []
    assert report.errors == []


def test_renaming_the_homelab_chat_server_restarts_it_on_its_cached_weights():
    report = edit("homelab", lambda c: models(c)["chat"].update(name="chat-server"))
    no_collision_or_wait(report)
    deployment = report.entry("Deployment", "chat-server")
    # Delete-first: the new pod does not wait for the GPU share the old one holds.
    assert deployment.op == "replace" and deployment.action.create_first is False
    # The component is named by its config key, so its Secret (a fixed name) is updated, not re-created.
    assert report.entry("Secret", "llama-server-api-key").op == "update"
    assert report.of_kind("redownload") == []
    (down,) = report.of_kind("downtime")
    assert "load 102 s" in down.message and "download" not in down.message


def test_renaming_the_strix_engine_keeps_its_old_weights_and_says_what_it_costs():
    """Kubernetes names a StatefulSet's claims after it: a renamed engine gets new claims. The
    preview says so before `pulumi up` (size and time), nothing collides or waits, and the old
    claims are retained, not lost (docs/day-2.md: keep `name` to keep the weights)."""
    report = edit("strix-halo", lambda c: models(c)["flash"].update(name="flash-engine"))
    no_collision_or_wait(report)
    assert report.entry("StatefulSet", "flash-engine").action.create_first is False
    orphaned = {c.subject.split(": ")[0].rsplit("/", 1)[1] for c in report.of_kind("claim-orphaned")}
    assert orphaned == {"weights-halogen-flash-0", "weights-halogen-flash-1"}
    (again,) = report.of_kind("redownload")
    assert "231 GiB" in again.message
    # ...and names the one line that avoids it.
    assert again.message.endswith("set models.flash.workload.name: halogen-flash")


def test_renaming_the_strix_engine_with_its_workload_name_kept_downloads_nothing():
    """The preview's advice taken: the server (its Service, the gateway's backend) gets the new
    name, the StatefulSet keeps the old one and with it the claims weights-halogen-flash-<n>."""
    def rename(c):
        models(c)["flash"].update(name="flash-engine")
        models(c)["flash"]["workload"]["name"] = "halogen-flash"

    report = edit("strix-halo", rename)
    no_collision_or_wait(report)
    assert report.of_kind("redownload") == [] and report.of_kind("claim-orphaned") == []
    assert report.of_kind("change-ignored") == []  # the claim template's labels follow workload.name too
    engine = report.entry("StatefulSet", "halogen-flash")
    # Its selector and serviceName follow the server's name (both immutable): replaced delete-first
    # under the same name, so the new pods mount the same claims.
    assert engine.op == "replace" and engine.action.create_first is False
    assert engine.new.inputs["spec"]["serviceName"] == "flash-engine"
    assert report.entry("Service", "flash-engine").op in ("create", "replace")
    (down,) = report.of_kind("downtime")
    assert "load 119 s" in down.message and "download" not in down.message


@pytest.mark.parametrize("stack", ["homelab", "strix-halo"])
def test_moving_to_another_namespace_loses_no_cache(stack):
    report = edit(stack, lambda c: c["inference-plane:namespace"].update(name="inference"))
    no_collision_or_wait(report)
    namespace = [e for e in report.find("Namespace") if e.op != "same"]
    assert namespace and all(e.action.retained for e in namespace)
    # Every old claim stays behind, retained with its namespace: orphaned (reported), never deleted.
    assert report.of_kind("claim-orphaned")
    for workload in report.find("Deployment") + report.find("StatefulSet"):
        assert workload.action.create_first is False


def test_changing_the_cache_storage_class_does_not_wedge_the_stack():
    report = edit("homelab", lambda c: c["inference-plane:model_cache"].update(storage_class="nfs-client"))
    no_collision_or_wait(report)
    assert report.entry("PersistentVolumeClaim", "llama-server-models").op == "same"
    (ignored,) = report.of_kind("change-ignored")
    assert "spec.storageClassName" in ignored.message


def test_resizing_the_engines_claim_template_does_not_replace_the_statefulset():
    report = edit("strix-halo", lambda c: models(c)["flash"]["workload"]["cache_volume"].update(size="300Gi"))
    no_collision_or_wait(report)
    assert report.entry("StatefulSet", "halogen-flash").op == "same"
    assert report.of_kind("restart") == [] and report.of_kind("downtime") == []
    assert any("volumeClaimTemplates" in c.message for c in report.of_kind("change-ignored"))


def test_rotating_the_homelab_key_updates_the_secret_and_restarts_the_server():
    report = edit("homelab", lambda c: None, secrets_after={"llama_api_key": "rotated-key"})
    no_collision_or_wait(report)
    assert report.entry("Secret", "llama-server-api-key").op == "update"
    assert report.of_kind("secret-gap") == []
    # llama.cpp reads --api-key-file once: the pod template's fingerprint restarts it.
    (restart,) = report.of_kind("restart")
    assert restart.subject.endswith("llama-server")
    # Replaced outright, the old key stops working at the restart: said, with the two-key steps.
    (replaced,) = report.of_kind("old-key-refused")
    assert replaced.subject.endswith("llama-server-api-key") and "401" in replaced.message
    assert "two lines" in replaced.message


def test_the_first_step_of_a_two_key_rotation_is_not_a_replacement():
    old = "inference-plane:llama_api_key-value"
    report = edit("homelab", lambda c: None, secrets_after={"llama_api_key": f"{old}\nnew-key-2"})
    assert report.entry("Secret", "llama-server-api-key").op == "update"
    assert report.of_kind("old-key-refused") == []


def test_rotating_the_strix_keys_leaves_no_secret_missing():
    report = edit("strix-halo", lambda c: None,
                  secrets_after={"llamacpp_api_key": "rotated-llama", "gateway_master_key": "rotated-master"})
    no_collision_or_wait(report)
    changed = [e for e in report.find("Secret") if e.op != "same"]
    assert {e.after.name for e in changed} >= {"llama-cpp-api-key", "inference-api-keys", "llama-cpp-provider-key"}
    assert all(e.op == "update" for e in changed)
    assert report.of_kind("secret-gap") == [] and report.of_kind("stale-secret") == []
    assert [c.subject.rsplit("/", 1)[1] for c in report.of_kind("restart")] == ["llama-cpp"]


def test_growing_the_ingress_timeout_is_an_update_in_place():
    def longer(c):
        models(c)["chat"]["exposure"]["timeout_seconds"] = 7200

    report = edit("homelab", longer)
    assert report.changed() == [] or all(e.op == "update" for e in report.changed())


def test_removing_the_gateway_section_says_which_secrets_to_remove():
    from conftest import run_values, strix_values, STRIX_SECRETS

    values = strix_values()
    del values["gateway"]
    with pytest.raises(Exception) as caught:
        run_values(values, secrets=STRIX_SECRETS, stack="strix-halo")
    message = str(caught.value)
    assert "gateway_master_key: a secret no setting names any more; remove it: pulumi config rm gateway_master_key" in message
    assert "\n" not in message.strip()


def test_numbers_that_pulumi_config_set_path_writes_are_accepted():
    """`pulumi config set --path models.chat.resources.cpu_limit 6` stores the number 6."""
    from plane import parse_stack
    from conftest import homelab_plain_values

    values = homelab_plain_values()
    values["models"]["chat"]["resources"]["cpu_limit"] = 6
    values["model_cache"]["size"] = 40 * 2**30
    with pytest.raises(ConfigError, match=r"model_cache\.size: .*binary suffix"):
        parse_stack(values)
    values["model_cache"]["size"] = "40Gi"
    assert parse_stack(values).models["chat"].resources.cpu_limit == "6"
    # Anything but a whole number or true/false it stores as a string: "12.5" is still 12.5.
    values["startup"] = {"download_mib_per_s": "12.5"}
    values["node_pools"]["iris-xe"]["memory_bandwidth_gbs"] = "53.9"
    parsed = parse_stack(values)
    assert parsed.startup.download_mib_per_s == 12.5 and parsed.node_pools["iris-xe"].memory_bandwidth_gbs == 53.9
    values["startup"] = {"download_mib_per_s": "12.5 MiB/s"}
    with pytest.raises(ConfigError, match=r"startup\.download_mib_per_s: Input should be a valid number"):
        parse_stack(values)


def test_a_renamed_engines_downtime_counts_both_replicas_downloading_over_one_uplink():
    report = edit("strix-halo", lambda c: models(c)["flash"].update(name="flash-engine"))
    (down,) = report.of_kind("downtime")
    # 115.5 GiB at 50 MiB/s is 2366 s per claim; two claims fill at once over the same uplink.
    assert "download 2366 s x 2 claims over one uplink + load 119 s" in down.message
    assert "about 81 min" in down.message


def startup(config: dict) -> dict:
    return config.setdefault("inference-plane:startup", {})


@pytest.mark.parametrize("stack, change", [
    # A faster uplink or disk than the defaults, a shorter minimum, a longer image pull: each is
    # an estimate (Pulumi's wait, the progress deadline, the alert), none is part of a pod.
    ("homelab", {"download_mib_per_s": 40}),
    ("homelab", {"load_mib_per_s": 900, "min_seconds": 120}),
    ("homelab", {"image_pull_seconds": 1200}),
    ("strix-halo", {"download_mib_per_s": 9}),
    ("strix-halo", {"load_mib_per_s": 400, "min_seconds": 300}),
    ("rtx4090", {"download_mib_per_s": 20, "load_mib_per_s": 3000}),
    ("cpu-cluster", {"download_mib_per_s": 12}),
])
def test_tuning_a_startup_estimate_restarts_no_server(stack, change):
    report = edit(stack, lambda c: startup(c).update(change))
    no_collision_or_wait(report)
    assert report.of_kind("restart") == [] and report.of_kind("downtime") == []
    assert report.of_kind("redownload") == []
    for workload in report.find("Deployment") + report.find("StatefulSet"):
        assert workload.op in ("same", "update")
        if workload.op == "update":
            before, after = workload.old.inputs["spec"]["template"], workload.new.inputs["spec"]["template"]
            assert before == after


def test_an_estimate_slower_than_the_defaults_lengthens_the_probe_and_says_it_restarts():
    """The one startup edit that must reach the pods: the probe would otherwise kill a start that
    the new estimate expects to take longer."""
    report = edit("homelab", lambda c: startup(c).update(download_mib_per_s=4))
    restarted = {c.subject.rsplit("/", 1)[1] for c in report.of_kind("restart")}
    # The chat model's 19.8 GiB at 4 MiB/s outlasts the default window; the embeddings model's
    # 0.6 GiB still fits the 600 s minimum, so that server is left alone.
    assert restarted == {"llama-server"}
    chat = report.entry("Deployment", "llama-server")
    probe = chat.new.inputs["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * (probe["failureThreshold"] - 1) >= 19.8 * 1024 / 4


def test_giving_a_statefulset_claims_of_its_own_replaces_it_with_them():
    """Adding cache_volume to a StatefulSet that used the shared cache: the claim template is
    added (a path the old object lacks, which ignoreChanges cannot hold back), so the StatefulSet
    is replaced with it; ignoring the whole list used to drop it and leave pods that mount a
    volume nothing defines (stuck until Pulumi's timeout)."""
    before = stack_file_config("strix-halo")
    del models(before)["flash"]["workload"]["cache_volume"], models(before)["flash"]["prefetch"]
    # On the shared cache, both replicas need one both nodes can mount, large enough for the weights.
    before["inference-plane:model_cache"].update(storage_class="ceph-filesystem", access_mode="ReadWriteMany", size="128Gi")
    after = copy.deepcopy(before)
    models(after)["flash"]["workload"]["cache_volume"] = {"storage_class": "local-path", "size": "256Gi"}
    models(after)["flash"]["prefetch"] = {"repo": "peonist/qwen38-flash-next-w4b"}
    secrets = {k.split(":", 1)[1]: f"{k}-value" for k, v in before.items() if isinstance(v, dict) and "secure" in v}
    report = preview(run_stack_file("strix-halo", before, secrets), run_stack_file("strix-halo", after, secrets),
                     options_from_config(after))
    no_collision_or_wait(report)
    assert report.of_kind("pods-cannot-start") == []
    engine = report.entry("StatefulSet", "halogen-flash")
    assert engine.op == "replace" and engine.action.create_first is False
    assert engine.applied.inputs["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "weights"
    (fills,) = report.of_kind("redownload")
    assert fills.message.startswith("downloads 231 GiB")


def test_a_quant_swap_on_the_full_homelab_cache_is_refused_before_it_starts():
    """Another quant is another file: the server downloads it beside the old one (nothing
    prunes the cache), and 19.8 + 0.6 + 28.5 GiB do not fit the 40 GiB claim."""
    def swap(c):
        chat = models(c)["chat"]
        chat["hf_repo"] = chat["hf_repo"].replace(":Q4_K_M", ":Q6_K")
        chat["weights"] = "28.5Gi"
        chat["resources"].update(memory_request="44Gi", memory_limit="48Gi")

    report = edit("homelab", swap)
    (download,) = report.of_kind("redownload")
    assert download.message.startswith("downloads 28.5 GiB") and ":Q6_K" in download.message
    (space,) = report.of_kind("cache-space")
    assert space.severity == "error" and "(40 GiB) must hold 48.9 GiB" in space.message
    (down,) = report.of_kind("downtime")
    assert "download 3434 s + load 146 s" in down.message  # 28.5 GiB at 8.5 MiB/s, not just the load


def test_a_new_prefetch_commit_downloads_on_each_replica_in_turn():
    before = stack_file_config("strix-halo")
    models(before)["flash"]["prefetch"]["revision"] = "a" * 40
    after = copy.deepcopy(before)
    models(after)["flash"]["prefetch"]["revision"] = "b" * 40
    secrets = {k.split(":", 1)[1]: f"{k}-value" for k, v in before.items() if isinstance(v, dict) and "secure" in v}
    report = preview(run_stack_file("strix-halo", before, secrets), run_stack_file("strix-halo", after, secrets),
                     options_from_config(after))
    (download,) = report.of_kind("redownload")
    assert download.message.startswith("downloads 231 GiB") and "@" + "b" * 40 in download.message
    assert report.of_kind("cache-space") == []  # 2 x 115.5 GiB fit each 256 GiB claim
    (out,) = report.of_kind("reduced-capacity")
    assert "download 2366 s + load 119 s" in out.message


def test_pinning_a_branch_to_a_commit_may_download_nothing():
    """main -> its commit is what the warning recommends: offline nobody knows whether main still
    points there, so the preview says "up to", counts no download and refuses no cache space."""
    report = edit("strix-halo", lambda c: models(c)["flash"]["prefetch"].update(revision="a" * 40))
    (download,) = report.of_kind("redownload")
    assert download.message.startswith("downloads up to 231 GiB") and "nothing if that commit" in download.message
    assert report.of_kind("cache-space") == []
    (out,) = report.of_kind("reduced-capacity")
    assert "download" not in out.message


def test_a_rename_and_a_claim_resize_together_replace_with_the_new_template():
    """A replacement is created from the program's values, ignored paths included: the new
    StatefulSet's template says 300Gi, while the claims it re-uses keep their size."""
    def both(c):
        models(c)["flash"].update(name="flash-engine")
        models(c)["flash"]["workload"].update(name="halogen-flash")
        models(c)["flash"]["workload"]["cache_volume"]["size"] = "300Gi"

    report = edit("strix-halo", both)
    engine = report.entry("StatefulSet", "halogen-flash")
    assert engine.op == "replace"
    assert engine.applied.inputs["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "300Gi"
    assert report.of_kind("change-ignored") == [] and report.of_kind("redownload") == []
    assert len(report.of_kind("claim-template-ignored")) == 1


def test_growing_a_local_path_cache_says_the_resize_is_refused():
    report = edit("strix-halo", lambda c: c["inference-plane:model_cache"].update(size="32Gi"))
    (refused,) = report.of_kind("update-rejected")
    assert refused.severity == "error" and "local-path volumes cannot grow" in refused.message


def library_models(config: dict) -> dict:
    return models(config)["library"]["on_demand"]["models"]


def test_adding_and_removing_a_model_on_demand_restarts_nothing_and_says_what_is_fetched():
    """llama.cpp's router re-reads its preset on GET /models?reload=1 and keeps every child whose
    settings did not change (tests/test_router_library.py runs it): the preset ConfigMap is updated in
    place (the stack sets enableConfigMapMutable) and the keeper sidecar fetches and reloads. The
    router's pod is not touched while the planned limit and memory stay the same."""
    def change(c):
        library = library_models(c)
        del library["qwen3-14b"]
        # With a shorter context than the server's 16k, so any two models still fit the card (11.1 GiB at
        # 16k beside qwen3-30b-a3b's 12.1 would not: the planned limit, and so the pod, would change).
        library["phi-4"] = {"hf_repo": "bartowski/phi-4-GGUF:Q4_K_M", "weights": "8.4Gi", "ctx_size": 8192,
                            "facts": {"layers": 40, "kv_heads": 10, "head_dim": 128, "params_b": 14.7}}
        # Its gateway route goes with it (a route to a name the router does not list is refused).
        routes = c["inference-plane:gateway"]["routes"]
        routes[:] = [r for r in routes if r["model"] != "qwen3-14b"] + [
            {"model": "phi-4", "backends": [{"tier": "library"}, {"tier": "openrouter", "model": "microsoft/phi-4"}]}]

    report = edit("rtx3090-library", change)
    no_collision_or_wait(report)
    assert report.entry("ConfigMap", "llama-library-files").op == "update"
    # The Deployment's spec may change its progress deadline (the downloads' budget), never its pod template.
    assert report.entry("Deployment", "llama-library").op in ("same", "update")
    assert report.of_kind("restart") == [] and report.of_kind("downtime") == []
    assert report.entry("AIGatewayRoute", "inference-routes-1").op == "update"
    (library,) = report.of_kind("library")
    assert library.subject == "llama-library (models.library.on_demand)"
    assert [(e.model, e.change, e.unloads) for e in report.library["llama-library"]] == [
        ("phi-4", "added", False), ("qwen3-14b", "removed", True)]
    # 8.4 GiB at the stack's 40 MiB/s: 215 s.
    assert library.message.startswith(
        "fetches phi-4 (8.4 GiB), about 4 min at the stack's download rate, then offers it (until then the admission "
        "proxy answers 503 with Retry-After for it, which the gateway retries on the route's next tier); drops qwen3-14b: "
        "unloaded if loaded and forgotten (then the admission proxy answers 400, model not found; its files stay in the "
        "cache); each model unloaded by the edit is drained first: new requests for it get 503 with Retry-After")
    assert "its keeper applies it once the kubelet has refreshed the mounted ConfigMap" in library.message
    assert "no restart" in library.message


@pytest.mark.parametrize("what", ["remove the 30B", "add a 4B"])
def test_a_library_edit_restarts_nothing(what):
    """Issue #48 item 1: the router pod's memory is the budget the proxy admits within, not the largest set of
    today's library, so adding or removing a model changes no pod template (adding a 4B raised the limit
    14Gi -> 17Gi and replaced the pod for its download): the keeper applies it, and the preview says so, and
    what a client sees meanwhile (the proxy's 503, which the gateway retries on the next tier)."""
    def change(c):
        if what == "add a 4B":
            library_models(c)["qwen3-4b"] = {"hf_repo": "Qwen/Qwen3-4B-GGUF:Q4_K_M"}
            return
        library_models(c).pop("qwen3-30b-a3b")
        routes = c["inference-plane:gateway"]["routes"]
        routes[:] = [r for r in routes if r["model"] != "qwen3-30b-a3b"]

    report = edit("rtx3090-library", change)
    no_collision_or_wait(report)
    assert not report.of_kind("restart") and not report.of_kind("downtime")
    (library,) = report.of_kind("library")
    assert "no restart" in library.message and "the pod restarts" not in library.message
    if what == "add a 4B":
        assert "the admission proxy answers 503 with Retry-After for it" in library.message


def test_other_weights_under_the_same_name_are_fetched_again_and_said_so():
    """A requant keeps the public name but not the weights: the preview says which model is fetched again, that
    the old weights serve meanwhile, and that it is drained and unloaded once they are fetched."""
    report = edit("rtx3090-library", lambda c: library_models(c)["llama-3.1-8b"].update(
        hf_repo="bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q5_K_M"))
    no_collision_or_wait(report)
    (library,) = report.of_kind("library")
    assert [(e.model, e.change, e.unloads) for e in report.library["llama-library"]] == [
        ("llama-3.1-8b", "new weights", True)]
    assert ("fetches new weights for llama-3.1-8b (bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M -> "
            "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q5_K_M, ") in library.message
    assert "while the old ones serve; then unloads it" in library.message and "drained first" in library.message


def test_a_context_change_reloads_that_model_alone_after_draining_it():
    """Issue #48 item 3: a ctx_size change is a settings change of one preset section: the preview names the
    model, the setting, that it is drained first, and (pinned) that the proxy loads it again at once."""
    report = edit("rtx3090-library", lambda c: library_models(c)["qwen3-8b"].update(ctx_size=8192))
    no_collision_or_wait(report)
    assert not report.of_kind("restart") and not report.of_kind("downtime")
    assert [(e.model, e.change, e.unloads) for e in report.library["llama-library"]] == [
        ("qwen3-8b", "new settings", True)]
    (library,) = report.of_kind("library")
    assert library.message.startswith("reloads qwen3-8b with new settings (ctx-size 16384 -> 8192): unloaded, then the "
                                      "admission proxy loads it again at once (pinned) (about ")
    assert "drained first: new requests for it get 503 with Retry-After" in library.message


def test_moving_the_pin_reloads_nothing():
    """Issue #48 item 2: the pin lives in the admission plan, not in the router's preset, so moving it changes
    no section: the preview says the proxy loads the new one and the old one stays until its room is needed."""
    def change(c):
        library_models(c)["qwen3-8b"].pop("pinned")
        library_models(c)["llama-3.1-8b"]["pinned"] = True

    report = edit("rtx3090-library", change)
    no_collision_or_wait(report)
    assert not report.of_kind("restart") and not report.of_kind("downtime")
    assert [(e.model, e.change, e.unloads) for e in report.library["llama-library"]] == [
        ("llama-3.1-8b", "pinned", False), ("qwen3-8b", "unpinned", False)]
    (library,) = report.of_kind("library")
    assert "drained" not in library.message and library.message.count("nothing reloads") == 2


def _router_and_own_server(move_out: bool):
    """The report for moving qwen3-14b out of rtx3090-library's library to a server of its own on the shared
    card (conftest.router_move_configs), or back."""
    base, moved, secrets = router_move_configs()
    runs = [run_stack_file("rtx3090-library", c, secrets) for c in (base, moved)]
    before, after = runs if move_out else runs[::-1]
    report = preview(before, after, options_from_config(moved))
    budgets = [run.outputs["capacity_plan"]["servers"]["library"]["residency"]["vram_budget_gib"] for run in (before, after)]
    (card,) = runs[1].outputs["capacity_plan"]["nodes"][0]["gpus"]  # the card with qwen14 on it
    return report, budgets, card


@pytest.mark.parametrize("move_out", [True, False])
def test_moving_a_model_between_the_router_and_a_server_of_its_own_plans_the_moment_both_hold_vram(move_out):
    """Issue #48 item 4: the router keeps its old budget until its proxy reads the new plan (or, when it restarts,
    until its old pod exits), while the new server's pods start at once; moving back, the old server holds its
    VRAM until the update deletes its pods. The preview sums that moment (each workload at the larger of its
    figures) against the card. Moving out, the new server waits for room (its init container; run against the
    real router in tests/test_router_library.py), so the two never overlap and the preview says so; moving back
    it warns and gives the order that avoids it."""
    report, (old_budget, new_budget), card = _router_and_own_server(move_out)
    (overlap,) = report.of_kind("card-overlap")
    assert overlap.subject == "GPU 0 of rtx3090 node 0"
    server = card["workloads"]["qwen14"]
    largest = max(old_budget, new_budget)
    if move_out:
        assert new_budget < old_budget and overlap.severity == "info"
        assert (f"ordered so that both never hold the card at once ({largest:g} + {server:g} GiB would be "
                f"{largest + server:.1f} of {card['vram_gib']:g}): the new pods wait (init container room) until the "
                f"router holds no more than {new_budget:g} GiB") in overlap.message
    else:
        assert new_budget > old_budget and overlap.severity == "warning" and "while qwen14 goes" in overlap.message
        assert (f"{largest:g} + {server:g} = {largest + server:.1f} GiB, more than the card's {card['vram_gib']:g}"
                in overlap.message)
        assert overlap.message.endswith("keeps the router's budget for that update instead (a model that needs the "
                                        "memory is refused until the next one): remove the server first, then grow "
                                        "the library")


def test_a_router_restart_says_its_pinned_models_load_after_it_serves():
    """Issue #48 item 3: a restarted router answers once it is up, but holds no model: the downtime line says
    the pinned model loads next (its cold swap, by the plan) and the others on their first request."""
    report, _, _ = _router_and_own_server(True)
    (down,) = [c for c in report.of_kind("downtime") if "llama-library" in c.subject]
    plan = stack_plan_swap("qwen3-8b")
    assert (f"then the admission proxy loads the pinned qwen3-8b (about {round(plan)} s off the volume, by the plan), "
            "and every other model loads on its first request") in down.message


def stack_plan_swap(model: str) -> float:
    run = run_stack_file("rtx3090-library", stack_file_config("rtx3090-library"))
    return run.outputs["capacity_plan"]["servers"]["library"]["residency"]["models"][model]["swap_seconds"]["cold"]


def test_a_moved_server_on_claims_of_its_own_cannot_wait_for_room_and_the_preview_says_the_order():
    """A StatefulSet with a claim per replica does not mount the cache the router's keeper publishes its status
    on: no wait is rendered, and the preview warns of the overlap with the two-step order instead."""
    base, moved, secrets = router_move_configs()
    moved["inference-plane:models"]["qwen14"]["workload"] = {
        "kind": "StatefulSet", "cache_volume": {"storage_class": "local-path", "size": "20Gi"}}
    after = run_stack_file("rtx3090-library", moved, secrets)
    assert "room" not in after.outputs["capacity_plan"]["servers"]["qwen14"]
    report = preview(run_stack_file("rtx3090-library", base, secrets), after, options_from_config(moved))
    (overlap,) = report.of_kind("card-overlap")
    assert overlap.severity == "warning" and "more than the card's 24" in overlap.message
    assert overlap.message.endswith("first the library edit alone, then, once the router holds no more than "
                                    "14.01 GiB, the new server")
