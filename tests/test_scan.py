"""checkov finds nothing unsuppressed in any shipped environment, and suppressions are kept honest."""

from __future__ import annotations

import pytest
from conftest import SHIPPED_ENVS

from stacks.scan import SUPPRESSIONS, load_suppressions, scan

pytestmark = pytest.mark.synth


@pytest.mark.parametrize("env_name", SHIPPED_ENVS)
def test_every_shipped_environment_scans_with_zero_failed_checks(synthesized, env_name, capsys):
    stack_dir, _ = synthesized[env_name]
    assert scan(stack_dir, env_name) == 0, capsys.readouterr().out
    assert "stale suppression" not in capsys.readouterr().out


def test_every_suppression_names_one_resource_and_gives_a_reason():
    entries = load_suppressions()
    assert entries
    for entry in entries:
        assert entry.check.startswith("CKV") and "*" not in entry.resource and len(entry.reason) > 40


def test_a_suppression_without_a_reason_is_refused(tmp_path):
    bad = tmp_path / "s.toml"
    bad.write_text('[[suppress]]\ncheck = "CKV_AWS_18"\nresource = "aws_s3_bucket.x"\nreason = " "\n')
    with pytest.raises(ValueError, match="has no reason"):
        load_suppressions(bad)


def test_an_unsuppressed_failure_is_counted_and_printed_and_a_stale_one_reported(synthesized, tmp_path, capsys):
    # The same stack with one suppression swapped for one that matches nothing.
    text = SUPPRESSIONS.read_text()
    entry = '[[suppress]]\ncheck = "CKV_AWS_18"\nresource = "aws_s3_bucket.artifacts_bucket"\n'
    assert entry in text
    trimmed = tmp_path / "suppressions.toml"
    swapped = (
        '[[suppress]]\ncheck = "CKV_AWS_0"\nresource = "aws_s3_bucket.artifacts_bucket"\nreason = "x"\n\n'
        '[[suppress]]\ncheck = "CKV_AWS_0"\nresource = "aws_s3_bucket.not_in_this_stack"\n'
    )
    trimmed.write_text(text.replace(entry, swapped))
    stack_dir, _ = synthesized["dev"]
    assert scan(stack_dir, "dev", suppressions_file=trimmed) == 1
    out = capsys.readouterr().out
    assert "FAILED CKV_AWS_18 aws_s3_bucket.artifacts_bucket" in out
    assert "stale suppression (matched nothing in dev): CKV_AWS_0 aws_s3_bucket.artifacts_bucket" in out
    assert "not_in_this_stack" not in out  # another stack's resource: not this scan's business
