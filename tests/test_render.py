"""Offline render: strict validation, determinism, all-or-nothing writes, no secret values."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest

from planning.split import estimates_by_workload
import yaml

from conftest import ROOT, STACKS, run_values, stack_values
from render.manifests import SECRET_TEXT, dump, manifests
from render.output import MARKER, RenderError, render_stack
from render.validate import CRD_SCHEMAS_ENV, ManifestError, validate


def files_of(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def write_stack(tmp_path, name: str, values: dict) -> None:
    config = {f"inference-plane:{k}": v for k, v in values.items()}
    (tmp_path / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))


def test_there_are_stacks():
    assert "homelab" in STACKS


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_renders_and_validates_strictly(tmp_path, stack):
    result = render_stack(stack, tmp_path / "out")
    written = sorted(p.name for p in (tmp_path / "out").glob("*.yaml") if p.name != "kustomization.yaml")
    assert written == sorted(n for n, m in result.files.items() if m["kind"] != "Secret")  # Secrets: SECRETS.md
    for name in written:
        manifest = yaml.safe_load((tmp_path / "out" / name).read_text())
        validate(name, manifest, result.run.config.cluster.kubernetes_version)
    kustomization = yaml.safe_load((tmp_path / "out" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == written
    assert kustomization["resources"][0].startswith("namespace_")
    for model in result.run.config.models.values():
        assert model.name in result.summary()


def test_strict_core_schema_rejects_an_unknown_field(homelab_run):
    files = manifests(homelab_run)
    deployment = copy.deepcopy(files["deployment_ai_llama-server.yaml"])
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbes"] = {}
    with pytest.raises(ManifestError, match=r"deployment_ai_llama-server.yaml: Deployment spec.template.spec.containers.0"):
        validate("deployment_ai_llama-server.yaml", deployment, "1.33")


def test_strict_core_schema_rejects_a_wrong_type(homelab_run):
    service = copy.deepcopy(manifests(homelab_run)["service_ai_llama-server.yaml"])
    service["spec"]["ports"][0]["port"] = "eighty"
    with pytest.raises(ManifestError, match=r"Service spec.ports.0.port"):
        validate("svc.yaml", service, "1.33")


def test_strict_crd_schema_rejects_an_unknown_field(homelab_run):
    policy = copy.deepcopy(manifests(homelab_run)["ciliumnetworkpolicy_ai_default-deny-ingress.yaml"])
    policy["spec"]["egress"][0]["toEndpoint"] = []
    with pytest.raises(ManifestError, match=r"CiliumNetworkPolicy spec.egress.0"):
        validate("cnp.yaml", policy, "1.33")


def test_crd_schema_location_is_overridable(homelab_run, tmp_path, monkeypatch):
    monkeypatch.setenv(CRD_SCHEMAS_ENV, str(tmp_path))
    policy = manifests(homelab_run)["ciliumnetworkpolicy_ai_default-deny-ingress.yaml"]
    with pytest.raises(ManifestError, match=rf"no schema for CiliumNetworkPolicy cilium.io/v2 at {tmp_path}"):
        validate("cnp.yaml", policy, "1.33")


def test_unsupported_kubernetes_version_is_an_error(homelab_run):
    namespace = manifests(homelab_run)["namespace_ai.yaml"]
    with pytest.raises(ManifestError, match="cluster.kubernetes_version: 1.12 has no schemas"):
        validate("ns.yaml", namespace, "1.12")


def test_rendering_twice_gives_identical_files(tmp_path):
    render_stack("homelab", tmp_path / "a")
    render_stack("homelab", tmp_path / "b")
    render_stack("homelab", tmp_path / "b")
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")


def test_invalid_config_writes_nothing_and_keeps_the_previous_render(tmp_path):
    good = stack_values("homelab")
    write_stack(tmp_path, "good", good)
    out = tmp_path / "out"
    render_stack("good", out, project_dir=tmp_path)
    before = files_of(out)
    bad = copy.deepcopy(good)
    bad["models"]["embed"]["exposure"] = {"host": "embed.renner.uno", "tls_secret": "t"}
    write_stack(tmp_path, "good", bad)
    with pytest.raises(RenderError, match=r"models.embed.exposure: an exposed embedding server needs api_key") as caught:
        render_stack("good", out, project_dir=tmp_path)
    assert caught.value.exit_code == 2
    assert files_of(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.good.yaml", "out"]


def test_a_folder_that_is_not_a_render_is_never_replaced(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RenderError, match="is not a previous render"):
        render_stack("homelab", tmp_path)
    assert files_of(tmp_path) == {"notes.txt": b"mine"}


def test_render_marks_its_folder(tmp_path):
    render_stack("homelab", tmp_path / "out")
    assert (tmp_path / "out" / MARKER).is_file()


SECRET = "sk-live-9f8e7d6c5b4a-never-render-me"


def test_secret_values_never_reach_manifests_or_plain_outputs(homelab_values):
    homelab_values["models"]["chat"]["api_key"] = {"secret_name": "llama-api-key", "from_config": "chat_api_key"}
    run = run_values(homelab_values, secrets={"chat_api_key": SECRET})
    files = manifests(run)
    text = "".join(dump(m) for m in files.values())
    assert SECRET not in text
    secret = files["secret_ai_llama-api-key.yaml"]
    assert secret["stringData"] == {"api-keys": SECRET_TEXT, "metrics-token": SECRET_TEXT}
    plain_outputs = {k: v for k, v in run.outputs.items() if k not in run.secret_outputs}
    assert SECRET not in repr(plain_outputs)


def test_rendered_folder_holds_no_placeholder_credential(tmp_path):
    """The folder is safe to `kubectl apply -k`: no Secret with a placeholder value; SECRETS.md says
    what to create first, by name, namespace and key."""
    result = render_stack("strix-halo", tmp_path / "out")
    out = tmp_path / "out"
    secrets = [m for m in result.files.values() if m["kind"] == "Secret"]
    assert len(secrets) >= 5
    listed = yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
    assert all(yaml.safe_load((out / name).read_text())["kind"] != "Secret" for name in listed)
    assert sorted(p.name for p in out.glob("*.yaml")) == sorted([*listed, "kustomization.yaml"])
    for path in out.iterdir():
        if path.is_file():
            assert SECRET_TEXT not in path.read_text() and "offline-render-placeholder" not in path.read_text()
    guide = (out / "SECRETS.md").read_text()
    for secret in secrets:
        meta = secret["metadata"]
        keys = " ".join(f"--from-file={k}=./{meta['name']}.{k}" for k in sorted(secret["stringData"]))
        assert f"kubectl -n {meta['namespace']} create secret generic {meta['name']} {keys}" in guide
    assert f"{len(secrets)} Secret(s) are not in the folder" in result.summary()


def test_cli_error_is_one_line_and_non_zero(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "render", "no-such-stack", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "no stack 'no-such-stack'" in proc.stderr
    assert not out.exists()


def test_cli_renders_and_summarises(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "render", "homelab", "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "llama-server" in proc.stdout and "memory 24Gi/32Gi" in proc.stdout
    assert "https://llm.renner.uno" in proc.stdout and "gpu.intel.com/i915=1" in proc.stdout


def test_summary_reads_at_a_glance(tmp_path):
    result = render_stack("strix-halo", tmp_path / "out")
    lines = result.summary().splitlines()
    servers = [l.split()[0] for l in lines[lines.index("  model servers:") + 1:] if "(request/limit)" in l]
    header = next(i for i, l in enumerate(lines) if l.split()[:2] == ["server", "weights"])
    table = [l.split()[0] for l in lines[header + 1:header + 1 + len(servers)]]
    assert servers == table == [m.name for m in result.run.config.models.values()]
    # Every column lines up: each cell of a row ends where its header ends.
    rows = lines[header:header + 1 + len(servers)]
    ends = lambda row: [m.end() for m in re.finditer(r"\S+(?: \S+)*", row)]  # noqa: E731
    assert all(ends(row)[1:] == ends(rows[0])[1:] for row in rows)
    plan = result.run.outputs["capacity_plan"]["servers"]
    embedding = [k for k, m in result.run.config.models.items() if m.role == "embedding"]
    assert embedding and all(plan[k]["decode_bound_tok_s"] is None for k in embedding)


def test_decode_column_stays_apart_past_100_tok_s():
    from render.output import plan_tables

    plan = {"nodes": [], "servers": {"x": {
        "name": "x", "memory_request": "1Gi", "memory_limit": "2Gi", "decode_bound_tok_s": 107.5,
        "decode_predicted_tok_s": {"empty": 101.2, "half": 99.5, "full": 97.0},
        "prefill_tok_s": 2514.3, "first_token_full_s": 12.04,
        "budget": {"startup_seconds": 600},
        "estimate": {k: 0.1 for k in ("weights_gib", "kv_gib", "recurrent_gib", "overhead_gib", "host_caches_gib", "total_gib")},
    }}}
    row = plan_tables(plan)[-1]
    assert re.search(r" 10 min           101/99\.5/97\.0 tok/s  107\.5 tok/s +2,514 tok/s \(12\.0 s\)$", row), row


@pytest.mark.parametrize("stack", STACKS)
def test_plan_picture_draws_the_plans_figures(tmp_path, stack):
    import json
    import xml.etree.ElementTree as ET

    result = render_stack(stack, tmp_path / "out")
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    svg = ET.parse(tmp_path / "out" / "plan.svg").getroot()
    rects = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if "data-part" in r.attrib]
    servers = {s["name"]: s for s in plan["servers"].values()}
    estimates = estimates_by_workload(plan)  # a split's helpers are workloads of their own
    for node in plan["nodes"]:
        where = f"{node['pool']}/{node['node'] + 1}"
        mine = [r for r in rects if r.get("data-node") == where]
        (budget,) = [r for r in mine if r.get("data-part") == "offers"]
        assert float(budget.get("data-gib")) == pytest.approx(node["offers_gib"], abs=1e-3)
        scale = float(budget.get("width")) / node["offers_gib"]
        for name, limit in node["workloads"].items():
            parts = {r.get("data-part"): float(r.get("data-gib")) for r in mine if r.get("data-server") == name}
            assert sum(parts.values()) == pytest.approx(limit, abs=1e-2)  # the pod's memory limit
            # A part of zero GiB (weights that all live in VRAM) is not drawn.
            assert parts.get("weights", 0.0) == pytest.approx(estimates[name]["weights_gib"], abs=1e-3)
        headroom = [float(r.get("data-gib")) for r in mine if r.get("data-part") == "headroom"]
        assert sum(headroom) == pytest.approx(max(node["free_gib"], 0), abs=1e-3)
        drawn = sum(float(r.get("width")) for r in mine if r.get("data-part") not in ("offers",))
        assert drawn == pytest.approx(float(budget.get("width")), rel=1e-3)  # bars fill the budget exactly
        assert scale > 0
        for gpu in node.get("gpus", []):
            # A discrete GPU's bar: each server's VRAM, as the plan has it, on the same scale.
            label = f"{where} GPU {gpu['gpu'] + 1}"
            vram = {r.get("data-server"): float(r.get("data-gib")) for r in rects
                    if r.get("data-node") == label and r.get("data-part") == "vram"}
            assert vram == pytest.approx({n: servers[n]["vram"]["total_gib"] for n in gpu["workloads"]}, abs=1e-3)
            (size,) = [r for r in rects if r.get("data-node") == label and r.get("data-part") == "vram-size"]
            assert float(size.get("width")) == pytest.approx(gpu["vram_gib"] * scale, rel=1e-3)
            # Each share of the card is named: under the bar always, on it where it is wide enough.
            (caption,) = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text") if t.get("data-gpu") == label]
            assert all(f"{n} {gib:.1f}" in caption for n, gib in gpu["workloads"].items())
            labels = {t.get("data-label") for t in svg.iter("{http://www.w3.org/2000/svg}text") if t.get("data-label")}
            widest = max(gpu["workloads"], key=gpu["workloads"].get)
            assert widest in labels
    # Every colour drawn is in the legend (the GPU rows' too).
    legend = {r.get("fill") for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("data-legend")}
    assert {r.get("fill") for r in rects if r.get("fill") != "none"} <= legend
    # The decode figures: the prediction (context empty and full) for every chat server that has one.
    texts = {t.get("data-server"): t for t in svg.iter("{http://www.w3.org/2000/svg}text") if t.get("data-server")}
    for name, server in servers.items():
        predicted = server.get("decode_predicted_tok_s")
        if predicted:
            assert float(texts[name].get("data-decode-empty")) == pytest.approx(predicted["empty"], abs=0.01)
            assert float(texts[name].get("data-decode-full")) == pytest.approx(predicted["full"], abs=0.01)
    assert f"plan picture: {tmp_path / 'out' / 'plan.svg'}" in result.summary()


def test_the_render_shows_what_the_program_warns_about(tmp_path):
    """A stack without kubernetes:enableSecretMutable renders, and says what a key rotation would do."""
    stack = (ROOT / "Pulumi.homelab.yaml").read_text().replace('  kubernetes:enableSecretMutable: "true"\n', "")
    (tmp_path / "Pulumi.homelab.yaml").write_text(stack)
    result = render_stack("homelab", tmp_path / "out", project_dir=tmp_path)
    assert ("  warning: kubernetes:enableSecretMutable is not true: a rotated key replaces its Secret and readers "
            "briefly find none; run: pulumi config set kubernetes:enableSecretMutable true") in result.summary()
    shipped = render_stack("homelab", tmp_path / "shipped")
    # The shipped stack sets it; its one warning is the seed's memory request below the estimate.
    assert [line for line in shipped.summary().splitlines() if "warning:" in line] == [
        line for line in shipped.summary().splitlines() if "warning: models.chat.resources.memory_request 24Gi" in line
    ] != []


def test_a_router_stack_without_mutable_configmaps_says_what_a_library_edit_would_do(tmp_path):
    """The router's preset changes with every model added: replaced (delete-first) unless the provider
    updates ConfigMaps in place. The shipped on-demand stack sets it and does not warn."""
    line = '  kubernetes:enableConfigMapMutable: "true"\n'
    text = (ROOT / "Pulumi.rtx3090-library.yaml").read_text()
    assert line in text
    (tmp_path / "Pulumi.rtx3090-library.yaml").write_text(text.replace(line, ""))
    result = render_stack("rtx3090-library", tmp_path / "out", project_dir=tmp_path)
    assert ("  warning: kubernetes:enableConfigMapMutable is not true: adding or removing a model of "
            "models.library.on_demand replaces its ConfigMap, deleted first; run: pulumi config set "
            "kubernetes:enableConfigMapMutable true") in result.summary()
    shipped = render_stack("rtx3090-library", tmp_path / "shipped")
    assert "enableConfigMapMutable" not in shipped.summary()


def _stack_text_render(tmp_path, text: str) -> subprocess.CompletedProcess:
    (tmp_path / "Pulumi.mine.yaml").write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "render", "mine", "--out", str(tmp_path / "out"), "--stack-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """PyYAML's default keeps the last of two equal keys: a second `chat:` pasted under models
    would drop the first server without a word (and `pulumi up` would delete it)."""
    text = (ROOT / "Pulumi.homelab.yaml").read_text()
    lines = text.splitlines()
    models = lines.index("  inference-plane:models:")
    chat = lines.index("    chat:")
    pasted = "\n".join(lines[:models + 1] + ["    chat:", "      role: chat"] + lines[models + 1:]) + "\n"
    proc = _stack_text_render(tmp_path, pasted)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    # The original chat: (two lines further down now) is the second one; the pasted one is first.
    assert f"Pulumi.mine.yaml:{chat + 3}:5: duplicate key 'chat' (first at line {models + 2})" in proc.stderr
    assert "remove or rename one" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_yes_and_no_are_strings_as_the_pulumi_cli_reads_them(tmp_path):
    text = (ROOT / "Pulumi.homelab.yaml").read_text()
    assert text.count("      webui: false\n") == 1
    no_webui = text.replace("      webui: false\n", "      webui: no\n")
    proc = _stack_text_render(tmp_path, no_webui)
    assert proc.returncode == 2
    assert "models.embed.webui" in proc.stderr and "'no'" in proc.stderr


def test_the_summary_counts_the_files_it_wrote(tmp_path):
    result = render_stack("strix-halo", tmp_path / "out")
    written = [p for p in (tmp_path / "out").glob("*.yaml") if p.name != "kustomization.yaml"]
    secrets = sum(1 for m in result.files.values() if m["kind"] == "Secret")
    assert secrets > 0
    assert result.summary().splitlines()[0].startswith(
        f"rendered stack 'strix-halo': {len(written)} manifests in {tmp_path / 'out'} (and {secrets} Secrets to create, SECRETS.md)"
    )


def test_a_new_render_keeps_what_it_did_not_write(tmp_path):
    """The folder is replaced whole: a file a user put there (a SealedSecret, as SECRETS.md
    suggests) or another stack's render is not deleted silently."""
    out = tmp_path / "out"
    render_stack("homelab", out)
    sealed = out / "sealedsecret_ai_llama-server-api-key.yaml"
    sealed.write_text("kind: SealedSecret\n")
    with pytest.raises(RenderError, match=r"holds files the render did not write \(sealedsecret_ai_llama-server-api-key\.yaml\)"):
        render_stack("homelab", out)
    assert sealed.exists()
    sealed.unlink()
    render_stack("homelab", out)  # its own files only: replaced as before
    with pytest.raises(RenderError, match=r"holds the render of Pulumi\.homelab\.yaml, not Pulumi\.cpu-cluster\.yaml"):
        render_stack("cpu-cluster", out)
    assert (out / "deployment_ai_llama-server.yaml").exists()


def test_stack_files_read_as_yaml_v3_reads_them():
    """The Pulumi CLI reads stack files with Go's yaml.v3: merge keys work (a key written beside
    one overrides it), and scalars resolve as its resolve.go does, not as YAML 1.1."""
    from render.offline import StackFileError, load_stack_text

    text = "base: &b {a: 1, c: 1}\nx: {<<: *b, c: 2}\nn: [1:30, 0o17, 1e3, =, 2024-01-01, 1_000, on, no, True]\n"
    document = load_stack_text(text, "Pulumi.t.yaml")
    assert document["x"] == {"a": 1, "c": 2}
    assert document["n"] == ["1:30", 15, 1000.0, "=", "2024-01-01", 1000, "on", "no", True]
    with pytest.raises(StackFileError, match=r"^Pulumi\.t\.yaml:2:1: duplicate key 'a' \(first at line 1\)"):
        load_stack_text("a: 1\na: 2\n", "Pulumi.t.yaml")


def test_the_benchmarks_synthetic_stack_renders(tmp_path):
    """make bench renders N-server synthetic stacks; a change of defaults must not break them unseen."""
    from lab.bench.run import synthetic_stack

    (tmp_path / "Pulumi.synthetic-3.yaml").write_text(yaml.safe_dump(synthetic_stack(3)))
    result = render_stack("synthetic-3", tmp_path / "out", project_dir=tmp_path)
    deployments = [m for m in result.files.values() if m["kind"] == "Deployment"]
    assert len(deployments) == 3 and any(m["kind"] == "CiliumNetworkPolicy" for m in result.files.values())
