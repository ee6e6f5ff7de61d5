"""A clone works on its own: nothing is read from ../shared at run time, and the vendored
schema generator keeps the strictness the render relies on."""

from __future__ import annotations

import shutil
import subprocess
import sys

import yaml

from conftest import ROOT


def test_a_copy_with_nothing_beside_it_renders(tmp_path):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    clone = tmp_path / "deep" / "clone"  # ../shared does not exist from here
    for name in files:
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    assert not (clone.parent / "shared").exists()
    result = subprocess.run([sys.executable, "-m", "render", "strix-halo", "--out", str(tmp_path / "out")],
                            cwd=clone, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in (tmp_path / "out").glob("*.yaml")}
    assert {"AIGatewayRoute", "CiliumNetworkPolicy", "VMServiceScrape"} <= kinds  # custom kinds validated


def test_schema_generator_closes_objects_but_not_branches():
    from tools.crd_schemas import schemas

    crd = {"spec": {"group": "example.io", "names": {"kind": "Widget"}, "versions": [
        {"name": "v1", "served": True, "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {"a": {"type": "string"}},
                     "anyOf": [{"properties": {"a": {"type": "string"}}}]},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"x": {}}}}}}},
        {"name": "v0", "served": False, "schema": {"openAPIV3Schema": {}}}]}}
    out = schemas(crd)
    assert list(out) == ["example.io/widget_v1.json"]
    schema = out["example.io/widget_v1.json"]
    # metadata is the API server's (ObjectMeta): present, open.
    assert schema["additionalProperties"] is False and schema["properties"]["metadata"] == {"type": "object"}
    spec = schema["properties"]["spec"]
    assert spec["additionalProperties"] is False
    assert "additionalProperties" not in spec["anyOf"][0]
    assert "additionalProperties" not in schema["properties"]["free"]
