"""Bad input to the job CLI and SDK, against the moto server: every bad items file is refused
with its line number and leaves nothing behind; a job name keeps its items; status survives
markup in reasons, is done only when every item is final, and counts the items the queue's
redrive moved to the dead-letter queue as failed."""

from __future__ import annotations

import io
import json
import os

import boto3
import pytest
from agent_harness import Harness
from click.testing import CliRunner

from tidefleet import naming
from tidefleet.cli import main
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.jobs import sdk
from tidefleet.jobs.spec import JobSpec
from tidefleet.records import Item, Job

MB = sdk.MAX_LINE_BYTES
GOOD_25 = b"".join(f"s3://b/{i}\n".encode() for i in range(25))  # three SQS batches


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def run(h: Harness, *args: str, stdin: bytes | None = None):
    env = {"TIDEFLEET_ENV": str(h.env_path), "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
    return CliRunner().invoke(main, list(args), env=env, input=stdin)


def refused_cleanly(out) -> None:
    assert out.exit_code == 1, out.output
    assert isinstance(out.exception, SystemExit) and "Traceback" not in out.output


def queued(h: Harness) -> int:
    return h.queue_depth("work")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"s3://a\n\xff\xfe bad\n", "items.txt:2: not UTF-8 (byte 0xff at column 1); save the file as UTF-8"),
        (b'{"id": "a", "args": []}\n\n{"id": "a", "args": []}\n',
         "items.txt:3: item id 'a' already used on line 1; give each item its own id"),
        (b's3://x\n{"id": "000000", "args": ["y"]}\n', "items.txt:2: item id '000000' already used on line 1"),
        (b'{"id": "a..b", "args": []}\n', "items.txt:1: item id 'a..b' contains '..'; use 1-128 letters"),
        (b'{"id": "a/b", "args": []}\n', "items.txt:1: item id 'a/b' contains '/'"),
        (b'{"id": "a:b", "args": []}\n', "items.txt:1: item id 'a:b' contains ':'"),
        (b'{"id": "a b", "args": []}\n', "items.txt:1: item id 'a b' contains ' '"),
        (b'{"id": "a\\tb", "args": []}\n', "items.txt:1: item id 'a\\tb' contains '\\t'"),
        (b'{"id": "a\\u0007", "args": []}\n', "items.txt:1: item id 'a\\x07' contains '\\x07'"),
        (b'{"id": ".hidden", "args": []}\n', "items.txt:1: item id '.hidden' starts with '.'"),
        (b'{"id": "", "args": []}\n', "items.txt:1: item id '' is empty"),
        (b'{"id": "' + b"x" * 129 + b'", "args": []}\n', "items.txt:1: item id 'xxx"),
        (b'{"id": ["x"], "args": []}\n', "items.txt:1: item id must be a string (got ['x'])"),
        (b'{"id": "a", "args": [1, "b"]}\n', 'items.txt:1: "args" must be a string or a list of strings (got [1, \'b\'])'),
        (b'{"id": "a", "arg": []}\n', "items.txt:1: an item object has the keys \"id\" (optional) and \"args\" (got 'arg', 'id')"),
        (b'["a", 2]\n', "items.txt:1: not an item (got ['a', 2])"),
        (b'["a\\u0000b"]\n', "items.txt:1: args[0] contains a NUL byte"),
        (b"s3://a\x00b\n", "items.txt:1: args[0] contains a NUL byte"),
        (b'{"id": "a", "args": "x\\u0000"}\n', "items.txt:1: args[0] contains a NUL byte"),
        (b'{"id": "a", "args": ["ok", "x\\udcff"]}\n',
         "items.txt:1: args[1] is not valid text (a lone surrogate '\\udcff' at character 2); give the argument as UTF-8"),
        (b"s3://ok\n" + b"x" * (MB + 1) + b"\ns3://after\n", f"items.txt:2: line longer than {MB} bytes"),
        (b'{"id": \n', "items.txt:1: not valid JSON (Expecting value at column 7)"),
        (b"[" * 1500 + b"]" * 1500 + b"\n", "items.txt:1: not valid JSON (nested too deeply to read)"),
        (b"# only a comment\n\n", "items.txt: no items given; a job needs at least one item"),
        (GOOD_25 + b'{"id": "x/y", "args": []}\n', "items.txt:26: item id 'x/y' contains '/'"),  # after 3 batches
    ],
    ids=lambda value: repr(value)[:60],  # a 1 MiB id would reach PYTEST_CURRENT_TEST: too long for a child's environment
)  # fmt: skip
def test_a_bad_items_file_is_refused_with_its_line_and_leaves_no_job(h, tmp_path, content, message):
    items = tmp_path / "items.txt"
    items.write_bytes(content)
    out = run(h, "submit", "--name", "bad", "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    assert message in out.output.replace(str(tmp_path) + "/", "")
    assert DynamoStore(h.env.name, h.env.region).job(sdk.job_id_for("bad")) is None
    assert queued(h) == 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--name", "b\udcffd"], "name: not valid text (a lone surrogate '\\udcff' at character 2); give the name as UTF-8 text"),
    (["--name", "bad", "--item-env", "X=\udcff"], "--item-env X: a value must be UTF-8 text without NUL"),
])  # fmt: skip
def test_options_that_are_not_text_are_refused_before_anything_is_written(h, tmp_path, flags, message):
    # A command-line argument that is not UTF-8 reaches Python as lone surrogates (surrogateescape).
    items = tmp_path / "items.txt"
    items.write_text("s3://a\n")
    out = run(h, "submit", *flags, "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    assert message in out.output
    assert DynamoStore(h.env.name, h.env.region).job(sdk.job_id_for("bad")) is None and queued(h) == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_watch_time_limit_that_is_not_a_number_of_seconds_is_refused_with_its_name(value):
    # nan passes click's FloatRange: the deadline never came, and --watch never gave up.
    out = CliRunner().invoke(main, ["status", "--env", "dev", "some-job", "--watch", "--time-limit", value])
    assert out.exit_code == 2 and "--time-limit" in out.output and value in out.output, out.output
    assert "Traceback" not in out.output


def test_stdin_that_is_not_utf8_is_refused_with_its_line(h):
    out = run(h, "submit", "--name", "bad", "--queue", "work", "--items", "-", stdin=b"s3://a\ns3://\xe9t\xe9\n")
    refused_cleanly(out)
    assert "stdin:2: not UTF-8 (byte 0xe9 at column 6)" in out.output


def test_an_item_of_exactly_the_item_bound_is_accepted_and_one_byte_more_is_refused():
    fill = sdk.MAX_ITEM_BYTES - len('["000000",[""]]')
    (spec,) = sdk.read_items(io.BytesIO(b"x" * fill + b"\n"))
    assert len(spec.args[0]) == fill
    with pytest.raises(sdk.JobError, match=r"stdin:1: item '000000' is 65537 bytes as stored .* over the 64 KiB"):
        sdk.read_items(io.BytesIO(b"x" * (fill + 1) + b"\n"))


# -- items the store could never hold ----------------------------------------------------------
@pytest.mark.parametrize(
    "line, size",
    [
        (b"x" * (MB - 1), MB - 1 + 15),  # passes the line check; a DynamoDB item holds 400 KB
        (json.dumps([f"--arg{n}={'v' * 1000}" for n in range(300)]).encode(), None),  # ~300 KB: never claimable
        (json.dumps(["\u00e9" * 20000]).encode(), 20000 * 6 + 15),  # measured as sent: JSON escapes non-ASCII
    ],
    ids=["near-1MiB-line", "300-args-of-1000", "escaped-non-ascii"],
)  # fmt: skip
def test_an_item_over_the_item_bound_is_refused_with_its_line_before_the_job_is_written(h, tmp_path, line, size):
    items = tmp_path / "items.txt"
    items.write_bytes(b"s3://fine\n" + line + b"\n")
    out = run(h, "submit", "--name", "big", "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    assert f"{items}:2: item '000001' is " in out.output
    assert "over the 64 KiB an item may hold; pass large data by URI, not inline; nothing submitted" in out.output
    if size:
        assert f"is {size} bytes as stored" in out.output
    assert DynamoStore(h.env.name, h.env.region).job(sdk.job_id_for("big")) is None and queued(h) == 0


def test_an_item_at_the_bound_is_recorded_sent_and_claimable_with_a_long_history(h):
    """The bound leaves room: an agent's claim and many attempts' history entries still fit."""
    fill = sdk.MAX_ITEM_BYTES - len('["000000",[""]]')
    job_id = sdk.submit(h.env, "at bound", "work", sdk.read_items(["y" * fill]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    entry = {"attempt": 1, "node": "i-0123456789abcdef0", "outcome": "failed", "reason": "exit code 1; last output: " + "z" * 300}
    for n in range(100):
        assert store.update_item(job_id, "000000", status="running", node="i-0123456789abcdef0", lease_until=1e12,
                                 message_id="m" * 100, append={"history": {**entry, "attempt": n}}) is not None
    assert len(store.item(job_id, "000000").history) == 100


def test_an_item_environment_over_the_bound_is_refused_naming_the_flag(h, tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("a\n")
    big = [f"--item-env=V{n}={'x' * 120_000}" for n in range(4)]
    out = run(h, "submit", "--name", "env", "--queue", "work", "--items", str(items), *big)
    refused_cleanly(out)
    assert "--item-env: 4 variable(s) of 480008 bytes in all, over the 64 KiB a job's environment may hold; " \
           "pass large data by URI" in out.output  # fmt: skip
    assert DynamoStore(h.env.name, h.env.region).job(sdk.job_id_for("env")) is None and queued(h) == 0


def test_every_problem_is_listed_up_to_ten_then_counted(tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("".join(f'{{"id": "bad/{i}", "args": []}}\n' for i in range(13)))
    with pytest.raises(sdk.JobError) as err:
        sdk.read_items(items)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{items}: 13 problem(s), nothing submitted:"
    assert [line.split(": ", 1)[0] for line in lines[1:11]] == [f"{items}:{n}" for n in range(1, 11)]
    assert lines[11:] == ["... and 3 more problem(s)"]


@pytest.mark.parametrize(
    "items, job_id, message",
    [
        ([sdk.ItemSpec("a/../b", ["x"])], None, "items[0]: item id 'a/../b' contains '..'"),
        ([sdk.ItemSpec("a", ["x"]), sdk.ItemSpec("a", ["y"])], None, "items[1]: item id 'a' already used by items[0]"),
        ([sdk.ItemSpec("a", [3])], None, "items[0]: not an ItemSpec(item_id: str, args: list[str])"),
        ([sdk.ItemSpec("a", ["x\0"])], None, "items[0]: args[0] contains a NUL byte"),
        ([sdk.ItemSpec("a", ["\udcff"])], None, "items[0]: args[0] is not valid text (a lone surrogate '\\udcff'"),
        ([sdk.ItemSpec("a", ["x"])], "../etc", "job id: '../etc' contains '..'"),
        ([sdk.ItemSpec("a", ["x"])], "a:b", "job id: 'a:b' contains ':'"),
    ],
)
def test_items_built_in_code_get_the_same_rules_before_anything_is_written(h, items, job_id, message):
    with pytest.raises(sdk.JobError) as err:
        sdk.submit(h.env, "code", "work", items, job_id=job_id, kick=False)
    assert message in str(err.value)
    assert DynamoStore(h.env.name, h.env.region).job(job_id or sdk.job_id_for("code")) is None and queued(h) == 0


# -- a job name keeps its items ------------------------------------------------------------------
def test_resubmitting_a_job_name_with_other_items_is_refused_and_changes_nothing(h, tmp_path):
    first = sdk.submit(h.env, "keep", "work", sdk.read_items(["a", "b"]), kick=False)
    assert DynamoStore(h.env.name, h.env.region).job(first.job_id).items_digest.startswith("seq-sha256:")
    for other in (["a", "c"], ["a", "b", "c"], ["b", "a"]):  # another arg, one more, a different order
        with pytest.raises(sdk.JobError, match="already exists with different items .2 item.s. recorded"):
            sdk.submit(h.env, "keep", "work", sdk.read_items(other), kick=False)
    assert queued(h) == 2 and sdk.status(h.env, first.job_id).job.total == 2
    items = tmp_path / "items.txt"
    items.write_text("a\nz\n")
    out = run(h, "submit", "--name", "keep", "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    assert "re-submit the same items in the same order, or use another --name or --job-id" in out.output


def test_a_job_recorded_before_digests_is_compared_by_its_recorded_items(h):
    store = DynamoStore(h.env.name, h.env.region)
    job_id = sdk.job_id_for("old")
    store.put_job(Job(job_id, "old", "work", 0.0, total=2))  # no digest; its submit stopped after one item
    store.put_item_if_new(Item(job_id, "000000", ["a"]))
    with pytest.raises(sdk.JobError, match="different items"):
        sdk.submit(h.env, "old", "work", sdk.read_items(["x", "b"]), kick=False)
    with pytest.raises(sdk.JobError, match="different items"):
        sdk.submit(h.env, "old", "work", sdk.read_items(["a", "b", "c"]), kick=False)
    done = sdk.submit(h.env, "old", "work", sdk.read_items(["a", "b"]), kick=False)
    assert (done.new_items, done.sent, done.total) == (1, 2, 2)


# -- status --------------------------------------------------------------------------------------
def job_status(total: int, *statuses: str) -> sdk.JobStatus:
    items = [Item("j", f"{n:06d}", status=s) for n, s in enumerate(statuses)]
    return sdk.JobStatus(Job("j", "j", "work", 0.0, total), {}, items)


@pytest.mark.parametrize(
    "status, done",
    [
        (job_status(2, "succeeded", "failed"), True),
        (job_status(3, "succeeded", "cancelled", "failed"), True),
        (job_status(2, "succeeded", "running"), False),
        (job_status(2, "succeeded", "pending"), False),
        (job_status(3, "succeeded", "failed"), False),  # one item not recorded yet: its submit stopped midway
        (job_status(2, "succeeded", "interrupted"), False),  # a status this version does not know is not final
        (job_status(1), False),
    ],
)
def test_a_job_is_done_only_when_every_item_has_a_final_status(status, done):
    assert status.done is done


def test_status_prints_reasons_with_markup_as_written(h):
    job_id = sdk.submit(h.env, "markup", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    reason = "exit code 1: [/x] closing [bold unclosed :x: [red]not red[/red] " + "and a long tail " * 10
    DynamoStore(h.env.name, h.env.region).update_item(job_id, "000000", status="failed", reason=reason)
    sdk.cancel(h.env, job_id)
    out = run(h, "status", job_id)
    assert out.exit_code == 1, out.output  # done with a failed item
    assert f"failed 000000: {reason}" in out.output and "[cancelled job]" in out.output


def test_status_of_a_job_whose_submit_stopped_midway_says_to_run_it_again(h):
    store = DynamoStore(h.env.name, h.env.region)
    store.put_job(Job("half", "half", "work", 0.0, total=3))
    store.put_item_if_new(Item("half", "000000", ["a"], status="succeeded"))
    out = run(h, "status", "half")
    assert "2 item(s) not recorded yet: run the same submit again" in out.output


# -- dead letters --------------------------------------------------------------------------------
def redrive_to_the_dead_letter_queue(h: Harness) -> None:
    """Receive every message of the work queue as nodes that die would, until SQS's redrive has
    moved them all (after the queue's maxReceiveCount receives)."""
    sqs = boto3.client("sqs", region_name=h.env.region)
    url = sqs.get_queue_url(QueueName=naming.queue(h.env.name, "work"))["QueueUrl"]
    for _ in range(20):
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
        if queued(h) == 0:
            return
    raise AssertionError("redrive did not move the messages")


def test_items_redrive_moved_to_the_dead_letter_queue_are_failed_and_stay_there_for_retry(h):
    store, cloud = DynamoStore(h.env.name, h.env.region), for_env(h.env)
    mine = sdk.submit(h.env, "dies", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    other = sdk.submit(h.env, "also dies", "work", sdk.read_items(["c"]), kick=False).job_id
    store.update_item(mine, "000000", status="running", node="i-gone")
    redrive_to_the_dead_letter_queue(h)
    # The agent dead-letters an item whose retries ran out itself, then records why: not ours to mark.
    store.put_item_if_new(Item(mine, "gave-up", ["d"], status="running"))
    sdk.send_messages(cloud, "work", [sdk.ItemMessage(mine, "gave-up", ["d"], failures=3)], dead_letter=True)
    cloud.queues.send("work", ["not an item message"], dead_letter=True)
    sdk.send_messages(cloud, "work", [sdk.ItemMessage(mine, "never-recorded", ["e"])], dead_letter=True)

    status = sdk.status(h.env, mine)
    receives = h.env.queues["work"].max_receive_count
    failed = {i.item_id: i.reason for i in status.items if i.status == "failed"}
    assert failed == dict.fromkeys(
        ("000000", "000001"), f"moved to the dead-letter queue by the queue's redrive after {receives} receives")
    assert status.counts["failed"] == 2 and store.item(mine, "gave-up").status == "running", "not ours to mark"
    (warning,) = status.warnings
    assert warning.startswith("1 message(s) in the dead-letter queue of 'work' are not tidefleet items (a poison message")
    assert store.item(other, "000000").status == "queued", "only the job shown is reconciled"
    assert store.item(mine, "never-recorded") is None, "a dead letter never creates a record"
    assert h.queue_depth("work", dead_letter=True) == 6, "peeked, not deleted"

    assert sdk.reconcile_dead_letters(h.env).failed == [(other, "000000")]  # every job
    # Released at once: retry-failed finds them all, and sends back the three with a record to queue
    # (never-recorded has none: an agent would drop it; it stays in the dead-letter queue).
    assert sdk.retry_failed(h.env, mine) == 3
    assert store.item(mine, "000000").status == "queued"
    assert h.queue_depth("work", dead_letter=True) == 3, "never-recorded, the poison message and other's"


def test_status_warns_on_stderr_and_never_crashes_on_a_dead_letter_queue(h):
    job_id = sdk.submit(h.env, "warned", "work", sdk.read_items(["a"]), kick=False).job_id
    for_env(h.env).queues.send("work", ["{]"], dead_letter=True)
    out = run(h, "status", job_id)
    assert out.exit_code == 0 and "warning: 1 message(s) in the dead-letter queue of 'work'" in out.output
    boto3.client("sqs", region_name=h.env.region).delete_queue(
        QueueUrl=for_env(h.env).queues.url("work", dead_letter=True))
    out = run(h, "status", job_id)
    assert out.exit_code == 0 and "warning: could not read the dead-letter queue of 'work'" in out.output
    assert "queued 1" in out.output


def test_a_dead_letter_the_agent_sent_on_the_jobs_own_retry_budget_is_left_to_the_agents_record(h):
    """A job whose spec allows no retry: the agent dead-letters its item after one failure (fewer
    than the queue's budget of 2), then records why. A status call in between must not take that
    message for the queue's redrive and write its own reason over the agent's."""
    store, cloud = DynamoStore(h.env.name, h.env.region), for_env(h.env)
    job = sdk.submit(h.env, "strict", "work", sdk.read_items(["a"]), kick=False, spec=JobSpec(max_retries=0)).job_id
    store.update_item(job, "000000", status="running", node="i-1")
    sdk.send_messages(cloud, "work", [sdk.ItemMessage(job, "000000", ["a"], failures=1)], dead_letter=True)
    assert sdk.reconcile_dead_letters(h.env, job).failed == []
    assert store.item(job, "000000").status == "running", "the agent's record comes next"


# -- names, ids and paths ------------------------------------------------------------------------
def test_an_empty_name_or_job_id_is_refused_naming_the_option(h, tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("a\n")
    out = run(h, "submit", "--name", "", "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    assert "name: a job needs a name (got ''); give --name a few words" in out.output
    out = run(h, "submit", "--name", "n", "--job-id", "", "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    assert "job id: '' is empty; use 1-128 letters" in out.output
    assert sdk.jobs(h.env) == [] and queued(h) == 0


def test_a_job_id_given_again_with_another_name_is_refused(h, tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("a\n")
    assert run(h, "submit", "--name", "x", "--job-id", "x-1", "--queue", "work", "--items", str(items)).exit_code == 0
    out = run(h, "submit", "--name", "somethingelse", "--job-id", "x-1", "--queue", "work", "--items", str(items))
    refused_cleanly(out)
    assert "job 'x-1' already exists under the name 'x' (got 'somethingelse'); re-submit it with --name 'x', " \
           "or use another --job-id" in out.output  # fmt: skip
    assert queued(h) == 1


def test_items_from_a_pipe_are_read_and_a_directory_is_named_as_one(h, tmp_path):
    read, write = os.pipe()
    os.write(write, b"s3://b/1\ns3://b/2\n")
    os.close(write)
    try:
        assert [s.args for s in sdk.read_items(f"/dev/fd/{read}")] == [["s3://b/1"], ["s3://b/2"]]
    finally:
        os.close(read)
    out = run(h, "submit", "--name", "d", "--queue", "work", "--items", str(tmp_path))
    refused_cleanly(out)
    assert f"items: '{tmp_path}' is a directory; give a file of URIs or JSON lines, or '-' for stdin" in out.output
    assert "no such file" in run(h, "submit", "--name", "d", "--queue", "work", "--items", str(tmp_path / "nope")).output


def test_an_items_path_the_os_cannot_open_is_named_with_the_os_reason(h, tmp_path):
    """Any OSError of the items file (here a name longer than the file system allows, where even
    asking whether it is a directory fails) is one line naming the file and the OS's words."""
    path = tmp_path / ("a" * 300 + ".txt")
    out = run(h, "submit", "--name", "d", "--queue", "work", "--items", str(path))
    refused_cleanly(out)
    assert (f"items: cannot read '{path}' (File name too long); give the path of a readable file of URIs or JSON "
            "lines, or '-' for stdin") in " ".join(out.output.split()), out.output
    assert queued(h) == 0


def test_logs_of_an_item_the_job_does_not_have_is_an_error(h):
    job_id = sdk.submit(h.env, "logged", "work", sdk.read_items(["a"]), kick=False).job_id
    out = run(h, "logs", job_id, "000000")
    assert out.exit_code == 0 and f"no logs yet for {job_id}/000000" in out.output
    failed = f"`tidefleet status --env {h.env_path} {job_id} --failed` lists"  # the environment as the user gave it
    for item, message in (("nosuch-item", f"item 'nosuch-item' not found in job '{job_id}'; check the id ({failed}"),
                          ("../../x", "item id '../../x' contains '..'")):  # fmt: skip
        out = run(h, "logs", job_id, item)
        refused_cleanly(out)
        assert message in out.output and failed in out.output and "no logs yet" not in out.output, out.output


def test_logs_of_an_item_that_ran_and_printed_nothing_say_so_not_no_logs_yet(h):
    """"no logs yet" reads as "never ran": an item whose record shows an attempt ran."""
    job_id = sdk.submit(h.env, "quiet", "work", sdk.read_items(["a", "b"]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    store.update_item(job_id, "000000", status="succeeded", attempts=1)
    store.update_item(job_id, "000001", status="running", attempts=2)
    out = run(h, "logs", job_id, "000000")
    assert out.exit_code == 0 and out.output == (f"no output from {job_id}/000000: it ran (1 attempt, now succeeded) "
                                                 "and printed nothing\n"), out.output
    out = run(h, "logs", job_id, "000001")
    assert out.exit_code == 0 and out.output == (f"no output from {job_id}/000001 yet: it is running (attempt 2) "
                                                 "and has printed nothing so far\n"), out.output


def test_logs_of_an_item_cancelled_before_it_ran_say_it_never_ran_not_no_logs_yet(h):
    """"no logs yet" promised logs to come for an item that never will run."""
    job_id = sdk.submit(h.env, "cancelled-quiet", "work", sdk.read_items(["a"]), kick=False).job_id
    sdk.cancel(h.env, job_id, reason="superseded by v2")
    out = run(h, "logs", job_id, "000000")
    assert out.exit_code == 0 and out.output == (f"no logs for {job_id}/000000: it never ran (cancelled: superseded "
                                                 "by v2)\n"), out.output
    plain = sdk.submit(h.env, "cancelled-plain", "work", sdk.read_items(["a"]), kick=False).job_id
    sdk.cancel(h.env, plain)  # the reason is the status's word: said once
    assert run(h, "logs", plain, "000000").output == f"no logs for {plain}/000000: it never ran (cancelled)\n"
    out = run(h, "logs", plain)  # none will come: not "yet"
    assert out.output == f"no logs for {plain}: it was cancelled, and none of its items printed anything\n", out.output


def test_logs_of_a_job_that_does_not_exist_is_an_error_that_names_a_jobs_id_for_its_name(h):
    job_id = sdk.submit(h.env, "named", "work", sdk.read_items(["a"]), kick=False).job_id
    out = run(h, "logs", "named")
    refused_cleanly(out)
    assert f"job 'named' not found in environment '{h.env.name}'; 'named' is the name of job {job_id!r}: give that id" in out.output
    out = run(h, "logs", "nobody")
    refused_cleanly(out)
    assert "job 'nobody' not found" in out.output and "no logs yet" not in out.output, out.output


# -- what submit says it does --------------------------------------------------------------------
def test_submit_says_held_for_an_after_job_and_already_submitted_for_a_no_op(h, tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("a\nb\n")
    first = run(h, "submit", "--name", "first", "--queue", "work", "--items", str(items))
    assert first.exit_code == 0 and "sending 2 item(s) to work" in first.output
    assert "2 item(s), 2 new, 2 sent" in first.output
    again = run(h, "submit", "--name", "first", "--queue", "work", "--items", str(items))
    assert again.exit_code == 0 and "sending" not in again.output, again.output
    job = sdk.job_id_for("first")
    assert (f"job {job}: already submitted (2 item(s)); nothing recorded or sent again; `tidefleet status --env "
            f"{h.env_path} {job}` shows its progress") in again.output, again.output
    held = run(h, "submit", "--name", "then", "--queue", "work", "--items", str(items), "--after", job)
    assert held.exit_code == 0 and "sending" not in held.output and "2 sent" not in held.output, held.output
    assert f"recording 2 item(s) on work, held until {job} has succeeded" in held.output
    assert "2 item(s), 2 new, held: sent once job" in held.output and queued(h) == 2


# -- a queue the environment file has and the cloud does not -------------------------------------
def test_a_queue_not_deployed_is_named_and_leaves_no_job(h, tmp_path):
    (tmp_path / "more").mkdir()
    grown = tmp_path / "more" / h.env_path.name  # the same environment, a queue added since its deploy
    grown.write_text(h.env_path.read_text() + '\n[queues.extra]\npool = "cpu"\n')
    items = tmp_path / "items.txt"
    items.write_text("a\n")
    out = CliRunner().invoke(main, ["submit", "--env", str(grown), "--name", "newq", "--queue", "extra",
                                    "--items", str(items)], env={"TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"})  # fmt: skip
    refused_cleanly(out)
    name = naming.queue(h.env.name, "extra")
    assert f"queues.extra: SQS queue '{name}' does not exist in region us-east-1; it was added after the last " \
           f"deploy: deploy it (invoke deploy --env {grown})" in out.output  # fmt: skip
    assert "is not deployed" not in out.output
    assert DynamoStore(h.env.name, h.env.region).job(sdk.job_id_for("newq")) is None
