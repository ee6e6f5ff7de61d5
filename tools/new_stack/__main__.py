"""`python -m tools.new_stack ARGS` from the project folder (what `make new-stack` runs), or
`python tools/new_stack ARGS` from anywhere."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a folder: only tools/new_stack/ is on the path
    sys.path.insert(0, str(ROOT))

from tools.new_stack.cli import main  # noqa: E402 - after the path edit above

sys.exit(main())
