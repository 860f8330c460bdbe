"""`tidefleet sandbox --train`'s summary and progress line, from inputs built here (no sandbox run)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tidefleet import costs
from tidefleet.config import load_environment
from tidefleet.jobs import sdk
from tidefleet.records import Item, Job
from tidefleet.sandbox import training, view

TRAIN = load_environment("sandbox-train")


def a_status(job_id: str, total: int, **counts: int) -> sdk.JobStatus:
    return sdk.JobStatus(job=Job(job_id, job_id, "q", 0.0, total), counts={s: counts.get(s, 0) for s in sdk.STATES},
                         items=[])  # fmt: skip


def summarise(tmp_path, events: list[dict], *, zero_at: float | None, item=None, parts=()):
    path = tmp_path / "train-events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    sandbox = SimpleNamespace(tick_error="", workdir=tmp_path)
    charged = costs.charges(TRAIN, Job("t", "t", "train", 0.0, 1), [item], parts={"train": list(parts)}) if item else []
    return training._summarise(sandbox, path, item, a_status("gpu", 0), "", 0.0, zero_at, gang_size=2, charged=charged)


def test_a_run_cut_short_by_the_time_limit_says_so_and_one_started_rank_is_not_a_gang(tmp_path):
    # `sandbox --train --time-limit 10`: the gang's lead started alone before the limit.
    summary = summarise(tmp_path, [{"event": "start", "attempt": 1, "rank": 0, "node": "i-a", "resumed_from": 0}],
                        zero_at=None)  # fmt: skip
    rows = dict(summary.rows())
    assert rows["time limit (--time-limit) hit"] == "YES: the run was cut short"
    assert rows["gang: nodes, distinct ranks, rendezvous"] == "1 of 2, NO, NO"
    assert not summary.ranks_on_distinct_nodes and not summary.ok


def test_a_gang_of_its_two_nodes_that_met_passes_those_checks(tmp_path):
    events = [{"event": "start", "attempt": 1, "rank": r, "node": f"i-{r}", "resumed_from": 0} for r in (0, 1)]
    summary = summarise(tmp_path, [*events, {"event": "rendezvous", "attempt": 1, "peers": [1]}], zero_at=5.0)
    rows = dict(summary.rows())
    assert rows["gang: nodes, distinct ranks, rendezvous"] == "2 of 2, yes, yes"
    assert rows["time limit (--time-limit) hit"] == "no"


def test_each_attempt_is_billed_on_the_nodes_it_ran_on_the_leads_entry_and_the_members_parts(tmp_path):
    ran = {"instance_type": "g5.12xlarge", "spot": True, "slots": 4, "node_slots": 4, "seconds": 5.0, "ended_at": 1.8e9}
    history = [{"attempt": 1, "node": "i-a", "outcome": "interrupted", **ran},
               {"attempt": 2, "node": "i-a", "outcome": "released"},  # gave back before it ran: not billed
               {"attempt": 3, "node": "i-c", "outcome": "succeeded", **ran}]  # fmt: skip
    item = Item("train-job", "train", [], status="succeeded", attempts=3, interruptions=1, history=history)
    summary = summarise(tmp_path, [], zero_at=5.0, item=item,
                        parts=[{"attempt": 1, "node": "i-b", **ran}, {"attempt": 3, "node": "i-d", **ran}])  # fmt: skip
    assert summary.billed_nodes == [2, 2] and dict(summary.rows())["gang nodes billed, per attempt"] == "2 of 2, 2 of 2"
    lead_only = summarise(tmp_path, [], zero_at=5.0, item=item, parts=[{"attempt": 3, "node": "i-d", **ran}])
    assert lead_only.billed_nodes == [1, 2] and not lead_only.ok


def test_the_progress_line_counts_the_gpu_items_with_the_training_item():
    # The 4 GPU items done, the training item running: 4 of 5 final, as 'waiting' counts all 5 queues' items.
    progress = training.both(a_status("gpu", 4, succeeded=4), a_status("train", 1, running=1))
    line = view.plain(status=progress, queues={"infer": (0, 0, 0), "train": (0, 1, 0)}, nodes=[], busy={})
    assert line.startswith("4/5 final (0 failed)  waiting 0")
    assert progress.counts["succeeded"] == 4 and progress.counts["running"] == 1
