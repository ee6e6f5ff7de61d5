"""Regenerate the vendored strict CRD schemas (schemas/crd) from CustomResourceDefinition YAML.

    python tools/crd_schemas.py CRD.yaml [CRD.yaml ...] [--out schemas/crd]

For each served version of each CRD it writes `<group>/<kind lower>_<version>.json`: the version's
openAPIV3Schema with `additionalProperties: false` on every object that lists `properties` (unless it
preserves unknown fields), `anyOf`/`oneOf`/`allOf` branches left open as structural schemas require,
and `metadata` left to the API server. A real API server prunes an unknown field silently; these
schemas reject it, so a misspelt field fails the render instead of vanishing in the cluster.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

BRANCHES = ("anyOf", "oneOf", "allOf")


def strict(node: Any, in_branch: bool = False) -> Any:
    if isinstance(node, list):
        return [strict(n, in_branch) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in BRANCHES:
            out[key] = [strict(v, True) for v in value]
        elif key == "properties":
            out[key] = {name: strict(v) for name, v in value.items()}
        else:
            out[key] = strict(value, in_branch)
    if ("properties" in out and not in_branch and not out.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in out):
        out["additionalProperties"] = False
    return out


def schemas(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = crd["spec"]
    out = {}
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        schema = strict(version["schema"]["openAPIV3Schema"])
        # Left to the API server (ObjectMeta), as in the published kubeconform schemas.
        schema.setdefault("properties", {})["metadata"] = {"type": "object"}
        out[f"{spec['group']}/{spec['names']['kind'].lower()}_{version['name']}.json"] = schema
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crds", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "schemas" / "crd")
    args = parser.parse_args()
    for path in args.crds:
        for document in yaml.safe_load_all(path.read_text()):
            if not document or document.get("kind") != "CustomResourceDefinition":
                continue
            for name, schema in schemas(document).items():
                target = args.out / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
                print(target)


if __name__ == "__main__":
    main()
