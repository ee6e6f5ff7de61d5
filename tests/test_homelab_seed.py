"""The homelab stack against the hand-written manifests it replaces, field by field.

The seed's objects (``tests/seeds/homelab_000.yaml``, extracted from seed 000) are the expectations. Every value the seed
sets must be rendered with the same value, unless it is listed in DELIBERATE with the reason and
a check of what the program does instead.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import yaml

from conftest import ROOT
from render.manifests import manifests

SEED = ROOT / "tests" / "seeds" / "homelab_000.yaml"


def seed_objects() -> dict[tuple[str, str], dict[str, Any]]:
    """Every Kubernetes object the seed's diff adds, keyed by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(SEED.read_text()) if d}


SEED_OBJECTS = seed_objects()


Path = tuple[Any, ...]


def leaves(value: Any, path: Path = ()) -> dict[Path, Any]:
    if isinstance(value, dict):
        out: dict[Path, Any] = {}
        for key, item in value.items():
            out.update(leaves(item, (*path, key)))
        return out
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(leaves(item, (*path, index)))
        return out
    return {path: value}


def at(value: Any, path: Path) -> Any:
    for part in path:
        value = value[part]
    return value


def dotted(path: Path) -> str:
    return ".".join(str(p) for p in path)


def flag_pairs(args: list[str]) -> dict[str, str | None]:
    pairs: dict[str, str | None] = {}
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[index + 1] if index + 1 < len(args) else None
            pairs[arg] = None if following is None or following.startswith("--") else following
    return pairs


def startup_seconds(container: dict) -> int:
    probe = container["startupProbe"]
    return probe["periodSeconds"] * (probe["failureThreshold"] - 1)


CONTAINER = ("spec", "template", "spec", "containers", 0)
ARGS = (*CONTAINER, "args")
CHAT_STARTUP = (*CONTAINER, "startupProbe", "failureThreshold")

# (kind, name, path) -> (reason, check on the rendered object and the seed's value)
DELIBERATE: dict[tuple[str, str, Path], tuple[str, Callable[[dict, Any], bool]]] = {
    ("Deployment", "llama-server", CHAT_STARTUP): (
        "computed from 19.8 GiB of weights at the seed's implied 8.5 MiB/s plus load time, not a literal; "
        "never shorter than the seed's 40 minutes",
        lambda rendered, seed: startup_seconds(at(rendered, CONTAINER)) >= seed * 10,
    ),
    ("Deployment", "llama-embed", CHAT_STARTUP): (
        "the seed's 60 x 10 s meant 10 minutes, but the kubelet probes at once and acts on the 60th failure "
        "after 59 periods: one more failure gives the whole 600 s",
        lambda rendered, seed: startup_seconds(at(rendered, CONTAINER)) == seed * 10,
    ),
}


@pytest.fixture(scope="module")
def rendered(homelab_run) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests(homelab_run).values()}


def test_seed_was_read():
    kinds = sorted(kind for kind, _ in SEED_OBJECTS)
    assert kinds == sorted(
        ["CiliumNetworkPolicy", "Deployment", "Deployment", "Ingress", "Kustomization", "Namespace",
         "PersistentVolumeClaim", "Service", "Service"]
    )


@pytest.mark.parametrize(
    "key",
    [k for k in SEED_OBJECTS if k[0] not in ("Kustomization", "CiliumNetworkPolicy")],
    ids=lambda k: f"{k[0]}/{k[1]}",
)
def test_every_seed_setting_is_rendered(rendered, key):
    seed = SEED_OBJECTS[key]
    assert key in rendered, f"the homelab stack renders no {key[0]} {key[1]}"
    ours = rendered[key]
    for path, value in leaves(seed).items():
        if path[: len(ARGS)] == ARGS:
            continue
        deliberate = DELIBERATE.get((key[0], key[1], path))
        if deliberate is not None:
            reason, check = deliberate
            assert check(ours, value), f"{key} {dotted(path)}: {reason}"
            continue
        try:
            rendered_value = at(ours, path)
        except (KeyError, IndexError):
            pytest.fail(f"{key} {dotted(path)}: seed sets {value!r}, the render leaves it out")
        assert rendered_value == value, f"{key} {dotted(path)}: seed has {value!r}, rendered {rendered_value!r}"


@pytest.mark.parametrize("name", ["llama-server", "llama-embed"])
def test_every_seed_flag_is_passed_with_its_value(rendered, name):
    # Renamed on purpose: the pinned build logs the seed's --no-webui as a deprecated alias of --no-ui.
    seed_flags = {("--no-ui" if k == "--no-webui" else k): v
                  for k, v in flag_pairs(at(SEED_OBJECTS[("Deployment", name)], ARGS)).items()}
    our_flags = flag_pairs(at(rendered[("Deployment", name)], ARGS))
    assert seed_flags.items() <= our_flags.items()
    # Added on purpose: the default port moves between builds, /metrics feeds monitoring, and the
    # host-RAM caches are capped so that the capacity plan counts what the server really holds.
    # The chat server is reachable from outside its namespace (Traefik), so it takes an API key.
    # The embedder's pooling is explicit: the one the planner checked its micro-batch against. Its
    # CORS is limited to localhost: without the flag the server echoes any Origin with credentials
    # (seen running the pinned build).
    caches = ({"--cache-ram", "--ctx-checkpoints", "--api-key-file"} if name == "llama-server"
              else {"--cache-ram", "--pooling", "--cors-origins"})
    assert set(our_flags) - set(seed_flags) == {"--host", "--port", "--metrics"} | caches


def test_cold_start_survives_pulumi_up_as_it_survived_flux(homelab_run):
    flux = SEED_OBJECTS[("Kustomization", "llama-server")]
    assert flux["spec"]["timeout"] == "60m" and flux["spec"]["wait"] is True
    chat = homelab_run.one("Deployment", "llama-server")
    container = chat.inputs["spec"]["template"]["spec"]["containers"][0]
    wait = int(chat.custom_timeouts["create"].rstrip("s"))
    # Differs on purpose: derived from the budget (image pull + download + load) instead of a round 60m.
    assert wait >= startup_seconds(container) + 600
    assert 40 * 60 < wait <= 60 * 60


def _same_rules(seed_rules: list[dict], our_rules: list[dict]) -> tuple[list[dict], list[dict]]:
    missing = [r for r in seed_rules if r not in our_rules]
    added = [r for r in our_rules if r not in seed_rules]
    return missing, added


def test_network_policy_matches_the_seed_except_where_narrowed(rendered):
    seed = SEED_OBJECTS[("CiliumNetworkPolicy", "default-deny-ingress")]
    ours = rendered[("CiliumNetworkPolicy", "default-deny-ingress")]
    assert ours["metadata"]["namespace"] == seed["metadata"]["namespace"]
    assert ours["spec"]["endpointSelector"] == seed["spec"]["endpointSelector"]
    missing, added = _same_rules(seed["spec"]["ingress"], ours["spec"]["ingress"])
    assert missing == [] and added == []

    missing, added = _same_rules(seed["spec"]["egress"], ours["spec"]["egress"])
    # Narrowed on purpose: `world` gave every pod the whole internet, but only the model download
    # needs it (image pulls are the kubelet's), so the model hub's hosts replace it.
    (seed_entities, seed_dns) = sorted(missing, key=lambda r: "toEntities" in r)[::-1]
    assert seed_entities["toEntities"] == ["host", "remote-node", "world"]
    assert {"toEntities": ["host", "remote-node"]} in added
    (fqdn,) = [r for r in added if "toFQDNs" in r]
    assert {"matchName": "huggingface.co"} in fqdn["toFQDNs"]
    # Widened on purpose: DNS over TCP for large answers, and the DNS proxy that toFQDNs needs.
    (our_dns,) = [r for r in added if r.get("toEndpoints") == seed_dns["toEndpoints"]]
    assert seed_dns["toPorts"][0]["ports"][0] in our_dns["toPorts"][0]["ports"]
    assert {"port": "53", "protocol": "TCP"} in our_dns["toPorts"][0]["ports"]
    assert len(added) == 3


def test_namespace_differs_only_by_pod_security_labels(rendered):
    seed = SEED_OBJECTS[("Namespace", "ai")]
    ours = rendered[("Namespace", "ai")]
    assert seed["metadata"] == {"name": "ai"}
    # The seed left the cluster's baseline in force; its pods already meet `restricted`, so enforce it.
    assert ours["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
