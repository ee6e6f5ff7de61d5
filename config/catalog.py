"""Architecture facts for known models, keyed by Hugging Face repo.

The facts live in ``catalog.yaml`` beside this module: one entry per GGUF repo, with the
``config.types.ModelFacts`` fields plus ``source`` (required), ``note`` and ``also`` (other repos
that take the same facts). The file is read and validated on the first ``catalog()`` call, never
at import time.

A stack can serve any other model by giving ``models.<key>.facts`` in its config; these are
only defaults, so that a stack naming a known repo does not have to copy them.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:
    from config.facts import ModelFacts

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")

# Keys an entry may carry besides the ModelFacts fields; stripped before validation.
_EXTRA_KEYS = ("source", "note", "also")
_REPO = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$")


class CatalogError(ValueError):
    """catalog.yaml is malformed; the message names the file, the repo and the field."""


_LOCK = threading.Lock()
_CACHE: dict[str, "ModelFacts"] = {}
_FOLDED: dict[str, str] = {}  # casefolded repo -> repo as spelled in the catalog


def _load_yaml(text: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader either way


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(entry)"


def parse_catalog(text: str, where: str = "catalog.yaml") -> dict[str, "ModelFacts"]:
    """Every repo (entries and their ``also`` aliases) mapped to its validated facts."""
    from pydantic import ValidationError

    from config.facts import ModelFacts

    try:
        data = _load_yaml(text)
    except Exception as exc:  # yaml.YAMLError and its C twin
        raise CatalogError(f"{where}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: must be a mapping of Hugging Face repo -> facts, got {type(data).__name__}")

    result: dict[str, ModelFacts] = {}
    folded: dict[str, str] = {}

    def claim(name: Any, owner: str, field: str) -> str:
        if not isinstance(name, str) or not _REPO.fullmatch(name):
            raise CatalogError(f"{where}: {owner}: {field}: {name!r} is not a Hugging Face repo (org/name, no :QUANT)")
        key = name.casefold()
        if key in folded:
            raise CatalogError(f"{where}: {owner}: {field}: {name} is already listed (as {folded[key]})")
        folded[key] = name
        return name

    for repo, entry in data.items():
        repo = claim(repo, str(repo), "repo")
        if not isinstance(entry, dict):
            raise CatalogError(f"{where}: {repo}: must be a mapping of facts, got {type(entry).__name__}")
        fields = dict(entry)
        source = fields.pop("source", None)
        fields.pop("note", None)
        also = fields.pop("also", None) or []
        if not isinstance(source, str) or not source.strip():
            raise CatalogError(f"{where}: {repo}: source: required, one line naming the config.json or model card")
        if not isinstance(also, list):
            raise CatalogError(f"{where}: {repo}: also: must be a list of repos, got {type(also).__name__}")
        try:
            facts = ModelFacts.model_validate(fields)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise CatalogError(
                f"{where}: {repo}: {_field_path(error['loc'])}: {error['msg']} (got {error.get('input')!r})"
            ) from None
        result[repo] = facts
        for index, alias in enumerate(also):
            result[claim(alias, repo, f"also[{index}]")] = facts
    return result


def catalog() -> dict[str, "ModelFacts"]:
    """The built-in facts, read from catalog.yaml on first use (nothing is read at import time)."""
    if not _CACHE:
        with _LOCK:
            if not _CACHE:
                built = parse_catalog(CATALOG_PATH.read_text(encoding="utf-8"), where=str(CATALOG_PATH.name))
                _FOLDED.update({repo.casefold(): repo for repo in built})
                _CACHE.update(built)
    return _CACHE


def repo_of(hf_repo: str) -> str:
    return hf_repo.split(":", 1)[0]


def lookup(repo: str) -> Optional["ModelFacts"]:
    """The catalog's facts for a repo (``org/name``, a ``:QUANT`` tag ignored); Hub names are
    case-insensitive, so is this."""
    known = catalog()
    name = repo_of(repo)
    if name in known:
        return known[name]
    spelled = _FOLDED.get(name.casefold())
    return known[spelled] if spelled is not None else None


def near_repos(repo: str) -> list[str]:
    """Catalog repos spelt like ``repo`` (a typo's likely meaning), closest first."""
    import difflib

    folded = {name.casefold(): name for name in catalog()}
    return [folded[n] for n in difflib.get_close_matches(repo_of(repo).casefold(), list(folded), n=2, cutoff=0.85)]


class _Served(Protocol):
    """A model server or a router's model: what facts_for reads (config.types imports this module)."""

    facts: Optional["ModelFacts"]
    hf_repo: Optional[str]


def facts_for(model: _Served) -> Optional["ModelFacts"]:
    """The model's own facts, else the catalog's for its repo, else None."""
    if model.facts is not None:
        return model.facts
    return lookup(model.hf_repo) if model.hf_repo else None
