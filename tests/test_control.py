"""The control tick's orchestration on in-memory ports: how observations become views, and
how a decision is applied (order, idempotence, dry run, failures). Decisions are injected
here so the act step is tested on its own; test_handlers.py runs the real policy."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tidefleet import control, policy
from tidefleet.agent.gang import Beacon
from tidefleet.cloud.memory import MemoryFleet, MemoryGroup, MemoryNodes, MemoryQueues
from tidefleet.config import parse_environment
from tidefleet.policy.interruption import DrainNode, Ignore, LifecycleHold, action_for
from tidefleet.policy.model import PoolDecision
from tidefleet.ports import Backlog, GroupInstance, GroupState, Ports
from tidefleet.records import Heartbeat, QueueStats, WaitingMark, waiting_mark_of

EVENTS = Path(__file__).parent / "events"
NOW = 1_800_000_000.0

ENV = parse_environment(
    {
        "region": "us-east-1",
        "pools": {
            "cpu": {
                "max": 6,
                "command": "work",
                "slots_per_unit": 2,
                "instance_types": [{"type": "c6i.large"}],
            },
            "gpu": {
                "max": 8,
                "command": "train",
                "capacity_unit": "gpus",
                "instance_types": [{"type": "g5.12xlarge", "weight": 4, "gpus": 4}],
            },
        },
        "queues": {"demo": {"pool": "cpu"}, "train": {"pool": "gpu", "slots_per_item": 4}},
    },
    name="t",
)


def instance(id_, state="InService", type_="c6i.large", protected=False):
    return GroupInstance(id_, type_, state, spot=True, launched_at=NOW - 900, protected=protected)


def beat(id_, pool="cpu", busy=0, draining=False):
    return Heartbeat(
        id_,
        pool,
        at=NOW - 5,
        slots=2,
        busy_slots=busy,
        idle_since=None if busy else NOW - 600,
        draining=draining,
    )


@dataclass
class FakeFleet:
    groups_: dict[str, GroupState]
    calls: list[tuple] = field(default_factory=list)
    broken: set[str] = field(default_factory=set)  # pools whose every action fails
    refused: set[tuple[str, str]] = field(default_factory=set)  # (action, pool) that fail

    def groups(self, pools, since):
        return {p: g for p, g in self.groups_.items() if p in pools}

    def _check(self, pool, action):
        if pool in self.broken:
            raise RuntimeError(f"group of {pool} is unreachable")
        if (action, pool) in self.refused:
            raise PermissionError(f"not authorized to {action}")

    def set_desired(self, pool, desired):
        self._check(pool, "set_desired")
        self.calls.append(("set_desired", pool, desired))
        self.groups_[pool] = replace(self.groups_[pool], desired=desired)

    def terminate(self, pool, ids):
        self._check(pool, "terminate")
        g = self.groups_[pool]
        live = [i.id for i in g.instances if i.id in ids and i.lifecycle_state == "InService"]
        self.calls += [("terminate", pool, i) for i in live]
        self.groups_[pool] = replace(
            g, desired=g.desired - len(live), instances=tuple(i for i in g.instances if i.id not in live)
        )
        return tuple(live)

    def set_on_demand_base(self, pool, units):
        self._check(pool, "set_on_demand_base")
        self.calls.append(("set_on_demand_base", pool, units))

    def group_of(self, instance_id):
        return next((g.name for g in self.groups_.values() for i in g.instances if i.id == instance_id), None)

    def complete_lifecycle_action(self, pool, instance_id, hook, token):
        self.calls.append(("complete_lifecycle_action", pool, instance_id, hook, token))


@dataclass
class FakeNodes:
    beats: dict[str, dict[str, Heartbeat]] = field(default_factory=dict)
    marked: list[tuple[str, str]] = field(default_factory=list)
    grants: dict[str, tuple[int, float, float, int]] = field(default_factory=dict)

    def heartbeats(self, pool):
        return self.beats.get(pool, {})

    def node_rows(self, pool):
        return self.heartbeats(pool), frozenset()  # marks are only recorded (`marked`), never a row

    def grant_leave(self, pool, units, at, until, stay=0):
        self.grants[pool] = (units, at, until, stay)

    def mark_draining(self, pool, node_id):
        self.marked.append((pool, node_id))

    let_go: dict[str, bool | Exception] = field(default_factory=dict)  # node -> let_idle_go's answer (default True)
    asked_let_go: list[tuple[str, str, float]] = field(default_factory=list)

    def let_idle_go(self, pool, node_id, idle_since):
        self.asked_let_go.append((pool, node_id, idle_since))
        answer = self.let_go.get(node_id, True)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def forget_node(self, pool, node_id):
        del self.beats[pool][node_id]


@dataclass
class FakeQueues:
    backlogs: dict[str, Backlog] = field(default_factory=dict)

    def backlog(self, queue):
        return self.backlogs.get(queue, Backlog(0, 0))


def group(pool, desired, *instances, on_demand_base=0):
    return GroupState(f"tidefleet-t-{pool}", desired, 0, 8, on_demand_base, tuple(instances))


def ports(*groups_, beats=None, backlogs=None):
    fleet = FakeFleet({g.name.removeprefix("tidefleet-t-"): g for g in groups_})
    return Ports(queues=FakeQueues(backlogs or {}), fleet=fleet, nodes=FakeNodes(beats or {}))


@pytest.fixture
def decide(monkeypatch):
    """Make the policy return these decisions, whatever it observes."""
    seen = {}

    def use(*decisions):
        def fake(env, fleet, now):
            seen["fleet"] = fleet
            return decisions

        monkeypatch.setattr(policy, "decide", fake, raising=False)
        return seen

    return use


def decision(pool, desired, terminate=(), on_demand_base=None):
    return PoolDecision(pool, desired, tuple(terminate), on_demand_base, reasons=("because",))


# -- observe ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lifecycle", "heartbeat", "expected"),
    [
        ("Pending", None, "pending"),
        ("InService", None, "pending"),  # booted, agent not heard from yet
        ("InService", beat("i-1"), "running"),
        ("Pending:Wait", beat("i-1"), "running"),
        ("InService", beat("i-1", draining=True), "draining"),
        ("Terminating:Wait", beat("i-1", busy=1), "draining"),
        ("Terminating", beat("i-1"), "terminating"),
        ("Standby", beat("i-1"), None),
    ],
)
def test_node_state_comes_from_the_group_and_the_heartbeat(lifecycle, heartbeat, expected):
    view = control.node_view(ENV.pools["cpu"], instance("i-1", lifecycle), heartbeat, NOW)
    assert (view.state if view else None) == expected


def test_a_node_view_carries_weight_slots_busy_and_protection_from_config_group_and_heartbeat():
    view = control.node_view(
        ENV.pools["gpu"],
        instance("i-9", type_="g5.12xlarge", protected=True),
        beat("i-9", pool="gpu", busy=4),
        NOW,
    )
    assert (view.weight, view.slots, view.busy_slots, view.protected, view.idle_since) == (
        4,
        4,
        4,
        True,
        None,
    )
    assert view.last_heartbeat == NOW - 5 and view.spot


def test_a_node_ec2_does_not_list_yet_counts_as_just_launched_so_it_is_not_replaced():
    unlisted = replace(instance("i-1"), launched_at=None)
    assert control.node_view(ENV.pools["cpu"], unlisted, None, NOW).launched_at == NOW


def test_observe_reads_backlog_per_queue_and_skips_pools_without_a_group(caplog):
    p = ports(group("cpu", 1, instance("i-1")), backlogs={"demo": Backlog(7, 2), "train": Backlog(3, 0)})
    with caplog.at_level(logging.WARNING, "tidefleet.control"):
        seen = control.observe(ENV, p, NOW, ["cpu", "gpu"])
    assert [q.name for q in seen.fleet.queues] == ["demo"]
    assert (seen.fleet.queues[0].visible, seen.fleet.queues[0].in_flight) == (7, 2)
    assert [v.name for v in seen.fleet.pools] == ["cpu"] and set(seen.groups) == {"cpu"}
    assert "no auto scaling group" in caplog.text and '"gpu"' in caplog.text


@pytest.mark.parametrize("tick_s,waiting_tick_s,next_tick", [(60, 10, 10.0), (60, 0, 60.0), (5, 10, 5.0)])
def test_each_queue_view_says_how_soon_the_scaler_decides_again_while_items_wait(tick_s, waiting_tick_s, next_tick):
    """What leaving an item to turnover counts on (`demand.wait_horizon`): the run's re-tick while
    it is sooner than the scheduled tick, else the tick."""
    scaler = ENV.scaler.model_copy(update={"tick_s": tick_s, "waiting_tick_s": waiting_tick_s})
    env = ENV.model_copy(update={"scaler": scaler})
    seen = control.observe(env, ports(group("cpu", 1, instance("i-1")), backlogs={"demo": Backlog(7, 2)}), NOW, ["cpu"])
    assert seen.fleet.queues[0].next_tick_s == next_tick


def test_observe_counts_each_item_spot_nodes_left_to_on_demand_nodes_once_and_only_where_the_queue_asks():
    env = parse_environment({"region": "us-east-1", "pools": {"cpu": {"max": 6, "command": "work",
                             "instance_types": [{"type": "c6i.large"}]}},
                             "queues": {"demo": {"pool": "cpu", "on_demand_after_interruptions": 2},
                                        "plain": {"pool": "cpu"}}}, name="t")  # fmt: skip
    beats = {"i-1": replace(beat("i-1"), on_demand_wanted={"demo": ["j/1", "j/2"], "plain": ["j/9"]}),
             "i-2": replace(beat("i-2"), on_demand_wanted={"demo": ["j/2", "j/3"]})}  # fmt: skip
    seen = control.observe(env, ports(group("cpu", 2, instance("i-1"), instance("i-2")), beats={"cpu": beats}), NOW, ["cpu"])
    assert {q.name: q.on_demand_wanted for q in seen.fleet.queues} == {"demo": 3, "plain": 0}


def test_a_gang_item_is_demand_for_every_node_of_it_an_elastic_one_for_its_max():
    data = {"region": "us-east-1", "pools": {"gpu": {"max": 16, "command": "train", "capacity_unit": "gpus",
            "instance_types": [{"type": "g5.12xlarge", "weight": 4, "gpus": 4}]}},
            "queues": {"fixed": {"pool": "gpu", "slots_per_item": 4, "nodes_per_item": 2},
                       "elastic": {"pool": "gpu", "slots_per_item": 4, "nodes_per_item": {"min": 2, "max": 4}}}}  # fmt: skip
    env = parse_environment(data, name="t")
    p = ports(group("gpu", 0), backlogs={"fixed": Backlog(3, 1), "elastic": Backlog(1, 1)})
    seen = {q.name: (q.visible, q.in_flight) for q in control.observe(env, p, NOW, ["gpu"]).fleet.queues}
    assert seen == {"fixed": (6, 2), "elastic": (4, 4)}


def test_forming_gangs_leads_in_the_group_tell_the_members_they_still_wait_for():
    """A lead's beacon says how many members its forming gang lacks; a running elastic gang's, a
    lead gone from the group's and a malformed beacon count none."""
    env = parse_environment({"region": "us-east-1", "pools": {"gpu": {"max": 16, "command": "train",
                             "capacity_unit": "gpus", "instance_types": [{"type": "g5.12xlarge", "weight": 4, "gpus": 4}]}},
                             "queues": {"fixed": {"pool": "gpu", "slots_per_item": 4, "nodes_per_item": 3},
                                        "elastic": {"pool": "gpu", "slots_per_item": 4, "nodes_per_item": {"min": 2, "max": 4}}}},
                            name="t")  # fmt: skip

    def lead(id_, queue, short, forming=True):
        beacon = Beacon(queue, "j", id_, 1, NOW - 30, forming=forming, short=short).record()
        return replace(beat(id_, pool="gpu", busy=4), slots=4, gang=beacon)

    beats = {"i-1": lead("i-1", "fixed", 2), "i-2": lead("i-2", "fixed", 1), "i-3": lead("i-3", "elastic", 3, forming=False),
             "i-gone": lead("i-gone", "elastic", 1), "i-4": replace(beat("i-4", pool="gpu"), gang={"queue": "elastic"})}  # fmt: skip
    gpu = group("gpu", 16, *(instance(i, type_="g5.12xlarge") for i in ("i-1", "i-2", "i-3", "i-4")))
    p = ports(gpu, backlogs={"fixed": Backlog(0, 2), "elastic": Backlog(0, 1)}, beats={"gpu": beats})
    seen = {q.name: q.forming_short for q in control.observe(env, p, NOW, ["gpu"]).fleet.queues}
    assert seen == {"fixed": 3, "elastic": 0}


def waiting_ports(visible: int, marks: MemoryQueues, in_flight: int = 0) -> Ports:
    return replace(ports(group("cpu", 1, instance("i-1")), backlogs={"demo": Backlog(visible, in_flight)}), stats=marks)


def ages(p: Ports, now: float, dry_run: bool = False) -> dict[str, float | None]:
    control.tick(ENV, p, now, pools=["cpu"], dry_run=dry_run)
    return {q.name: q.oldest_age_s for q in control.observe(ENV, p, now, ["cpu"]).fleet.queues}


def cohorts(p: Ports, now: float) -> tuple:
    control.tick(ENV, p, now, pools=["cpu"])
    (queue,) = control.observe(ENV, p, now, ["cpu"]).fleet.queues
    return queue.waiting_ages


def test_a_backlog_is_aged_from_the_tick_that_first_saw_it_and_the_mark_goes_when_it_empties():
    marks = MemoryQueues()
    assert ages(waiting_ports(5, marks), NOW) == {"demo": 0.0}  # the submit's kick: first seen now
    assert marks.waiting == {"demo": WaitingMark(((NOW, 5),), 0)}
    assert ages(waiting_ports(3, marks), NOW + 30) == {"demo": 30.0}  # still waiting: 30 s old
    assert marks.waiting == {"demo": WaitingMark(((NOW, 3),), 0)}
    assert ages(waiting_ports(0, marks), NOW + 60) == {"demo": None} and marks.waiting == {}
    assert ages(waiting_ports(2, marks), NOW + 90) == {"demo": 0.0}
    assert marks.waiting == {"demo": WaitingMark(((NOW + 90, 2),), 0)}


def test_items_that_arrive_later_are_a_younger_cohort_and_leave_after_the_older_ones():
    marks = MemoryQueues()
    assert cohorts(waiting_ports(4, marks), NOW) == ((0.0, 4),)
    assert cohorts(waiting_ports(10, marks), NOW + 20) == ((20.0, 4), (0.0, 6))  # 6 more came
    assert cohorts(waiting_ports(7, marks), NOW + 30) == ((30.0, 1), (10.0, 6))  # 3 left: the oldest first
    assert cohorts(waiting_ports(7, marks), NOW + 40) == ((40.0, 1), (20.0, 6))  # as many: as old as kept
    assert cohorts(waiting_ports(5, marks), NOW + 50) == ((30.0, 5),)


def test_a_count_that_holds_while_items_start_is_of_new_items_and_a_start_not_counted_errs_long():
    """An item each tick that runs as the next comes: one waiting at every tick, a different one.
    Without the starts since the mark (in flight, plus succeeded), the first one's time was kept
    and the age ran on: 29,950 s past the truth in a replay, and a node launched per item."""
    marks = MemoryQueues()
    assert cohorts(waiting_ports(1, marks), NOW) == ((0.0, 1),)
    assert cohorts(waiting_ports(1, marks, in_flight=1), NOW + 50) == ((0.0, 1),)  # the first started
    marks.stats["demo"] = QueueStats(300.0, 1)  # it succeeded, and the second started
    assert cohorts(waiting_ports(1, marks, in_flight=1), NOW + 100) == ((0.0, 1),)
    assert marks.waiting["demo"] == WaitingMark(((NOW + 100, 1),), 2)
    # The second failed (in flight falls, no success): no start is seen, and the waiting one ages on.
    assert cohorts(waiting_ports(1, marks), NOW + 150) == ((50.0, 1),)


def test_a_success_counted_a_heartbeat_after_its_delete_is_no_start():
    """SQS stops counting an item in flight at its delete; the agent counts its success at its next
    heartbeat. A mark that took the dip as its count would see that success as a start later, and
    make the oldest waiting items young."""
    marks = MemoryQueues()
    assert cohorts(waiting_ports(2, marks, in_flight=1), NOW) == ((0.0, 2),)
    assert cohorts(waiting_ports(2, marks), NOW + 30) == ((30.0, 2),)  # deleted, not counted yet
    marks.stats["demo"] = QueueStats(20.0, 1)  # counted
    assert cohorts(waiting_ports(2, marks), NOW + 60) == ((60.0, 2),)


def test_a_tick_that_could_not_read_the_successes_knows_no_start_and_marks_none():
    """A malformed stats record fails its read alone: the waiting marks are still read. Counted
    from in flight alone, the tick's count would fall by every success, and the next tick, which
    reads them again, would take all of them for starts and make every waiting item new."""

    class Stats(MemoryQueues):
        bad = False

        def queue_stats(self, queues):
            if self.bad:
                raise ValueError("stats of demo: mean_item_s is not a number")
            return super().queue_stats(queues)

    marks = Stats(stats={"demo": QueueStats(60.0, 100)})
    assert cohorts(waiting_ports(2, marks, in_flight=1), NOW) == ((0.0, 2),)
    marks.bad = True
    seen = control.observe(ENV, waiting_ports(3, marks, in_flight=1), NOW + 30, ["cpu"])
    assert seen.fleet.queues[0].waiting_ages == ((30.0, 2), (0.0, 1))
    assert seen.waiting_marks == {"demo": WaitingMark(((NOW, 2), (NOW + 30, 1)), None)}
    marks.waiting.update(seen.waiting_marks)
    marks.bad = False
    assert cohorts(waiting_ports(3, marks, in_flight=1), NOW + 60) == ((60.0, 2), (30.0, 1))


def test_cohorts_past_the_most_a_mark_keeps_merge_as_old_as_the_older():
    marks = MemoryQueues()
    for n in range(control.MAX_COHORTS + 3):
        ages_now = cohorts(waiting_ports(n + 1, marks), NOW + 10 * n)
    assert len(ages_now) == control.MAX_COHORTS and sum(c for _, c in ages_now) == control.MAX_COHORTS + 3
    assert ages_now[0] == (10.0 * (control.MAX_COHORTS + 2), 4)  # the first four as one, the oldest's age
    assert [age for age, _ in ages_now] == sorted((age for age, _ in ages_now), reverse=True)


def test_a_mark_from_before_cohorts_counts_every_waiting_item_as_old_as_it():
    marks = MemoryQueues()
    marks.waiting["demo"] = waiting_mark_of({"since": NOW - 100})
    assert cohorts(waiting_ports(6, marks), NOW) == ((100.0, 6),)


def test_a_dry_run_writes_no_mark_and_a_cloud_given_age_wins():
    marks = MemoryQueues()
    ages(waiting_ports(5, marks), NOW, dry_run=True)
    assert marks.waiting == {}
    p = replace(waiting_ports(5, marks), queues=FakeQueues({"demo": Backlog(5, 0, oldest_age_s=42.0)}))
    assert ages(p, NOW + 10) == {"demo": 42.0}


def test_a_mark_that_cannot_be_written_is_logged_and_the_tick_goes_on(caplog):
    class Refusing(MemoryQueues):
        def mark_waiting(self, queue, mark):
            raise ConnectionError("store unreachable")

    p = waiting_ports(5, Refusing())
    with caplog.at_level(logging.WARNING, logger=control.log.name):
        decisions = control.tick(ENV, p, NOW, pools=["cpu"])
    assert decisions and any('"action": "mark waiting"' in r.getMessage() and "store unreachable" in r.getMessage()
                             for r in caplog.records)  # fmt: skip


def hold_ports(marks: MemoryQueues) -> Ports:
    return replace(ports(group("cpu", 1, instance("i-1")), backlogs={"demo": Backlog(5, 2)}), stats=marks)


def test_a_queue_view_carries_its_team_max_wait_and_whether_the_scaler_holds_it():
    marks = MemoryQueues()
    marks.held["demo"] = NOW - 60
    (queue,) = control.observe(ENV, hold_ports(marks), NOW, ["cpu"]).fleet.queues
    assert (queue.team, queue.held, queue.max_wait_s) == (ENV.team_of("demo"), True, ENV.queues["demo"].max_wait_s)
    marks.held.clear()
    assert not control.observe(ENV, hold_ports(marks), NOW, ["cpu"]).fleet.queues[0].held


@pytest.mark.parametrize(
    ("case", "before", "hold", "release", "dry_run", "after"),
    [
        ("a hold is written with the tick's time", {}, ("demo",), (), False, {"demo": NOW}),
        ("a release removes the mark", {"demo": NOW - 60}, (), ("demo",), False, {}),
        ("a dry run writes no hold", {}, ("demo",), (), True, {}),
        ("a dry run releases nothing", {"demo": NOW - 60}, (), ("demo",), True, {"demo": NOW - 60}),
    ],
)
def test_hold_and_release_marks_follow_the_decision(decide, case, before, hold, release, dry_run, after):
    marks = MemoryQueues()
    marks.held.update(before)
    decide(replace(decision("cpu", 1), hold=hold, release=release))
    control.tick(ENV, hold_ports(marks), NOW, pools=["cpu"], dry_run=dry_run)
    assert marks.held == after


def test_a_hold_that_cannot_be_written_fails_the_tick_after_every_other_action(decide):
    class Refusing(MemoryQueues):
        def mark_held(self, queue, since):
            raise ConnectionError("store unreachable")

    decide(replace(decision("cpu", 2), hold=("demo",)))
    p = hold_ports(Refusing())
    with pytest.raises(control.TickError) as err:
        control.tick(ENV, p, NOW, pools=["cpu"])
    assert "queue demo: hold: ConnectionError: store unreachable" in str(err.value)
    assert ("set_desired", "cpu", 2) in p.fleet.calls


def test_observe_gives_each_queue_its_recorded_mean_item_time_and_none_when_unknown():
    p = ports(group("cpu", 1, instance("i-1")), group("gpu", 0))
    assert [q.mean_item_s for q in control.observe(ENV, p, NOW, ["cpu", "gpu"]).fleet.queues] == [None, None]
    p = replace(p, stats=MemoryQueues(stats={"demo": QueueStats(mean_item_s=23.5, items=40)}))
    seen = control.observe(ENV, p, NOW, ["cpu", "gpu"])
    assert {q.name: q.mean_item_s for q in seen.fleet.queues} == {"demo": 23.5, "train": None}


def test_heartbeats_of_nodes_long_gone_from_the_group_are_forgotten_and_recent_ones_kept(decide):
    reclaimed = replace(beat("i-old"), at=NOW - ENV.pools["cpu"].boot_timeout_s - 1)
    just_left = beat("i-new")  # silent for 5s only: maybe still on its way out
    p = ports(
        group("cpu", 1, instance("i-1")),
        beats={"cpu": {"i-1": beat("i-1"), "i-old": reclaimed, "i-new": just_left}},
    )
    decide(decision("cpu", 1))
    control.tick(ENV, p, NOW, dry_run=True)
    assert set(p.nodes.beats["cpu"]) == {"i-1", "i-old", "i-new"}  # a dry run forgets nothing
    control.tick(ENV, p, NOW)
    assert set(p.nodes.beats["cpu"]) == {"i-1", "i-new"}


# -- act ----------------------------------------------------------------------------------


def test_scale_in_terminates_the_named_node_with_decrement_before_touching_desired(decide):
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")))
    decide(decision("cpu", 1, terminate=["i-2"]))
    control.tick(ENV, p, NOW)
    assert p.fleet.calls == [("terminate", "cpu", "i-2"), ("set_desired", "cpu", 1)]
    assert [i.id for i in p.fleet.groups_["cpu"].instances] == ["i-1"]


def test_an_idle_node_is_terminated_only_once_marked_draining_on_the_idle_time_the_tick_saw(decide):
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), beats={"cpu": {"i-2": beat("i-2")}})
    decide(decision("cpu", 1, terminate=["i-2"]))
    control.tick(ENV, p, NOW)
    assert p.nodes.asked_let_go == [("cpu", "i-2", NOW - 600)]
    assert p.fleet.calls == [("terminate", "cpu", "i-2"), ("set_desired", "cpu", 1)]


def test_an_idle_node_that_took_work_after_the_tick_saw_it_is_kept_and_holds_desired_up(decide, caplog):
    """The race the mark closes: its agent claimed an item between the tick's read and its act.
    Terminating it would interrupt that item (a gang's whole attempt, in the sandbox)."""
    p = ports(group("cpu", 3, instance("i-1"), instance("i-2"), instance("i-3")),
              beats={"cpu": {"i-2": beat("i-2"), "i-3": beat("i-3")}})  # fmt: skip
    p.nodes.let_go["i-2"] = False
    decide(decision("cpu", 1, terminate=["i-2", "i-3"]))
    with caplog.at_level(logging.INFO, "tidefleet.control"):
        control.tick(ENV, p, NOW)
    assert p.fleet.calls == [("terminate", "cpu", "i-3"), ("set_desired", "cpu", 2)]
    line = json.loads(next(r.getMessage() for r in caplog.records if r.getMessage().startswith('{"pool": "cpu"')))
    assert line["kept"] == {"i-2": "took work after this tick saw it idle"} and line["terminated"] == ["i-3"]


def test_an_idle_node_whose_mark_fails_is_kept_and_the_tick_says_so(decide):
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), beats={"cpu": {"i-2": beat("i-2")}})
    p.nodes.let_go["i-2"] = RuntimeError("throttled")
    decide(decision("cpu", 1, terminate=["i-2"]))
    with pytest.raises(control.TickError, match="cpu: let idle node i-2 go: RuntimeError: throttled"):
        control.tick(ENV, p, NOW)
    assert p.fleet.calls == []  # desired stays 2: lowering it would let the group pick a node


def test_scale_out_sets_the_absolute_desired_capacity(decide):
    p = ports(group("cpu", 1, instance("i-1")))
    decide(decision("cpu", 4))
    control.tick(ENV, p, NOW)
    assert p.fleet.calls == [("set_desired", "cpu", 4)]


def test_never_lowers_desired_below_the_nodes_still_in_the_group(decide, caplog):
    # Desired 0 with two live nodes and no named victims would let the group pick one.
    p = ports(group("cpu", 3, instance("i-1"), instance("i-2")))
    decide(decision("cpu", 0))
    with caplog.at_level(logging.INFO, "tidefleet.control"):
        control.tick(ENV, p, NOW)
    assert p.fleet.calls == [("set_desired", "cpu", 2)]
    assert "desired kept at 2, not 0" in caplog.text


def test_a_node_the_group_would_not_terminate_still_holds_desired_up(decide):
    # The policy replaces a node stuck booting; the group only terminates InService nodes.
    p = ports(group("cpu", 2, instance("i-1"), instance("i-stuck", "Pending")))
    decide(decision("cpu", 1, terminate=["i-stuck"]))
    control.tick(ENV, p, NOW)
    assert p.fleet.calls == []  # desired stays 2: lowering it would let the group pick i-1


def test_a_node_held_by_the_terminate_hook_does_not_hold_desired_up(decide):
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2", "Terminating:Wait")))
    decide(decision("cpu", 1))
    control.tick(ENV, p, NOW)
    assert p.fleet.calls == [("set_desired", "cpu", 1)]


def test_applying_the_same_decision_twice_changes_nothing_the_second_time(decide):
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), group("gpu", 0, on_demand_base=0))
    decide(decision("cpu", 1, terminate=["i-2"]), decision("gpu", 0, on_demand_base=4))
    control.tick(ENV, p, NOW)
    first = list(p.fleet.calls)
    p.fleet.groups_["gpu"] = replace(p.fleet.groups_["gpu"], on_demand_base=4)
    control.tick(ENV, p, NOW)
    assert p.fleet.calls == first  # the node is gone, desired and base already match


def test_never_terminates_a_node_that_is_not_in_the_pools_group(decide):
    p = ports(group("cpu", 1, instance("i-1")), group("gpu", 4, instance("i-g", type_="g5.12xlarge")))
    decide(decision("cpu", 1, terminate=["i-g"]))
    control.tick(ENV, p, NOW)
    assert ("terminate", "gpu", "i-g") not in p.fleet.calls and (
        "terminate",
        "cpu",
        "i-g",
    ) not in p.fleet.calls


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_dry_run_decides_and_logs_but_changes_nothing(decide, caplog, how):
    env = ENV.model_copy(update={"scaler": ENV.scaler.model_copy(update={"dry_run": how == "environment"})})
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")))
    decide(decision("cpu", 1, terminate=["i-2"], on_demand_base=1))
    with caplog.at_level(logging.INFO, "tidefleet.control"):
        decisions = control.tick(env, p, NOW, dry_run=how == "flag")
    assert p.fleet.calls == [] and decisions[0].terminate == ("i-2",)
    assert json.loads(caplog.records[-1].getMessage())["dry_run"] is True


def test_every_tick_writes_each_pools_leave_grant_and_a_failed_write_only_logs(decide, caplog):
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), group("gpu", 0))
    decide(replace(decision("cpu", 2), leave=2, stay_first=1), decision("gpu", 0))
    control.tick(ENV, p, NOW)
    until = NOW + control.LEAVE_GRANT_TICKS * ENV.scaler.tick_s
    assert p.nodes.grants == {"cpu": (2, NOW, until, 1), "gpu": (0, NOW, until, 0)}  # 0: the last grant withdrawn
    p.nodes.grants.clear()
    control.tick(ENV, p, NOW, dry_run=True)
    assert p.nodes.grants == {}
    p.nodes.grant_leave = lambda *a: (_ for _ in ()).throw(ConnectionError("store unreachable"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, "tidefleet.control"):
        control.tick(ENV, p, NOW)  # no TickError: idle nodes only wait for the next tick
    warnings = [json.loads(r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted((w["pool"], w["action"], w["error"]) for w in warnings) == [
        (pool, "grant leave", "ConnectionError: store unreachable") for pool in ("cpu", "gpu")]


def test_logs_one_json_line_per_decision_with_before_after_and_reasons(decide, caplog):
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), group("gpu", 0))
    decide(decision("cpu", 1, terminate=["i-2"]), decision("gpu", 4))
    with caplog.at_level(logging.INFO, "tidefleet.control"):
        control.tick(ENV, p, NOW)
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert [line["pool"] for line in lines] == ["cpu", "gpu"]
    assert lines[0]["desired_before"] == 2 and lines[0]["desired_after"] == 1
    assert lines[0]["terminated"] == ["i-2"] and lines[0]["reasons"] == ["because"]


def test_a_failing_pool_does_not_stop_the_others_and_the_tick_reports_it(decide):
    p = ports(group("cpu", 0), group("gpu", 0))
    p.fleet.broken.add("cpu")
    decide(decision("cpu", 2), decision("gpu", 4))
    with pytest.raises(control.TickError, match="^cpu: set_desired: RuntimeError: group of cpu is unreachable$") as err:
        control.tick(ENV, p, NOW)
    assert p.fleet.calls == [("set_desired", "gpu", 4)]
    assert [d.pool for d in err.value.decisions] == ["cpu", "gpu"]


def test_the_on_demand_base_is_set_before_desired_so_new_nodes_are_bought_as_it_says(decide):
    p = ports(group("gpu", 0))
    decide(decision("gpu", 4, on_demand_base=4))
    control.tick(ENV, p, NOW)
    assert p.fleet.calls == [("set_on_demand_base", "gpu", 4), ("set_desired", "gpu", 4)]


@pytest.mark.parametrize(
    ("refused", "still_done"),
    [
        ("set_on_demand_base", [("terminate", "cpu", "i-2"), ("set_desired", "cpu", 2)]),
        ("set_desired", [("terminate", "cpu", "i-2"), ("set_on_demand_base", "cpu", 1)]),
        # Which nodes went is unknown after a failed terminate: desired waits for the next tick.
        ("terminate", [("set_on_demand_base", "cpu", 1)]),
    ],
)
def test_a_refused_action_does_not_stop_the_others_and_is_logged_on_its_own_line(decide, caplog, refused, still_done):
    p = ports(group("cpu", 3, instance("i-1"), instance("i-2"), instance("i-3")))
    p.fleet.refused.add((refused, "cpu"))
    decide(decision("cpu", 2, terminate=["i-2"], on_demand_base=1))
    with caplog.at_level(logging.INFO, "tidefleet.control"), pytest.raises(control.TickError) as err:
        control.tick(ENV, p, NOW)
    assert p.fleet.calls == still_done
    assert str(err.value) == f"cpu: {refused}: PermissionError: not authorized to {refused}"
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert [line for line in lines if "action" in line] == [
        {"pool": "cpu", "action": refused, "error": f"{refused}: PermissionError: not authorized to {refused}"}
    ]
    assert lines[-1]["failed"] == [f"{refused}: PermissionError: not authorized to {refused}"]


def test_a_tick_error_keeps_each_failed_actions_exception_for_the_function_to_explain(decide):
    """The core imports no cloud: the function's handler says each error in its cloud's words
    (`failure_line(err, explain)`), after the action's `<pool>: <action>`; unexplained ones as raised."""
    from tidefleet.triggers import failure_line

    p = ports(group("cpu", 0), group("gpu", 0))
    p.fleet.refused.add(("set_desired", "cpu"))
    p.fleet.broken.add("gpu")
    decide(decision("cpu", 2), decision("gpu", 4))
    with pytest.raises(control.TickError) as err:
        control.tick(ENV, p, NOW)
    assert [(where, type(e)) for where, e in err.value.failures] == [
        ("cpu: set_desired", PermissionError), ("gpu: set_desired", RuntimeError)
    ]
    assert str(err.value) == ("cpu: set_desired: PermissionError: not authorized to set_desired\n"
                              "gpu: set_desired: RuntimeError: group of gpu is unreachable")  # fmt: skip
    explain = lambda e: f"the role may not ({e}); redeploy" if isinstance(e, PermissionError) else None
    assert failure_line(err.value, explain) == (
        "some actions failed, the next tick tries them again: cpu: set_desired: the role may not (not authorized to "
        "set_desired); redeploy; gpu: set_desired: RuntimeError: group of gpu is unreachable"
    )


def test_acted_is_told_what_each_pool_was_set_to_not_what_was_decided(decide):
    # cpu's group has a MaxSize (4) below the config's max (6); gpu's set is refused.
    p = ports(replace(group("cpu", 1, instance("i-1")), max=4), group("gpu", 1))
    p.fleet.refused.add(("set_desired", "gpu"))
    decide(decision("cpu", 6), decision("gpu", 4))
    acted: dict = {}
    with pytest.raises(control.TickError):
        control.tick(ENV, p, NOW, acted=acted.__setitem__)
    assert acted["cpu"]["desired_after"] == 4
    assert acted["cpu"]["held"] == (
        "desired capped at the group's MaxSize 4 (config max 6), not 6: deploy the environment to apply it"
    )
    assert acted["gpu"]["desired_after"] == 1  # the group keeps its own
    assert acted["gpu"]["failed"] == ["set_desired: PermissionError: not authorized to set_desired"]
    acted.clear()
    control.tick(ENV, p, NOW, dry_run=True, acted=acted.__setitem__)
    assert acted == {}  # nothing set


def test_acted_is_told_the_on_demand_base_the_group_has_after_the_tick(decide):
    p = ports(group("cpu", 1), group("gpu", 1))
    p.fleet.refused.add(("set_on_demand_base", "gpu"))
    decide(decision("cpu", 2, on_demand_base=2), decision("gpu", 2, on_demand_base=2))
    acted: dict = {}
    with pytest.raises(control.TickError):
        control.tick(ENV, p, NOW, acted=acted.__setitem__)
    assert acted["cpu"]["base_after"] == 2  # set as decided
    assert acted["gpu"]["base_after"] == 0  # refused: the group keeps its own


def test_a_tick_for_one_pool_observes_only_that_pool(decide):
    p = ports(group("cpu", 0), group("gpu", 0), backlogs={"demo": Backlog(1, 0)})
    seen = decide()
    control.tick(ENV, p, NOW, pools=["gpu"])
    assert [v.name for v in seen["fleet"].pools] == ["gpu"] and [q.name for q in seen["fleet"].queues] == [
        "train"
    ]


# -- interruptions ------------------------------------------------------------------------


def event(name, *, drop=(), **detail):
    """A captured event with `detail` fields changed and the `drop` ones (detail or top level) removed."""
    raw = json.loads((EVENTS / f"{name}.json").read_text())
    raw["detail"] |= detail
    for key in drop:
        (raw if key in raw else raw["detail"]).pop(key)
    return raw


SPOT_WARNING_AT = datetime(2026, 11, 21, 12, 0, tzinfo=UTC).timestamp()  # "time" in spot_warning.json
SANDBOXED = ENV.model_copy(update={"name": "sandbox"})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            event("spot_warning"),
            DrainNode(
                "i-1234567890abcdef0",
                None,
                SPOT_WARNING_AT + 120,
                "spot interruption warning: the instance will terminate in 120s",
            ),
        ),
        (
            event("spot_warning", **{"instance-action": "stop"}),
            DrainNode("i-1234567890abcdef0", None, SPOT_WARNING_AT + 120,
                      "spot interruption warning: the instance will stop in 120s"),
        ),
        (
            event("spot_warning", drop=["instance-action", "time"]),  # no action: terminate; no time: no deadline
            DrainNode("i-1234567890abcdef0", None, None, "spot interruption warning: the instance will terminate in 120s"),
        ),
        (
            event("rebalance"),
            DrainNode(
                "i-1234567890abcdef0", None, None, "rebalance recommendation: spot interruption risk is high"
            ),
        ),
        (
            event("lifecycle_terminate"),
            DrainNode(
                "i-1234567890abcdef0",
                "cpu",
                None,
                "group tidefleet-sandbox-cpu is terminating the instance (hook tidefleet-sandbox-cpu-drain)",
                LifecycleHold("tidefleet-sandbox-cpu-drain", "87654321-4321-4321-4321-210987654321"),
            ),
        ),
        (
            event("lifecycle_terminate", LifecycleHookName="custom-drain"),  # the event's hook is the one held
            DrainNode(
                "i-1234567890abcdef0",
                "cpu",
                None,
                "group tidefleet-sandbox-cpu is terminating the instance (hook custom-drain)",
                LifecycleHold("custom-drain", "87654321-4321-4321-4321-210987654321"),
            ),
        ),
        (
            event("lifecycle_terminate", drop=["LifecycleHookName", "LifecycleActionToken"]),
            DrainNode(
                "i-1234567890abcdef0",
                "cpu",
                None,
                "group tidefleet-sandbox-cpu is terminating the instance (hook tidefleet-sandbox-cpu-drain)",
                LifecycleHold("tidefleet-sandbox-cpu-drain", None),
            ),
        ),
        (
            event("lifecycle_terminate", drop=["AutoScalingGroupName"]),
            Ignore("EC2 Instance-terminate Lifecycle Action: detail.EC2InstanceId or detail.AutoScalingGroupName missing"),
        ),
        (
            event("malformed"),
            Ignore(
                "EC2 Spot Instance Interruption Warning: detail.instance-id missing or not an instance id (got None)"
            ),
        ),
        (
            event("unknown"),
            Ignore(
                "event 'EC2 Instance State-change Notification' from 'aws.ec2' is not an interruption this function handles"
            ),
        ),
        (
            event("lifecycle_terminate", AutoScalingGroupName="someone-elses"),
            Ignore(
                "EC2 Instance-terminate Lifecycle Action: group 'someone-elses' is not a pool of environment 'sandbox'"
            ),
        ),
        (
            event("lifecycle_terminate", LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING"),
            Ignore(
                "EC2 Instance-terminate Lifecycle Action: transition 'autoscaling:EC2_INSTANCE_LAUNCHING' is not a termination"
            ),
        ),
        ("not json at all", Ignore("not an EventBridge event (no 'detail' object)")),
        ({"detail": []}, Ignore("not an EventBridge event (no 'detail' object)")),
    ],
)
def test_action_for_each_interruption_event(raw, expected):
    assert action_for(raw, SANDBOXED) == expected


NO_BACKLOG = Backlog(0, 0)


def drain_ports(heartbeat=None, backlog=NO_BACKLOG):
    return ports(
        group("cpu", 1, instance("i-1")),
        beats={"cpu": {"i-1": heartbeat}} if heartbeat else {},
        backlogs={"demo": backlog},
    )


HOLD = LifecycleHold("tidefleet-t-cpu-drain", "tok")


@pytest.mark.parametrize(
    ("heartbeat", "released"),
    [(None, "never reported"), (beat("i-1"), "idle"), (beat("i-1", busy=2), None)],
)
def test_the_terminate_hook_is_completed_only_for_an_idle_or_silent_node(heartbeat, released, decide):
    p = drain_ports(heartbeat)
    line = control.drain(ENV, p, DrainNode("i-1", "cpu", None, "hook", HOLD), NOW)
    assert p.nodes.marked == [("cpu", "i-1")]
    completed = [c for c in p.fleet.calls if c[0] == "complete_lifecycle_action"]
    assert line.get("released") == released
    assert completed == (
        [("complete_lifecycle_action", "cpu", "i-1", "tidefleet-t-cpu-drain", "tok")] if released else []
    )


def test_the_in_memory_fleet_releases_a_node_the_hook_holds_once_and_a_second_release_is_already_done():
    group = MemoryGroup("tidefleet-t-cpu", desired=0, max=6, instances=[instance("i-1", state="Terminating:Wait")])
    p = Ports(queues=MemoryQueues(), fleet=MemoryFleet({"cpu": group}), nodes=MemoryNodes())
    hook = DrainNode("i-1", "cpu", None, "hook", HOLD)
    assert control.drain(ENV, p, hook, NOW)["released"] == "never reported"
    assert control.drain(ENV, p, hook, NOW)["released"] == "already completed"  # the event delivered twice
    assert p.fleet.groups(["cpu"], NOW)["cpu"].instances == ()


def test_a_drain_with_backlog_runs_a_tick_for_that_pool_at_once(decide):
    p = drain_ports(beat("i-1", busy=2), backlog=Backlog(3, 2))
    seen = decide(decision("cpu", 2))
    line = control.drain(ENV, p, DrainNode("i-1", None, NOW + 120, "spot"), NOW)
    assert [v.name for v in seen["fleet"].pools] == ["cpu"]
    assert line["backlog"] == 5 and line["replacement"] == [2] and ("set_desired", "cpu", 2) in p.fleet.calls


def test_a_drain_without_backlog_asks_for_no_replacement(decide):
    p = drain_ports(beat("i-1"))
    seen = decide(decision("cpu", 5))
    line = control.drain(ENV, p, DrainNode("i-1", None, None, "rebalance"), NOW)
    assert "fleet" not in seen and "replacement" not in line and p.fleet.calls == []


def test_a_drain_of_an_instance_outside_the_environment_is_ignored():
    p = drain_ports()
    line = control.drain(ENV, p, DrainNode("i-stranger", None, None, "spot"), NOW)
    assert "no group" in line["ignored"] and p.nodes.marked == []


# -- a node's clock ahead of the scaler's --------------------------------------------------


def ahead(id_, seconds, busy=0):
    """A heartbeat from a node whose clock is `seconds` ahead: written 5 s ago, idle 600 s, by its clock."""
    return replace(beat(id_, busy=busy), at=NOW - 5 + seconds, idle_since=None if busy else NOW - 600 + seconds)


def test_a_heartbeat_from_a_clock_ahead_is_read_as_written_now_with_the_nodes_own_idle_time():
    view = control.node_view(ENV.pools["cpu"], instance("i-1"), ahead("i-1", 3600), NOW)
    assert (view.last_heartbeat, view.idle_since) == (NOW, NOW - 595)  # idle 595 s by its own clock
    small = control.node_view(ENV.pools["cpu"], instance("i-1"), ahead("i-1", 30), NOW)
    assert (small.last_heartbeat, small.idle_since) == (NOW + 25, NOW - 570)  # within the slack: as written


def test_the_tick_says_which_node_clock_is_ahead_and_never_a_negative_idle_time():
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), beats={"cpu": {"i-1": ahead("i-1", 3600), "i-2": beat("i-2")}})
    (d,) = control.tick(ENV, p, NOW, pools=["cpu"], dry_run=True)
    assert ("node i-1's clock is 3595s ahead of the scaler's: its heartbeat is read as written now, and if it dies "
            "it is replaced 3595s late (fix the node's clock: NTP)") in d.reasons, d.reasons
    assert [r for r in d.reasons if r.startswith("terminate i-1: idle 595s")], d.reasons  # its own idle time, not -3005s
    control.tick(ENV, p, NOW, pools=["cpu"])
    assert ("cpu", "i-1", NOW + 3000) in p.nodes.asked_let_go  # the idle time as written: the store compares it


def test_nodes_that_could_not_run_items_hold_the_pools_launches_and_are_remembered_an_hour():
    """Rule 14 through the tick, real policy: three gone nodes whose agents said at start they
    cannot run items hold launches for waiting work; ten minutes after the newest, one node tries.
    Their heartbeats are kept past the boot timeout (a gone node's without a fault is forgotten
    then) while the fault is under an hour old."""
    why = "the item user 'tidefleet-item' does not exist on this node"
    faulted = {f"i-bad{k}": replace(beat(f"i-bad{k}", draining=True), at=NOW - 300 + 100 * k, fault=why)
               for k in range(3)}  # fmt: skip
    p = ports(group("cpu", 0), beats={"cpu": dict(faulted)}, backlogs={"demo": Backlog(5, 0)})
    (held,) = control.tick(ENV, p, NOW, pools=["cpu"])
    assert held.desired == 0
    assert f"pool cpu: launches held: the last 3 nodes could not run items (newest i-bad2, 100s ago: {why}); " \
           "fix the node image or setup, then redeploy; one node tries again in 500s" in held.reasons, held.reasons
    assert any(r.startswith("launches held: pool cpu at 0 units") for r in held.reasons), held.reasons
    (retry,) = control.tick(ENV, p, NOW - 100 + control.policy.faults.RETRY_AFTER_S, pools=["cpu"])
    assert retry.desired == 1, "one node tries again"
    control.tick(ENV, p, NOW + ENV.pools["cpu"].boot_timeout_s + 1, pools=["cpu"])
    assert set(p.nodes.beats["cpu"]) == set(faulted), "kept past the boot timeout: the hold counts them"
    control.tick(ENV, p, NOW + control.FAULT_MEMORY_S, pools=["cpu"])
    assert p.nodes.beats["cpu"] == {}, "forgotten an hour after they said it"


def test_a_healthy_node_launched_after_the_faults_ends_them_for_good_even_once_it_is_gone():
    """Rule 14 counts faults no healthy node came after; the tick forgets those a healthy node
    superseded (once silent past a boot, not an hour), so the healthy node's scale-in within the
    hour does not bring the old faults, and the hold, back."""
    why = "its docker does not answer"
    faulted = {f"i-bad{k}": replace(beat(f"i-bad{k}", draining=True), at=NOW - 1000 + 100 * k, fault=why)
               for k in range(3)}  # fmt: skip
    good = replace(instance("i-good"), launched_at=NOW - 500)
    p = ports(group("cpu", 1, good), beats={"cpu": {**faulted, "i-good": beat("i-good", busy=1)}},
              backlogs={"demo": Backlog(5, 1)})  # fmt: skip
    later = NOW + ENV.pools["cpu"].boot_timeout_s
    (decision,) = control.tick(ENV, p, later, pools=["cpu"])
    assert not any("launches held" in r for r in decision.reasons), decision.reasons
    assert set(p.nodes.beats["cpu"]) == {"i-good"}, "superseded: forgotten once silent past a boot"
    del p.nodes.beats["cpu"]["i-good"]
    p.fleet.groups_["cpu"] = group("cpu", 0)
    (after,) = control.tick(ENV, p, later + 60, pools=["cpu"])
    assert not any("launches held" in r for r in after.reasons) and after.desired > 0, after.reasons


def test_a_record_from_before_an_instances_launch_is_a_previous_machines_under_the_same_name():
    """A MIG recreates a preempted Spot VM under the same name: the old machine's draining, idle
    record must not have the new one terminated before its agent reports (and forgets it)."""
    old = replace(beat("n-1", draining=True), at=NOW - 300)
    recreated = replace(instance("n-1"), launched_at=NOW - 40)
    p = ports(group("cpu", 1, recreated), beats={"cpu": {"n-1": old}}, backlogs={"demo": Backlog(1, 0)})
    (decision,) = control.tick(ENV, p, NOW, pools=["cpu"])
    assert not any(r.startswith("terminate n-1") for r in decision.reasons), decision.reasons
    assert ("terminate", "cpu", "n-1") not in p.fleet.calls
    (view,) = control.observe(ENV, p, NOW, ["cpu"]).fleet.pools[0].nodes
    assert (view.state, view.last_heartbeat) == ("pending", None)
    lagging = replace(beat("n-1"), at=NOW - 60)  # its own, from a clock 30 s behind: read as ever
    p = ports(group("cpu", 1, replace(instance("n-1"), launched_at=NOW - 90)), beats={"cpu": {"n-1": lagging}})
    (view,) = control.observe(ENV, p, NOW, ["cpu"]).fleet.pools[0].nodes
    assert view.state == "running" and view.last_heartbeat == NOW - 60


def test_a_fault_a_healthy_node_came_after_stays_forgotten_when_that_node_leaves_soon():
    """The one node rule 14 lets try runs healthy, then leaves before the old faults are silent a
    boot: they are forgotten at once, so they never hold launches again."""
    pool = ENV.pools["cpu"].model_copy(update={"boot_timeout_s": 900})  # longer than RETRY_AFTER_S, as on GPU pools
    env = ENV.model_copy(update={"pools": {**ENV.pools, "cpu": pool}})
    faulted = {f"i-bad{k}": replace(beat(f"i-bad{k}", draining=True), at=NOW - 700 + 40 * k, fault="docker")
               for k in range(3)}  # fmt: skip
    p = ports(group("cpu", 0), beats={"cpu": dict(faulted)}, backlogs={"demo": Backlog(1, 0)})
    assert control.tick(env, p, NOW, pools=["cpu"])[0].desired == 1, "one node tries"
    p.fleet.groups_["cpu"] = group("cpu", 1, replace(instance("i-good"), launched_at=NOW))
    p.nodes.beats["cpu"]["i-good"] = beat("i-good", busy=1)
    control.tick(env, p, NOW + 120, pools=["cpu"])
    assert set(p.nodes.beats["cpu"]) == {"i-good"}, "superseded faults forgotten at once"
    p.nodes.beats["cpu"]["i-good"] = replace(beat("i-good"), at=NOW + 170)
    p.fleet.groups_["cpu"] = group("cpu", 0)
    (after,) = control.tick(env, p, NOW + 240, pools=["cpu"])
    assert not any("launches held" in r for r in after.reasons) and after.desired == 1, after.reasons


@pytest.mark.parametrize("fails", ["nodes", "backlog"])
def test_a_pool_whose_nodes_or_queue_cannot_be_read_is_left_out_and_the_others_are_acted_on(fails, caplog):
    """One throttled heartbeat partition or one deleted queue raised out of observe: no pool was
    decided nor acted on. The pool it belongs to is left out (as a missing group is), said in one
    line, and the tick's TickError names it once the others are done."""
    p = ports(group("cpu", 0), group("gpu", 0), backlogs={"demo": Backlog(3, 0)})
    refused = RuntimeError("Rate exceeded")

    def refuse(real, key):
        def read(name):
            if name == key:
                raise refused
            return real(name)
        return read

    if fails == "nodes":
        p.nodes.node_rows = refuse(p.nodes.node_rows, "gpu")
    else:
        p.queues.backlog = refuse(p.queues.backlog, "train")
    with caplog.at_level(logging.WARNING), pytest.raises(control.TickError) as failed:
        control.tick(ENV, p, NOW)
    assert [d.pool for d in failed.value.decisions] == ["cpu"]
    assert ("set_desired", "cpu", 2) in p.fleet.calls and not [c for c in p.fleet.calls if c[1] == "gpu"]
    assert "gpu: not observed, so not decided nor acted on this tick" in str(failed.value)
    assert failed.value.summary == "some pools could not be read"
    what = "its nodes" if fails == "nodes" else "a queue's backlog"
    assert f'"skipped": "{what} not read: RuntimeError: Rate exceeded"' in caplog.text
