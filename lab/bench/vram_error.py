"""The VRAM plan (engines/llamacpp_memory.py) against what llama-server held on a real card: one row per
server of bench/results-vram-*.json (lab/bench/measure_vram.py) with the plan's figure for the same settings,
nvidia-smi's figure for the process after a full micro-batch, and the error. docs/capacity-planning.md's
table ("VRAM: planned and measured") is this output.

    python -m lab.bench.vram_error [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from lab.bench.measure_vram import model_of

TOLERANCE = 0.05  # the plan within 5 % of the card's figure
MOST_UNDER_MIB = 256  # and never more than this below it


def rows() -> list[dict]:
    from engines import engine_of

    out = []
    for path in sorted((ROOT / "bench").glob("results-vram-*.json")):
        record = json.loads(path.read_text())
        for row in record["rows"]:
            model, pool = model_of(row["origin"], row["update"])
            estimate, _ = engine_of(model).estimate(model, pool, "bench")
            planned = estimate.vram.total_gib * 1024
            measured = row["smi_after_request_mib"]
            out.append({"case": row["case"], "gpu": record["gpu"].split(",")[0], "planned_mib": planned, "measured_mib": measured,
                        "error": (planned - measured) / measured, "under_mib": max(0.0, measured - planned),
                        "source": f"bench/{path.name}"})
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    table = rows()
    if args.markdown:
        print("| server (stack/key or case) | card | planned MiB | measured MiB | error |")
        print("|---|---|---:|---:|---:|")
        for r in table:
            print(f"| {r['case']} | {r['gpu']} | {r['planned_mib']:.0f} | {r['measured_mib']:.0f} | {r['error']:+.1%} |")
    else:
        for r in table:
            print(f"{r['case']:40} planned {r['planned_mib']:8.0f} MiB  measured {r['measured_mib']:8.0f} MiB  {r['error']:+6.1%}")
    worst = max(abs(r["error"]) for r in table)
    under = max(r["under_mib"] for r in table)
    print(f"vram: {len(table)} servers, worst error {worst:.1%} (goal {TOLERANCE:.0%}), most under {under:.0f} MiB "
          f"(goal {MOST_UNDER_MIB})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
