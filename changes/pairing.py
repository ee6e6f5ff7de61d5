"""Pairing by URN, then alias (provider.py fact 9): which old resource each new one continues, and
what the cluster gets for a pair."""

from __future__ import annotations

import copy
from typing import Mapping, Optional, Sequence

from .provider import Action, RegisteredLike, apply_ignore_changes


def _urn_parts(urn: str) -> tuple[str, str, str, str]:
    """(stack, project, qualified type, name) of ``urn:pulumi:<stack>::<project>::<type>::<name>``."""
    head, project, qualified, name = urn.split("::", 3)
    return head[len("urn:pulumi:"):], project, qualified, name


def _is_root(urn: str) -> bool:
    return _urn_parts(urn)[2].split("$")[-1] == "pulumi:pulumi:Stack"


class _UrnBuilder:
    """Builds URNs the way the run that recorded them did. Pulumi's engine qualifies a child's
    type with its parent's whole type chain and leaves the root stack out; the SDK's mock monitor
    (the offline runs) uses the parent's own type only, root stack included. Both conventions are
    read off the recorded URNs, so alias URNs compare with them."""

    def __init__(self, resources: Sequence[RegisteredLike]):
        by_urn = {r.urn: r for r in resources}
        self.full_chain = any(
            r.parent in by_urn
            and "$" in _urn_parts(r.parent)[2]
            and _urn_parts(r.urn)[2].startswith(_urn_parts(r.parent)[2] + "$")
            for r in resources
        )
        self.root_in_chain = any(
            r.parent and r.parent not in by_urn and _urn_parts(r.urn)[2].startswith("pulumi:pulumi:Stack$")
            for r in resources
        )

    def make(self, stack: str, project: str, parent: Optional[str], type_: str, name: str) -> str:
        qualified = type_
        if parent and _is_root(parent):
            if self.root_in_chain:
                qualified = f"pulumi:pulumi:Stack${type_}"
        elif parent:
            parent_type = _urn_parts(parent)[2]
            qualified = f"{parent_type if self.full_chain else parent_type.split('$')[-1]}${type_}"
        return f"urn:pulumi:{stack}::{project}::{qualified}::{name}"


def _depth(resource: RegisteredLike, by_urn: Mapping[str, RegisteredLike]) -> int:
    depth, parent, seen = 0, resource.parent, set()
    while parent in by_urn and parent not in seen:
        seen.add(parent)
        depth += 1
        parent = by_urn[parent].parent
    return depth


def _alias_candidates(
    new: RegisteredLike, aliased: Mapping[str, str], builder: _UrnBuilder, root: Optional[str]
) -> list[str]:
    stack, project, _, _ = _urn_parts(new.urn)
    parent = new.parent or root
    candidates: list[str] = []
    for spec in new.aliases:
        if spec.get("urn"):
            candidates.append(spec["urn"])
            continue
        if spec.get("no_parent"):
            alias_parent = root
        elif spec.get("parent_urn"):
            alias_parent = aliased.get(spec["parent_urn"], spec["parent_urn"])
        else:
            alias_parent = parent
        candidates.append(builder.make(stack, project, alias_parent, spec.get("type") or new.type, spec.get("name") or new.name))
    old_parent = aliased.get(new.parent) if new.parent else None
    if old_parent:
        parent_name = _urn_parts(new.parent)[3]
        old_parent_name = _urn_parts(old_parent)[3]
        for urn in [new.urn] + list(candidates):
            _, _, qualified, name = _urn_parts(urn)
            child_type = qualified.split("$")[-1]
            if name.startswith(parent_name):
                name = old_parent_name + name[len(parent_name):]
            candidates.append(builder.make(stack, project, old_parent, child_type, name))
    return candidates


def pair(
    before: Sequence[RegisteredLike], after: Sequence[RegisteredLike]
) -> tuple[list[tuple[Optional[RegisteredLike], Optional[RegisteredLike], bool]], dict[str, str]]:
    """(old, new, via_alias) pairs: every new resource with the old one it continues, if any,
    then every old resource nothing continues; and new URN -> old URN for the aliased ones."""
    olds = {r.urn: r for r in before}
    news = {r.urn: r for r in after}
    builder = _UrnBuilder(list(after) or list(before))
    root = next((r.parent for r in list(after) + list(before) if r.parent and _is_root(r.parent)), None)
    taken: set[str] = set()
    aliased: dict[str, str] = {}
    pairs: list[tuple[Optional[RegisteredLike], Optional[RegisteredLike], bool]] = []
    for new in sorted(after, key=lambda r: (_depth(r, news), r.urn)):
        match: Optional[str] = new.urn if new.urn in olds and new.urn not in taken else None
        if match is None:
            for candidate in _alias_candidates(new, aliased, builder, root):
                if candidate in olds and candidate not in taken and candidate not in news:
                    match = candidate
                    break
        if match is not None:
            taken.add(match)
            if match != new.urn:
                aliased[new.urn] = match
        pairs.append((olds.get(match) if match else None, new, bool(match and match != new.urn)))
    pairs += [(old, None, False) for urn, old in olds.items() if urn not in taken]
    return pairs, aliased


def _applied(old: Optional[RegisteredLike], new: Optional[RegisteredLike], action: Action) -> Optional[RegisteredLike]:
    """What the cluster gets: the new inputs with ignored paths reset, except for a replacement,
    which is created from the program's own values (fact 4)."""
    if old is None or new is None or not new.ignore_changes or not new.custom or action.op == "replace":
        return new
    applied = copy.copy(new)
    applied.inputs = apply_ignore_changes(old.inputs, new.inputs, new.ignore_changes)
    return applied
