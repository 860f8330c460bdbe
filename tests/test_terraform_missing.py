"""Without terraform or tofu, plan/deploy/destroy say what to install, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.terraform import TerraformMissing, terraform_binary

ROOT = Path(__file__).resolve().parents[1]


def test_missing_binary_names_both_tools_and_where_to_get_them(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TerraformMissing) as err:
        terraform_binary()
    message = str(err.value)
    for hint in ("terraform", "OpenTofu", ">= 1.10", "https://developer.hashicorp.com/terraform/install",
                 "https://opentofu.org/docs/intro/install/"):  # fmt: skip
        assert hint in message


@pytest.mark.parametrize("name", ["terraform", "tofu"])
def test_either_binary_on_path_is_used(monkeypatch, tmp_path, name):
    binary = tmp_path / name
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert terraform_binary() == str(binary)


def test_invoke_deploy_without_terraform_ends_with_the_message_and_a_nonzero_exit(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "deploy", "--env", "dev"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": str(tmp_path)},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Install Terraform >= 1.10" in output and "Traceback" not in output, output
