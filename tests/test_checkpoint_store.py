"""Where `tidefleet.agent.checkpoint` keeps what a workload saves: a save is whole or not there
(also when two run at once or one is killed), a location means one folder on every backend, a
call to the cloud gives up within the README's bounds, and a bad location, name or value is one
clear error before anything is written."""

from __future__ import annotations

import multiprocessing
import os

from tidefleet.agent import checkpoint

A = b"A" * (4 << 20)
B = b"B" * (1 << 20)


def _save(base: str, data: bytes, barrier) -> None:
    barrier.wait()
    checkpoint.save("state.bin", data, base=base)


def _killed_save(base: str) -> None:
    os.replace = lambda *_: os._exit(9)  # killed after writing, before its rename
    checkpoint.save("state.bin", b"lost", base=base)


def test_two_saves_at_once_leave_one_of_them_whole_and_no_partial_behind(tmp_path):
    base = tmp_path.as_uri() + "/"
    ctx = multiprocessing.get_context("fork")
    for _ in range(12):
        barrier = ctx.Barrier(2)
        procs = [ctx.Process(target=_save, args=(base, data, barrier)) for data in (A, B)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0], "a save raised"
        assert checkpoint.load("state.bin", base=base) in (A, B)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def test_a_killed_saves_leftovers_are_swept_by_the_next_save_and_never_loaded(tmp_path):
    base = tmp_path.as_uri() + "/"
    checkpoint.save("state.bin", b"kept", base=base)
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        p = ctx.Process(target=_killed_save, args=(base,))
        p.start()
        p.join(60)
        assert p.exitcode == 9
    assert checkpoint.load("state.bin", base=base) == b"kept"
    left = [p.name for p in tmp_path.iterdir() if p.name != "state.bin"]
    assert left, "the killed saves left their temporary files"
    checkpoint.save("other", b"x", base=base)  # any save in the folder sweeps them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "state.bin"]
    assert checkpoint.load("state.bin", base=base) == b"kept"
