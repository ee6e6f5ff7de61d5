"""inference-plane's policy pack: `pulumi preview --policy-pack policy` (this folder)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from pack import POLICIES  # noqa: E402

PolicyPack(name="inference-plane", enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
