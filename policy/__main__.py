"""inference-plane's policy pack: `pulumi preview --policy-pack policy` (this folder)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The facts the rules check against are the program's own (common/constants.py, standard library only).
sys.path.insert(1, os.path.dirname(HERE))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from pack import POLICIES  # noqa: E402

PolicyPack(name="inference-plane", enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
