"""Find the Terraform binary: `terraform` or OpenTofu's `tofu`, whichever is on PATH."""

from __future__ import annotations

import shutil

# The oldest Terraform and OpenTofu that read every stack: an s3 state without a lock table
# locks with `use_lockfile`, new in both in 1.10. One minimum for all stacks, as the README says;
# each stack's `terraform.required_version` makes an older binary stop at init, saying so.
MIN_VERSION = "1.10"
INSTALL_HINT = (
    f"neither `terraform` nor `tofu` is on PATH. Install Terraform >= {MIN_VERSION} "
    f"(https://developer.hashicorp.com/terraform/install) or OpenTofu >= {MIN_VERSION} "
    "(https://opentofu.org/docs/intro/install/), then run this again. "
    "Everything before apply (invoke synth, scan, build) works without it."
)


def require_terraform(stack) -> None:
    """Declare the minimum on a TerraformStack, before its first child: to cdktn, whose synth
    checks (an s3 backend's `use_lockfile`) read it, and in the JSON, where init enforces it."""
    stack.node.set_context("targetVersions", {"terraform": f">={MIN_VERSION}.0", "opentofu": f">={MIN_VERSION}.0"})
    stack.add_override("terraform.required_version", f">= {MIN_VERSION}")


class TerraformMissing(Exception):
    """Neither binary is installed; the message says what to install."""


def terraform_binary() -> str:
    for name in ("terraform", "tofu"):
        found = shutil.which(name)
        if found:
            return found
    raise TerraformMissing(INSTALL_HINT)
