"""docs/capacity-planning.md's three measured tables (VRAM, decode, prefill) are the output of
lab/bench/vram_error.py, lab/bench/decode_error.py and lab/bench/prefill_error.py: this writes them in place
(`make docs`) or, with --check, fails when the page is not today's output (tests/test_structure.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "capacity-planning.md"
# (script and arguments, the table's first line, the prefix of its last line)
TABLES = [
    (["-m", "lab.bench.vram_error", "--markdown"], "| server (stack/key or case) |", "vram: "),
    (["-m", "lab.bench.decode_error"], "| placement | device | model | settings |", "decode CPU only: "),
    (["-m", "lab.bench.prefill_error"], "| placement | device | model | prompt |", "prefill: "),
]


def render(text: str) -> str:
    for args, first, last in TABLES:
        out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        start = text.index(first)
        end = text.index("\n", text.index("\n" + last, start) + 1)
        text = text[:start] + out + text[end:]
    return text


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print(f"{PAGE.relative_to(ROOT)}: the measured tables are not the bench scripts' output; run: make docs", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
