"""Render a stack to a folder of manifests: all or nothing."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from common.constants import RPC_HELPER_LABEL
from components.meta import VALUE_NOTES_ANNOTATION

from .offline import PROJECT_DIR, ProgramRun, StackFileError, run_stack
from .manifests import dump, manifests
from .picture import node_label, plan_svg
from .prerequisites import prerequisites, prerequisites_text
from .reach import reach_lines
from .validate import ManifestError, validate_all
from common.errors import one_line
from components.namespace import egress_summary
from common.constants import probe_allows_seconds
from policy.rules import RESOURCE_RULES, STACK_RULES, run_rules


def predicted_cell(predicted: Optional[dict], span: Optional[dict] = None, why: Sequence[str] = ()) -> str:
    """The predicted decode rates (engines/llamacpp_speed.py), context empty / half / full; where the CPU does
    part of the work on a node whose read bandwidth or decode figures are not measured, or a quantized KV cache
    runs on a backend where its cost is not measured, the range to the high end and why."""
    if not predicted:
        return "-"
    def rate(value: float) -> str:
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"
    cell = "/".join(rate(predicted[k]) for k in ("empty", "half", "full")) + " tok/s"
    if span:
        cell += " (to " + "/".join(rate(span[k][1]) for k in ("empty", "half", "full")) + ": " + "; ".join(why) + ")"
    return cell


def prefill_cell(rate: Optional[float], first_token_s: Optional[float]) -> str:
    """Prompt processing at a 4096-token prompt, and the wait for the first token of a full-context prompt."""
    if not rate:
        return "-"
    return f"{rate:,.0f} tok/s ({first_token_s:.1f} s)" if first_token_s < 100 else f"{rate:,.0f} tok/s ({first_token_s / 60:.1f} min)"


def vram_cell(vram: dict, split: Optional[dict] = None) -> str:
    """The VRAM column: per card, with where the layers and experts are (a split's main server: its blocks, and how
    many its helpers hold, so it does not read as a partial offload)."""
    where = f"{vram['layers_offloaded']}/{vram['layers']} layers"
    if split:
        helpers = split.get("helpers") or []
        where += f", {sum(h['blocks'] for h in helpers)} on its {len(helpers)} RPC helper{'s' if len(helpers) > 1 else ''}"
    if vram.get("experts_in_ram"):
        where += f", experts of {vram['experts_in_ram']} in RAM"
    if vram.get("gpus", 1) > 1:
        where += f", x{vram['gpus']} GPUs"
    return f"{vram['total_gib']:.1f} ({where})"


def policy_config(run: ProgramRun) -> dict:
    """The pack's config for this stack, as `pulumi config` would give it to the policies."""
    label = run.config.cluster.public_dns_label
    return {"publicDnsLabels": [label] if label else []}

MARKER = ".inference-plane-render"


class RenderError(Exception):
    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(one_line(message))
        self.exit_code = exit_code


@dataclass
class RenderResult:
    stack: str
    out: Path
    run: ProgramRun
    files: dict[str, dict[str, Any]]

    def summary(self) -> str:
        kinds = Counter(m["kind"] for m in self.files.values())
        written = sum(n for kind, n in kinds.items() if kind != "Secret")
        lines = [
            f"rendered stack {self.stack!r}: {written} manifests in {self.out} (and {kinds['Secret']} Secrets to create, "
            f"{SECRETS_FILE}), all valid, {len(RESOURCE_RULES) + len(STACK_RULES)} policies passed"
            if kinds["Secret"] else
            f"rendered stack {self.stack!r}: {written} manifests in {self.out}, all valid, "
            f"{len(RESOURCE_RULES) + len(STACK_RULES)} policies passed"
        ]
        lines.append("  " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())))
        endpoints = self.run.outputs.get("endpoints", {})
        plans = (self.run.outputs.get("capacity_plan") or {}).get("servers", {})
        key_of = {model.name: key for key, model in self.run.config.models.items()}
        lines.append("  model servers:")
        # The same order as the capacity table: the stack's models, as configured.
        order = {model.name: i for i, model in enumerate(self.run.config.models.values())}
        workloads = sorted((m for m in self.files.values() if m["kind"] in ("Deployment", "StatefulSet")),
                           key=lambda m: order.get(m["metadata"]["name"], len(order)))
        for manifest in workloads:
            container = manifest["spec"]["template"]["spec"]["containers"][0]
            resources = container.get("resources", {})
            requests, limits = resources.get("requests", {}), resources.get("limits", {})
            gpus = [f"{k}={v}" for k, v in limits.items() if k not in ("cpu", "memory")]
            name = manifest["metadata"]["name"]
            key = key_of.get(name)
            served = endpoints.get(key, {})
            endpoint = served.get("external_url") or served.get("url", "-")
            startup = container.get("startupProbe", {})
            budget_min = probe_allows_seconds(startup.get("periodSeconds", 0), startup.get("failureThreshold", 0)) / 60
            waited = f", wait {plans[key]['budget']['wait_seconds'] / 60:.0f} min" if key in plans else ""
            replicas = manifest["spec"].get("replicas", 1)
            labels = manifest["spec"]["template"]["metadata"].get("labels") or {}
            if RPC_HELPER_LABEL in labels:
                args = container.get("args") or []
                port = args[args.index("-p") + 1] if "-p" in args else "?"
                lines.append(f"    {name:<16} {manifest['kind']} x{replicas}  memory {requests.get('memory', '-')}/"
                             f"{limits.get('memory', '-')} (request/limit)  gpu {', '.join(gpus) or 'none'}  RPC helper of "
                             f"{labels[RPC_HELPER_LABEL]} on port {port}")
                continue
            lines.append(
                f"    {name:<16} {manifest['kind']} x{replicas}  memory {requests.get('memory', '-')}/"
                f"{limits.get('memory', '-')} (request/limit)  gpu {', '.join(gpus) or 'none'}  startup {budget_min:.0f} min{waited}"
                f"  {endpoint}"
            )
        lines.extend(reach_lines(list(self.files.values()), self.run.config))
        lines.append("  egress: " + egress_summary(self.run.config.namespace, self.run.config.cluster))
        # What the program warned about (as `pulumi preview` would show it), one line each.
        lines.extend(f"  warning: {one_line(message)}" for message in self.run.logs)
        lines.extend(plan_tables(self.run.outputs.get("capacity_plan")))
        if (self.out / "plan.svg").exists():
            lines.append(f"  plan picture: {self.out / 'plan.svg'}")
        secrets = sum(1 for m in self.files.values() if m["kind"] == "Secret")
        needs = [what for what, _, _ in prerequisites(list(self.files.values()))]
        if needs:
            lines.append(f"  the cluster must already have ({self.out / PREREQUISITES_FILE}): {'; '.join(needs)}")
        if secrets:
            lines.append(f"  {secrets} Secret(s) are not in the folder (values live in Pulumi only): with kubectl, apply the "
                         f"namespace, create them, then apply the folder, as {self.out / SECRETS_FILE} says")
        return "\n".join(lines)


def plan_tables(plan: dict | None) -> list[str]:
    """The capacity plan as two small tables: per node, and per model server."""
    if not plan:
        return []
    lines = ["  capacity plan (GiB):", f"    {'pool/node':<22}{'offers':>8}{'planned':>9}{'free':>8}"]
    for node in plan["nodes"]:
        where = node_label(node)
        lines.append(f"    {where:<22}{node['offers_gib']:>8.1f}{node['planned_gib']:>9.1f}{node['free_gib']:>8.1f}")
        for gpu in node.get("gpus", []):
            # Discrete GPUs: VRAM is planned per card, beside the node's system RAM.
            free = gpu["vram_gib"] - gpu["planned_gib"]
            lines.append(f"    {'  GPU ' + str(gpu['gpu'] + 1) + ' VRAM':<22}{gpu['vram_gib']:>8.1f}{gpu['planned_gib']:>9.1f}{free:>8.1f}")
    discrete = any("vram" in server for server in plan["servers"].values())
    header = ["server", "weights", "KV", "state", "backend", "caches", "total", "mem request", "mem limit",
              "startup", "decode ~ empty/half/full ctx", "decode <=", "prefill ~ (full ctx: first token)"]
    if discrete:
        header[1:1] = ["VRAM"]
    rows = []
    for server in plan["servers"].values():
        e = server["estimate"]
        bound = server["decode_bound_tok_s"]
        row = [
            server["name"], f"{e['weights_gib']:.1f}", f"{e['kv_gib']:.2f}", f"{e['recurrent_gib']:.2f}",
            f"{e['overhead_gib']:.1f}", f"{e['host_caches_gib']:.1f}", f"{e['total_gib']:.1f}",
            server["memory_request"], server["memory_limit"], f"{server['budget']['startup_seconds'] / 60:.0f} min",
            predicted_cell(server.get("decode_predicted_tok_s"), server.get("decode_range_tok_s"),
                           server.get("decode_range_why")),
            f"{bound:.1f} tok/s" if bound else "-",
            prefill_cell(server.get("prefill_tok_s"), server.get("first_token_full_s")),
        ]
        if discrete:
            vram = server.get("vram")
            row[1:1] = [vram_cell(vram, server.get("split")) if vram else "-"]
        rows.append(row)
    if discrete:
        lines.append("    (VRAM: on the GPU; the other columns: system RAM)")
    # Columns as wide as their widest cell, two spaces apart: aligned whatever the figures.
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("    " + "  ".join(cells).rstrip())
    for server in plan["servers"].values():
        lines += residency_lines(server)
    return lines


def residency_lines(server: dict) -> list[str]:
    """A router's residency: how many of its models stay loaded, how full a resident set keeps the budget,
    and each model's share, swap and speed (plan.json has the rest)."""
    residency = server.get("residency")
    if not residency:
        return []
    models, fill = residency["models"], residency["fill"]
    on_card = residency["vram_budget_gib"] is not None
    budget = residency["vram_budget_gib"] if on_card else residency["ram_budget_gib"]
    pinned = [name for name, m in models.items() if m["pinned"]]
    cap = f", at most {residency['max_loaded']}" if residency["max_loaded"] is not None else ""
    lines = [f"  models on demand, {server['name']}: loaded while they fit the {budget:.1f} GiB {'VRAM' if on_card else 'RAM'} "
             f"budget (up to {residency['most_resident']} of {len(models)} at once{cap}); to load another, the admission "
             f"proxy unloads the least recently used idle model{', never ' + ', '.join(pinned) + ' (pinned)' if pinned else ''}; "
             + (f"a full set holds {fill['worst']:.0%}-{fill['best']:.0%} of the budget (typical {fill['typical']:.0%})"
                if fill is not None else "more sets fit than the plan walks: the count and the pod's memory are "
                "bounds (the largest models that many), and no full set's share is said")]
    header = ["model", "VRAM" if on_card else "RAM", "RAM", "swap warm/cold", "decode ~ empty/half/full ctx"]
    rows = [[name + (" (vision)" if m.get("multimodal") else ""), f"{m['vram_gib' if on_card else 'ram_gib']:.1f}", f"{m['ram_gib']:.1f}",
             f"{m['swap_seconds']['warm']:g}/{m['swap_seconds']['cold']:g} s",
             predicted_cell(m.get("decode_predicted_tok_s"))] for name, m in models.items()]
    if not on_card:
        header, rows = [h for i, h in enumerate(header) if i != 2], [[c for i, c in enumerate(r) if i != 2] for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("    " + "  ".join(cells).rstrip())
    return lines


PREREQUISITES_FILE = "PREREQUISITES.md"
SECRETS_FILE = "SECRETS.md"


def supplied_secrets(run: ProgramRun) -> list[str]:
    """Secrets the stack names but neither the program nor cert-manager creates."""
    gateway = run.config.gateway if run.config is not None else None
    if gateway is None or gateway.client_ca_secret is None:
        return []
    return [f"`{gateway.client_ca_secret}` in namespace `{run.config.namespace.name}` (key: ca.crt): the CA that signs "
            "the clients' certificates (gateway.client_ca_secret; the gateway requires and verifies them)"]


def secrets_to_create(stack: str, secrets: list[dict[str, Any]], supplied: Optional[list[str]] = None,
                      namespace_files: Optional[list[str]] = None) -> str:
    """The kubectl path, in the order it works: the cluster's prerequisites, the namespace, one
    command per Secret (values left to the user, with what each key must hold), then the folder;
    ``supplied``: Secrets the stack refers to but never creates."""
    ordered = sorted(secrets, key=lambda m: (m["metadata"].get("namespace", ""), m["metadata"]["name"]))
    first = ordered[0]["metadata"]["name"]
    first_key = sorted({*(ordered[0].get("stringData") or {}), *(ordered[0].get("data") or {})})[0]
    namespaces = " ".join(f"-f {name}" for name in namespace_files or [])
    lines = [
        f"# Applying this folder with kubectl (stack {stack})",
        "",
        "`pulumi up` does all of this itself. This folder holds no Secret objects: their values are Pulumi",
        "secrets, never written here. In this folder, in this order:",
        "",
        f"1. What the cluster must already run: {PREREQUISITES_FILE}.",
        *([f"2. The namespace, which the Secrets go into: `kubectl apply {namespaces}`"] if namespaces else []),
        "3. Each Secret below, with its real value (or the equivalent SealedSecret / SOPS-encrypted Secret in",
        "   your GitOps repository, kept outside this folder: a new render replaces the folder whole). Write",
        f"   each value to its file without a trailing newline (`printf %s '<value>' > ./{first}.{first_key}`):",
        "   a header value cannot hold one.",
        "4. Everything else: `kubectl apply -k .`",
        "",
    ]
    for secret in ordered:
        meta = secret["metadata"]
        keys = sorted({*(secret.get("stringData") or {}), *(secret.get("data") or {})})
        # From files: a key file may hold two lines while a key rotates, which a literal cannot.
        # One file per Secret and key: four provider Secrets all hold an apiKey, each a different one.
        sources = " ".join(f"--from-file={k}=./{meta['name']}.{k}" for k in keys)
        lines += [f"- `{meta['name']}` in namespace `{meta.get('namespace', 'default')}` (keys: {', '.join(keys)})", ""]
        notes = (meta.get("annotations") or {}).get(VALUE_NOTES_ANNOTATION)
        if notes:
            lines += [f"  - `{line.split(': ', 1)[0]}`: {line.split(': ', 1)[1]}" for line in notes.splitlines()] + [""]
        lines += [f"      kubectl -n {meta.get('namespace', 'default')} create secret generic {meta['name']} {sources}", ""]
    if supplied:
        lines += ["Also referred to, never created by `pulumi up` either (they must exist in both cases):", ""]
        lines += [f"- {what}" for what in supplied] + [""]
    return "\n".join(lines)


def _kustomization(files: dict[str, dict[str, Any]]) -> str:
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(files),
    }
    return dump(document)


def _check_previous_render(out: Path, stack: str) -> None:
    """A new render replaces the folder whole: refuse when that would drop something it did not
    write (a SealedSecret put beside the manifests) or another stack's render."""
    marker = out / MARKER
    if not marker.is_file():
        return
    first, *listed = marker.read_text().splitlines()
    origin = first.removeprefix("rendered by inference-plane from ").split(";")[0]
    if origin != f"Pulumi.{stack}.yaml":
        raise RenderError(f"{out}: holds the render of {origin}, not Pulumi.{stack}.yaml; choose another --out", exit_code=2)
    if listed:  # renders before this release listed nothing
        foreign = sorted(p.name for p in out.iterdir() if p.name not in {*listed, MARKER})
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" (+{len(foreign) - 3} more)" if len(foreign) > 3 else "")
            raise RenderError(f"{out}: holds files the render did not write ({shown}) and a new render would delete; "
                              "move them out of the folder first", exit_code=2)


def render_stack(stack: str, out: Path, project_dir: Path = PROJECT_DIR) -> RenderResult:
    import pulumi

    from common.errors import CapacityError
    from config import ConfigError

    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise RenderError(f"{out} exists and is not a previous render; choose another --out", exit_code=2)
    _check_previous_render(out, stack)
    try:
        run = run_stack(stack, project_dir)
    except (FileNotFoundError, StackFileError) as error:
        raise RenderError(str(error), exit_code=2) from None
    except (ConfigError, CapacityError, pulumi.RunError) as error:
        raise RenderError(str(error), exit_code=2) from None
    try:
        files = manifests(run)
    except (ManifestError, ValueError) as error:
        raise RenderError(f"invalid manifest: {error}") from None
    try:
        validate_all(files.items(), run.config.cluster.kubernetes_version)
    except ManifestError as error:
        # A version the schemas do not cover is the stack file's; anything else a manifest's.
        where = f"Pulumi.{stack}.yaml: " if str(error).startswith("cluster.kubernetes_version") else "invalid manifest: "
        raise RenderError(f"{where}{error}", exit_code=2 if where.startswith("Pulumi.") else 1) from None
    except ValueError as error:
        raise RenderError(f"invalid manifest: {error}") from None
    violations = run_rules(list(files.items()), policy_config(run))
    if violations:
        rule, resource, message = violations[0]
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise RenderError(f"policy {rule} violated by {resource}: {message}{more}")

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)
    try:
        # Secrets stay out of the folder a GitOps tool applies: their values exist only in Pulumi's
        # state, and a placeholder applied as a credential would become the credential.
        applied = {n: m for n, m in files.items() if m["kind"] != "Secret"}
        for name, manifest in applied.items():
            (staging / name).write_text(dump(manifest))
        (staging / "kustomization.yaml").write_text(_kustomization(applied))
        (staging / PREREQUISITES_FILE).write_text(prerequisites_text(stack, list(files.values()), run.config))
        secrets = [m for m in files.values() if m["kind"] == "Secret"]
        namespaces = sorted(name for name, m in applied.items() if m["kind"] == "Namespace")
        if secrets:
            (staging / SECRETS_FILE).write_text(secrets_to_create(stack, secrets, supplied_secrets(run), namespaces))
        if run.outputs.get("capacity_plan"):
            (staging / "plan.json").write_text(json.dumps(run.outputs["capacity_plan"], indent=2, sort_keys=True) + "\n")
            (staging / "plan.svg").write_text(plan_svg(run.outputs["capacity_plan"]))
        written = sorted(p.name for p in staging.iterdir())
        (staging / MARKER).write_text(f"rendered by inference-plane from Pulumi.{stack}.yaml; do not edit\n"
                                      + "".join(f"{name}\n" for name in written))
        if out.exists():
            retired = out.with_name(f".{out.name}.old")
            shutil.rmtree(retired, ignore_errors=True)
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired)
        else:
            staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return RenderResult(stack=stack, out=out, run=run, files=files)
