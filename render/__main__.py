"""Offline render: ``python -m render <stack> [--out DIR]``.

Runs the program under Pulumi's mock engine with the stack's config, writes one manifest per
resource, validates each strictly and prints a summary. On any error: one line on stderr, a
non-zero exit, and nothing written (a previous render in the folder is left as it was).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .offline import PROJECT_DIR
from .output import RenderError, render_stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m render", description=__doc__.splitlines()[0])
    parser.add_argument("stack", help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument("--out", type=Path, help="output folder (default: rendered/<stack>)")
    parser.add_argument(
        "--stack-dir", type=Path, default=PROJECT_DIR, help="folder holding Pulumi.<stack>.yaml (default: the project)"
    )
    args = parser.parse_args(argv)
    out = args.out or Path("rendered") / args.stack
    try:
        result = render_stack(args.stack, out, project_dir=args.stack_dir)
    except RenderError as error:
        print(f"render {args.stack}: {error}", file=sys.stderr)
        return error.exit_code
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
