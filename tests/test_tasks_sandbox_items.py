"""invoke sandbox --items: a value out of range is refused at the task with the exit code of every
other bad option value of the tasks (1), and 0 without --keep, which started and stopped the
sandbox with nothing run and no summary, is refused with what to give instead."""

from __future__ import annotations

import pytest
from invoke import Exit, MockContext

import tasks


@pytest.fixture
def handed(monkeypatch) -> list[list[str]]:
    given: list[list[str]] = []
    monkeypatch.setattr("tidefleet.cli.main", lambda args, prog_name: given.append(args))
    return given


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ("", "--items: must be a whole number (got '')"),
        ("99999999999999999999", "--items: must be at most 10000 (got '99999999999999999999')"),
        ("0", ("--items: 0 runs no demo job, so the sandbox would start and stop with nothing to show; give at "
               "least 1, or add --keep to start just the system")),
    ],
)
def test_a_bad_items_value_is_refused_at_the_task_with_exit_1(handed, items, message):
    with pytest.raises(Exit) as refused:
        tasks.sandbox(MockContext(), items=items)
    assert refused.value.code == 1
    assert refused.value.message == message
    assert handed == []


def test_zero_items_with_keep_is_just_the_system(handed):
    tasks.sandbox(MockContext(), items="0", keep=True)
    tasks.sandbox(MockContext(), items="10000")
    assert [args[args.index("--items") + 1] for args in handed] == ["0", "10000"]
