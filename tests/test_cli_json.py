"""The CLI as something to script, against the moto server: `status` exit codes, --watch with
--time-limit, failure summaries, and the `--json` schemas of status, nodes, logs, validate and jobs."""

from __future__ import annotations

import json
import re
import time

import boto3
import pytest
from agent_harness import Harness
from click.testing import CliRunner

from tidefleet import naming
from tidefleet.cli import main
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.jobs import cli as jobs_cli
from tidefleet.jobs import sdk
from tidefleet.records import Heartbeat


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def run(h: Harness, *args: str):
    env = {"TIDEFLEET_ENV": str(h.env_path), "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
    return CliRunner().invoke(main, list(args), env=env)


def job_with(h: Harness, name: str, *statuses: str) -> str:
    """A job whose items have `statuses`; "failed:REASON" gives a reason (default "exit code 1")."""
    job_id = sdk.submit(h.env, name, "work", sdk.read_items([f"s3://b/{n}" for n in range(len(statuses))]),
                        kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    for n, status in enumerate(statuses):
        status, _, reason = status.partition(":")
        if status != "queued":
            store.update_item(job_id, f"{n:06d}", status=status, reason=reason or "exit code 1")
    return job_id


# -- status: exit codes, --watch, failures ------------------------------------------------------
@pytest.mark.parametrize(
    "statuses, exit_code",
    [
        (("succeeded", "succeeded"), 0),  # done, nothing failed
        (("succeeded", "cancelled"), 1),  # cancelled: `status --watch J && next` must not go on
        (("succeeded", "failed"), 1),  # done with a failed item
        (("failed", "queued"), 0),  # still running: no verdict yet
        (("running", "queued"), 0),
    ],
)
def test_status_exits_1_only_when_the_job_is_done_with_failed_or_cancelled_items(h, statuses, exit_code):
    out = run(h, "status", job_with(h, "exit-" + "-".join(statuses), *statuses))
    assert out.exit_code == exit_code, out.output
    assert "Traceback" not in out.output


def test_watch_gives_up_at_the_time_limit_with_exit_1_and_a_line_saying_so(h):
    job_id = job_with(h, "slow", "queued")
    out = run(h, "status", job_id, "--watch", "--time-limit", "0.2")
    assert out.exit_code == 1
    assert f"gave up after --time-limit 0.2s: job {job_id} not done (0/1 items final)" in out.output


def test_watch_redraws_until_done_then_exits_like_status(h, monkeypatch):
    job_id = job_with(h, "finishing", "running", "running")
    store = DynamoStore(h.env.name, h.env.region)
    pending = ["000000", "000001"]

    def one_item_finishes(seconds):  # each refresh sees one more item final
        store.update_item(job_id, pending.pop(0), status="failed", reason="boom")

    monkeypatch.setattr(jobs_cli.time, "sleep", one_item_finishes)
    out = run(h, "status", job_id, "--watch")
    assert out.exit_code == 1 and not pending
    assert "failed 2" in out.output and "failed 000001: boom" in out.output
    # Piped (CliRunner is no terminal): a view each time the counts changed, one after the other.
    assert out.output.index("failed 1") < out.output.index("failed 2")


def test_piped_tables_keep_long_ids_whole_and_a_heartbeat_ahead_of_the_clock_is_never_negative(h):
    node_id = "i-" + "0123456789abcdef" * 6  # wider than the 80 columns rich assumes without a terminal
    DynamoStore(h.env.name, h.env.region).put_heartbeat(
        Heartbeat(node_id, "cpu", at=4e9, slots=2, busy_slots=1, idle_since=None, instance_type="c6i.large", spot=True))
    out = run(h, "nodes")
    assert out.exit_code == 0 and node_id in out.output, out.output
    assert "now (its clock is" in out.output and "-" not in out.output.split(node_id)[1].split("ahead")[0]


def test_a_pool_without_nodes_is_one_line_saying_why_and_json_keeps_its_shape(h):
    out = run(h, "nodes")
    assert out.exit_code == 0 and "┃" not in out.output, out.output  # no empty table
    assert out.output.splitlines() == [
        ("pool cpu: desired 0, 0 instance(s): no nodes; normal with nothing to run: the pool scales to zero, "
         "and the scaler starts nodes when items are queued")]
    (obj,) = json_lines(run(h, "nodes", "--json"))
    assert obj["pools"] == [{"pool": "cpu", "desired": 0, "instances": 0, "nodes": []}]
    h.group_instance()  # launched, its agent not started yet: no heartbeat
    assert run(h, "nodes").output.splitlines() == [
        ("pool cpu: desired 1, 1 instance(s): no node has reported yet; each is listed from its agent's first "
         "heartbeat, typically 60 s after launch")]
    group = naming.group(h.env.name, "cpu")
    boto3.client("autoscaling", region_name=h.env.region).delete_auto_scaling_group(AutoScalingGroupName=group,
                                                                                    ForceDelete=True)  # fmt: skip
    assert run(h, "nodes").output.splitlines() == [
        f"pool cpu: group not found, no nodes; `invoke deploy --env {h.env_path}` creates it"]


def test_status_summarises_failures_and_lists_them_all_with_failed(h):
    job_id = job_with(h, "many-failed", *["failed"] * 11, "failed:out of memory", "succeeded")
    out = run(h, "status", job_id)
    assert out.exit_code == 1
    assert "top failure reasons:" in out.output and "11 x exit code 1" in out.output and "1 x out of memory" in out.output
    assert "failed 000009: exit code 1" in out.output and "failed 000010" not in out.output
    assert "... and 2 more failed item(s): --failed lists them all" in out.output
    out = run(h, "status", job_id, "--failed")
    assert "failed 000011: out of memory" in out.output and "more failed item(s)" not in out.output
    # Every reason different (each names its item): no summary repeating the list below it.
    out = run(h, "status", job_with(h, "all-different", "failed:item 0 broke", "failed:item 1 broke"))
    assert "top failure reasons" not in out.output and "failed 000001: item 1 broke" in out.output


def test_time_limit_without_watch_is_refused(h):
    out = run(h, "status", "x", "--time-limit", "5")
    assert out.exit_code == 2 and "only applies with --watch" in out.output


# -- --json: one versioned schema per command ---------------------------------------------------
def json_lines(out) -> list[dict]:
    assert "Traceback" not in out.output
    return [json.loads(line) for line in out.stdout.splitlines()]


def has_shape(obj: dict, shape: dict) -> None:
    """Every key of `shape` is in `obj` with a value of that type (fields are only ever added)."""
    for key, types in shape.items():
        assert key in obj, key
        assert isinstance(obj[key], types), (key, obj[key])


STATUS_SHAPE = {"schema": str, "job_id": str, "name": str, "queue": str, "created_at": float, "total": int,
                "cancelled": bool, "state": str, "done": bool, "counts": dict, "unrecorded": int, "failed": list,
                "warnings": list}
JOB_SHAPE = {k: STATUS_SHAPE[k] for k in ("job_id", "name", "queue", "created_at", "total", "cancelled", "state",
                                          "done", "counts")}


def test_status_json_has_the_versioned_schema_and_the_same_exit_code(h):
    job_id = job_with(h, "json-status", "succeeded", "failed:out of memory")
    out = run(h, "status", job_id, "--json")
    (obj,) = json_lines(out)
    assert out.exit_code == 1
    has_shape(obj, STATUS_SHAPE)
    assert obj["schema"] == "tidefleet.status/1" and obj["state"] == "failed" and obj["done"] is True
    assert obj["counts"] == {"succeeded": 1, "running": 0, "queued": 0, "failed": 1, "cancelled": 0}
    assert obj["failed"] == [{"item_id": "000001", "reason": "out of memory", "exit_code": None}]


def test_status_json_under_watch_prints_one_object_per_refresh(h):
    out = run(h, "status", job_with(h, "json-watch", "queued"), "--json", "--watch", "--time-limit", "0.1")
    lines = json_lines(out)
    assert out.exit_code == 1 and len(lines) >= 1 and all(o["state"] == "running" for o in lines)


def test_nodes_json_lists_pools_and_nodes(h):
    DynamoStore(h.env.name, h.env.region).put_heartbeat(
        Heartbeat("i-1", "cpu", at=0.0, slots=2, busy_slots=1, idle_since=None, instance_type="c6i.large", spot=True))
    out = run(h, "nodes", "--json")
    (obj,) = json_lines(out)
    assert out.exit_code == 0 and obj["schema"] == "tidefleet.nodes/1" and isinstance(obj["env"], str)
    (pool,) = [p for p in obj["pools"] if p["pool"] == "cpu"]
    has_shape(pool, {"pool": str, "desired": (int, type(None)), "instances": (int, type(None)), "nodes": list})
    (node,) = pool["nodes"]
    has_shape(node, {"node_id": str, "instance_type": str, "spot": bool, "busy_slots": int, "slots": int,
                     "gpus": int, "draining": bool, "heartbeat_age_s": float, "gone": bool})


def test_logs_json_is_one_object_per_line(h):
    job_id = job_with(h, "json-logs", "queued")
    stream = for_env(h.env).logs.stream("work", job_id, "000000", 1)
    for line in ("epoch 1", '{"not": "parsed"}'):
        stream.write(line)
    stream.close()
    out = run(h, "logs", job_id, "--json")
    lines = json_lines(out)
    assert out.exit_code == 0 and [o["line"] for o in lines] == ["epoch 1", '{"not": "parsed"}']
    for obj in lines:
        has_shape(obj, {"schema": str, "job_id": str, "stream": str, "line": str})
        assert obj["schema"] == "tidefleet.log/1" and obj["job_id"] == job_id


@pytest.mark.parametrize("names, exit_code", [(["dev"], 0), (["dev", "no-such-env"], 1)])
def test_validate_json_reports_every_environment(names, exit_code):
    out = CliRunner().invoke(main, ["validate", "--json", *names])
    (obj,) = json_lines(out)
    assert out.exit_code == exit_code and obj["schema"] == "tidefleet.validate/1" and obj["ok"] is (exit_code == 0)
    assert [e["name"] for e in obj["environments"]] == names
    for env in obj["environments"]:
        has_shape(env, {"name": str, "ok": bool, "error": (str, type(None)), "cloud": (str, type(None)),
                        "region": (str, type(None)), "pools": (int, type(None)), "queues": (int, type(None))})
    assert obj["environments"][0]["cloud"] == "aws"


# -- no tracebacks ------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["status", "no-such-job"], ["status", "no-such-job", "--json"],
                                  ["logs", "no-such-job", "--json"]])
def test_a_missing_job_is_one_line_and_exit_1(h, args):
    out = run(h, *args)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit)
    assert out.output.strip().count("\n") == 0 and "job 'no-such-job' not found" in out.output


@pytest.mark.parametrize("args", [["status", "j"], ["status", "j", "--json"], ["nodes", "--json"],
                                  ["logs", "j", "--json"]])
def test_an_unreachable_endpoint_is_one_line_and_exit_1(h, monkeypatch, args):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    out = run(h, *args)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit)
    assert out.output.strip().count("\n") == 0 and "cannot reach AWS" in out.output


# -- jobs --------------------------------------------------------------------------------------
def test_jobs_lists_every_job_with_its_state_and_filters_by_queue_and_state(h):
    running = job_with(h, "list-running", "succeeded", "queued")
    done = job_with(h, "list-done", "succeeded")
    failed = job_with(h, "list-failed", "failed")
    other = sdk.submit(h.env, "list-short", "short", sdk.read_items(["a"]), kick=False).job_id
    cases = [  # (filters, job ids expected, oldest first)
        ([], [running, done, failed, other]),
        (["--queue", "work"], [running, done, failed]),
        (["--state", "running"], [running, other]),
        (["--state", "done"], [done]),
        (["--state", "failed", "--queue", "work"], [failed]),
        (["--state", "failed", "--queue", "short"], []),
    ]
    for filters, expected in cases:
        out = run(h, "jobs", "--json", *filters)
        (obj,) = json_lines(out)
        assert out.exit_code == 0 and obj["schema"] == "tidefleet.jobs/1"
        assert [j["job_id"] for j in obj["jobs"]] == expected, filters
        for job in obj["jobs"]:
            has_shape(job, JOB_SHAPE)
    text = run(h, "jobs", "--queue", "work")
    assert text.exit_code == 0 and f"{failed}  work  failed  1/1 final (1 failed, 0 running)" in text.output
    out = run(h, "jobs", "--queue", "nope")
    assert out.exit_code == 1 and "unknown queue 'nope'" in out.output and "Traceback" not in out.output


def test_jobs_filters_by_every_state_it_prints_cancelled_and_cancelling_too(h):
    done = job_with(h, "list-done", "succeeded")
    cancelled = job_with(h, "list-cancelled", "queued")
    cancelling = job_with(h, "list-cancelling", "running", "queued")  # its running item stops within a heartbeat
    for job_id in (cancelled, cancelling):
        sdk.cancel(h.env, job_id)
    for state, expected in (("cancelled", cancelled), ("cancelling", cancelling), ("done", done)):
        text = run(h, "jobs", "--state", state)
        assert text.exit_code == 0 and [line.split("  ")[:3] for line in text.output.splitlines()] == \
            [[expected, "work", state]], text.output
        (obj,) = json_lines(run(h, "jobs", "--json", "--state", state))
        assert [j["job_id"] for j in obj["jobs"]] == [expected]
    assert [s.job.job_id for s in sdk.jobs(h.env, state="cancelled")] == [cancelled]
    assert run(h, "jobs", "--state", "running").output == "no jobs in state running\n", "a cancelling job is not listed as running"


def test_jobs_since_leaves_out_older_jobs_and_a_bad_value_names_the_option(h):
    job_with(h, "since-old", "succeeded")
    assert [j["name"] for j in json_lines(run(h, "jobs", "--json", "--since", "1d"))[0]["jobs"]] == ["since-old"]
    assert json_lines(run(h, "jobs", "--json", "--since", "2999-01-01"))[0]["jobs"] == []
    assert "since 2999-01-01" in run(h, "jobs", "--since", "2999-01-01").output
    out = run(h, "jobs", "--since", "last week")
    assert out.exit_code == 2 and "--since: not a duration or a date (got 'last week')" in out.output
    assert "Traceback" not in out.output


def test_jobs_with_an_unreachable_endpoint_is_one_line_and_exit_1(h, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    out = run(h, "jobs", "--json")
    assert out.exit_code == 1 and out.output.strip().count("\n") == 0 and "cannot reach AWS" in out.output


def test_tick_log_json_prints_tidefleets_json_lines_and_no_library_chatter(h):
    """--log-json adds the function's JSON lines on stderr, and only those: not botocore's INFO
    ("Found credentials in environment variables.") through a root logger set to INFO."""
    import os
    import subprocess
    import sys

    job_with(h, "waiting", "queued")
    done = subprocess.run([sys.executable, "-m", "tidefleet.cli", "tick", "--env", str(h.env_path), "--dry-run",
                           "--log-json"], env={**os.environ, "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and "Found credentials" not in done.stderr, done.stderr
    assert all(isinstance(json.loads(line), dict) for line in lines), done.stderr
    assert "(dry run: nothing changed)" in done.stdout


def test_nodes_says_a_heartbeat_from_a_clock_ahead_is_now_not_0s_ago(h):
    """The scaler reads a heartbeat over 60 s ahead of its clock as written now (control.CLOCK_SLACK_S)."""
    store = DynamoStore(h.env.name, h.env.region)
    store.put_heartbeat(Heartbeat("i-ahead", "cpu", at=time.time() + 3600, slots=2, busy_slots=1, idle_since=None,
                                  instance_type="c6i.large", spot=True))  # fmt: skip
    store.put_heartbeat(Heartbeat("i-fine", "cpu", at=time.time() - 5, slots=2, busy_slots=0, idle_since=time.time(),
                                  instance_type="c6i.large", spot=True))  # fmt: skip
    out = run(h, "nodes")
    ahead = next(line for line in out.output.splitlines() if "i-ahead" in line)
    assert re.search(r"now \(its clock is 3\d{3}s", ahead), out.output
    assert "s ago" in next(x for x in out.output.splitlines() if "i-fine" in x), out.output
