"""The capacity plan drawn per node, as an SVG written beside plan.json (no drawing library needed).

One bar per node, as wide as what the node offers (allocatable less reserved): for each model server
placed there its weights, KV and recurrent state, backend working set and host caches, then the
margin its memory limit adds over the estimate; what is left is headroom. Then one bar per discrete GPU,
and, for a server of models on demand, one bar per full resident set (each model's share of the budget). Every rectangle carries
its figures (data-node, data-server, data-part, data-gib) so a test can check them against the plan.
"""
from __future__ import annotations

from html import escape

from planning.split import estimates_by_workload

PARTS = (  # (part, estimate fields, colour)
    ("weights", ("weights_gib",), "#4e79a7"),
    ("kv+state", ("kv_gib", "recurrent_gib"), "#f28e2b"),
    ("backend", ("overhead_gib",), "#e15759"),
    ("caches", ("host_caches_gib",), "#76b7b2"),
    ("limit margin", (), "#bab0ac"),
)
HEADROOM = "#d4edda"
WIDTH, LABEL, BAR, GAP, TOP = 900, 150, 28, 22, 40
VRAM = "#8e6c8a"
# One colour per model of a router, in its resident-set rows.
MODEL_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#9c755f", "#76b7b2", "#edc948")
LEGEND_STEP = 120
CHAR_WIDTH = 6.5  # a 12 px sans-serif character, roughly


def node_label(node: dict) -> str:
    """How a planned node is named in the summary and the picture: <pool>/<1-based index>."""
    return f"{node['pool']}/{node['node'] + 1}"


def plan_svg(plan: dict) -> str:
    nodes = plan["nodes"]
    estimates = estimates_by_workload(plan)
    scale = (WIDTH - LABEL - 20) / max([n["offers_gib"] for n in nodes] + [g["vram_gib"] for n in nodes for g in n.get("gpus", [])] or [1])
    gpu_rows = [(node, gpu) for node in nodes for gpu in node.get("gpus", [])]
    # A router's full resident sets, one row each (what the admission proxy can leave loaded together).
    set_rows = [(server, names) for server in plan["servers"].values() if server.get("residency")
                for names in server["residency"].get("full_sets", [])]
    rows = len(nodes) + len(gpu_rows) + len(set_rows)
    speeds = [s for s in plan["servers"].values() if s.get("decode_bound_tok_s") or s.get("decode_predicted_tok_s")]
    height = TOP + rows * (BAR + GAP) + 40 + 18 * len(speeds)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">',
           '<text x="10" y="20" font-size="14">capacity plan per node (GiB; bar = what the node offers, allocatable less reserved)</text>']
    for row, node in enumerate(nodes):
        y = TOP + row * (BAR + GAP)
        where = node_label(node)
        out.append(f'<text x="10" y="{y + BAR / 2 + 4}">{escape(where)}</text>')
        x = float(LABEL)
        for name, limit in node["workloads"].items():
            estimate = estimates.get(name, {})
            sizes = [(part, sum(estimate.get(f, 0.0) for f in fields), colour) for part, fields, colour in PARTS[:-1]]
            sizes.append((PARTS[-1][0], max(limit - sum(s for _, s, _ in sizes), 0.0), PARTS[-1][2]))
            for part, gib, colour in sizes:
                if gib <= 0:
                    continue
                out.append(f'<rect x="{x:.2f}" y="{y}" width="{gib * scale:.2f}" height="{BAR}" fill="{colour}" '
                           f'data-node="{escape(where)}" data-server="{escape(name)}" data-part="{part}" data-gib="{gib:.3f}">'
                           f'<title>{escape(name)} {part}: {gib:.1f} GiB</title></rect>')
                x += gib * scale
            out.append(f'<line x1="{x:.2f}" y1="{y}" x2="{x:.2f}" y2="{y + BAR}" stroke="#333"/>')
        free = node["free_gib"]
        if free > 0:
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{free * scale:.2f}" height="{BAR}" fill="{HEADROOM}" '
                       f'data-node="{escape(where)}" data-part="headroom" data-gib="{free:.3f}"><title>headroom: {free:.1f} GiB</title></rect>')
        out.append(f'<rect x="{LABEL}" y="{y}" width="{node["offers_gib"] * scale:.2f}" height="{BAR}" fill="none" stroke="#333" '
                   f'data-node="{escape(where)}" data-part="offers" data-gib="{node["offers_gib"]:.3f}"/>')
        out.append(f'<text x="{LABEL}" y="{y + BAR + 14}">{node["planned_gib"]:.1f} planned of {node["offers_gib"]:.1f}, '
                   f'{free:.1f} free</text>')
    for row, (node, gpu) in enumerate(gpu_rows, start=len(nodes)):
        # One bar per discrete GPU, on the same GiB scale: what each server holds in its VRAM.
        y = TOP + row * (BAR + GAP)
        where = f"{node_label(node)} GPU {gpu['gpu'] + 1}"
        out.append(f'<text x="10" y="{y + BAR / 2 + 4}">{escape(where)}</text>')
        x = float(LABEL)
        for name, gib in gpu["workloads"].items():
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{gib * scale:.2f}" height="{BAR}" fill="{VRAM}" stroke="#333" '
                       f'data-node="{escape(where)}" data-server="{escape(name)}" data-part="vram" data-gib="{gib:.3f}">'
                       f'<title>{escape(name)} VRAM: {gib:.1f} GiB</title></rect>')
            # The server's name on its share of the card, where it fits (the title says it on hover anyway).
            label = f"{name} {gib:.1f}"
            if gib * scale > len(label) * CHAR_WIDTH + 8:
                out.append(f'<text x="{x + 4:.2f}" y="{y + BAR / 2 + 4}" fill="#fff" data-label="{escape(name)}">'
                           f'{escape(label)}</text>')
            x += gib * scale
        out.append(f'<rect x="{LABEL}" y="{y}" width="{gpu["vram_gib"] * scale:.2f}" height="{BAR}" fill="none" stroke="#333" '
                   f'data-node="{escape(where)}" data-part="vram-size" data-gib="{gpu["vram_gib"]:.3f}"/>')
        shares = ", ".join(f"{name} {gib:.1f}" for name, gib in gpu["workloads"].items())
        out.append(f'<text x="{LABEL}" y="{y + BAR + 14}" data-gpu="{escape(where)}">{gpu["planned_gib"]:.1f} GiB of VRAM '
                   f'planned of {gpu["vram_gib"]:.1f}: {escape(shares)}</text>')
    for row, (server, names) in enumerate(set_rows, start=len(nodes) + len(gpu_rows)):
        y = TOP + row * (BAR + GAP)
        residency = server["residency"]
        on_card = residency["vram_budget_gib"] is not None
        budget = residency["vram_budget_gib"] if on_card else residency["ram_budget_gib"]
        where = f"{server['name']} set {row - len(nodes) - len(gpu_rows) + 1}"
        out.append(f'<text x="10" y="{y + BAR / 2 + 4}">{escape(where)}</text>')
        x = float(LABEL)
        total = 0.0
        for name in names:
            gib = residency["models"][name]["vram_gib" if on_card else "ram_gib"]
            colour = MODEL_COLOURS[list(residency["models"]).index(name) % len(MODEL_COLOURS)]
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{gib * scale:.2f}" height="{BAR}" fill="{colour}" stroke="#333" '
                       f'data-set="{escape(where)}" data-server="{escape(server["name"])}" data-model="{escape(name)}" '
                       f'data-gib="{gib:.3f}"><title>{escape(name)}: {gib:.1f} GiB</title></rect>')
            label = f"{name} {gib:.1f}"
            if gib * scale > len(label) * CHAR_WIDTH + 8:
                out.append(f'<text x="{x + 4:.2f}" y="{y + BAR / 2 + 4}" fill="#fff">{escape(label)}</text>')
            x += gib * scale
            total += gib
        out.append(f'<rect x="{LABEL}" y="{y}" width="{budget * scale:.2f}" height="{BAR}" fill="none" stroke="#333" '
                   f'stroke-dasharray="4 2" data-set="{escape(where)}" data-part="budget" data-gib="{budget:.3f}"/>')
        out.append(f'<text x="{LABEL}" y="{y + BAR + 14}">resident together: {total:.1f} of the {budget:.1f} GiB '
                   f'{"VRAM" if on_card else "RAM"} budget ({total / budget:.0%})</text>')
    legend_y = TOP + rows * (BAR + GAP) + 10
    legend = [*PARTS, ("headroom", (), HEADROOM)] + ([("VRAM (GPU rows)", (), VRAM)] if gpu_rows else [])
    for i, (part, _, colour) in enumerate(legend):
        out.append(f'<rect x="{10 + i * LEGEND_STEP}" y="{legend_y}" width="12" height="12" fill="{colour}" data-legend="{part}"/>'
                   f'<text x="{26 + i * LEGEND_STEP}" y="{legend_y + 11}">{part}</text>')
    for i, server in enumerate(speeds):
        # Decode: the prediction at an empty, half and full context, and the bandwidth bound.
        predicted = server.get("decode_predicted_tok_s")
        bound = server.get("decode_bound_tok_s")
        said = ("decode ~ " + " / ".join(f"{predicted[k]:.1f}" for k in ("empty", "half", "full"))
                + " tok/s (context empty / half / full)") if predicted else "decode: no prediction for this device"
        data = (f' data-decode-empty="{predicted["empty"]:.2f}" data-decode-full="{predicted["full"]:.2f}"' if predicted else "")
        out.append(f'<text x="10" y="{legend_y + 34 + 18 * i}" data-server="{escape(server["name"])}"{data}>'
                   f'{escape(server["name"])}: {said}' + (f", at most {bound:.1f} tok/s" if bound else "") + "</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
