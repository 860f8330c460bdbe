"""Rule 14 (`tidefleet.policy.faults`): nodes that could not run items hold the pool's launches."""

from tidefleet.policy.faults import FAULTS_IN_A_ROW, RETRY_AFTER_S, hold, in_a_row
from tidefleet.policy.model import NodeFault, NodeView

NOW = 100_000.0
WHY = "its docker does not answer (Cannot connect to the Docker daemon)"


def node(id_, launched_at, *, state="running", heartbeat=True, booted_at=None):
    return NodeView(id=id_, instance_type="g5.xlarge", weight=1, slots=1, spot=True, state=state,
                    launched_at=launched_at, last_heartbeat=NOW - 5 if heartbeat else None, booted_at=booted_at)  # fmt: skip


def faults(*ats):
    return [NodeFault(f"i-bad{k}", at, WHY) for k, at in enumerate(ats)]


def test_fewer_faults_than_the_row_hold_nothing():
    assert hold("gpu", faults(NOW - 300, NOW - 200), [], NOW) is None


def test_three_faults_in_a_row_hold_launches_and_say_why_and_when_one_node_tries_again():
    held = hold("gpu", faults(NOW - 300, NOW - 200, NOW - 100), [], NOW)
    assert held is not None and held.launch == 0
    assert "launches held: the last 3 nodes could not run items (newest i-bad2, 100s ago: its docker" in held.reason
    assert f"one node tries again in {RETRY_AFTER_S - 100}s" in held.reason


def test_past_the_retry_time_one_node_tries_but_not_while_one_boots():
    row = faults(NOW - 3 * RETRY_AFTER_S, NOW - 2 * RETRY_AFTER_S, NOW - RETRY_AFTER_S - 1)
    assert hold("gpu", row, [], NOW).launch == 1
    booting = hold("gpu", row, [node("i-new", NOW - 30, state="pending", heartbeat=False)], NOW)
    assert booting.launch == 0 and "i-new boots and tells whether it runs items" in booting.reason


def test_a_healthy_node_launched_after_the_faults_ends_the_hold_one_launched_before_does_not():
    row = faults(NOW - 300, NOW - 200, NOW - 100)
    assert hold("gpu", row, [node("i-good", NOW - 50)], NOW) is None
    assert hold("gpu", row, [node("i-old", NOW - 5000)], NOW).launch == 0
    # A fault after the healthy node's launch counts again; the two before it do not.
    assert len(in_a_row(row, [node("i-good", NOW - 150)])) == 1


def test_a_faulted_node_still_in_the_group_is_not_the_healthy_node_that_ends_the_hold():
    row = faults(NOW - 300, NOW - 200, NOW - 100)
    still_there = node("i-bad2", NOW - 160, state="draining")
    assert hold("gpu", row, [still_there], NOW).launch == 0
    assert FAULTS_IN_A_ROW == 3


def test_the_readmes_launches_held_line_is_what_the_rule_says():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (line,) = re.findall(r"^pool gpu: launches held: .*$", readme, re.MULTILINE)
    why = "its GPUs are not usable: nvidia-smi not found: the NVIDIA driver is not installed"
    row = [NodeFault("i-0a17", NOW - 400, why), NodeFault("i-0b29", NOW - 250, why), NodeFault("i-0c41", NOW - 95, why)]
    assert hold("gpu", row, [], NOW).reason == line


def test_faults_are_ordered_by_boot_so_a_broken_node_launched_beside_a_healthy_one_is_not_after_it():
    """A faulted agent exits and is restarted (systemd, every 5 s), each start reporting the fault
    again: by report, the broken nodes of a batch with a healthy one would all come after it, and
    a pool where one instance type is broken would launch one node at a time while the others run.
    By boot, only those that came after the healthy one count."""
    healthy = node("i-good", NOW - 600, booted_at=NOW - 580)
    batch = [NodeFault(f"i-bad{k}", NOW - 5, WHY, booted_at=NOW - 590 + 5 * k) for k in range(4)]  # booted 590..575
    assert [f.node_id for f in in_a_row(batch, [healthy])] == ["i-bad3"], "booted after i-good: 575 > 580 ago"
    assert hold("gpu", batch, [healthy], NOW) is None
    later = [NodeFault(f"i-new{k}", NOW - 5, WHY, booted_at=NOW - 300 + k) for k in range(3)]
    assert hold("gpu", batch + later, [healthy], NOW).launch == 0, "three more that booted after it do hold"
