"""The architecture, enforced: cloud SDKs only in their adapter packages, and a core that
imports no adapter (it reaches a cloud through `tidefleet.cloud.for_env` and the ports).

Static (every import statement, function-level ones included) and dynamic (what importing a
core module really loads, in a fresh interpreter)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tidefleet", "lambdas", "stacks")
# The runtimes that are one cloud by nature may import that cloud's adapters (not its SDK).
ADAPTER_USERS = {
    "tidefleet/cloud/__init__.py": ("aws", "gcp"),  # for_env: the one place that chooses
    "tidefleet/sandbox/": ("aws",),  # the whole loop on a moto server
    "lambdas/scaler/": ("aws",),
    "lambdas/interruption/": ("aws",),
    "lambdas/gcp_scaler/": ("gcp",),
}
SDKS = {"boto3": "aws", "botocore": "aws", "google": "gcp"}


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def where(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def cloud_package(path: str) -> str | None:
    """"aws" or "gcp" for a module inside that adapter package."""
    for cloud in ("aws", "gcp"):
        if path.startswith(f"tidefleet/cloud/{cloud}/"):
            return cloud
    return None


def allowed_adapters(path: str) -> tuple[str, ...]:
    own = cloud_package(path)
    if own:
        return (own,)
    return next((clouds for prefix, clouds in ADAPTER_USERS.items() if path.startswith(prefix)), ())


def violations() -> list[str]:
    out = []
    for path in modules():
        name = where(path)
        for module in imports(path):
            top = module.split(".")[0]
            if top in SDKS and cloud_package(name) != SDKS[top]:
                out.append(f"{name}: imports {module} outside tidefleet/cloud/{SDKS[top]}/")
            for cloud in ("aws", "gcp"):
                if module.startswith(f"tidefleet.cloud.{cloud}") and cloud not in allowed_adapters(name):
                    out.append(f"{name}: imports the {cloud} adapter {module}; go through tidefleet.cloud.for_env")
    return out


def test_cloud_sdks_are_imported_only_by_their_adapter_packages_and_the_core_imports_no_adapter():
    assert violations() == []


def test_the_check_sees_a_violation_when_there_is_one(tmp_path, monkeypatch):
    (tmp_path / "tidefleet" / "jobs").mkdir(parents=True)
    (tmp_path / "tidefleet" / "jobs" / "bad.py").write_text(
        "def f():\n    import boto3\n    from tidefleet.cloud.gcp.pubsub import publish\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations() == [
        "tidefleet/jobs/bad.py: imports boto3 outside tidefleet/cloud/aws/",
        "tidefleet/jobs/bad.py: imports the gcp adapter tidefleet.cloud.gcp.pubsub; go through tidefleet.cloud.for_env",
    ]


CORE = [
    "tidefleet.records", "tidefleet.ports", "tidefleet.cloud", "tidefleet.control", "tidefleet.policy",
    "tidefleet.jobs.sdk", "tidefleet.jobs.cli", "tidefleet.agent.worker", "tidefleet.agent.checkpoint",
    "tidefleet.sim", "tidefleet.config", "tidefleet.cli",
]  # fmt: skip


@pytest.mark.parametrize("module", CORE)
def test_importing_a_core_module_loads_no_cloud_sdk(module):
    code = (
        f"import sys, json, {module}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'boto3', 'botocore', 'google'})))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(loaded.stdout) == []
