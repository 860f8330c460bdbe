"""Control characters (a line break, a tab, an escape sequence) in the text a user gives and the
CLI prints back, against the moto server: refused where the user gives it (a job name, a cancel
reason), written escaped on one line where it was stored anyway (a name recorded before the rule,
a workload's last output line in a failure reason, a job's command)."""

from __future__ import annotations

import time

import pytest
from agent_harness import Harness
from test_jobs_bad_input import queued, refused_cleanly, run

from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.jobs import sdk
from tidefleet.records import Job


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


@pytest.mark.parametrize(("name", "shown"), [
    ("a\nb", "'\\n' at character 2"),
    ("a\r", "'\\r' at character 2"),
    ("\tx", "'\\t' at character 1"),
    ("x\x1b[2Jy", "'\\x1b' at character 2"),
    ("x\x7f", "'\\x7f' at character 2"),
    ("x\x9b31m", "'\\x9b' at character 2"),  # C1: a one-byte escape sequence start on some terminals
])  # fmt: skip
def test_a_job_name_with_a_control_character_is_refused_in_one_line_naming_the_field(h, tmp_path, name, shown):
    items = tmp_path / "items.txt"
    items.write_text("s3://a\n")
    out = run(h, "submit", "--name", name, "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    (line,) = out.output.strip().splitlines()
    assert line.startswith("Error: name: a control character ") and shown in line and "one line" in line, line
    assert "\x1b" not in line and "\r" not in line
    with pytest.raises(sdk.JobError, match="^name: a control character"):
        sdk.submit(h.env, name, "work", sdk.read_items(["s3://a"]), kick=False)
    assert sdk.jobs(h.env) == [] and queued(h) == 0


def test_a_name_of_other_scripts_and_emoji_is_still_a_name(h):
    job = sdk.submit(h.env, "nächtlich 評価 🚀 zwj 👩‍🔬", "work", sdk.read_items(["a"]), kick=False)
    assert DynamoStore(h.env.name, h.env.region).job(job.job_id).name == "nächtlich 評価 🚀 zwj 👩‍🔬"


def test_jobs_prints_a_name_recorded_with_control_characters_escaped_on_its_one_line(h):
    store = DynamoStore(h.env.name, h.env.region)
    store.put_job(Job("old-1", "a\nb\x1b[2Jc", "work", time.time(), 0, counted=True))  # recorded before the rule
    out = run(h, "jobs")
    assert out.exit_code == 0, out.output
    (line,) = out.output.strip().splitlines()
    assert line.startswith("old-1  work") and line.endswith("a\\nb\\x1b[2Jc") and "\x1b" not in line


def test_a_cancel_reason_with_a_control_character_or_not_text_is_refused(h):
    job_id = sdk.submit(h.env, "cancel me", "work", sdk.read_items(["a"]), kick=False).job_id
    with pytest.raises(sdk.JobError, match=r"^reason: a control character '\\n' at character 5"):
        sdk.cancel(h.env, job_id, reason="line\ntwo")
    with pytest.raises(sdk.JobError, match="^reason: must be a string"):
        sdk.cancel(h.env, job_id, reason=3)
    assert not DynamoStore(h.env.name, h.env.region).job(job_id).cancelled, "refused before anything is written"
    assert sdk.cancel(h.env, job_id, reason="superseded by v2") == 1


def test_status_prints_a_workloads_escape_sequences_and_line_breaks_escaped(h):
    job_id = sdk.submit(h.env, "colours", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    reason = "exit code 1; last output: \x1b[31mFAILED\x1b[0m tests/x.py\rdone"
    DynamoStore(h.env.name, h.env.region).update_item(job_id, "000000", status="failed", reason=reason)
    out = run(h, "status", job_id)
    assert "\x1b" not in out.output and "\r" not in out.output
    assert "failed 000000: exit code 1; last output: \\x1b[31mFAILED\\x1b[0m tests/x.py\\rdone" in out.output
