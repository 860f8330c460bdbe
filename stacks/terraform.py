"""Find the Terraform binary: `terraform` or OpenTofu's `tofu`, whichever is on PATH."""

from __future__ import annotations

import shutil

INSTALL_HINT = (
    "neither `terraform` nor `tofu` is on PATH. Install Terraform >= 1.6 "
    "(https://developer.hashicorp.com/terraform/install) or OpenTofu >= 1.6 "
    "(https://opentofu.org/docs/intro/install/), then run this again. "
    "Everything before apply (invoke synth, scan, build) works without it."
)


class TerraformMissing(Exception):
    """Neither binary is installed; the message says what to install."""


def terraform_binary() -> str:
    for name in ("terraform", "tofu"):
        found = shutil.which(name)
        if found:
            return found
    raise TerraformMissing(INSTALL_HINT)
