"""Consequences of new pods starting: restarts, weights downloaded again, the downtime they cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from common.constants import COLD_START_ANNOTATION, COMMIT_ID

from .claims import _cache_space
from .consequences import _Context, _hint, _Start
from .report import Severity
from .workloads import ClaimKey, ServerHint, _ClaimFate


@dataclass
class _Claims:
    again: list[ClaimKey]  # new or emptied, in place of a claim the workload had before
    first: list[ClaimKey]  # new, for a place the workload did not have (new workload, new replica)
    unfamiliar: list[ClaimKey]  # existing, but not mounted by this workload before

    @property
    def fresh(self) -> list[ClaimKey]:
        return self.again + self.first


def _fresh_claims(start: _Start, fates: Mapping[ClaimKey, _ClaimFate]) -> _Claims:
    previous = start.previous.claim_slots() if start.previous else []
    before_keys = {key for key, _ in previous}
    before_slots = {slot for _, slot in previous}
    result = _Claims([], [], [])
    for key, slot in start.workload.claim_slots():
        fate = fates.get(key)
        if fate is None or fate.fate == "lost":
            (result.again if slot in before_slots else result.first).append(key)
        elif key not in before_keys:
            result.unfamiliar.append(key)
    return result


def _restarts_and_downloads(ctx: _Context, starts: Sequence[_Start], fates: Mapping[ClaimKey, _ClaimFate]) -> None:
    for start in starts:
        w = start.workload
        hint = _hint(ctx, w)
        claims = _fresh_claims(start, fates)
        if start.how.startswith("scaled up"):
            ctx.add("scale-up", "info", w.label, start.how)
        elif start.how.startswith("OnDelete"):
            ctx.add("not-restarted", "warning", w.label, start.how)
        elif start.previous is not None:
            ctx.add("restart", "info", w.label, start.how)
        groups: tuple[tuple[list[ClaimKey], str, Severity], ...] = (
            (claims.again, "downloads again", "warning"),
            (claims.first, "downloads", "info"),
        )
        for keys, verb, severity in groups:
            if keys:
                size = f"{hint.weights_gib * len(keys):g} GiB" if hint.weights_gib else "its weights"
                names = ", ".join(f"{ns}/{name}" for ns, name in keys)
                ctx.add("redownload", severity, w.label, f"{verb} {size}: it mounts claims that are new or emptied "
                        f"by this edit ({names}){_keep_claims(start, hint) if keys is claims.again else ''}")
        if claims.unfamiliar and not claims.fresh:
            names = ", ".join(f"{ns}/{name}" for ns, name in claims.unfamiliar)
            ctx.add("redownload", "info", w.label, f"mounts existing claims it did not mount before ({names}): "
                    "downloads unless they already hold its weights")
        downloads = len(claims.fresh)
        kept = [key for key in w.claims() if key not in claims.fresh]
        before_source = start.previous.weights_source() if start.previous is not None else ()
        if kept and before_source and w.weights_source() != before_source:
            # The claims keep the old weights; the pods need others (another quant, repo or revision).
            size = f"{hint.weights_gib * len(kept):g} GiB" if hint.weights_gib else "its new weights"
            change = f"it now fetches {', '.join(w.weights_source())} (was {', '.join(before_source)})"
            if _only_a_moving_revision(before_source, w.weights_source()):
                # A branch and a commit: offline, nobody knows whether the branch already pointed there.
                ctx.add("redownload", "warning", w.label,
                        f"downloads up to {size}: {change}; nothing if that commit is the one the branch had when the "
                        "claims were filled")
            else:
                ctx.add("redownload", "warning", w.label, f"downloads {size}: {change}; the old weights stay on its claims")
                downloads += 1 if start.partial else len(kept)
                _cache_space(ctx, start, hint)
        if start.down or start.partial:
            _downtime(ctx, start, downloads if not start.partial else min(downloads, 1), hint)


def _only_a_moving_revision(before: Sequence[str], after: Sequence[str]) -> bool:
    """Whether the sources differ only in a revision where one side is a branch or tag."""
    if len(before) != len(after):
        return False
    for old, new in zip(before, after):
        if old == new:
            continue
        old_repo, _, old_rev = old.rpartition("@")
        new_repo, _, new_rev = new.rpartition("@")
        if not old_repo or old_repo != new_repo or (COMMIT_ID.fullmatch(old_rev) and COMMIT_ID.fullmatch(new_rev)):
            return False
    return True


def _keep_claims(start: _Start, hint: ServerHint) -> str:
    """The fix, when a StatefulSet gets new claims only because its name changed: its claims are
    named after it, and workload.name keeps the old name while the server's name changes."""
    old, new = start.previous, start.workload
    if old is None or new.kind != "StatefulSet" or old.kind != "StatefulSet" or old.name == new.name:
        return ""
    where = f"models.{hint.key}.workload.name" if hint.key else "the server's workload.name"
    return f"; to keep the old claims and their weights, set {where}: {old.name}"


def _downtime(ctx: _Context, start: _Start, downloads: int, hint: ServerHint) -> None:
    """``downloads``: how many claims are filled at once; replicas starting together share the
    node's uplink, so their downloads take as long as one after the other (the planner's rate is
    the uplink's)."""
    w = start.workload
    seconds: Optional[int] = None
    basis = ""
    if hint.load_seconds is not None and (not downloads or hint.download_seconds is not None):
        download = (hint.download_seconds or 0) * downloads
        seconds = hint.load_seconds + download
        shared = f" x {downloads} claims over one uplink" if downloads > 1 else ""
        parts = ([f"download {hint.download_seconds} s{shared}"] if downloads else []) + [f"load {hint.load_seconds} s"]
        basis = "capacity plan: " + " + ".join(parts)
    elif w.cold_start is not None and downloads:
        seconds, basis = w.cold_start, f"{COLD_START_ANNOTATION} annotation"
    estimate = f"about {_duration(seconds)} ({basis}; image pull not counted)" if seconds is not None else \
        "for an unknown time (no load estimate for it)"
    if start.partial:
        ctx.add("reduced-capacity", "info", w.label, f"each pod is out {estimate} while the others serve")
    else:
        ctx.add("downtime", "warning", w.label, f"not serving {estimate}: {start.how}{_router_loads(hint)}")


def _router_loads(hint: ServerHint) -> str:
    """A router serves once it is up, but every model it held is unloaded: the pinned ones load at once
    (one after another, by its admission proxy), each other one on its first request."""
    if not hint.library:
        return ""
    pinned = {m: lib.cold_seconds for m, lib in sorted(hint.library.items()) if lib.pinned}
    loads = [s for s in pinned.values() if s is not None]
    if pinned:
        took = f" (about {_duration(round(sum(loads)))} off the volume, by the plan)" if len(loads) == len(pinned) else ""
        head = f"; then the admission proxy loads the pinned {', '.join(pinned)}{took}, and every other model loads on its first request"
    else:
        head = "; then every model loads on its first request"
    return head + " (its swap time, `make render`)"


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
