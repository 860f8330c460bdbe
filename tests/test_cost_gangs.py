"""`tidefleet cost` on a gang job, on the moto server: the members' parts recorded beside the
item are billed with the lead's entry, and only jobs that may have parts (a gang queue's, or a
queue no longer configured) cost a query for them; `tidefleet rightsize` fits a gang queue's member
one per node."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tidefleet.cli import main
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.records import Item, Job

pytestmark = pytest.mark.moto

ENV_TOML = """
region = "us-east-1"

[pools.cpu]
max = 4
command = "true"
instance_types = [{ type = "c6i.large" }]

[queues.train]
pool = "cpu"
nodes_per_item = 2

[queues.work]
pool = "cpu"
"""
PRICE = 0.034  # c6i.large spot (tidefleet/prices.py)


def ran(node: str, seconds: float, **extra) -> dict:  # a tenth of a core, 300 MiB: light
    return {"attempt": 1, "node": node, "exit_code": 0, "seconds": seconds, "instance_type": "c6i.large",
            "spot": True, "slots": 1, "node_slots": 1, "ended_at": 1.8e9, "cpu_s": seconds / 10, "peak_rss_mb": 300.0,
            **extra}  # fmt: skip


def test_a_gangs_members_are_billed_with_its_lead_and_only_gang_jobs_are_asked_for_parts(tmp_path, aws, monkeypatch):
    path = tmp_path / "gangs.toml"
    path.write_text(ENV_TOML)
    env = load_environment(str(path))
    provision(env, user_data={"cpu": ""})
    store = DynamoStore(env.name, env.region)
    for job_id, queue in (("gang", "train"), ("single", "work"), ("orphan", "gone")):
        store.put_job(Job(job_id, job_id, queue, created_at=1.7e9, total=1))
        store.create_items([Item(job_id, "000000", args=["x"])], unseen=True)
        store.update_item(job_id, "000000", append={"history": {**ran("node-a", 3600.0), "outcome": "succeeded"}})
        store.record_part(job_id, "000000", {**ran("node-b", 1800.0), "rank": 1, "outcome": "member"})
    asked, parts = [], DynamoStore.parts
    monkeypatch.setattr(DynamoStore, "parts", lambda self, job_id: asked.append(job_id) or parts(self, job_id))
    out = CliRunner().invoke(main, ["cost", "--by", "job", "--since", "all", "--json", "--env", str(path)])
    assert out.exit_code == 0 and "Traceback" not in out.output, out.output
    rows = {r["key"]: r for r in json.loads(out.output)["rows"]}
    assert rows["gang"]["attempts"] == 2 and rows["gang"]["cost_usd"] == pytest.approx(1.5 * PRICE), "one per node"
    assert rows["orphan"]["cost_usd"] == pytest.approx(1.5 * PRICE), "its queue is gone: it may have been a gang's"
    assert rows["single"]["cost_usd"] == pytest.approx(PRICE), "an ordinary queue's job has no parts to read"
    assert sorted(asked) == ["gang", "orphan"]
    # rightsize through the CLI: the gang queue's members fit one per node (each takes its node),
    # where the ordinary queue's items, as light, would be packed.
    out = CliRunner().invoke(main, ["rightsize", "--since", "all", "--json", "--env", str(path)])
    assert out.exit_code == 0 and "Traceback" not in out.output, out.output
    advice = {a["scope"]: a for a in json.loads(out.output)["advice"]}
    assert advice["queue train"]["gang"] and advice["queue train"]["best"]["items_per_node"] == 1
    assert not advice["queue work"]["gang"] and advice["queue work"]["best"]["items_per_node"] > 1
