"""The change report: one entry per resource with the provider's action, the consequences for the
running servers, and how both are printed (a container's changed arguments shown per flag)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from .provider import Action, ObjectId, RegisteredLike

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass
class Entry:
    """One resource's change: its URN after the edit (before, for a delete) and the action."""

    urn: str
    type: str
    name: str
    action: Action
    old_urn: Optional[str] = None
    before: Optional[ObjectId] = None
    after: Optional[ObjectId] = None
    via_alias: bool = False
    old: Optional[RegisteredLike] = field(default=None, repr=False, compare=False)
    new: Optional[RegisteredLike] = field(default=None, repr=False, compare=False)
    # ``new`` with its ignoreChanges paths holding their old values: what the cluster gets.
    applied: Optional[RegisteredLike] = field(default=None, repr=False, compare=False)

    @property
    def op(self) -> str:
        return self.action.op

    @property
    def kubernetes(self) -> bool:
        return (self.after or self.before) is not None

    @property
    def kind(self) -> str:
        obj = self.after or self.before
        return obj.kind if obj else self.type.rsplit(":", 1)[-1]

    @property
    def object_name(self) -> Optional[str]:
        obj = self.after or self.before
        return obj.name if obj else None

    @property
    def subject(self) -> str:
        if self.before and self.after and self.before != self.after:
            return f"{self.before} -> {self.after.namespace + '/' if self.after.namespace else ''}{self.after.name}"
        obj = self.after or self.before
        return str(obj) if obj else f"{self.type.rsplit(':', 1)[-1]} {self.name}"


@dataclass(frozen=True)
class Consequence:
    kind: str
    severity: Severity
    subject: str
    message: str

    def line(self) -> str:
        return f"{self.severity:<7} {self.kind:<22} {self.subject}: {self.message}"


@dataclass
class ChangeReport:
    stack: str
    entries: list[Entry]
    consequences: list[Consequence]
    # A router's server name -> what a library edit does to each of its models (changes/library.py).
    library: dict = field(default_factory=dict)

    def changed(self) -> list[Entry]:
        return [e for e in self.entries if e.op != "same"]

    def find(self, kind: Optional[str] = None, name: Optional[str] = None, op: Optional[str] = None) -> list[Entry]:
        """Kubernetes entries by kind and object name (before or after the edit) and action."""
        found = []
        for e in self.entries:
            if not e.kubernetes or (kind and e.kind != kind) or (op and e.op != op):
                continue
            names = {o.name for o in (e.before, e.after) if o is not None}
            if name is None or name in names:
                found.append(e)
        return found

    def entry(self, kind: str, name: str) -> Entry:
        found = self.find(kind, name)
        if len(found) != 1:
            raise LookupError(f"expected one {kind} {name!r} in the report, found {len(found)}")
        return found[0]

    def of_kind(self, kind: str) -> list[Consequence]:
        return [c for c in self.consequences if c.kind == kind]

    @property
    def errors(self) -> list[Consequence]:
        return [c for c in self.consequences if c.severity == "error"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "resources": [
                {
                    "urn": e.urn,
                    "old_urn": e.old_urn,
                    "type": e.type,
                    "subject": e.subject,
                    "action": e.action.label,
                    "changed": list(e.action.changed),
                    "replace_paths": list(e.action.replace_paths),
                    "retained": e.action.retained,
                    "blocked": e.action.blocked,
                    "via_alias": e.via_alias,
                }
                for e in self.changed()
            ],
            "consequences": [vars(c) for c in self.consequences],
        }

    def text(self) -> str:
        kube = [e for e in self.entries if e.kubernetes or (e.new or e.old) and (e.new or e.old).custom]
        counts = {op: sum(1 for e in kube if e.op == op) for op in ("update", "replace", "create", "delete", "same")}
        lines = [
            f"{self.stack}: {counts['update']} update, {counts['replace']} replace, {counts['create']} create, "
            f"{counts['delete']} delete, {counts['same']} unchanged"
        ]
        for e in sorted((e for e in kube if e.op != "same"), key=_entry_order):
            lines.append("  " + _entry_line(e))
        if self.consequences:
            lines.append("consequences:")
            lines += ["  " + c.line() for c in self.consequences]
        else:
            lines.append("consequences: none")
        return "\n".join(lines)


_OP_ORDER = {"replace": 0, "delete": 1, "create": 2, "update": 3, "same": 4}


def _entry_order(e: Entry) -> tuple:
    return (_OP_ORDER[e.op], e.kind, e.subject)


_ARG_PATH = re.compile(r"^(?P<list>spec\.template\.spec\.(?:init)?[cC]ontainers\[(?P<i>[0-9]+)\]\.(?P<field>args|command))\[[0-9]+\]$")


def _readable_paths(e: Entry, paths: list[str]) -> list[str]:
    """Changed paths, with a container's changed args shown as the arguments added and removed
    (`args: +--cors-origins localhost`) instead of list positions."""
    out: list[str] = []
    seen: set[str] = set()
    for path in paths:
        match = _ARG_PATH.match(path)
        if match is None or e.old is None or e.applied is None:
            out.append(path)
            continue
        if match["list"] in seen:
            continue
        seen.add(match["list"])
        kind = "initContainers" if ".initContainers[" in path else "containers"
        index = int(match["i"])

        def args_of(registered) -> list[str]:
            containers = ((((registered.inputs or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get(kind) or []
            return [str(a) for a in (containers[index].get(match["field"]) or [])] if index < len(containers) else []

        change = _arg_changes(args_of(e.old), args_of(e.applied))
        out.append(f"{kind}[{index}].{match['field']}: {change[:120]}")
    return out


def _flag_values(args: list[str]) -> tuple[dict[str, list[Optional[str]]], list[str]]:
    """A command line as flag -> its values (None for a bare switch), in order, plus the bare
    arguments. A token after a flag is its value unless it is itself a flag (negative numbers are values)."""
    flags: dict[str, list[Optional[str]]] = {}
    bare: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-") and not _NUMBER.fullmatch(token):
            name, eq, inline = token.partition("=")
            if eq:
                flags.setdefault(name, []).append(inline)
            elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _NUMBER.fullmatch(args[i + 1])):
                flags.setdefault(name, []).append(args[i + 1])
                i += 1
            else:
                flags.setdefault(name, []).append(None)
        else:
            bare.append(token)
        i += 1
    return flags, bare


def _arg_changes(old: list[str], new: list[str]) -> str:
    """`--cache-ram 1024 -> 4; added --cors-origins localhost; removed --metrics`: per flag, not by
    position or as a set of words (a value another flag also has would vanish from a set)."""
    old_flags, old_bare = _flag_values(old)
    new_flags, new_bare = _flag_values(new)

    def shown(flag: str, values: list[Optional[str]]) -> str:
        return " ".join(f"{flag} {v}" if v is not None else flag for v in values)

    parts: list[str] = []
    for flag in dict.fromkeys([*old_flags, *new_flags]):
        before, after = old_flags.get(flag), new_flags.get(flag)
        if before == after:
            continue
        if before is None:
            parts.append(f"added {shown(flag, after or [])}")
        elif after is None:
            parts.append(f"removed {shown(flag, before)}")
        else:
            values = lambda vs: ",".join("(switch)" if v is None else v for v in vs)  # noqa: E731
            parts.append(f"{flag} {values(before)} -> {values(after)}")
    if old_bare != new_bare:
        parts.append(f"arguments {' '.join(old_bare) or '(none)'} -> {' '.join(new_bare) or '(none)'}")
    return "; ".join(parts) or "same flags, another order"


_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def _entry_line(e: Entry) -> str:
    paths = _readable_paths(e, list(e.action.replace_paths or e.action.changed))
    shown = ", ".join(paths[:3]) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
    notes = []
    if e.action.retained and e.op in ("delete", "replace"):
        notes.append("retained")
    if e.action.blocked:
        notes.append("BLOCKED")
    if e.via_alias:
        notes.append("alias")
    tail = f"  [{', '.join(notes)}]" if notes else ""
    return f"{e.action.label:<23} {e.subject:<58} {shown}{tail}".rstrip()
