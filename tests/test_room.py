"""A server sharing its card with a router waits at start for the router to make room (issue #48 item 4): the
rendered objects of a model moved out of rtx3090-library's library to a server of its own, held to each other,
and the rendered wait (incluster/room.py) run as its init container runs it, on the status files the router's
keeper publishes. Against the real router, proxy and keeper: tests/test_router_library.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import router_move_configs, run_stack_file
from lab.contract.pod_programs import pod_command, programs_under, write_programs


@pytest.fixture(scope="module")
def moved() -> dict:
    """The stack with qwen14 moved out of the library: the router's and qwen14's pods, ConfigMaps and plan."""
    from render.manifests import manifests

    _, config, secrets = router_move_configs()
    run = run_stack_file("rtx3090-library", config, secrets)
    objects = list(manifests(run).values())
    pods = {m["metadata"]["name"]: m["spec"]["template"]["spec"] for m in objects if m["kind"] == "Deployment"}
    config_maps = {m["metadata"]["name"]: m for m in objects if m["kind"] == "ConfigMap"}
    return {"pods": pods, "config_maps": config_maps, "plan": run.outputs["capacity_plan"]}


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def test_the_moved_server_waits_on_the_status_the_routers_keeper_publishes(moved):
    """Cross-object: the wait reads the file the router's keeper writes (the proxy's status, copied from the
    scratch file the proxy writes), on the claim both pods mount at the same path (read-only for the wait),
    and waits for the budget the plan gave the router beside qwen14 (admission.json's), first of its pod's
    init containers, in the router's programs image."""
    router, server = moved["pods"]["llama-library"], moved["pods"]["qwen14"]
    (room, *_) = server["initContainers"]
    assert room["name"] == "room" and room["command"][-1].endswith("/room.py")
    containers = {c["name"]: c for c in router["containers"]}
    proxy, keeper = env_of(containers["admission"]), env_of(containers["library"])
    wait = env_of(room)
    assert keeper["ROOM_STATUS"] == proxy["ROOM_STATUS"]
    assert wait["ROOM_STATUS"] == keeper["ROOM_PUBLISH"]
    plan = json.loads(moved["config_maps"]["llama-library-files"]["data"]["admission.json"])
    # The budget it waits for is the router's own (admission.json), a file of its programs ConfigMap beside room.py.
    budget_file = json.loads(moved["config_maps"]["qwen14-programs"]["data"]["room.json"])
    assert budget_file == {"router": "llama-library", "router_budget_gib": plan["vram_budget_gib"]}
    assert wait["ROOM_BUDGET_FILE"] == room["command"][-1].rsplit("/", 1)[0] + "/room.json"
    assert plan["vram_budget_gib"] == moved["plan"]["servers"]["library"]["residency"]["vram_budget_gib"]
    # The same claim, mounted where the keeper writes: the keeper's mount of "models" and the wait's.
    claim = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in router["volumes"] if "persistentVolumeClaim" in v}
    server_claim = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in server["volumes"] if "persistentVolumeClaim" in v}
    (keeper_mount,) = [m for m in containers["library"]["volumeMounts"] if m["name"] == "models"]
    (room_mount,) = [m for m in room["volumeMounts"] if m["name"] == "models"]
    assert claim["models"] == server_claim["models"]
    assert room_mount["mountPath"] == keeper_mount["mountPath"] and room_mount.get("readOnly") is True
    assert wait["ROOM_STATUS"].startswith(keeper_mount["mountPath"] + "/")
    # The proxy writes only the control volume, which only it and the keeper mount (the router's children run
    # model code): the status and the control socket live there; the claim is not mounted where the network is.
    assert not [m for m in containers["admission"]["volumeMounts"] if m["name"] == "models"]
    control = {v["name"] for v in router["volumes"] if "emptyDir" in v and v["name"] != "scratch"}
    assert control == {"control"}
    mounted_by = {c["name"] for c in router["containers"] + router.get("initContainers", [])
                  for m in c.get("volumeMounts", []) if m["name"] == "control"}
    assert mounted_by == {"admission", "library"}
    (mount,) = [m["mountPath"] for m in containers["admission"]["volumeMounts"] if m["name"] == "control"]
    assert proxy["ROOM_STATUS"].startswith(mount + "/") and proxy["ADMISSION_CONTROL"].startswith(mount + "/")
    assert keeper["ADMISSION_CONTROL"] == proxy["ADMISSION_CONTROL"]
    on_demand = router["initContainers"][0]["image"]
    assert room["image"] == on_demand
    assert sorted(moved["config_maps"]["qwen14-programs"]["data"]) == ["room.json", "room.py"]


@pytest.fixture
def wait(moved, tmp_path):
    """Runs the rendered wait with its paths under tmp_path; returns (status file, start(env overrides))."""
    server = moved["pods"]["qwen14"]
    (room, *_) = server["initContainers"]
    root = write_programs(moved["config_maps"]["qwen14-programs"], server, programs_under(tmp_path))
    status = tmp_path / "status.json"

    def start(**overrides) -> subprocess.Popen:
        env = {**env_of(room), "ROOM_STATUS": str(status), "ROOM_BUDGET_FILE": str(root / "room.json"), **overrides}
        return subprocess.Popen(pod_command(room, root), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    return status, start, json.loads((root / "room.json").read_text())["router_budget_gib"]


def write_status(path: Path, budget: float, resident: float, age: float = 0.0) -> None:
    path.write_text(json.dumps({"vram_budget_gib": budget, "resident_vram_gib": resident, "at": time.time() - age}))


def test_no_router_status_or_a_stale_one_lets_the_server_start(wait):
    status, start, _ = wait
    first = start()
    out, _ = first.communicate(timeout=30)
    assert first.returncode == 0 and "no router holds the card" in out
    write_status(status, 23.0, 20.0, age=200)
    second = start()
    out, _ = second.communicate(timeout=30)
    assert second.returncode == 0 and "its proxy is not running" in out


def test_the_server_waits_while_the_router_holds_its_old_budget_and_starts_once_it_has_shrunk(wait):
    status, start, most = wait
    write_status(status, 23.0, 20.5)  # the old plan, a full card
    proc = start()
    time.sleep(3)
    assert proc.poll() is None, proc.communicate()[0]
    write_status(status, most, 20.5)  # the new plan read, the idle models not unloaded yet
    time.sleep(3)
    assert proc.poll() is None, proc.communicate()[0]
    write_status(status, most, most - 1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "starting" in out and "budget is 23 GiB and it holds 20.5 GiB" in out


@pytest.mark.parametrize("content", [b"{not json", b'{"vram_budget_gib": "NaN", "resident_vram_gib": 1, "at": 1}',
                                     b"[]", b'{"vram_budget_gib": 1e999, "resident_vram_gib": 1, "at": 1}'])
def test_an_unreadable_status_is_read_again_never_taken_as_room(wait, content):
    status, start, _ = wait
    status.write_bytes(content)
    proc = start(ROOM_WAIT_SECONDS="3")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "exiting to be restarted" in out


def test_a_change_of_the_routers_budget_restarts_no_server_beside_it(moved):
    """Found by a review: the budget was in the wait's environment, so any edit that moved the router's budget
    (a neighbour's VRAM, the card's size) changed every waiting server's pod template and restarted it. It is a
    file of the server's programs ConfigMap now, read at the wait's start: the ConfigMap changes, the pod does not."""
    from render.manifests import manifests

    _, config, secrets = router_move_configs()
    config["inference-plane:node_pools"]["rtx3090"]["vram"] = "32Gi"
    run = run_stack_file("rtx3090-library", config, secrets)
    objects = list(manifests(run).values())
    (deployment,) = [m for m in objects if m["kind"] == "Deployment" and m["metadata"]["name"] == "qwen14"]
    (programs,) = [m for m in objects if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "qwen14-programs"]
    assert json.loads(programs["data"]["room.json"])["router_budget_gib"] > json.loads(
        moved["config_maps"]["qwen14-programs"]["data"]["room.json"])["router_budget_gib"]
    assert deployment["spec"]["template"]["spec"] == moved["pods"]["qwen14"]
