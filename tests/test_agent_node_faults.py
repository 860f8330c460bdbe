"""A fault of the node itself (its docker daemon does not answer, its item user is missing) would
fail every item it takes and dead-letter a whole job within a second. At start-up such a node
takes nothing and is marked draining (as one with a broken GPU driver is); met while an attempt
starts, the item goes back as an interruption, unspent, and the node stops taking items. A
docker error that is the item's (a bad image name, an image that does not exist) stays the
item's failure, recorded with docker's own explaining line. Real agents against the moto server
and the fake `docker` of test_runner_containers."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

import pytest
from agent_harness import Harness, wait_until
from test_runner_containers import FakeDocker

from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.jobs import sdk

pytestmark = pytest.mark.moto

ENV_TOML = """
region = "us-east-1"

[pools.cpu]
max = 1
slots_per_unit = 1
{what}
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.work]
pool = "cpu"
max_retries = 0
item_timeout_s = 60
"""
CONTAINER = 'container = "busybox:1.36"'
COMMAND = 'command = "{python} {workload}"'
WORKLOAD = "print('ran', flush=True)\n"

# What docker run prints (on stderr) when dockerd is down, and its trailing hint (docker 25+; older
# ones say "See 'docker run --help'.").
DAEMON_DOWN = "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
HINT = "Run 'docker run --help' for more information"


@pytest.fixture
def docker(tmp_path, monkeypatch):
    fake = FakeDocker(tmp_path, monkeypatch)
    yield fake
    fake.close()


def harness(tmp_path, aws, what: str, request) -> Harness:
    h = Harness(tmp_path, aws, env_toml=ENV_TOML.replace("{what}", what), workload=WORKLOAD)
    request.addfinalizer(h.stop_agents)
    return h


def submit(h: Harness, items: int = 1) -> str:
    return sdk.submit(h.env, "node faults", "work", sdk.read_items([[f"x{i}"] for i in range(items)]),
                      kick=False).job_id  # fmt: skip


def assert_took_nothing_and_drains(h: Harness, node_id: str, why: str) -> None:
    log = h.agent_log(node_id)
    assert why in log and "it takes no items and is marked draining" in log, log
    assert "Traceback" not in log and "WARNING" not in log, log
    beat = DynamoStore(h.env.name, h.env.region).heartbeat("cpu", node_id)
    assert beat.draining and beat.busy_slots == 0
    assert why in beat.fault, "its heartbeat says why: the scaler holds launches after several (policy.faults)"
    assert h.queue_depth("work") == 1 and h.queue_depth("work", dead_letter=True) == 0


def test_a_container_node_whose_docker_daemon_is_down_takes_nothing_and_is_marked_draining(docker, tmp_path, aws,
                                                                                            request):  # fmt: skip
    h = harness(tmp_path, aws, CONTAINER, request)
    submit(h)
    docker.answer("ps,info,version", 1, DAEMON_DOWN.removeprefix("docker: "))  # as `docker ps` says it
    proc = h.start_agent("no-dockerd")
    assert proc.wait(30) == 1
    assert_took_nothing_and_drains(h, "no-dockerd", "Cannot connect to the Docker daemon")
    assert not any(c[0] == "run" for c in docker.calls())


def test_a_node_without_its_item_user_takes_nothing_and_is_marked_draining(tmp_path, aws, request):
    h = harness(tmp_path, aws, COMMAND, request)
    submit(h)
    proc = h.start_agent("no-user", TIDEFLEET_ITEM_USER="no-such-user")
    assert proc.wait(30) == 1
    assert_took_nothing_and_drains(h, "no-user", "the item user 'no-such-user' does not exist on this node")


def agent(h: Harness, **settings) -> Agent:
    node = Agent(h.env, "cpu", Settings(node_id="node-x", instance_type="c6i.large", spot=True, work_dir=h.tmp / "work",
                                        checkpoint_root=h.tmp / "checkpoints", heartbeat_s=0.5, wait_s=0, **settings),
                 metadata=Metadata("http://127.0.0.1:9"))  # fmt: skip
    node._prepare()
    return node


def assert_handed_back_unspent(h: Harness, node: Agent, job: str, caplog, why: str) -> None:
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: not node.runs, 30, "the attempt to settle")
    item = h.items(job)["000000"]
    assert (item.status, item.failures, item.interruptions) == ("queued", 0, 1), (item.status, item.reason)
    assert [e["outcome"] for e in item.history] == ["interrupted"]
    assert h.queue_depth("work") == 1 and h.queue_depth("work", dead_letter=True) == 0
    assert node.stopping.is_set(), "it takes no more items; its heartbeat says draining"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and why in errors[0], errors
    assert "Traceback" not in caplog.text


def test_a_docker_daemon_that_dies_later_hands_the_item_back_and_the_node_stops_taking_items(docker, tmp_path, aws,
                                                                                              request, caplog):  # fmt: skip
    caplog.set_level(logging.INFO, "tidefleet.agent")
    h = harness(tmp_path, aws, CONTAINER, request)
    job = submit(h)
    node = agent(h)  # dockerd answered at start-up
    docker.answer("run,rm,kill,ps", 125, f"{DAEMON_DOWN}\n{HINT}")
    assert_handed_back_unspent(h, node, job, caplog, DAEMON_DOWN)


def test_an_item_user_gone_later_hands_the_item_back_and_the_node_stops_taking_items(tmp_path, aws, request, caplog):
    caplog.set_level(logging.INFO, "tidefleet.agent")
    h = harness(tmp_path, aws, COMMAND, request)
    job = submit(h)
    node = agent(h)
    node.s = replace(node.s, item_user="gone-user")  # userdel after the agent started
    assert_handed_back_unspent(h, node, job, caplog, "the item user 'gone-user' does not exist on this node")
    assert not h.ledger.exists(), "nothing ran as the agent instead"


ITEM_FAULTS = [
    ("a bad image name", ["docker: invalid reference format.", "See 'docker run --help'."]),
    ("an image that does not exist", [
        "Unable to find image 'busybox:1.36' locally",
        ("docker: Error response from daemon: pull access denied for busybox, repository does not exist or may "
         "require 'docker login': denied: requested access to the resource is denied."),
        HINT,
    ]),
    # Not docker's own line: a container whose workload says so, with docker's exit code for itself.
    ("a workload that prints the daemon's words", [DAEMON_DOWN.removeprefix("docker: ")]),
]


@pytest.mark.parametrize(("case", "lines"), ITEM_FAULTS, ids=[f[0] for f in ITEM_FAULTS])
def test_a_docker_error_of_the_item_fails_the_item_with_dockers_explaining_line(docker, tmp_path, aws, request,
                                                                               case, lines):  # fmt: skip
    h = harness(tmp_path, aws, CONTAINER, request)
    job = submit(h)
    node = agent(h)
    docker.answer("run", 125, "\n".join(lines))
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: not node.runs, 30, "the attempt to settle")
    item = h.items(job)["000000"]
    explaining = next(line for line in reversed(lines) if line != HINT and not line.startswith("See "))
    assert (item.status, item.exit_code) == ("failed", 125), (item.status, item.reason)
    assert f"last output: {explaining[:100]}" in item.reason, item.reason
    assert not node.stopping.is_set(), "the node takes the next item"


def test_with_a_healthy_docker_a_container_node_runs_its_items(docker, tmp_path, aws, request):
    """The start-up check does not refuse a docker that answers (busybox here: the fake runs the args)."""
    h = harness(tmp_path, aws, CONTAINER.replace("busybox:1.36", "ghcr.io/acme/train:1"), request)
    job = sdk.submit(h.env, "fine", "work", sdk.read_items([[sys.executable, "-c", "print('ran')"]]),
                     kick=False).job_id  # fmt: skip
    node = agent(h)
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: not node.runs, 30, "the attempt to settle")
    node.records.flush()
    assert h.items(job)["000000"].status == "succeeded"
    assert not node.stopping.is_set()
