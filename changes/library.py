"""What a library edit does to a router's models, by the rules the pod applies: incluster/preset.py says which
models the router's reload unloads (settings changed, no longer listed), as the keeper reads it before it
drains them; the plan's sources say which get new weights (the keeper unloads those once fetched); the
plan's pins say what the admission proxy loads by itself. Each model's effect is kept as data
(``ChangeReport.library``) and said in one line per router."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Sequence

from components.pod import config_map_name
from components.prefetch import DRAIN_SECONDS, KEEP_SECONDS
from incluster import preset

from .consequences import _Context, _Start
from .downloads import _duration
from .workloads import LibraryModel, ServerHint, _all_containers, workload

Change = Literal["added", "new weights", "new settings", "removed", "pinned", "unpinned"]


@dataclass(frozen=True)
class ModelEffect:
    model: str
    change: Change
    unloads: bool  # the router unloads it if it runs (the keeper drains it first)
    says: str


DRAINED = (f"drained first: new requests for it get 503 with Retry-After (the gateway retries them on the route's "
           f"next tier) while those in flight finish (at most {DRAIN_SECONDS} s)")


def library_effects(old: Mapping[str, LibraryModel], new: Mapping[str, LibraryModel], old_preset: Optional[str],
                    new_preset: Optional[str], download_rate: Optional[float]) -> list[ModelEffect]:
    """Each model's effect, in model order. ``download_rate``: seconds per GiB at the stack's rate."""
    effects: list[ModelEffect] = []
    reloaded = set(preset.reloaded(old_preset, new_preset)) if old_preset is not None and new_preset is not None else set()
    old_sections = preset.sections(old_preset or "")
    new_sections = preset.sections(new_preset or "")
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before is None:
            took = f", about {_duration(round(download_rate * after.weights_gib))} at the stack's download rate" \
                if download_rate else ""
            effects.append(ModelEffect(name, "added", False,
                                       f"fetches {name} ({after.weights_gib:g} GiB){took}, then offers it (until then "
                                       "the admission proxy answers 503 with Retry-After for it, which the gateway "
                                       "retries on the route's next tier)"))
        elif after is None:
            effects.append(ModelEffect(name, "removed", True,
                                       f"drops {name}: unloaded if loaded and forgotten (then the admission proxy "
                                       "answers 400, model not found; its files stay in the cache)"))
        elif before.source and after.source != before.source:
            effects.append(ModelEffect(name, "new weights", True,
                                       f"fetches new weights for {name} ({before.source} -> {after.source}, "
                                       f"{after.weights_gib:g} GiB) while the old ones serve; then unloads it, and its "
                                       f"next request loads the new ones{_load(after.cold_seconds, 'off the volume')}"))
        elif name in reloaded:
            changed = _settings_changed(old_sections, new_sections, name)
            again = "the admission proxy loads it again at once (pinned)" if after.pinned else "its next request loads it"
            effects.append(ModelEffect(name, "new settings", True,
                                       f"reloads {name} with new settings ({changed}): unloaded, then {again}"
                                       f"{_load(after.warm_seconds, 'from the page cache')}"))
        if before is not None and after is not None and before.pinned != after.pinned:
            effects.append(ModelEffect(name, "pinned", False,
                                       f"pins {name}: the admission proxy loads it at its next pin check, making room "
                                       "as for a request (only idle models are unloaded); nothing reloads")
                           if after.pinned else
                           ModelEffect(name, "unpinned", False,
                                       f"unpins {name}: it stays loaded until its room is needed by a request, and is "
                                       "unloaded only when idle; nothing reloads"))
    return effects


def _settings_changed(old: Mapping[str, dict], new: Mapping[str, dict], name: str) -> str:
    before, after = preset.settings(old, name), preset.settings(new, name)
    return ", ".join(f"{key} {before.get(key, 'unset')} -> {after.get(key, 'unset')}"
                     for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key))


def _load(seconds: Optional[float], where: str) -> str:
    return f" (about {_duration(round(seconds))} {where}, by the plan)" if seconds is not None else ""


def _presets(ctx: _Context, workload_name: str, hint: ServerHint) -> tuple[Optional[str], Optional[str]]:
    """The router's preset before and after the edit: the file its keeper reads (its PRESET), from the server's
    files ConfigMap."""
    def preset_key(resource) -> Optional[str]:
        w = workload(resource)
        for container in _all_containers((w.template.get("spec") or {}) if w else {}):
            for env in container.get("env") or []:
                if env.get("name") == "PRESET" and isinstance(env.get("value"), str):
                    return env["value"].rsplit("/", 1)[-1]
        return None

    keys = [None, None]
    for e in ctx.entries:
        if e.kind in ("Deployment", "StatefulSet") and e.object_name == workload_name:
            keys = [preset_key(e.old), preset_key(e.new)]
    name = config_map_name(hint.server) if hint.server else None
    for e in ctx.entries:
        if e.kind == "ConfigMap" and e.object_name == name:
            return tuple((r.inputs.get("data") or {}).get(key) if r is not None and key else None
                         for r, key in zip((e.old, e.new), keys))
    return None, None


def _library_edits(ctx: _Context, starts: Sequence[_Start]) -> None:
    """A router's models added, removed, fetched anew, reloaded or (un)pinned: applied by its keeper and its
    admission proxy with no restart, unless this update restarts the pod anyway."""
    restarting = {s.workload.name for s in starts}
    for name, hint in ctx.hints.items():
        old = ctx.old_hints.get(name)
        if hint.library is None or old is None or old.library is None:
            continue
        rate = (hint.download_seconds / hint.weights_gib) if hint.download_seconds and hint.weights_gib else None
        effects = library_effects(old.library, hint.library, *_presets(ctx, name, hint), rate)
        if not effects:
            continue
        ctx.library[hint.server or name] = tuple(effects)
        parts = [e.says for e in effects]
        if any(e.unloads for e in effects) and name not in restarting:
            parts.append("each model unloaded by the edit is " + DRAINED + "; the others keep running")
        how = ("the pod restarts in this update (above): every loaded model unloads; the models on the volume are "
               "offered at once and the keeper fetches the new ones in the background"
               if name in restarting else
               f"its keeper applies it once the kubelet has refreshed the mounted ConfigMap (its sync period and "
               f"cache, typically 1-2 min) and within its {KEEP_SECONDS} s round (no restart)")
        ctx.add("library", "info", f"{name} (models.{hint.key}.on_demand)", f"{'; '.join(parts)}; {how}")



def _card_overlaps(ctx: _Context, starts: Sequence[_Start]) -> None:
    """A router's VRAM budget changes while another server on its card starts or goes (a model moved between
    the router and a server of its own, a server added beside it): the router's admission proxy holds it to
    the old budget until it reads the new plan (the kubelet refreshes the mounted ConfigMap in ~1-2 min; the
    proxy then unloads idle models at its next round, busy ones once their requests end), while the other
    pods start at once, and a deleted one holds its VRAM until its pod has exited. The moment both hold VRAM
    is planned here: each workload at the larger of its two figures."""
    started = {s.workload.name for s in starts}
    restarting = {s.workload.name for s in starts if s.down}
    for card, after in ctx.cards.items():
        before = ctx.old_cards.get(card)
        if before is None:
            continue
        for router, hint in ctx.hints.items():
            old_hint = ctx.old_hints.get(router)
            if router not in after.workloads or old_hint is None or None in (hint.vram_budget_gib, old_hint.vram_budget_gib):
                continue
            old_budget, new_budget = old_hint.vram_budget_gib, hint.vram_budget_gib
            others = {w: max(before.workloads.get(w, 0.0), after.workloads.get(w, 0.0))
                      for w in set(before.workloads) | set(after.workloads) if w != router}
            arriving = sorted(w for w in others if w in started or w not in before.workloads)
            leaving = sorted(w for w in before.workloads if w != router and w not in after.workloads)
            if old_budget == new_budget or not (arriving if new_budget < old_budget else leaving):
                continue
            moment = max(old_budget, new_budget) + sum(others.values())
            pool, node, gpu = card
            where = f"GPU {gpu} of {pool} node {node}"
            waits = [w for w in arriving if ctx.hints.get(w) is not None and ctx.hints[w].room_gib is not None
                     and ctx.hints[w].room_gib <= new_budget + 1e-9]
            if new_budget < old_budget and waits == arriving:
                ctx.add("card-overlap", "info", where,
                        f"{router}'s budget shrinks {old_budget:g} -> {new_budget:g} GiB while {', '.join(arriving)} "
                        f"start{'s' if len(arriving) == 1 else ''} beside it; ordered so that both never hold the "
                        f"card at once ({max(old_budget, new_budget):g} + {sum(others.values()):g} GiB would be "
                        f"{moment:.1f} of {after.vram_gib:g}): the new pods wait (init container room) until the "
                        f"router holds no more than {new_budget:g} GiB, " + (
                            "which it does once its old pod has exited (it restarts in this update)"
                            if router in restarting else
                            "which it reaches once its admission proxy has read the new plan (~1-2 min) and unloaded "
                            "idle models (busy ones once their requests end)"))
                continue
            if new_budget < old_budget:
                until = ("until its old pod has exited (it restarts in this update; the other pods start at once)"
                         if router in restarting else
                         "until its admission proxy reads the new plan (the kubelet refreshes the ConfigMap in ~1-2 "
                         "min; it then unloads idle models at its next round, busy ones once their requests end)")
                what = (f"{router}'s budget shrinks {old_budget:g} -> {new_budget:g} GiB while {', '.join(arriving)} "
                        f"start{'s' if len(arriving) == 1 else ''} beside it: {until} the router may still hold "
                        f"{old_budget:g} GiB")
                way = ("a load on either side may fail for lack of VRAM (the new server's container restarts with "
                       "back-off; the router answers 503, retried on the route's next tier) until the router has shrunk; "
                       "to avoid it, apply in two steps: first the library edit alone, then, once the router holds "
                       f"no more than {new_budget:g} GiB, the new server")
            else:
                what = (f"{router}'s budget grows {old_budget:g} -> {new_budget:g} GiB while {', '.join(leaving)} "
                        f"{'goes' if len(leaving) == 1 else 'go'}: its admission proxy may read the new plan before "
                        "the update has deleted the old pods and they have exited")
                way = ("a load on the router past its old budget may fail for lack of VRAM (503, retried on the "
                       "route's next tier) until the old pods have exited; pulumi up, reading the last update's "
                       "history, keeps the router's budget for that update instead (a model that needs the memory is "
                       "refused until the next one): remove the server first, then grow the library")
            sizes = " + ".join(f"{g:g}" for g in [max(old_budget, new_budget), *others.values()])
            if moment <= after.vram_gib:
                ctx.add("card-overlap", "info", where, f"{what}; both fit at once: {sizes} = {moment:.1f} of "
                        f"{after.vram_gib:g} GiB")
            else:
                ctx.add("card-overlap", "warning", where, f"{what}: {sizes} = {moment:.1f} GiB, more than the card's "
                        f"{after.vram_gib:g}; {way}")
