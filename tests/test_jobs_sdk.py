"""The job SDK and CLI against the moto server: items parsed from every source, idempotent
submit, status counts, cancel of waiting items, the scaler kick, and errors that say what to do."""

from __future__ import annotations

import io
import json
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from agent_harness import Harness
from click.testing import CliRunner

from tidefleet import control, naming
from tidefleet.agent.runner import workload_command
from tidefleet.cli import main
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.config import Pool
from tidefleet.jobs import sdk
from tidefleet.jobs.cost_cli import collect
from tidefleet.records import Heartbeat


@pytest.mark.parametrize(
    "source, expected",
    [
        (["s3://b/a", "s3://b/b"], [("000000", ["s3://b/a"]), ("000001", ["s3://b/b"])]),
        ([["--lr", "0.1"]], [("000000", ["--lr", "0.1"])]),
        ([{"id": "run-7", "args": ["x"]}], [("run-7", ["x"])]),
        (io.StringIO('# comment\ns3://b/a\n\n{"id": "k", "args": "s3://b/b"}\n["a", "b"]\n'),
         [("000000", ["s3://b/a"]), ("k", ["s3://b/b"]), ("000002", ["a", "b"])]),
        # Normalised: a byte-order mark, CRLF line ends, blank and whitespace-only lines, spaces around a URI.
        (io.BytesIO(b'\xef\xbb\xbfs3://b/a\r\n   \r\n\t s3://b/b  \r\n{"id": 7, "args": []}'),
         [("000000", ["s3://b/a"]), ("000001", ["s3://b/b"]), ("7", [])]),
    ],
)
def test_reads_items_from_lists_uris_and_json_lines(source, expected):
    assert [(s.item_id, s.args) for s in sdk.read_items(source)] == expected


@pytest.mark.parametrize(
    "source, message",
    [
        ([], "items: no items given"),
        ([{"id": "a", "args": []}, {"id": "a", "args": []}], "items[1]: item id 'a' already used by items[0]"),
        ([{"id": "bad id!", "args": []}], "items[0]: item id 'bad id!' contains ' '"),
        ([3], "items[0]: not an item (got 3)"),
        (io.StringIO('{"id": \n'), "stdin:1: not valid JSON"),
        ("/no/such/file", "no such file '/no/such/file'"),
        ("s3://b/a", ("items: no such file 's3://b/a'; a string is a file's path: give one item as a list, "
                      "read_items(['s3://b/a'])")),
        # Not a list of items: a dict's keys, a set's order (it changes from run to run), bytes' ints.
        ({"id": "x", "args": ["--foo"]}, ("items: a dict is not a list of items (got {'id': 'x', 'args': ['--foo']}); "
                                         "give a list of them, e.g. read_items([{'id': 'x', 'args': ['--foo']}])")),
        ({"s3://b/a", "s3://b/b"}, ("items: a set has no order, and items are numbered by their position (a re-submit "
                                   "must give them in the same order); give a list, e.g. read_items(sorted(items))")),
        (frozenset({"s3://b/a"}), "items: a frozenset has no order"),
        (b"s3://b/a\n", ("items: bytes are not a list of items (got b's3://b/a\\n'); give a list, a file path, or "
                         "the bytes as a stream: read_items(io.BytesIO(data))")),
        (bytearray(b"s3://b/a"), "items: bytearray is not a list of items"),
    ],
)
def test_bad_items_are_refused_with_what_to_do(source, message):
    with pytest.raises(sdk.JobError) as err:
        sdk.read_items(source)
    assert message in str(err.value)


@pytest.mark.parametrize("source", [{"s3://b/a": 1}, {"s3://b/a"}, b"s3://b/a\n", "items.txt"])
def test_submit_refuses_what_read_items_refuses_as_not_a_list_of_items(source):
    with pytest.raises(sdk.JobError, match=r"^items: (a dict|a set|bytes|a str) "):
        sdk.check_items(source)


def test_items_built_in_code_that_are_not_item_specs_point_at_read_items():
    with pytest.raises(sdk.JobError) as err:
        sdk.check_items(["s3://b/a"])
    assert str(err.value) == ("items[0]: not an ItemSpec(item_id: str, args: list[str]) (got 's3://b/a'); give "
                              "sdk.read_items(...) of URIs, lists of args or {'id': ..., 'args': [...]} objects, "
                              "or ItemSpec objects; nothing submitted")


def test_job_id_is_deterministic_and_readable():
    assert sdk.job_id_for("Nightly eval #3") == sdk.job_id_for("Nightly eval #3")
    assert sdk.job_id_for("Nightly eval #3").startswith("nightly-eval-3-")
    assert sdk.job_id_for("a") != sdk.job_id_for("A")


def test_container_pools_run_docker_with_the_item_environment_passed_through(tmp_path):
    pool = Pool(instance_types=[{"type": "c6i.large"}], max=1, container="ghcr.io/x/train:1")
    argv = workload_command(pool, ["--epochs", "3"], ["TIDEFLEET_JOB_ID"], [tmp_path])
    assert argv == ["docker", "run", "--rm", "-e", "TIDEFLEET_JOB_ID", "-v", f"{tmp_path}:{tmp_path}",
                    "ghcr.io/x/train:1", "--epochs", "3"]
    command_pool = Pool(instance_types=[{"type": "c6i.large"}], max=1, command="python3 -m train --fast")
    assert workload_command(command_pool, ["s3://x"], [], []) == ["python3", "-m", "train", "--fast", "s3://x"]


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def test_submitting_the_same_job_twice_creates_nothing_twice(h):
    items = sdk.read_items([f"s3://b/{i}" for i in range(23)])  # three SQS batches
    first = sdk.submit(h.env, "twice", "work", items, kick=False)
    again = sdk.submit(h.env, "twice", "work", items, kick=False)
    assert (first.new_items, first.sent, first.total) == (23, 23, 23)
    assert (again.job_id, again.new_items, again.sent, again.total) == (first.job_id, 0, 0, 23)
    assert h.queue_depth("work") == 23
    status = sdk.status(h.env, first.job_id)
    assert status.counts == {"succeeded": 0, "running": 0, "queued": 23, "failed": 0, "cancelled": 0}


def test_a_job_name_cannot_move_to_another_queue(h):
    sdk.submit(h.env, "j", "work", sdk.read_items(["a"]), kick=False)
    with pytest.raises(sdk.JobError, match="already exists on queue 'work'"):
        sdk.submit(h.env, "j", "short", sdk.read_items(["a"]), kick=False)
    with pytest.raises(sdk.JobError, match="unknown queue 'nope'.*known queues: short, work"):
        sdk.submit(h.env, "j", "nope", sdk.read_items(["a"]), kick=False)


def test_a_jobs_name_given_for_its_id_is_answered_with_the_id(h):
    job_id = sdk.submit(h.env, "my-first-job", "work", sdk.read_items(["a"]), kick=False).job_id
    fix = f"'my-first-job' is the name of job {job_id!r}: give that id"
    for call in (lambda: sdk.status(h.env, "my-first-job"), lambda: sdk.cancel(h.env, "my-first-job"),
                 lambda: sdk.submit(h.env, "then", "work", sdk.read_items(["b"]), kick=False, after="my-first-job"),
                 lambda: collect(h.env, job_id="my-first-job")):  # fmt: skip
        with pytest.raises(sdk.JobError, match=f"job 'my-first-job' not found in environment '{h.env.name}'; {fix}"):
            call()
    shown = CliRunner().invoke(main, ["status", "--env", str(h.env_path), "my-first-job"])
    assert shown.exit_code == 1 and fix in shown.output and "Traceback" not in shown.output, shown.output
    with pytest.raises(sdk.JobError, match="job 'nobody' not found in environment .*; check the id printed by submit"):
        sdk.status(h.env, "nobody")
    with pytest.raises(sdk.JobError, match="after: job 5 not found"):  # not a name to look up: no traceback
        sdk.submit(h.env, "then", "work", sdk.read_items(["b"]), kick=False, after=5)


def test_cancel_reads_no_heartbeat_nor_failed_item(h, monkeypatch):
    """The schedule function cancels overdue runs and may read neither (its role: JOB# and WATCH records)."""
    job_id = sdk.submit(h.env, "quick-cancel", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    for read in ("heartbeats", "failed_items"):
        monkeypatch.setattr(DynamoStore, read, lambda *a, **k: pytest.fail(f"cancel read {a[1:]}"))
    assert sdk.cancel(h.env, job_id) == 2


def test_cancel_marks_waiting_items_cancelled_and_flags_the_job(h):
    job_id = sdk.submit(h.env, "c", "work", sdk.read_items(["a", "b", "c"]), kick=False).job_id
    assert sdk.cancel(h.env, job_id) == 3
    status = sdk.status(h.env, job_id)
    assert status.job.cancelled and status.counts["cancelled"] == 3 and status.done
    with pytest.raises(sdk.JobError, match="was cancelled"):
        sdk.submit(h.env, "c", "work", sdk.read_items(["a"]), kick=False)


def test_submit_kicks_the_scaler_and_a_failed_kick_only_warns(h, monkeypatch):
    received = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("TIDEFLEET_KICK_URL", f"http://127.0.0.1:{server.server_address[1]}/kick")
        result = sdk.submit(h.env, "kicked", "work", sdk.read_items(["a"]))
        assert received == [{"tidefleet": "kick", "env": "t", "reason": f"submit {result.job_id}"}]
    finally:
        server.shutdown()
    result = sdk.submit(h.env, "kick-fails", "work", sdk.read_items(["a"]))  # nobody listens any more
    assert result.kick.startswith(f"warning: could not kick the scaler at TIDEFLEET_KICK_URL=http://127.0.0.1:"
                                  f"{server.server_address[1]}/kick (a sandbox's; unset it to kick the deployed "
                                  "scaler) (") and result.sent == 1  # fmt: skip
    monkeypatch.delenv("TIDEFLEET_KICK_URL")  # no URL: the scaler function, absent on the emulator
    assert "within 60s" in sdk.submit(h.env, "kick-lambda", "work", sdk.read_items(["a"])).kick


def test_cli_submit_status_and_nodes_from_the_environment_name(h, tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("s3://b/1\ns3://b/2\n")
    runner = CliRunner()
    env = {"TIDEFLEET_ENV": str(h.env_path), "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
    out = runner.invoke(main, ["submit", "--name", "cli", "--queue", "work", "--items", str(items)], env=env)
    assert out.exit_code == 0 and "2 item(s), 2 new, 2 sent" in out.output
    job_id = sdk.job_id_for("cli")
    out = runner.invoke(main, ["status", job_id], env=env)
    assert out.exit_code == 0 and "queued 2" in out.output and "0/2" in out.output
    DynamoStore(h.env.name, h.env.region).put_heartbeat(
        Heartbeat(
            "i-1", "cpu", at=0.0, slots=2, busy_slots=1, idle_since=None, instance_type="c6i.large", spot=False
        )
    )
    out = runner.invoke(main, ["nodes"], env=env)
    assert out.exit_code == 0 and "i-1" in out.output and "on-demand" in out.output and "1/2" in out.output
    assert "pool cpu: desired 0, 0 instance(s)" in out.output
    boto3.client("autoscaling", region_name=h.env.region).delete_auto_scaling_group(
        AutoScalingGroupName=naming.group(h.env.name, "cpu"), ForceDelete=True
    )
    assert "group not found" in runner.invoke(main, ["nodes"], env=env).output


def test_nodes_shows_a_node_its_group_no_longer_lists_as_gone_after_the_groups_nodes(h):
    """A terminated node's heartbeat outlives it until the scaler forgets it: `nodes` listed it as
    draining under its group's 'desired 1, 1 instance(s)', as if it were one of them."""
    store, now = DynamoStore(h.env.name, h.env.region), time.time()
    gone = h.group_instance()
    store.put_heartbeat(Heartbeat(gone, "cpu", at=now, slots=2, busy_slots=0, idle_since=now, draining=True,
                                  instance_type="c6i.large", spot=False))  # fmt: skip
    boto3.client("autoscaling", region_name=h.env.region).terminate_instance_in_auto_scaling_group(
        InstanceId=gone, ShouldDecrementDesiredCapacity=True)  # fmt: skip
    up = h.group_instance()
    store.put_heartbeat(Heartbeat(up, "cpu", at=now, slots=2, busy_slots=1, idle_since=None, instance_type="c6i.large",
                                  spot=False))  # fmt: skip
    env = {"TIDEFLEET_ENV": str(h.env_path)}
    out = CliRunner().invoke(main, ["nodes"], env=env)
    lines = out.output.splitlines()
    assert out.exit_code == 0 and "pool cpu: desired 1, 1 instance(s)" in lines[0], out.output
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if gone in line or up in line]
    assert [(row[0], row[4]) for row in rows] == [(up, "busy"), (gone, "gone")], out.output
    (pool,) = [p for p in json.loads(CliRunner().invoke(main, ["nodes", "--json"], env=env).output)["pools"]
               if p["pool"] == "cpu"]  # fmt: skip
    listed = [(n["node_id"], n["draining"], n["gone"]) for n in pool["nodes"]]
    assert listed == [(up, False, False), (gone, True, True)]


def test_nodes_says_why_a_node_could_not_run_items_gone_or_not(h):
    """A node whose agent found at start it cannot run items says why in its heartbeat (the
    scaler holds the pool's launches after several): `nodes` shows it, whole, under the table."""
    store, now = DynamoStore(h.env.name, h.env.region), time.time()
    why = "its docker does not answer (Cannot connect to the Docker daemon at unix:///var/run/docker.sock)"
    store.put_heartbeat(Heartbeat("i-bad", "cpu", at=now, slots=2, busy_slots=0, idle_since=now, draining=True,
                                  instance_type="c6i.large", fault=why))  # fmt: skip
    env = {"TIDEFLEET_ENV": str(h.env_path)}
    out = CliRunner().invoke(main, ["nodes"], env=env)
    (row,) = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.output.splitlines() if "i-bad" in line
              and "│" in line]  # fmt: skip
    assert out.exit_code == 0 and row[4] == "gone, cannot run items", out.output
    assert f"i-bad could not run items: {why}" in out.output.splitlines(), out.output
    (pool,) = [p for p in json.loads(CliRunner().invoke(main, ["nodes", "--json"], env=env).output)["pools"]
               if p["pool"] == "cpu"]  # fmt: skip
    assert [(n["node_id"], n["fault"]) for n in pool["nodes"]] == [("i-bad", why)]


def test_nodes_of_a_pool_without_a_group_are_gone_and_it_says_their_records_stay_until_it_is_deployed(h):
    """A deleted group's nodes went with it, but the scaler reads no pool without a group, so it
    never forgets their heartbeats: `nodes` listed them `gone`, which for a node its group dropped
    means until the scaler forgets it (once silent for a boot), and they stayed for good unexplained."""
    store = DynamoStore(h.env.name, h.env.region)
    store.put_heartbeat(Heartbeat("i-old", "cpu", at=0.0, slots=2, busy_slots=0, idle_since=0.0,
                                  instance_type="c6i.large", spot=True))  # fmt: skip
    boto3.client("autoscaling", region_name=h.env.region).delete_auto_scaling_group(
        AutoScalingGroupName=naming.group(h.env.name, "cpu"), ForceDelete=True)  # fmt: skip
    control.tick(h.env, for_env(h.env).control_ports(), time.time())  # silent far longer than a boot: kept
    assert "i-old" in store.heartbeats("cpu")
    env = {"TIDEFLEET_ENV": str(h.env_path)}
    out = CliRunner().invoke(main, ["nodes"], env=env)
    (row,) = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.output.splitlines()
              if "i-old" in line]  # fmt: skip
    assert out.exit_code == 0 and "pool cpu: group not found" in out.output and row[4] == "gone", out.output
    assert (f"pool cpu has no group: its 1 node(s) above went with it, and their heartbeat records stay "
            f"listed until it is deployed again (invoke deploy --env {h.env_path}), as the scaler forgets "
            "only the nodes of a group it finds") in out.output.splitlines(), out.output  # fmt: skip
    (pool,) = [p for p in json.loads(CliRunner().invoke(main, ["nodes", "--json"], env=env).output)["pools"]
               if p["pool"] == "cpu"]  # fmt: skip
    assert (pool["desired"], pool["instances"], [(n["node_id"], n["gone"]) for n in pool["nodes"]]) == (
        None, None, [("i-old", True)])  # fmt: skip


def test_cli_errors_say_how_to_deploy_when_the_environment_is_missing(aws, tmp_path):
    h_env = tmp_path / "gone.toml"
    h_env.write_text('region = "us-east-1"\n[pools.cpu]\nmax = 1\ncommand = "true"\n'
                     'instance_types = [{ type = "c6i.large" }]\n[queues.q]\npool = "cpu"\n')
    runner = CliRunner()
    out = runner.invoke(main, ["status", "nope", "--env", str(h_env)])
    deploy = f"invoke deploy --env {h_env}"  # the environment as the user named it: a path here
    assert out.exit_code == 1 and deploy in out.output and "tidefleet sandbox --keep" in out.output
    out = runner.invoke(main, ["submit", "--env", str(h_env), "--name", "x", "--queue", "q", "--items", "-"], input="a\n")
    assert out.exit_code == 1 and deploy in out.output
    out = runner.invoke(main, ["status", "x", "--env", "no-such-env"])
    assert out.exit_code == 1 and "unknown environment" in out.output


def test_retry_failed_leaves_other_jobs_dead_letters_alone(h):
    sqs = boto3.client("sqs", region_name=h.env.region)
    dlq = sqs.get_queue_url(QueueName=naming.dead_letter_queue(h.env.name, "work"))["QueueUrl"]
    for job in ("mine", "other"):
        sdk.submit(h.env, job, "work", sdk.read_items(["a"]), kick=False)
        sqs.send_message(QueueUrl=dlq, MessageBody=sdk.ItemMessage(sdk.job_id_for(job), "000000", ["a"], failures=3).body())
    assert sdk.retry_failed(h.env, sdk.job_id_for("mine")) == 1
    assert h.queue_depth("work", dead_letter=True) == 1 and h.queue_depth("work") == 3


def test_status_counts_from_the_jobs_counters_and_heartbeats_without_reading_an_item(h, monkeypatch):
    import time

    job_id = sdk.submit(h.env, "counted", "work", sdk.read_items(["a", "b", "c", "d"]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    for item, status in (("000000", "succeeded"), ("000001", "cancelled")):
        store.update_item(job_id, item, status=status)
        store.update_item(job_id, item, status=status)  # a redelivered write: refused, not counted twice
    store.put_heartbeat(Heartbeat("n-1", h.env.queues["work"].pool, at=time.time(), slots=2, busy_slots=1,
                                  idle_since=None, running={job_id: 1}))  # fmt: skip
    store.put_heartbeat(Heartbeat("n-gone", h.env.queues["work"].pool, at=time.time() - 600, slots=2, busy_slots=1,
                                  idle_since=None, running={job_id: 1}))  # fmt: skip
    monkeypatch.setattr(DynamoStore, "items", lambda *_: pytest.fail("status read every item"))
    status = sdk.status(h.env, job_id)
    assert status.counts == {"succeeded": 1, "running": 1, "queued": 1, "failed": 0, "cancelled": 1}
    assert not status.done and status.items == []
    store.update_item(job_id, "000002", status="succeeded")
    store.update_item(job_id, "000003", status="succeeded")
    assert sdk.status(h.env, job_id).done


def test_retry_failed_sends_each_item_back_once_per_call_even_if_it_fails_again_meanwhile(h, monkeypatch):
    sqs = boto3.client("sqs", region_name=h.env.region)
    dlq = sqs.get_queue_url(QueueName=naming.dead_letter_queue(h.env.name, "work"))["QueueUrl"]
    job = sdk.submit(h.env, "flaky", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    for_env(h.env).queues.delete("work", [d.handle for d in for_env(h.env).queues.receive("work", 10, 0)])
    for item in ("000000", "000001", "000000"):  # item 0 dead-lettered twice (a duplicate)
        sqs.send_message(QueueUrl=dlq, MessageBody=sdk.ItemMessage(job, item, ["a"], failures=3).body())
    sent = sdk.send_messages
    refails = []

    def fails_again_at_once(cloud, queue, messages, **kwargs):  # an agent that fails them again meanwhile
        sent(cloud, queue, messages, **kwargs)
        if not kwargs.get("dead_letter") and len(refails) < 3:
            refails.append(messages)
            sent(cloud, queue, [replace(m, failures=3) for m in messages], dead_letter=True)

    monkeypatch.setattr(sdk, "send_messages", fails_again_at_once)
    assert sdk.retry_failed(h.env, job) == 2, "two distinct items, each sent back once"
    assert h.queue_depth("work") == 2
    assert h.queue_depth("work", dead_letter=True) == 3, "the duplicate and the new failures wait for the next call"


def test_cancel_leaves_a_finished_job_alone_and_says_so(h):
    job_id = sdk.submit(h.env, "finished", "work", sdk.read_items(["a", "b", "c"]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    for item, status in (("000000", "succeeded"), ("000001", "succeeded"), ("000002", "failed")):
        store.update_item(job_id, item, status=status)
    runner, env = CliRunner(), {"TIDEFLEET_ENV": str(h.env_path)}
    out = runner.invoke(main, ["cancel", job_id], env=env)
    assert out.exit_code == 0 and out.output.strip() == \
        f"job {job_id} already finished (succeeded 2, failed 1); nothing to cancel"  # fmt: skip
    assert not store.job(job_id).cancelled
    again = sdk.submit(h.env, "finished", "work", sdk.read_items(["a", "b", "c"]), kick=False)
    assert again.already and again.sent == 0, "the idempotent re-submit still works"


def test_cancelling_twice_says_already_cancelled(h):
    job_id = sdk.submit(h.env, "twice-cancelled", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    runner, env = CliRunner(), {"TIDEFLEET_ENV": str(h.env_path)}
    first = runner.invoke(main, ["cancel", job_id], env=env)
    assert first.exit_code == 0 and f"job {job_id} cancelled: 2 waiting item(s) cancelled" in first.output
    second = runner.invoke(main, ["cancel", job_id], env=env)
    assert second.exit_code == 0 and second.output.strip() == f"job {job_id} already cancelled; nothing to cancel"
    assert sdk.cancel_job(h.env, job_id).already


def test_a_cancel_that_stopped_midway_is_finished_by_the_next(h):
    job_id = sdk.submit(h.env, "half-cancelled", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    DynamoStore(h.env.name, h.env.region).cancel_job(job_id, "cancelled")  # flagged, items not reached yet
    done = sdk.cancel_job(h.env, job_id)
    assert done.cancelled == 2 and done.already.startswith(f"job {job_id} already cancelled")
    assert sdk.status(h.env, job_id).done


def test_a_cancel_throttled_midway_says_the_job_is_cancelled_and_to_run_it_again(h, monkeypatch):
    """It said only what the cloud said ("… did not answer within 8 s"): read as "nothing happened"."""
    from botocore.exceptions import ClientError

    job_id = sdk.submit(h.env, "throttled-cancel", "work", sdk.read_items(["a", "b"]), kick=False).job_id

    def throttled(self, writes):
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "TransactWriteItems")

    with monkeypatch.context() as patched:
        patched.setattr(DynamoStore, "update_items", throttled)
        out = CliRunner().invoke(main, ["cancel", job_id], env={"TIDEFLEET_ENV": str(h.env_path)})
    assert out.exit_code == 1 and "Traceback" not in out.output
    line = out.output.strip()
    assert line.startswith("Error: ") and "\n" not in line and "Throttl" in line, line
    assert line.endswith(f"; job {job_id} is cancelled (its running items stop within a heartbeat; its agents skip "
                         "its queued items), but not every waiting item is marked yet: run the same cancel again to finish")
    assert sdk.cancel_job(h.env, job_id).cancelled == 2  # and so it does


def test_an_sdk_cloud_error_keeps_its_type_and_carries_the_clis_line_generators_too(aws):
    """Callers that catch botocore's errors still do; the note is the line the CLI prints."""
    from botocore.exceptions import ClientError

    from tidefleet.config import load_environment

    env = load_environment("dev")  # nothing deployed on this moto server
    says = ("DynamoDB table 'tidefleet-dev' does not exist: environment 'dev' is not (fully) deployed in us-east-1; "
            "deploy it with `invoke deploy --env dev` or start `tidefleet sandbox --keep`")
    for call in (lambda: sdk.status(env, "x-1"), lambda: list(sdk.log_lines(env, "x-1")),
                 lambda: sdk.cancel(env, "x-1")):  # fmt: skip
        with pytest.raises(ClientError) as caught:
            call()
        assert caught.value.__notes__ == [says]
