"""A job's own spec (image, command, env, slots, timeout, retries): checked against what its
queue allows, one line per problem, and resolved into what the agent runs."""

from __future__ import annotations

import json
import sys

import pytest
from agent_harness import Harness, wait_until
from click.testing import CliRunner

from tidefleet.cli import main
from tidefleet.config import Pool, Queue
from tidefleet.jobs import sdk
from tidefleet.jobs.spec import JobSpec, problems, resolve

CONTAINER = Pool(instance_types=[{"type": "g5.xlarge", "gpus": 1}], max=4, container="ghcr.io/acme/train:2026.11",
                 env={"A": "pool"})  # fmt: skip
COMMAND = Pool(instance_types=[{"type": "c6i.large"}], max=4, command="python3 -m worker")
QUEUE = Queue(pool="p", slots_per_item=4, item_timeout_s=3600, max_retries=3,
              accept_images=["ghcr.io/acme/*"], accept_commands=["python3 -m *"])  # fmt: skip
STRICT = Queue(pool="p")

BAD = [  # (spec, pool, queue, the one line)
    (JobSpec(image="busybox"), CONTAINER, QUEUE, "spec.image: queue 'q' does not accept this image (got 'busybox'); add a pattern to queues.q.accept_images"),
    (JobSpec(image="ghcr.io/evil/x:1"), CONTAINER, STRICT, "spec.image: queue 'q' does not accept this image"),
    (JobSpec(image="Bad Image"), CONTAINER, QUEUE, "spec.image: not an image reference (got 'Bad Image')"),
    (JobSpec(image=":v2"), COMMAND, QUEUE, "spec.image: queue 'q' runs a command, not a container (got ':v2')"),
    (JobSpec(command="rm -rf /"), COMMAND, QUEUE, "spec.command: queue 'q' does not accept this command (got 'rm -rf /')"),
    (JobSpec(command="python3 -m x"), COMMAND, STRICT, "spec.command: queue 'q' does not accept this command"),
    (JobSpec(command="python3 'x"), COMMAND, QUEUE, "spec.command: not shell words"),
    (JobSpec(command="  "), COMMAND, QUEUE, "spec.command: empty"),
    (JobSpec(env={"TIDEFLEET_JOB_ID": "x"}), COMMAND, QUEUE, "spec.env.TIDEFLEET_JOB_ID: not a usable variable name"),
    (JobSpec(env={"1X": "x"}), COMMAND, QUEUE, "spec.env.1X: not a usable variable name"),
    (JobSpec(env={"X": "a\0b"}), COMMAND, QUEUE, "spec.env.X: a value must be UTF-8 text without NUL"),
    (JobSpec(env={"X": 3}), COMMAND, QUEUE, "spec.env.X: a value must be UTF-8 text without NUL (got 3)"),
    (JobSpec(env={"X": "a\udcff"}), COMMAND, QUEUE, "spec.env.X: a value must be UTF-8 text without NUL"),
    (JobSpec(command="python3 -m \udcff"), COMMAND, QUEUE, "spec.command: not valid text (a lone surrogate '\\udcff' at character 12); give the command as UTF-8 text"),
    (JobSpec(slots=8), CONTAINER, QUEUE, "spec.slots: must be a whole number from 1 to 4, the queue's slots_per_item (got 8); ask for less, or raise queues.q.slots_per_item"),
    (JobSpec(slots=0), CONTAINER, QUEUE, "spec.slots: must be a whole number from 1 to 4"),
    (JobSpec(timeout_s=7200), CONTAINER, QUEUE, "spec.timeout_s: must be a whole number from 1 to 3600, the queue's item_timeout_s (got 7200)"),
    (JobSpec(max_retries=9), CONTAINER, QUEUE, "spec.max_retries: must be a whole number from 0 to 3, the queue's max_retries (got 9)"),
    (JobSpec(max_retries=True), CONTAINER, QUEUE, "spec.max_retries: must be a whole number"),
    (JobSpec(slots="2"), CONTAINER, QUEUE, "spec.slots: must be a whole number from 1 to 4, the queue's slots_per_item (got '2')"),
]


@pytest.mark.parametrize(("spec", "pool", "queue", "expected"), BAD)
def test_a_spec_beyond_what_the_queue_allows_gets_one_line_naming_field_value_and_fix(spec, pool, queue, expected):
    found = problems(spec, "q", queue, pool)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("spec", [
    JobSpec(), JobSpec(image=":v2"), JobSpec(image="ghcr.io/acme/train:v3"), JobSpec(image="ghcr.io/acme/eval:1"),
    JobSpec(command="python3 -m eval --fast"), JobSpec(env={"LR": "3e-4"}), JobSpec(slots=2, timeout_s=60, max_retries=0),
])  # fmt: skip
def test_what_the_queue_allows_passes(spec):
    pool = COMMAND if spec.command else CONTAINER
    assert problems(spec, "q", QUEUE, pool) == []


def test_a_tag_of_the_pool_s_own_image_needs_no_pattern():
    assert problems(JobSpec(image=":v2"), "q", STRICT, CONTAINER) == []
    assert resolve(JobSpec(image=":v2"), STRICT, CONTAINER).container == "ghcr.io/acme/train:v2"


def test_the_job_s_values_win_where_set_and_the_queue_s_elsewhere():
    plain = resolve(JobSpec(), QUEUE, CONTAINER)
    assert (plain.container, plain.command, plain.env, plain.slots, plain.timeout_s, plain.max_retries) == (
        "ghcr.io/acme/train:2026.11", None, {"A": "pool"}, 4, 3600, 3)
    own = resolve(JobSpec(image="ghcr.io/acme/eval:1", command="python3 -m eval", env={"A": "job", "B": "b"},
                          slots=1, timeout_s=60, max_retries=0), QUEUE, CONTAINER)  # fmt: skip
    assert (own.container, own.command, own.env, own.slots, own.timeout_s, own.max_retries) == (
        "ghcr.io/acme/eval:1", "python3 -m eval", {"A": "job", "B": "b"}, 1, 60, 0)
    assert resolve(JobSpec(), QUEUE, COMMAND).command == "python3 -m worker"


def test_the_record_keeps_only_what_was_asked_and_reads_back_the_same():
    spec = JobSpec(image=":v2", env={"A": "1"}, max_retries=0)
    assert spec.record() == {"image": ":v2", "env": {"A": "1"}, "max_retries": 0}
    assert JobSpec.from_record(spec.record()) == spec and JobSpec.from_record(None) == JobSpec()


# -- submit and status, against the moto server ------------------------------------------------


@pytest.fixture
def h(tmp_path, aws):
    harness = Harness(tmp_path, aws)
    yield harness
    harness.stop_agents()


def test_the_spec_is_recorded_on_the_job_and_shown_by_status(h):
    spec = JobSpec(env={"LR": "3e-4"}, timeout_s=30, max_retries=0)
    job_id = sdk.submit(h.env, "tuned", "work", sdk.read_items(["a"]), kick=False, spec=spec).job_id
    assert sdk.status(h.env, job_id).job.spec == {"env": {"LR": "3e-4"}, "timeout_s": 30, "max_retries": 0}
    out = CliRunner().invoke(main, ["status", job_id, "--env", str(h.env_path), "--json"]).output
    assert json.loads(out)["spec"] == spec.record()
    shown = CliRunner().invoke(main, ["status", job_id, "--env", str(h.env_path)]).output
    assert "spec: env {'LR': '3e-4'}  timeout_s 30  max_retries 0" in shown


def test_a_job_cannot_change_its_spec_on_resubmit(h):
    sdk.submit(h.env, "j", "work", sdk.read_items(["a"]), kick=False, spec=JobSpec(timeout_s=30))
    with pytest.raises(sdk.JobError, match="already exists with another spec"):
        sdk.submit(h.env, "j", "work", sdk.read_items(["a"]), kick=False, spec=JobSpec(timeout_s=20))
    assert sdk.submit(h.env, "j", "work", sdk.read_items(["a"]), kick=False, spec=JobSpec(timeout_s=30)).new_items == 0


def test_a_bad_spec_is_refused_before_anything_is_written(h):
    result = CliRunner().invoke(main, ["submit", "--env", str(h.env_path), "--name", "n", "--queue", "short",
                                       "--items", "-", "--command", "rm -rf /", "--slots", "9"], input="a\n")  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output
    # The CLI names its own flags, not the record's fields.
    assert "--command: queue 'short' does not accept this command (got 'rm -rf /')" in result.output
    assert "--slots: must be a whole number from 1 to 1, the queue's slots_per_item (got 9); ask for less" in result.output
    assert "spec." not in result.output
    assert sdk.jobs(h.env) == []
    for flags, expected in ((["--slots", "0"], ("--slots: must be a whole number from 1 to 1, the queue's slots_per_item "
                                                "(got 0); give 1 to 1, or leave it out for the queue's 1")),
                            (["--timeout", "0"], "--timeout: must be a whole number from 1 to 2"),
                            (["--max-retries", "-1"], "--max-retries: must be a whole number from 0 to 0"),
                            (["--item-env", "1X=a"], "--item-env 1X: not a usable variable name")):  # fmt: skip
        out = CliRunner().invoke(main, ["submit", "--env", str(h.env_path), "--name", "n", "--queue", "short",
                                        "--items", "-", *flags], input="a\n")  # fmt: skip
        assert out.exit_code == 1 and expected in out.output and "ask for less" not in out.output, out.output
    bad_env = CliRunner().invoke(main, ["submit", "--env", str(h.env_path), "--name", "n", "--queue", "work",
                                        "--items", "-", "--item-env", "LR"], input="a\n")  # fmt: skip
    assert bad_env.exit_code == 2 and "--item-env" in bad_env.output and "KEY=VALUE" in bad_env.output


def test_the_agent_runs_the_job_with_its_own_command_env_timeout_and_retries(h):
    other_ledger = h.tmp / "job-ledger.jsonl"
    spec = JobSpec(command=f"{sys.executable} {h.tmp / 'workload.py'} steps=1", env={"LEDGER": str(other_ledger)},
                   timeout_s=3, max_retries=0)  # fmt: skip
    job = sdk.submit(h.env, "own", "work", sdk.read_items([{"id": "ok", "args": []}, {"id": "hangs", "args": ["hang=1"]}]),
                     kick=False, spec=spec).job_id  # fmt: skip
    h.start_agent("spec-node")
    wait_until(lambda: sdk.status(h.env, job).done, 60, "both items final")
    items = h.items(job)
    assert items["ok"].status == "succeeded"
    # The job's 3 s timeout, not the queue's 60 s; no retry (the queue allows 2).
    assert items["hangs"].status == "failed" and items["hangs"].attempts == 1 and "timed out" in items["hangs"].reason
    started = [json.loads(line) for line in other_ledger.read_text().splitlines() if '"start"' in line]
    assert sorted(s["item"] for s in started) == ["hangs", "ok"] and not h.ledger.exists()
