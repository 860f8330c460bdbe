"""`tidefleet.lifeline`: a child started with the lifeline ends, with what it started, once its
parent is gone, whatever killed the parent (SIGKILL here: no handler of the parent's runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tidefleet import lifeline

CHILD = """
import subprocess, sys, time
from tidefleet import lifeline
assert lifeline.watch(lifeline.end_tree)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(grandchild.pid, flush=True)
time.sleep(600)
"""

PARENT = """
import os, subprocess, sys, time
from tidefleet import lifeline
tie, fds = lifeline.for_child()
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, **tie}, pass_fds=fds)
print(child.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_child_and_what_it_started_end_once_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True)
    child = grandchild = parent.pid
    try:
        child, grandchild = int(parent.stdout.readline()), int(parent.stdout.readline())
        time.sleep(0.5)
        assert not gone(child) and not gone(grandchild), "both run while the parent lives"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while not (gone(child) and gone(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(child) and gone(grandchild)
    finally:  # whatever failed, nothing of it is left running
        for pid in (parent.pid, child, grandchild):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_process_without_a_lifeline_watches_nothing(monkeypatch):
    monkeypatch.delenv(lifeline.ENV, raising=False)
    assert lifeline.watch(lambda: None) is False
    with open(os.devnull) as not_a_pipe:  # a variable that names an fd which is no pipe here
        monkeypatch.setenv(lifeline.ENV, str(not_a_pipe.fileno()))
        assert lifeline.watch(lambda: None) is False
    monkeypatch.setenv(lifeline.ENV, "closed")
    assert lifeline.watch(lambda: None) is False
