"""The sandbox's own parts, each against the real thing it stands in for: the metadata
endpoint read by the agent's own IMDS client, resources on a moto server, node processes
started from the instance's user-data, and the item accounting."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import boto3
import pytest

from tidefleet import naming
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import environment_path, load_environment
from tidefleet.jobs import scheduled, sdk
from tidefleet.jobs.sdk import JobStatus
from tidefleet.records import Item, Job
from tidefleet.sandbox.imds import MetadataServer
from tidefleet.sandbox.launcher import Launcher
from tidefleet.sandbox.run import FAIL_EVERY, ScheduledJobs, account, make_inputs, read_events

SANDBOX = load_environment("sandbox")


@pytest.fixture
def imds():
    server = MetadataServer().start()
    yield server
    server.stop()


def test_metadata_speaks_imdsv2_and_the_agent_reads_a_spot_notice_only_once_sent(imds):
    url = imds.add("i-abc", "c6i.large", spot=True, availability_zone="us-east-1a")
    with pytest.raises(urllib.error.HTTPError) as err:  # no token, no answer
        urllib.request.urlopen(f"{url}/latest/meta-data/instance-id")
    assert err.value.code == 401

    agent_view = Metadata(url)
    assert agent_view.get("/latest/meta-data/instance-id") == "i-abc"
    assert agent_view.get("/latest/meta-data/instance-life-cycle") == "spot"
    assert agent_view.notice() is None

    imds.send_spot_notice("i-abc", in_s=120)
    assert "spot interruption notice: terminate" in agent_view.notice().reason


@pytest.mark.parametrize("gone", [BrokenPipeError, ConnectionResetError])
def test_a_node_gone_before_its_answer_is_written_prints_no_traceback(gone, capsys):
    """Ctrl-C mid-run killed an agent while the metadata server answered it: socketserver printed a
    traceback over the sandbox's live view (seen in CI). Any other error is still printed."""
    from tidefleet.sandbox.imds import LoopbackServer

    server = LoopbackServer(("127.0.0.1", 0), object)
    try:
        for error, printed in ((gone, False), (ValueError, True)):
            try:
                raise error("the client left")
            except error:
                server.handle_error(None, ("127.0.0.1", 1))
            assert ("Traceback" in capsys.readouterr().err) == printed, error
    finally:
        server.server_close()


def test_metadata_tells_the_agent_when_the_group_terminates_its_node(imds):
    agent_view = Metadata(imds.add("i-def", "c6i.large", spot=False, availability_zone="us-east-1a"))
    assert agent_view.get("/latest/meta-data/autoscaling/target-lifecycle-state") == "InService"
    imds.set_target_lifecycle_state("i-def", "Terminated")
    assert agent_view.notice().lifecycle


def test_provisions_queues_with_redrive_the_table_the_log_group_and_a_mixed_instances_group(aws):
    done = provision(SANDBOX, user_data={"cpu": "#!/bin/bash\ntrue\n"})
    sqs = boto3.client("sqs", region_name=SANDBOX.region)
    attrs = sqs.get_queue_attributes(QueueUrl=done.queue_urls["demo"], AttributeNames=["All"])["Attributes"]
    queue = SANDBOX.queues["demo"]
    assert int(attrs["VisibilityTimeout"]) == queue.visibility_timeout_s
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["maxReceiveCount"] == queue.max_receive_count
    assert redrive["deadLetterTargetArn"].endswith(naming.dead_letter_queue("sandbox", "demo"))

    boto3.client("dynamodb", region_name=SANDBOX.region).describe_table(TableName=naming.table("sandbox"))
    groups = boto3.client("logs", region_name=SANDBOX.region).describe_log_groups()["logGroups"]
    assert naming.item_log_group("sandbox") in [g["logGroupName"] for g in groups]

    autoscaling = boto3.client("autoscaling", region_name=SANDBOX.region)
    (group,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[done.groups["cpu"]])[
        "AutoScalingGroups"
    ]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, SANDBOX.pools["cpu"].max, 0)
    overrides = group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]
    assert [o["InstanceType"] for o in overrides] == [t.type for t in SANDBOX.pools["cpu"].instance_types]
    hooks = autoscaling.describe_lifecycle_hooks(AutoScalingGroupName=done.groups["cpu"])["LifecycleHooks"]
    assert [h["LifecycleHookName"] for h in hooks] == [naming.lifecycle_hook("sandbox", "cpu")]


def _wait_for(condition, launcher: Launcher, timeout_s: float = 15.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        launcher.step(time.time())
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(
        f"not reached within {timeout_s}s: {[(n.instance_id, n.state) for n in launcher.snapshot()]}"
    )


def test_launcher_runs_each_instances_user_data_and_gives_leavers_the_termination_path(aws, imds, tmp_path):
    # A stand-in boot script that records what a node sees, then waits like an agent would. The
    # record appears whole (a rename): `> seen` creates the file before echo writes to it.
    script = (
        '#!/bin/bash\necho "$TIDEFLEET_NODE_ID $TIDEFLEET_IMDS_URL" > seen.part && mv seen.part seen\n'
        'trap "echo term > stopped; exit 0" TERM\nwhile true; do sleep 0.1; done\n'
    )
    done = provision(SANDBOX, user_data={"cpu": script})
    launcher = Launcher(
        SANDBOX,
        imds,
        workdir=tmp_path,
        node_env={"PATH": "/usr/bin:/bin"},
        boot_delay_s=0,
        grace_s=5,
        reclaim_after_s=0.5,
    )
    autoscaling = boto3.client("autoscaling", region_name=SANDBOX.region)
    autoscaling.set_desired_capacity(AutoScalingGroupName=done.groups["cpu"], DesiredCapacity=2)
    _wait_for(
        lambda: all((tmp_path / "nodes" / n.instance_id / "seen").exists() for n in launcher.snapshot()),
        launcher,
    )
    nodes = launcher.snapshot()
    assert len(nodes) == 2 and launcher.peak_nodes == 2
    for node in nodes:
        seen_id, seen_url = (tmp_path / "nodes" / node.instance_id / "seen").read_text().split()
        assert seen_id == node.instance_id and seen_url == f"{imds.url}/{node.instance_id}"

    # Scale-in: the group lets one go; the agent gets the lifecycle state and SIGTERM.
    leaver, stayer = nodes
    autoscaling.terminate_instance_in_auto_scaling_group(
        InstanceId=leaver.instance_id, ShouldDecrementDesiredCapacity=True
    )
    _wait_for(lambda: launcher.nodes[leaver.instance_id].state == "gone", launcher)
    assert (tmp_path / "nodes" / leaver.instance_id / "stopped").read_text() == "term\n"
    assert launcher.nodes[leaver.instance_id].fate == "scaled in"

    # Chaos: a SIGKILLed node's instance is lost too, and the group replaces it.
    launcher.kill(stayer.instance_id)
    assert not (tmp_path / "nodes" / stayer.instance_id / "stopped").exists()
    _wait_for(lambda: len([n for n in launcher.snapshot() if n.state == "up"]) == 1, launcher)
    (replacement,) = [n for n in launcher.snapshot() if n.state == "up"]
    assert replacement.instance_id not in (leaver.instance_id, stayer.instance_id)

    # A spot notice, then EC2 reclaims the instance after the (shortened) two minutes.
    launcher.send_spot_notice(replacement.instance_id)
    assert Metadata(replacement.imds_url).notice() is not None
    _wait_for(lambda: launcher.nodes[replacement.instance_id].state == "gone", launcher)
    assert launcher.nodes[replacement.instance_id].fate == "reclaimed"
    launcher.shutdown()


def test_demo_inputs_fail_by_design_with_a_clear_reason_and_succeed_otherwise(tmp_path):
    specs, doomed = make_inputs(tmp_path, FAIL_EVERY, seed=1)
    assert doomed == {f"item-{FAIL_EVERY - 1:04d}"}
    results = {}
    for spec in specs[-2:]:
        run = subprocess.run(
            [sys.executable, "-m", "tidefleet.sandbox.demo_work", *spec.args],
            check=False,
            capture_output=True,
            text=True,
            env={"TIDEFLEET_ITEM_ID": spec.item_id},
        )
        results[spec.item_id] = run
    ok, bad = results[specs[-2].item_id], results[specs[-1].item_id]
    assert ok.returncode == 0 and json.loads(ok.stdout)["words"] > 0
    assert bad.returncode == 3 and "not UTF-8 text" in bad.stderr and "made to fail" in bad.stderr
    assert [(e["event"], e["item"]) for e in read_events(tmp_path)] == [
        ("start", specs[-2].item_id),
        ("success", specs[-2].item_id),
        ("start", specs[-1].item_id),
    ]


def test_the_demo_workload_fails_a_relative_or_missing_input_in_one_line_naming_it(tmp_path):
    """A node runs each item in its attempt's own folder and cannot know where it was submitted
    from: a relative path is refused as such (it once read the attempt's folder: FileNotFoundError)."""
    specs, _ = make_inputs(tmp_path / "my-inputs", 1, seed=1, fail_every=0)
    relative = str((tmp_path / specs[0].args[0]).relative_to(tmp_path))
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    lines = {}
    for given in (relative, str(tmp_path / "my-inputs" / "inputs" / "gone.txt")):
        run = subprocess.run([sys.executable, "-m", "tidefleet.sandbox.demo_work", given], cwd=attempt, check=False,
                             capture_output=True, text=True, env={"TIDEFLEET_ITEM_ID": "item-0000"})  # fmt: skip
        assert run.returncode == 2 and run.stdout == "", run.stderr
        lines[given] = run.stderr
    assert list(lines.values()) == [
        (f"{relative}: a relative path; an item runs in its own folder on a node, which cannot know the folder "
         "it was submitted from: name the input by its absolute path\n"),
        f"{tmp_path}/my-inputs/inputs/gone.txt: cannot read it (No such file or directory)\n",
    ]
    assert read_events(tmp_path / "my-inputs") == []  # not started


def _status(*items: Item) -> JobStatus:
    return JobStatus(Job("j", "j", "demo", 0.0, len(items)), {}, list(items))


def _success(item: str, node: str, at: float) -> dict:
    return {"event": "success", "item": item, "node": node, "at": at}


@pytest.mark.parametrize(
    ("items", "events", "killed", "expect"),
    [
        pytest.param(
            [Item("j", "a", status="succeeded"), Item("j", "b", status="failed", reason="exit 3: not UTF-8")],
            [_success("a", "i-1", 1.0)],
            set(),
            {"succeeded": 1, "failed": {"b": "exit 3: not UTF-8"}},
            id="a clean run accounts for everything",
        ),
        pytest.param(
            [Item("j", "a", status="queued"), Item("j", "b", status="running")],
            [],
            set(),
            {"unaccounted": {"a": "queued", "b": "running"}},
            id="an unfinished item is unaccounted",
        ),
        pytest.param(
            [Item("j", "a", status="succeeded")],
            [],
            set(),
            {
                "succeeded": 0,
                "unaccounted": {"a": "succeeded in the store, but the workload never reported a success"},
            },
            id="a success the workload never reported is unaccounted",
        ),
        pytest.param(
            [Item("j", "c", status="failed", reason="exit 1")],
            [],
            set(),
            {"failed_unexpectedly": {"c": "exit 1"}},
            id="a failure not designed is reported",
        ),
        pytest.param(
            [Item("j", "a", status="succeeded", attempts=2)],
            [_success("a", "i-1", 1.0), _success("a", "i-2", 2.0)],
            {"i-1"},
            {"duplicate_successes": {"a": 2}, "duplicates_explained": True, "redelivered": 1},
            id="a second success after a SIGKILL lost the first report is explained",
        ),
        pytest.param(
            [Item("j", "a", status="succeeded")],
            [_success("a", "i-1", 1.0), _success("a", "i-2", 2.0)],
            set(),
            {"duplicate_successes": {"a": 2}, "duplicates_explained": False},
            id="a second success on healthy nodes is not",
        ),
    ],
)
def test_accounting(items, events, killed, expect):
    got = account(_status(*items), doomed={"b"}, events=events, killed_nodes=killed)
    assert {k: got[k] for k in expect} == expect


def test_the_launcher_survives_a_failed_round_and_says_so_once(tmp_path, imds):
    """The emulator slow, restarting or gone: a round's cloud error is one log line, the next
    round retries (as the control loop does), and the thread lives on."""
    import logging
    import threading

    from botocore.exceptions import EndpointConnectionError

    class Flaky:
        rounds = 0

        def in_service(self):
            self.rounds += 1
            if self.rounds <= 3:
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
            return {}

    launcher = Launcher(SANDBOX, imds, workdir=tmp_path, node_env={}, boot_delay_s=0, grace_s=1, reclaim_after_s=1)
    launcher.machines = Flaky()
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("tidefleet.sandbox.launcher")  # the sandbox writes it to launcher.log
    log.addHandler(handler)
    stop = threading.Event()
    thread = threading.Thread(target=launcher.run, args=(stop, 0.01), daemon=True)
    try:
        thread.start()
        deadline = time.time() + 10
        while launcher.machines.rounds < 6 and time.time() < deadline:
            time.sleep(0.01)
        assert thread.is_alive() and launcher.machines.rounds >= 6 and launcher.error == ""
    finally:
        stop.set()
        thread.join(timeout=5)
        log.removeHandler(handler)
    refused = 'EndpointConnectionError: Could not connect to the endpoint URL: "http://127.0.0.1:9"'
    assert lines == [f"launcher round failed, retrying: {refused}", "launcher rounds go through again"]


def _messages(env, queue: str) -> int:
    sqs = boto3.client("sqs", region_name=env.region)
    url = sqs.get_queue_url(QueueName=naming.queue(env.name, queue))["QueueUrl"]
    return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
               ["Attributes"]["ApproximateNumberOfMessages"])  # fmt: skip


@pytest.fixture
def schedules_log():
    """The lines of the fires' and the watch's log (the sandbox writes it to schedules.log)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    level = scheduled.log.level
    scheduled.log.addHandler(handler)
    scheduled.log.setLevel(logging.INFO)
    yield lines
    scheduled.log.setLevel(level)
    scheduled.log.removeHandler(handler)


def test_the_sandboxs_watch_sends_a_held_job_once_its_parent_succeeded_and_cancels_one_behind_a_failed_parent(aws):
    provision(SANDBOX, user_data={"cpu": ""})
    jobs = ScheduledJobs(SANDBOX, time.time())
    store = jobs.cloud.store
    submit = lambda name, items, **kw: sdk.submit(SANDBOX, name, "demo", sdk.read_items(items), kick=False, **kw)
    good, bad = submit("prepare", ["a"]).job_id, submit("broken", ["b"]).job_id
    held, doomed = submit("train", ["c", "d"], after=good).job_id, submit("eval", ["e"], after=bad).job_id
    jobs.step(time.time())
    assert store.job(held).waiting and store.job(doomed).waiting and _messages(SANDBOX, "demo") == 2

    (a,), (b,) = store.items(good), store.items(bad)
    store.update_item(good, a.item_id, status="succeeded")
    store.update_item(bad, b.item_id, status="failed", reason="exit code 3")
    jobs.step(time.time())
    assert not store.job(held).waiting and _messages(SANDBOX, "demo") == 4, "its two items are sent"
    cancelled = sdk.status(SANDBOX, doomed)
    assert cancelled.job.cancelled and cancelled.counts["cancelled"] == 1
    assert cancelled.job.cancel_reason == f"{bad} failed; submit with --after-finished to run after any outcome"
    assert store.watched() == [held], "a released job is forgotten at the next step; the cancelled one now"


def test_the_sandbox_fires_a_schedule_once_per_fire_time_from_the_first_after_its_start(aws, tmp_path, schedules_log):
    path = tmp_path / "sandbox.toml"  # named as the shipped one: the same resources
    path.write_text(environment_path("sandbox").read_text()
                    + '[schedules.merge]\nrate = "10 minutes"\nqueue = "demo"\nitems = ["x", ["y"]]\n')  # fmt: skip
    env = load_environment(str(path))
    provision(env, user_data={"cpu": ""})
    start = 1_750_000_000.0 - 1_750_000_000.0 % 600 + 30  # 30 s after a fire time: that one is not fired
    jobs = ScheduledJobs(env, start)
    jobs.step(start + 60)
    assert jobs.cloud.store.watched() == []
    jobs.step(start + 570)
    jobs.step(start + 580)  # the same fire time again: not fired twice
    assert [json.loads(line)["decision"] for line in schedules_log if '"schedule"' in line] == ["submit merge-20250615t1510"]
    assert jobs.cloud.store.watched() == ["merge-20250615t1510"]
    assert sdk.status(env, "merge-20250615t1510").job.total == 2 and _messages(env, "demo") == 2


def test_a_failed_watch_is_one_log_line_and_the_next_step_watches_again(aws, monkeypatch, schedules_log):
    provision(SANDBOX, user_data={"cpu": ""})
    jobs = ScheduledJobs(SANDBOX, time.time())
    calls = []

    def failing(env, cloud, now):
        calls.append(now)
        raise RuntimeError("the store is\nunreachable")

    monkeypatch.setattr(scheduled, "watch", failing)
    jobs.step(1.0)
    jobs.step(2.0)
    assert calls == [1.0, 2.0]
    assert schedules_log == ["watch failed: RuntimeError: the store is unreachable"] * 2


def test_a_sandbox_whose_start_fails_part_way_stops_everything_it_started_and_raises(tmp_path, monkeypatch):
    """A provision that fails (the emulator died under it, a Ctrl-C) hung the sandbox for good: its
    exit shut down the kick server, whose serve_forever had not been started, and waited for it."""
    import threading

    from tidefleet.sandbox import run

    def provision_fails(*args, **kwargs):
        raise RuntimeError("provisioning failed")

    monkeypatch.setattr(run, "provision", provision_fails)
    box, raised = run.Sandbox(load_environment("sandbox"), tmp_path / "sandbox", run.Timing()), []

    def start() -> None:
        try:
            box.__enter__()
        except RuntimeError as err:
            raised.append(str(err))

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    starting.join(timeout=60)
    assert not starting.is_alive(), "the sandbox's exit hung after a failed start"
    assert raised == ["provisioning failed"]
    assert box.moto.exited() is not None  # the emulator it had started was stopped too


def test_the_users_own_aws_settings_neither_stop_the_emulator_nor_reach_its_clients(tmp_path, monkeypatch):
    """The audit: `AWS_PROFILE=mywork` (a profile this machine lacks) ended moto at start with
    ProfileNotFound, said as 'is moto[server] installed?'; a service's own endpoint would send the
    sandbox's calls past the emulator. Both are back as they were after the run."""
    import boto3

    from tidefleet.sandbox import run

    monkeypatch.setenv("AWS_PROFILE", "not-on-this-machine")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:9")
    seen = {}

    def provision(env, *args, **kwargs):  # the sandbox's first calls: what its clients see
        seen["queues"] = boto3.client("sqs").list_queues().get("QueueUrls", [])
        raise RuntimeError("enough")

    monkeypatch.setattr(run, "provision", provision)
    box = run.Sandbox(load_environment("sandbox"), tmp_path / "sandbox", run.Timing())
    with pytest.raises(RuntimeError, match="enough"):
        box.__enter__()
    assert seen == {"queues": []}
    assert os.environ["AWS_PROFILE"] == "not-on-this-machine" and os.environ["AWS_ENDPOINT_URL_SQS"] == "http://127.0.0.1:9"
