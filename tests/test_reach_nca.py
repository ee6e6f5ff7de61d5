"""Who may connect to whom, computed from the rendered manifests by an independent implementation of Kubernetes
NetworkPolicy (np-guard's Network Config Analyzer, `nca`, installed in .venv-nca by `make test`): the summary's
reach lines (render/reach.py reads the policies itself) and a split's fence (docs/rpc-split.md: Locked down) are
held to what it finds, on the stacks that run plain NetworkPolicy (k3s' kube-router). It reads no
CiliumNetworkPolicy (nca/Resources/PolicyResources/NetworkPolicy.py knows k8s, Calico and Istio kinds only), so the
Cilium stacks are not covered here.

Beside the rendered objects, nca is given the pods a stock k3s runs that the policies name or must keep out: Traefik
and CoreDNS in kube-system with k3s' labels, a metrics-server (another kube-system pod) and an app in `default`."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from common.constants import COMPONENT_LABEL
from conftest import ROOT, stack_file_config
from render.output import render_stack
from render.reach import admitted

NCA = os.environ.get("INFERENCE_PLANE_NCA") or str(ROOT / ".venv-nca" / "bin" / "nca")
PLAIN_STACKS = ["cpu-cluster", "rtx3060", "rtx3090-library"]
WORLD = "0.0.0.0-255.255.255.255"


def _deployment(namespace: str, name: str, labels: dict[str, str], port: int) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": name, "image": "example", "ports": [{"containerPort": port}]}]}}}}


# What k3s installs (its Traefik and CoreDNS manifests' pod labels) and two pods the policies must keep out.
K3S_PODS = [
    _deployment("kube-system", "traefik", {"app.kubernetes.io/name": "traefik",
                                           "app.kubernetes.io/instance": "traefik-kube-system"}, 8000),
    _deployment("kube-system", "coredns", {"k8s-app": "kube-dns"}, 53),
    _deployment("kube-system", "metrics-server", {"k8s-app": "metrics-server"}, 10250),
    _deployment("default", "some-app", {"app": "some-app"}, 8080),
]
LINE = re.compile(r"^(?P<src>\S+) => (?P<dst>\S+) : (?P<conn>.+)$")


def connectivity(objects: list[dict], folder: Path) -> list[tuple[str, str, str]]:
    """(source, destination, connections) for every pair nca finds connected, workloads named
    `namespace/name[Kind]`, the world `0.0.0.0-255.255.255.255`."""
    if not os.access(NCA, os.X_OK):
        pytest.fail(f"nca is not installed at {NCA}: run `make test`, which builds .venv-nca")
    folder.mkdir(parents=True, exist_ok=True)
    for i, o in enumerate([*objects, *K3S_PODS]):
        (folder / f"{i:03d}.yaml").write_text(yaml.safe_dump(o, sort_keys=False))
    out = folder.parent / f"{folder.name}.txt"
    proc = subprocess.run([NCA, "--connectivity", "-r", str(folder), "-o", "txt_no_fw_rules", "-f", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    pairs = [(m["src"], m["dst"], m["conn"].strip()) for m in map(LINE.match, out.read_text().splitlines()) if m]
    assert pairs, out.read_text()[:2000]
    return pairs


def workloads(objects: list[dict]) -> dict[str, tuple[str, dict[str, str]]]:
    """nca's name for each workload -> (namespace, its pods' labels)."""
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}[{o['kind']}]":
            (o["metadata"]["namespace"], dict(o["spec"]["template"]["metadata"].get("labels") or {}))
            for o in [*objects, *K3S_PODS] if o["kind"] in ("Deployment", "StatefulSet")}


def servers(objects: list[dict]) -> list[tuple[str, str, dict[str, str]]]:
    """(nca name, namespace, pod labels) of each model server: the workloads a server Service selects."""
    selectors = [(s["metadata"]["namespace"], s["spec"]["selector"]) for s in objects if s["kind"] == "Service"
                 and (s["metadata"].get("labels") or {}).get("app.kubernetes.io/component") in COMPONENT_LABEL.values()]
    return [(name, ns, labels) for name, (ns, labels) in workloads(objects).items()
            if any(ns == sns and selector.items() <= labels.items() for sns, selector in selectors)]


def rendered(stack: str, tmp_path: Path) -> list[dict]:
    result = render_stack(stack, tmp_path / "out" / stack)
    return list(result.files.values())


@pytest.mark.parametrize("stack", PLAIN_STACKS)
def test_who_reaches_each_server_is_what_the_summary_reads_off_the_policies(stack, tmp_path):
    """For each model server, the workloads nca finds able to open a connection to it are exactly those the
    summary's reach lines admit (render/reach.py admitted: the namespace-wide policies' peers and the server's own
    policies'), from its namespace and from k3s' own, and nothing from the world or another namespace."""
    objects = rendered(stack, tmp_path)
    pairs = connectivity(objects, tmp_path / "nca")
    every = workloads(objects)
    checked = servers(objects)
    assert checked, "every shipped stack serves a model"
    for name, namespace, labels in checked:
        peers = admitted(objects, namespace) + admitted(objects, namespace, labels)
        said = {w for w, (ns, wl) in every.items() if w != name
                and any(pns in (ns, "*") and plabels.items() <= wl.items() for pns, plabels in peers)}
        found = {src for src, dst, _ in pairs if dst == name}
        print(stack, name, "<-", sorted(found))
        assert found == said, (stack, name, sorted(found ^ said))
        assert WORLD not in found and not any(w.startswith("default/") for w in found)


def test_a_split_helper_is_reached_by_the_main_server_alone_on_its_port_and_reaches_nothing(tmp_path):
    """The split's fence under plain NetworkPolicy (strix-halo-rpc with cni: networkpolicy): nca finds one
    connection into the helper, from the main server, TCP on the RPC port, and none out of it; every other pod of
    the namespace, of kube-system and of another namespace is kept out."""
    config = copy.deepcopy(stack_file_config("strix-halo-rpc"))
    config["inference-plane:cluster"] = {**config["inference-plane:cluster"], "cni": "networkpolicy"}
    config["inference-plane:namespace"] = {"name": "shikanime", "model_hub_egress": {
        "mode": "world", "reason": "plain NetworkPolicy cannot name hosts"}}
    (tmp_path / "Pulumi.rpc-np.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    objects = list(render_stack("rpc-np", tmp_path / "out", project_dir=tmp_path).files.values())
    pairs = connectivity(objects, tmp_path / "nca")
    helper, main = "shikanime/qwen3-235b-rpc-0[Deployment]", "shikanime/qwen3-235b[Deployment]"
    assert helper in workloads(objects) and main in workloads(objects)
    into = [(src, conn) for src, dst, conn in pairs if dst == helper]
    assert into == [(main, "{protocols:TCP,dst_ports:50052}")], into
    assert [dst for src, dst, _ in pairs if src == helper] == []
    # The main server is reached as the summary says, but by the helper, whose egress is closed (above).
    peers = admitted(objects, "shikanime") + admitted(objects, "shikanime", workloads(objects)[main][1])
    said = {w for w, (ns, labels) in workloads(objects).items() if w not in (main, helper)
            and any(pns in (ns, "*") and plabels.items() <= labels.items() for pns, plabels in peers)}
    assert {src for src, dst, _ in pairs if dst == main} == said
