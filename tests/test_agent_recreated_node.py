"""A preempted Spot VM is recreated by its managed instance group under the same name, and the
node id is the instance name on GCP: the new machine's agent must not read the previous
machine's sticky marks (its draining, set as it was preempted) as its own and refuse all work
(the audit's s5_recreated_same_name.py). A record last written before this machine booted is
forgotten at start; a mark-only record (a spot notice's draining before the first heartbeat)
and one written since the boot (the agent restarted) are this machine's, and kept."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import psutil
import pytest

from tests.test_gcp_agent import env, run_agent  # noqa: F401 - env is a fixture
from tests.test_gcp_agent_metadata import metadata_server  # noqa: F401 - a fixture
from tests.test_gcp_jobs import gcp  # noqa: F401 - a fixture
from tidefleet.cloud import for_env
from tidefleet.jobs import sdk
from tidefleet.records import Heartbeat

NODE = "tidefleet-gcp-dev-cpu-x1y2"


def last_beat(at: float) -> Heartbeat:
    """The previous machine's last heartbeat, on its preemption notice: draining."""
    return Heartbeat(NODE, "cpu", at=at, slots=2, busy_slots=0, idle_since=at, draining=True)


def test_a_machine_recreated_under_the_same_name_forgets_the_previous_ones_draining_and_takes_work(
    gcp, env, tmp_path, metadata_server, caplog  # noqa: F811
):
    url, _ = metadata_server
    store = for_env(env).store
    store.put_heartbeat(last_beat(psutil.boot_time() - 120))
    store.set_cordon("cpu", NODE, True)
    (tmp_path / "release").touch()
    job = sdk.submit(env, "after a repair", "default", sdk.read_items([["ok"]]), kick=False).job_id
    with caplog.at_level(logging.INFO, "tidefleet.agent"):
        agent = run_agent(env, tmp_path, NODE, url, lambda s: s.item(job, "000000").status == "succeeded")
    assert agent.stop_reason == "test over"
    assert store.item(job, "000000").status == "succeeded"
    (line,) = [r.getMessage() for r in caplog.records if "before this machine booted" in r.getMessage()]
    assert NODE in line and "draining" in line


def test_a_mark_only_record_is_this_machines_and_kept(gcp, env, tmp_path, metadata_server):  # noqa: F811
    url, _ = metadata_server
    store = for_env(env).store
    store.mark_draining("cpu", NODE)  # a spot notice before the agent's first heartbeat
    agent = run_agent(env, tmp_path, NODE, url, lambda s: False)
    assert agent.stop_reason == "node marked draining in the job store"


def test_a_record_written_since_the_boot_is_this_machines_and_kept(gcp, env, tmp_path, metadata_server):  # noqa: F811
    url, _ = metadata_server
    store = for_env(env).store
    store.put_heartbeat(last_beat(psutil.boot_time() + 1))  # the agent restarted on the same machine
    agent = run_agent(env, tmp_path, NODE, url, lambda s: False)
    assert agent.stop_reason == "node marked draining in the job store"


# On AWS (instance ids are never reused, so it never meets one there): the same rule, harmlessly.
def aws_agent(tmp_path, aws):
    from tests.agent_harness import Harness
    from tidefleet.agent.worker import Agent, Settings
    from tidefleet.cloud.aws.imds import Metadata

    h = Harness(tmp_path, aws)
    return Agent(h.env, "cpu", Settings(node_id="i-0123", instance_type="c6i.large", spot=True, work_dir=tmp_path / "work",
                                        checkpoint_root=tmp_path / "checkpoints", heartbeat_s=0.5, wait_s=0),
                 metadata=Metadata("http://127.0.0.1:9"))  # fmt: skip


@pytest.mark.moto
def test_on_aws_a_record_from_before_the_boot_is_forgotten_and_a_mark_only_one_kept(tmp_path, aws):
    node = aws_agent(tmp_path, aws)
    old = replace(last_beat(psutil.boot_time() - 120), node_id="i-0123", cordoned=True)
    node.store.put_heartbeat(old)
    node.store.set_cordon("cpu", "i-0123", True)
    node._prepare()
    node._write_heartbeat(0, time.time(), {})
    own = node.store.heartbeat("cpu", "i-0123")
    assert (own.draining, own.cordoned, node.stopping.is_set(), node.cordoned) == (False, False, False, False)

    node.store.forget_node("cpu", "i-0123")
    node.store.mark_draining("cpu", "i-0123")  # a spot notice before the first heartbeat
    node._prepare()
    node._write_heartbeat(0, time.time(), {})
    assert node.stopping.is_set() and node.stop_reason == "node marked draining in the job store"
