"""A container pool's agent where docker itself misbehaves, against the moto server and the fake
`docker` of test_runner_containers (there is no real docker here; the fake imitates what the
agent relies on: --cidfile, labels, --rm, --sig-proxy, and docker's refusal of a relative bind
mount). Whatever docker does, an item is never lost and never recorded as anything but what
its workload did, and a drain stays within the spot notice."""

from __future__ import annotations

import sys
import time

import pytest
from agent_harness import Harness, wait_until
from test_runner_containers import FakeDocker

from tidefleet.agent import runner, worker
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.jobs import sdk
from tidefleet.records import FINAL

pytestmark = pytest.mark.moto

# argv[-1] says what it does: "exit" (0 at once, as most workloads end), "complete" (declares
# completion, then exit 0), "finish-on-stop" (its last step once asked to stop: complete, exit 0),
# "ignore-stop" (a hung workload: only SIGKILL ends it).
WORKLOAD = r"""
import json, os, signal, sys, time
from tidefleet.agent import checkpoint

mode = sys.argv[-1]
with open(os.environ["LEDGER"], "a") as f:
    f.write(json.dumps({"event": "start", "cwd": os.getcwd()}) + "\n")
if mode == "ignore-stop":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
while mode == "finish-on-stop" and not checkpoint.should_stop():
    time.sleep(0.05)
if mode != "exit":
    checkpoint.complete()
print("trained", flush=True)
"""

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

# How a pool runs the workload: its config line, and what goes before the mode in the item's args.
KINDS = {
    "container": ('container = "ghcr.io/acme/train:1"', ["{python}", "{workload}"]),
    "command": ('command = "{python} {workload}"', []),
}


@pytest.fixture
def docker(tmp_path, monkeypatch):
    fake = FakeDocker(tmp_path, monkeypatch)
    yield fake
    fake.close()


def harness(tmp_path, aws, kind: str) -> tuple[Harness, list[str]]:
    what, before = KINDS[kind]
    h = Harness(tmp_path, aws, env_toml=ENV_TOML.replace("{what}", what), workload=WORKLOAD)
    return h, [a.format(python=sys.executable, workload=tmp_path / "workload.py") for a in before]


def submit(h: Harness, args: list[str]) -> str:
    return sdk.submit(h.env, "docker-faults", "work", sdk.read_items([args]), kick=False).job_id


@pytest.mark.parametrize("kind", KINDS)
def test_a_relative_work_dir_runs_items_in_absolute_folders(docker, tmp_path, aws, monkeypatch, request, kind):
    """`tidefleet agent --work-dir work`: a bind mount needs an absolute host path (docker refuses
    a relative one), and the workload runs in its folder (a container in the image's), where a
    relative stop or done file would name another place."""
    h, before = harness(tmp_path, aws, kind)
    request.addfinalizer(h.stop_agents)
    job = submit(h, [*before, "complete"])
    monkeypatch.chdir(tmp_path)  # the agent's folder: its relative work dir is tmp_path/work
    h.start_agent("node-rel", TIDEFLEET_AGENT_WORK_DIR="work")
    item = wait_until(lambda: (i := h.items(job)["000000"]).status in FINAL and i, 60, "the item to end")
    assert item.status == "succeeded", f"{item.reason}\nagent log:\n{h.agent_log('node-rel')[-3000:]}"
    folder = tmp_path.resolve() / "work" / job / "000000" / "1"  # getcwd() resolves links
    if kind == "container":
        (run,) = [c for c in docker.calls() if c[0] == "run"]
        mounts = [run[i + 1] for i, a in enumerate(run) if a == "-v"]
        assert f"{folder}:{folder}" in mounts, mounts


GRACE_S = 5.0  # the drain's grace here (90 s on AWS); a hung docker call outlasts it and SETTLE_S
HUNG = [
    # (case, the workload's mode, when the spot notice comes, the item's status, its interruptions)
    ("it ended on its own just before the notice", "exit", "cleanup", "succeeded", 0),
    ("it finishes its last step within the grace", "finish-on-stop", "running", "succeeded", 0),
    ("it ignores the stop and is killed at the grace's end", "ignore-stop", "running", "queued", 1),
]


@pytest.mark.parametrize(("case", "mode", "notice", "status", "interruptions"), HUNG, ids=[c[0] for c in HUNG])
def test_a_hung_dockerd_neither_loses_nor_misrecords_an_item_at_a_spot_notice(docker, tmp_path, aws, monkeypatch,
                                                                              case, mode, notice, status,
                                                                              interruptions):  # fmt: skip
    """docker rm and docker kill never answer: the attempt's outcome is what its workload did (a
    finished item is not handed back to run again), recorded or handed back within the grace and
    SETTLE_S, well within the 2 minutes a spot notice gives."""
    monkeypatch.setattr(runner, "DOCKER_S", 3 * (GRACE_S + worker.SETTLE_S))
    h, before = harness(tmp_path, aws, "container")
    job = submit(h, [*before, mode])
    docker.answer("rm,kill", "hang")
    node = Agent(h.env, "cpu", Settings(node_id="node-x", instance_type="c6i.large", spot=True, work_dir=tmp_path / "work",
                                        checkpoint_root=tmp_path / "checkpoints", heartbeat_s=0.5, wait_s=0,
                                        grace_s=GRACE_S),
                 metadata=Metadata("http://127.0.0.1:9"))  # fmt: skip
    node._prepare()
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    if notice == "cleanup":  # its container is being removed: its client, the workload, has exited
        wait_until(lambda: any(c[0] == "rm" for c in docker.calls()), 20, "the container's removal")
        assert node._free_slots() == 0, "no next item on the slot until its container is gone"
    else:
        wait_until(lambda: h.events("start"), 20, "the workload to start")
    node.request_stop("spot interruption notice: terminate")
    began = time.monotonic()
    node._drain()
    drained_s = time.monotonic() - began
    node._leave()
    item = h.items(job)["000000"]
    assert (item.status, item.interruptions) == (status, interruptions), (item.status, item.history)
    assert drained_s < GRACE_S + worker.SETTLE_S, f"the drain took {drained_s:.1f}s"
    # Not lost: a succeeded item's message is deleted, a handed-back one waits in the queue.
    assert h.queue_depth("work") == (status == "queued")
    assert docker.hanging(), "the fault was there all along: docker still hangs"
