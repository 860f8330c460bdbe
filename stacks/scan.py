"""checkov on a synthesized stack, offline, with reasoned per-resource suppressions.

checkov ignores inline skip comments in synthesized JSON (bridgecrewio/checkov#4634), so
suppressions live in `checkov_suppressions.toml`: one entry per (check, resource address),
each with its reason, optionally limited to some environments. There is no global skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from stacks.tools import dev_tool

SUPPRESSIONS = Path(__file__).with_name("checkov_suppressions.toml")
# No Prisma Cloud API key, no downloads of external checks or guideline mappings.
OFFLINE_ENV = {"BC_SKIP_MAPPING": "TRUE", "CHECKOV_SKIP_DOWNLOAD": "TRUE", "BC_API_KEY": ""}


@dataclass(frozen=True)
class Suppression:
    check: str
    resource: str
    reason: str
    envs: tuple[str, ...] = ()

    def applies_to(self, env_name: str) -> bool:
        return not self.envs or env_name in self.envs


@dataclass(frozen=True)
class Finding:
    check: str
    resource: str  # full Terraform address: aws_lambda_function.control_scaler, data.aws_x.y
    name: str


def load_suppressions(path: Path = SUPPRESSIONS) -> list[Suppression]:
    entries = tomllib.loads(path.read_text()).get("suppress", [])
    out = []
    for i, entry in enumerate(entries):
        if not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path.name}: suppress[{i}] ({entry.get('check')}) has no reason; every suppression needs one")
        if set(entry) - {"check", "resource", "reason", "envs"}:
            raise ValueError(f"{path.name}: suppress[{i}]: unknown keys {sorted(set(entry) - {'check', 'resource', 'reason', 'envs'})}")
        out.append(Suppression(entry["check"], entry["resource"], entry["reason"], tuple(entry.get("envs", ()))))
    return out


def _addresses(stack_json: dict) -> dict[str, str]:
    """checkov names some terraform_json blocks `resource.<name>`/`data.<name>`; map every
    form it uses back to the full address. Logical names are unique in our stacks."""
    out = {}
    for block, prefix in (("resource", ""), ("data", "data.")):
        for rtype, items in stack_json.get(block, {}).items():
            for name in items:
                full = f"{prefix}{rtype}.{name}"
                out.update({full: full, f"{rtype}.{name}": full, f"{block}.{name}": full})
    return out


def _without_terraform_settings(stack: dict) -> dict:
    """The stack less the `terraform` block's plain settings (`required_version`): checkov's
    terraform_json parser takes every key there for a nested block and fails on a string. It
    has no check on them; the backend and required_providers stay."""
    settings = {k: v for k, v in stack.get("terraform", {}).items() if isinstance(v, dict)}
    return stack | ({"terraform": settings} if "terraform" in stack else {})


def run_checkov(stack_file: Path) -> list[Finding]:
    with tempfile.TemporaryDirectory() as scratch:
        scanned = Path(scratch) / stack_file.name
        scanned.write_text(json.dumps(_without_terraform_settings(json.loads(stack_file.read_text()))))
        result = subprocess.run(
            [dev_tool("checkov", "checkov"), "-f", str(scanned), "--framework", "terraform_json", "-o", "json",
             "--skip-download"],
            check=False, capture_output=True, text=True, env={**os.environ, **OFFLINE_ENV},
        )  # fmt: skip
    try:
        reports = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"checkov failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}") from None
    addresses = _addresses(json.loads(stack_file.read_text()))
    findings = []
    for report in reports if isinstance(reports, list) else [reports]:
        if report.get("summary", {}).get("parsing_errors"):
            raise RuntimeError(f"checkov could not parse {stack_file}")
        for failed in report.get("results", {}).get("failed_checks", []):
            resource = addresses.get(failed["resource"], failed["resource"])
            findings.append(Finding(failed["check_id"], resource, failed["check_name"]))
    return findings


def scan(synth_dir: Path, env_name: str, *, suppressions_file: Path = SUPPRESSIONS) -> int:
    """Print every unsuppressed failed check and every stale suppression; return the failures."""
    stack_file = Path(synth_dir) / "cdk.tf.json"
    findings = run_checkov(stack_file)
    # A suppression for a resource this stack does not have (another cloud's, another env's
    # pool) does not apply here; one whose resource exists but no longer fails is stale.
    present = set(_addresses(json.loads(stack_file.read_text())).values())
    suppressions = [
        s for s in load_suppressions(suppressions_file) if s.applies_to(env_name) and s.resource in present
    ]
    suppressed = {(s.check, s.resource) for s in suppressions}
    failures = [f for f in findings if (f.check, f.resource) not in suppressed]
    for f in failures:
        print(f"FAILED {f.check} {f.resource}: {f.name}")
    found = {(f.check, f.resource) for f in findings}
    for s in suppressions:
        if (s.check, s.resource) not in found:
            print(f"stale suppression (matched nothing in {env_name}): {s.check} {s.resource}")
    print(f"checkov {env_name}: {len(failures)} failed check(s); {len(findings) - len(failures)} more suppressed, "
          "each with its reason in stacks/checkov_suppressions.toml")  # fmt: skip
    return len(failures)
