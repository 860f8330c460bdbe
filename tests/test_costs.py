"""Cost attribution and right-sizing, pure: attempts priced from their history entries, sums by
team / job / queue / user / pool / month, and the sizing advice, table-driven."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime

import pytest

from tidefleet import costs, rightsize
from tidefleet.config import load_environment, parse_environment
from tidefleet.records import Item, Job

ENV = parse_environment({
    "region": "us-east-1",
    "pools": {
        "cpu": {"max": 4, "command": "true", "slots_per_unit": 2, "team": "infra",
                "instance_types": [{"type": "c6i.large"}, {"type": "m6i.xlarge", "spot_price": 0.05}]},
        "gpu": {"max": 2, "command": "true", "team": "vision",
                "instance_types": [{"type": "g5.12xlarge", "weight": 4, "gpus": 4}], "capacity_unit": "gpus"},
    },
    "queues": {"render": {"pool": "cpu"}, "nlp": {"pool": "cpu", "team": "nlp"}, "train": {"pool": "gpu"}},
}, name="t")  # fmt: skip
JAN = datetime(2026, 1, 15, tzinfo=UTC).timestamp()
FEB = datetime(2026, 2, 15, tzinfo=UTC).timestamp()


def entry(seconds=3600.0, itype="c6i.large", spot=True, slots=1, node_slots=2, ended_at=JAN, **extra) -> dict:
    return {"attempt": 1, "node": "i-1", "exit_code": 0, "seconds": seconds, "outcome": "succeeded",
            "instance_type": itype, "spot": spot, "slots": slots, "node_slots": node_slots, "ended_at": ended_at,
            **extra}  # fmt: skip


def job(queue="render", job_id="j1", submitter="arn:aws:iam::1:user/ana") -> Job:
    return Job(job_id, job_id, queue, 0.0, 1, submitter=submitter)


def priced(*entries, queue="render", **kw) -> list[costs.Charge]:
    return costs.charges(ENV, job(queue), [Item("j1", "000000", history=list(entries))], **kw)


def test_an_end_appended_twice_by_a_retried_write_is_billed_once():
    """The logs/cost audit: a failure's history write that landed, its answer lost, was appended
    again by the retry (the fence, the attempt number, still passed): two charges for one attempt."""
    failed = entry(outcome="failed", exit_code=1)
    assert len(priced(failed, dict(failed))) == 1
    assert len(priced(failed, entry(attempt=2, ended_at=JAN + 60))) == 2, "two attempts are two charges"


@pytest.mark.parametrize(
    "e, queue, usd",
    [
        (entry(), "render", 0.034 / 2),  # an hour on half a spot c6i.large
        (entry(spot=False), "render", 0.085 / 2),  # on demand: the on-demand price
        (entry(slots=2), "render", 0.034),  # the whole node
        (entry(seconds=1800, node_slots=4), "render", 0.034 / 8),  # half an hour on a quarter
        (entry(itype="m6i.xlarge"), "render", 0.05 / 2),  # the environment's own price wins
        (entry(itype="c7i.large"), "render", 0.036 / 2),  # a type no longer in the pool: the built-in table
        (entry(itype="g5.12xlarge", slots=1, node_slots=4), "train", 2.27 / 4),  # one GPU of four
    ],
)
def test_an_attempt_costs_its_node_seconds_times_its_share_times_the_node_price(e, queue, usd):
    (charge,) = priced(e, queue=queue)
    assert charge.cost_usd == pytest.approx(usd)


@pytest.mark.parametrize(
    "e, reason",
    [
        ({"attempt": 1, "node": "i-2", "outcome": "lost", "reason": "node lost"}, "node lost"),
        ({"attempt": 1, "node": "i-2", "outcome": "succeeded", "reason": "completed by an earlier attempt"},
         "no run time"),
        ({"attempt": 1, "node": "i-2", "seconds": 10.0, "cpu_s": 1.0, "outcome": "succeeded"}, "older than cost"),
        (entry(itype="x9.huge"), "no price for x9.huge"),
    ],
)
def test_an_attempt_that_cannot_be_priced_is_counted_with_its_reason_never_guessed(e, reason):
    unpriced = Counter()
    assert priced(e, unpriced=unpriced) == []
    ((why, n),) = unpriced.items()
    assert reason in why and n == 1


@pytest.mark.parametrize(
    "queue, team", [("render", "infra"), ("nlp", "nlp"), ("train", "vision"), ("gone", "unknown")]
)
def test_the_team_is_the_queues_else_the_pools(queue, team):
    assert [c.team for c in priced(entry(), queue=queue)] == [team]


def test_since_keeps_only_attempts_that_ended_then_or_later():
    charges = priced(entry(ended_at=JAN), entry(ended_at=FEB), since=FEB - 1)
    assert [c.ended_at for c in charges] == [FEB]


def spread() -> list[costs.Charge]:
    """Three jobs: ana's render job (Jan + Feb), bo's nlp job (Feb), ana's GPU job (Feb)."""
    items = {
        ("j1", "render", "ana"): [entry(ended_at=JAN), entry(ended_at=FEB)],
        ("j2", "nlp", "bo"): [entry(ended_at=FEB, slots=2)],
        ("j3", "train", "ana"): [entry(itype="g5.12xlarge", node_slots=4, ended_at=FEB)],
    }
    return [c for (j, q, who), es in items.items()
            for c in costs.charges(ENV, job(q, j, who), [Item(j, "000000", history=es)])]  # fmt: skip


@pytest.mark.parametrize(
    "by, monthly, expected",
    [
        ("team", False, [(None, "vision", 2.27 / 4), (None, "infra", 0.034), (None, "nlp", 0.034)]),
        ("user", False, [(None, "ana", 2.27 / 4 + 0.034), (None, "bo", 0.034)]),
        ("queue", False, [(None, "train", 2.27 / 4), (None, "nlp", 0.034), (None, "render", 0.034)]),
        ("pool", False, [(None, "gpu", 2.27 / 4), (None, "cpu", 0.068)]),
        ("job", True, [("2026-01", "j1", 0.017), ("2026-02", "j3", 2.27 / 4), ("2026-02", "j2", 0.034),
                       ("2026-02", "j1", 0.017)]),
    ],
)  # fmt: skip
def test_costs_sum_by_each_grouping_and_by_month(by, monthly, expected):
    rows = costs.summarise(spread(), by, monthly=monthly)
    assert [(r.month, r.key) for r in rows] == [(m, k) for m, k, _ in expected]
    assert [r.cost_usd for r in rows] == pytest.approx([usd for *_, usd in expected])
    assert sum(r.attempts for r in rows) == 4


def test_an_unknown_grouping_is_refused_by_name():
    with pytest.raises(ValueError, match="by: unknown grouping 'colour'"):
        costs.summarise([], "colour")


@pytest.mark.parametrize(
    "text, expected",
    [("7d", 1_000_000 - 7 * 86400), ("12h", 1_000_000 - 43200), ("90s", 1_000_000 - 90), ("all", 0.0),
     ("2026-01-15", datetime(2026, 1, 15, tzinfo=UTC).timestamp()), ("12d", 0.0), ("9" * 40 + "d", 0.0)],
)  # fmt: skip
def test_since_reads_durations_dates_and_all(text, expected):
    assert costs.parse_since(text, 1_000_000) == expected


@pytest.mark.parametrize("text", ["7 days", "-1d", "d", "2026-13-01", "", "²d", "٣d"])  # digits int() refuses or reads
def test_a_bad_since_names_the_option_the_value_and_the_fix(text):
    with pytest.raises(ValueError, match=r"--since: not a duration or a date .* use e\.g\. 7d"):
        costs.parse_since(text, 1_000_000)


# -- right-sizing ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "itype, need, items, limited_by",
    [
        ("c6i.large", rightsize.Need(0.5, 500, 0, 0), 4, "cores"),  # 2 vCPUs / 0.5
        ("c6i.large", rightsize.Need(0.1, 1000, 0, 0), 3, "memory"),  # 4 GiB × 0.9 / 1000 MiB
        ("r6i.xlarge", rightsize.Need(1.0, 1000, 0, 0), 4, "cores"),
        ("g5.12xlarge", rightsize.Need(1.0, 1000, 1, 20_000), 4, "GPUs"),  # 4 A10Gs of 24 GB
        ("g5.12xlarge", rightsize.Need(1.0, 1000, 0.5, 0), 8, "GPUs"),  # half a GPU each
    ],
)
def test_a_node_fits_as_many_items_as_its_tightest_resource_allows(itype, need, items, limited_by):
    f = rightsize.fit(itype, need, 1.0)
    assert (f.items_per_node, f.limited_by, f.usd_per_item_hour) == (items, limited_by, pytest.approx(1.0 / items))


@pytest.mark.parametrize(
    "itype, need",
    [
        ("c6i.large", rightsize.Need(3.0, 100, 0, 0)),  # more cores than the node has
        ("c6i.large", rightsize.Need(0.1, 8000, 0, 0)),  # more memory
        ("c6i.large", rightsize.Need(0.1, 100, 1, 0)),  # a GPU item on a CPU type
        ("g4dn.xlarge", rightsize.Need(1.0, 100, 1, 20_000)),  # 20 GB of GPU memory on a 16 GB T4
        ("x9.huge", rightsize.Need(0.1, 100, 0, 0)),  # no size known
    ],
)
def test_a_type_that_cannot_hold_one_item_is_no_fit(itype, need):
    assert rightsize.fit(itype, need, 1.0) is None


ATTEMPTS = itertools.count(1)


def measured(cpu_s, seconds=100.0, rss=300.0, **extra) -> dict:
    """An attempt's end with its readings; each its own attempt (one end recorded twice is billed once)."""
    return entry(seconds=seconds, cpu_s=cpu_s, peak_rss_mb=rss, **{"attempt": next(ATTEMPTS), **extra})


def test_advice_sizes_items_from_their_p95_cores_and_peak_memory_and_prices_the_saving():
    # Items on half a c6i.large use a tenth of a core and 300 MiB (360 with headroom): ten fit one.
    found = priced(*[measured(cpu_s=10.0) for _ in range(20)])
    a = rightsize.advise(ENV, "queue render", "cpu", found)
    assert (a.cores_p95, a.peak_rss_mb) == (pytest.approx(0.1), 300.0)
    (now,) = a.now
    assert (now.instance_type, now.items, now.fits.items_per_node, now.fits.limited_by) == ("c6i.large", 2, 10, "memory")
    assert now.slots_per_unit == 10  # 10 items of one slot on a node of weight 1
    assert a.spent_usd == pytest.approx(20 * 100 / 3600 * 0.034 / 2)
    assert a.best.usd_per_item_hour <= 0.034 / 10
    assert a.saving_usd == pytest.approx(a.spent_usd - a.best.usd_per_item_hour * a.item_hours)
    assert a.saving_usd > 0


def test_a_type_that_costs_the_same_per_item_is_no_advice_and_no_saving():
    """0.82 cores each, on demand: 2 fit a c6i.large, 8 a c6i.2xlarge at 4x the price. The name broke the
    tie ("c6i.2xlarge" < "c6i.large"): a change of type for a saving of $0.000000000000000003."""
    a = rightsize.advise(ENV, "queue render", "cpu", priced(*[measured(cpu_s=82.0, rss=60, spot=False) for _ in range(20)]))
    assert (a.now[0].fits.items_per_node, a.best.instance_type, a.saving_usd) == (2, "c6i.large", 0.0)


def test_items_that_need_their_whole_node_are_left_alone():
    found = priced(*[measured(cpu_s=160.0, rss=1500, slots=2) for _ in range(5)])  # 1.6 cores: all of it
    (now,) = rightsize.advise(ENV, "queue render", "cpu", found).now
    assert (now.items, now.fits.items_per_node) == (1, 1)


@pytest.mark.parametrize(
    "extra, memory, time_",
    [
        ({"exit_code": 137, "outcome": "failed", "reason": "exit code 137"}, ["000000"], []),
        ({"exit_code": -9, "outcome": "failed", "reason": "exit code -9"}, ["000000"], []),
        ({"exit_code": -9, "outcome": "failed", "reason": "timed out after 60s"}, [], ["000000"]),
        ({"exit_code": 1, "outcome": "failed", "reason": "exit code 1"}, [], []),
        ({}, [], []),
    ],
)
def test_items_killed_for_memory_or_time_are_flagged(extra, memory, time_):
    a = rightsize.advise(ENV, "queue render", "cpu", priced(measured(cpu_s=10.0, **extra)))
    assert (list(a.hit_memory), list(a.hit_time)) == (memory, time_)


def test_gpu_items_are_sized_on_gpus_with_enough_memory_and_their_utilisation_is_reported():
    found = priced(*[measured(cpu_s=50.0, rss=4000, itype="g5.12xlarge", node_slots=4, gpu_util_pct=30,
                              gpu_mem_peak_mb=18_000) for _ in range(3)], queue="train")  # fmt: skip
    a = rightsize.advise(ENV, "queue train", "gpu", found)
    assert (a.need.gpus, a.gpu_util_pct, a.gpu_mem_peak_mb) == (1, 30, 18_000)
    assert rightsize.prices.SPECS[a.best.instance_type][3] * 1024 >= 18_000 * rightsize.HEADROOM  # not a 16 GB T4


@pytest.mark.parametrize("env, expected", [(ENV, "c6i.large"), (load_environment("gcp-dev"), "n2-standard-4")])
def test_candidates_are_the_pools_types_and_the_same_clouds_sized_types_but_no_burstable_ones(env, expected):
    found = rightsize.candidates(env, "cpu")
    assert expected in found and not any(t.startswith(rightsize.BURSTABLE) for t in found)
    assert all(("." in t) == (env.cloud == "aws") for t in found)


def test_a_gang_members_parts_are_priced_like_attempts_and_only_their_own_items():
    lead, member = entry(seconds=3600.0), entry(seconds=1800.0, spot=False, rank=1)
    charged = costs.charges(ENV, job(), [Item("j1", "000000", history=[lead])],
                            parts={"000000": [member], "000001": [member]})  # fmt: skip
    assert [(c.item_id, c.seconds, c.spot) for c in charged] == [("000000", 3600.0, True), ("000000", 1800.0, False)]


GANGS = parse_environment({
    "region": "us-east-1",
    "pools": {
        "cpu": {"max": 8, "command": "true", "slots_per_unit": 2, "instance_types": [{"type": "c6i.large"}]},
        "gpu": {"max": 8, "command": "true", "capacity_unit": "gpus",
                "instance_types": [{"type": "g5.12xlarge", "weight": 4, "gpus": 4}]},
    },
    "queues": {"dist": {"pool": "cpu", "slots_per_item": 2, "nodes_per_item": 2},
               "train": {"pool": "gpu", "slots_per_item": 4, "nodes_per_item": {"min": 2, "max": 4}}},
}, name="gangs")  # fmt: skip


@pytest.mark.parametrize("queue, pool, itype, node_slots", [("dist", "cpu", "c6i.large", 2),
                                                             ("train", "gpu", "g5.12xlarge", 4)])
def test_a_gang_member_fits_one_per_node_whatever_else_would_fit(queue, pool, itype, node_slots):
    # A tenth of a core and 300 MiB per member: ten would fit a c6i.large, 66 an m6i.2xlarge. But a
    # member takes its whole node (validation holds slots_per_item to the node's slots): advice to
    # pack more would be a config that cannot deploy, and a saving no gang can have.
    found = costs.charges(GANGS, job(queue), [Item("j1", "000000", history=[
        measured(cpu_s=10.0, itype=itype, slots=node_slots, node_slots=node_slots) for _ in range(3)])])
    a = rightsize.advise(GANGS, f"queue {queue}", pool, found)
    (now,) = a.now
    assert a.gang and (now.items, now.fits.items_per_node) == (1, 1)
    assert now.slots_per_unit == GANGS.pools[pool].slots_per_unit  # nothing to change
    assert a.best.items_per_node == 1 and a.best.usd_per_item_hour == costs.hourly(GANGS, pool, a.best.instance_type, True)
    assert not rightsize.advise(ENV, "queue render", "cpu", priced(measured(cpu_s=10.0))).gang


def test_a_gang_queues_advice_says_one_member_per_node_and_what_another_type_needs():
    from tidefleet.jobs.cost_cli import _advice_lines

    found = costs.charges(GANGS, job("dist"), [Item("j1", "000000", history=[
        measured(cpu_s=10.0, slots=2, node_slots=2)])])
    lines = _advice_lines(rightsize.advise(GANGS, "queue dist", "cpu", found))
    assert "  c6i.large: 1 item(s) per node now, which is what fits (a gang member takes its whole node)" in lines
    assert not any("set slots_per_unit" in line for line in lines)
    big = costs.charges(GANGS, job("train"), [Item("j1", "000000", history=[
        measured(cpu_s=50.0, rss=4000, itype="g5.12xlarge", slots=4, node_slots=4) for _ in range(3)])])
    a = rightsize.advise(GANGS, "queue train", "gpu", big)
    assert a.best.instance_type != "g5.12xlarge"  # a cheaper 4-GPU type is the member's whole node
    assert any("set the queue's slots_per_item to that type's slots" in line for line in _advice_lines(a))
