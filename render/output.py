"""Render a stack to a folder of manifests: all or nothing."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .engine import PROJECT_DIR, ProgramRun, run_stack
from .manifests import SECRET_TEXT, dump, manifests
from .validate import ManifestError, validate_all

MARKER = ".inference-plane-render"


class RenderError(Exception):
    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class RenderResult:
    stack: str
    out: Path
    run: ProgramRun
    files: dict[str, dict[str, Any]]

    def summary(self) -> str:
        kinds = Counter(m["kind"] for m in self.files.values())
        lines = [f"rendered stack {self.stack!r}: {len(self.files)} manifests in {self.out}, all valid"]
        lines.append("  " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())))
        endpoints = self.run.outputs.get("endpoints", {})
        lines.append("  model servers:")
        for manifest in self.files.values():
            if manifest["kind"] not in ("Deployment", "StatefulSet"):
                continue
            container = manifest["spec"]["template"]["spec"]["containers"][0]
            resources = container.get("resources", {})
            requests, limits = resources.get("requests", {}), resources.get("limits", {})
            gpus = [f"{k}={v}" for k, v in limits.items() if k not in ("cpu", "memory")]
            name = manifest["metadata"]["name"]
            endpoint = next(
                (e.get("external_url") or e["url"] for e in endpoints.values() if f"//{name}." in e["url"]), "-"
            )
            startup = container.get("startupProbe", {})
            budget_min = startup.get("periodSeconds", 0) * startup.get("failureThreshold", 0) / 60
            lines.append(
                f"    {name:<16} memory {requests.get('memory', '-')}/{limits.get('memory', '-')}"
                f"  gpu {', '.join(gpus) or 'none'}  startup {budget_min:.0f} min  {endpoint}"
            )
        if any(m["kind"] == "Secret" for m in self.files.values()):
            lines.append(f"  Secret values are not rendered: they read {SECRET_TEXT!r}")
        return "\n".join(lines)


def _kustomization(files: dict[str, dict[str, Any]]) -> str:
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(files),
    }
    return yaml.safe_dump(document, sort_keys=False)


def render_stack(stack: str, out: Path, project_dir: Path = PROJECT_DIR) -> RenderResult:
    import pulumi

    from components.config import ConfigError

    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise RenderError(f"{out} exists and is not a previous render; choose another --out", exit_code=2)
    try:
        run = run_stack(stack, project_dir)
    except FileNotFoundError as error:
        raise RenderError(str(error), exit_code=2) from None
    except (ConfigError, pulumi.RunError) as error:
        raise RenderError(str(error), exit_code=2) from None
    try:
        files = manifests(run)
        validate_all(files.items(), run.config.cluster.kubernetes_version)
    except (ManifestError, ValueError) as error:
        raise RenderError(f"invalid manifest: {error}") from None

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)
    try:
        for name, manifest in files.items():
            (staging / name).write_text(dump(manifest))
        (staging / "kustomization.yaml").write_text(_kustomization(files))
        (staging / MARKER).write_text(f"rendered by inference-plane from Pulumi.{stack}.yaml; do not edit\n")
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
