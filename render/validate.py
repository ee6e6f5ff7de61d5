"""Strict schema validation of rendered manifests.

Core kinds are checked against the strict schemas that ship in the ``kubernetes-validate``
package, for the stack's Kubernetes version; custom resources against the strict JSON Schemas
vendored in ``schemas/crd`` (kubeconform layout; provenance in ``schemas/README.md``), or wherever ``INFERENCE_PLANE_CRD_SCHEMAS``
points. A schema is parsed and compiled once per kind, not once per object.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import jsonschema
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

from .offline import PROJECT_DIR

CRD_SCHEMAS_ENV = "INFERENCE_PLANE_CRD_SCHEMAS"
DEFAULT_CRD_SCHEMAS = PROJECT_DIR / "schemas" / "crd"  # vendored: a clone validates on its own


class ManifestError(Exception):
    """A manifest that a strict schema rejects; ``str()`` is one line naming file and field."""


def crd_schema_dir() -> Path:
    return Path(os.environ.get(CRD_SCHEMAS_ENV) or DEFAULT_CRD_SCHEMAS)


def _core_api(api_version: str) -> str:
    """kubernetes-validate's file naming: networking.k8s.io/v1 -> networking-v1, v1 -> v1."""
    return re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)


@lru_cache(maxsize=None)
def _core_schema_dir(k8s_version: str) -> str:
    versions = [v for v in kv.all_versions() if kv.major_minor(v) == k8s_version]
    if not versions:
        supported = sorted({kv.major_minor(v) for v in kv.all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
        raise ManifestError(f"cluster.kubernetes_version: {k8s_version} has no schemas to check the manifests against "
                            f"(kubernetes-validate knows {supported[0]} to {supported[-1]}); set your cluster's version "
                            "within them")
    return f"kubernetes-json-schema/v{versions[-1]}-local-strict"


@lru_cache(maxsize=None)
def _core_registry(k8s_version: str) -> Registry:
    schema_dir = _core_schema_dir(k8s_version)
    return Resource.from_contents(kv.schema_contents(f"{schema_dir}/_definitions.json", k8s_version)) @ Registry()


@lru_cache(maxsize=None)
def _core_validator(kind: str, api_version: str, k8s_version: str):
    """None when kubernetes-validate has no schema for the kind (a custom resource)."""
    path = f"{_core_schema_dir(k8s_version)}/{kind.lower()}-{_core_api(api_version)}.json"
    try:
        schema = kv.schema_contents(path, k8s_version)
    except FileNotFoundError:
        return None
    registry = Resource.from_contents(schema) @ _core_registry(k8s_version)
    return jsonschema.Draft202012Validator(schema, registry=registry)


@lru_cache(maxsize=None)
def _crd_validator(kind: str, api_version: str, directory: Path) -> jsonschema.protocols.Validator:
    group, version = api_version.split("/")
    path = directory / group / f"{kind.lower()}_{version}.json"
    if not path.is_file():
        raise ManifestError(
            f"no schema for {kind} {api_version} at {path}; set {CRD_SCHEMAS_ENV} to a kubeconform-layout schema folder"
        )
    schema = json.loads(path.read_text())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def validator_for(manifest: dict[str, Any], k8s_version: str) -> jsonschema.protocols.Validator:
    kind, api_version = manifest["kind"], manifest["apiVersion"]
    core = _core_validator(kind, api_version, k8s_version)
    if core is not None:
        return core
    if "/" not in api_version or "." not in api_version.split("/")[0]:
        raise ManifestError(f"no strict schema for {kind} {api_version} in Kubernetes {k8s_version}")
    return _crd_validator(kind, api_version, crd_schema_dir().resolve())


def validate(name: str, manifest: dict[str, Any], k8s_version: str) -> None:
    validator = validator_for(manifest, k8s_version)
    error = jsonschema.exceptions.best_match(validator.iter_errors(manifest))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ManifestError(f"{name}: {manifest['kind']} {where}: {error.message}")


def validate_all(rendered: Iterable[tuple[str, dict[str, Any]]], k8s_version: str) -> int:
    count = 0
    for name, manifest in rendered:
        validate(name, manifest, k8s_version)
        count += 1
    return count
