"""invoke tasks given a bad value end in one line naming the option and the value, never a
traceback; run as a user runs them (a real `invoke` process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ctrl_c import as_at_a_terminal, group_state
from invoke import Collection, MockContext

import tasks

ROOT = Path(__file__).resolve().parents[1]


def run_invoke(*args: str, path: str | None = None, **variables: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"PATH": path} if path is not None else {}), **variables}
    return subprocess.run([sys.executable, "-m", "invoke", *args], check=False, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip


def test_no_task_option_is_typed_as_a_number_for_invoke_to_convert():
    """invoke converts an option with an int default itself and ends a non-number in its own
    traceback; numbers are taken as text and converted by the task (`tasks._number`)."""
    collection = Collection.from_module(tasks)
    typed = [f"{name} --{arg.name}" for name in collection.task_names
             for arg in collection[name].get_arguments() if arg.kind in (int, float)]  # fmt: skip
    assert not typed, typed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sandbox", "--items", "abc"), "--items: must be a whole number (got 'abc')"),
        (("sandbox", "--tick", "abc"), "--tick: must be a number (got 'abc')"),
        (("sandbox", "--time-limit", "-5"), "--time-limit: must be a finite number, not negative (got '-5')"),
        (("sandbox", "--tick", "inf"), "--tick: must be a finite number, not negative (got 'inf')"),
        (("sandbox", "--boot-delay", "inf"), "--boot-delay: must be a finite number, not negative (got 'inf')"),
        (("sandbox", "--seed", "x"), "Invalid value for '--seed': 'x' is not a valid integer"),
        (("bench-io", "--submit-items", "x"), "--submit-items: must be a whole number (got 'x')"),
        (("mutate", "--jobs", "x"), "--jobs: must be a whole number (got 'x')"),
        (("mutate", "--jobs", "0"), "--jobs: must be at least 1 (got '0'); it is how many mutants are tested at once"),
        (("build", "--cloud", "gcp", "--out", "/dev/null/x"), "build: cannot write /dev/null/x (Not a directory)"),
        (("sandbox", "--workdir", "/proc/x"), "Invalid value for --workdir: cannot create /proc/x (No such file or directory)"),
    ],
)
def test_a_bad_option_value_is_one_line_naming_it(args, message):
    result = run_invoke(*args)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert message in output and "Traceback" not in output, output


def test_mutate_refuses_zero_jobs_before_running_mutmut(monkeypatch):
    """mutmut took --max-children 0 and ended in its own ValueError (a pool of 0 processes)."""
    from invoke import Exit

    ran = []
    monkeypatch.setattr(tasks, "_run", lambda c, command, **kwargs: ran.append(command))
    with pytest.raises(Exit) as done:
        tasks.mutate(MockContext(), jobs="0")
    assert done.value.message == "--jobs: must be at least 1 (got '0'); it is how many mutants are tested at once"
    assert ran == []


def test_sandbox_passes_boot_delay_seed_and_json_to_tidefleet_sandbox(monkeypatch):
    """The task runs `tidefleet sandbox` in this process: the words it hands over are the command's
    options with the values given (the command's own defaults where none is)."""
    from tidefleet.sandbox.cli import sandbox

    given = []
    monkeypatch.setattr("tidefleet.cli.main", lambda args, prog_name: given.append(args))
    tasks.sandbox(MockContext(), items="3", boot_delay="0.25", seed="-4", json=True)
    tasks.sandbox(MockContext())
    (command, *args), (_, *plain) = given
    assert command == "sandbox"
    params = sandbox.make_context("sandbox", args).params
    assert (params["items"], params["boot_delay"], params["seed"], params["as_json"]) == (3, 0.25, -4, True)
    params = sandbox.make_context("sandbox", plain).params
    assert (params["boot_delay"], params["seed"], params["as_json"]) == (1.5, 7, False)
    assert "--items" not in plain  # left to the command: `invoke sandbox --train` must not hand it one


def test_invoke_sandbox_train_hands_no_items_option_which_train_refuses(monkeypatch):
    given = []
    monkeypatch.setattr("tidefleet.cli.main", lambda args, prog_name: given.append(args))
    tasks.sandbox(MockContext(), train=True)
    (args,) = given
    assert "--train" in args and "--items" not in args


def test_simulate_help_is_the_tasks_own():
    """invoke hands a required positional the next word, --help included: the task shows its help."""
    result = run_invoke("simulate", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: inv[oke] [--core-opts] simulate" in result.stdout and "--extra=STRING" in result.stdout


def test_simulate_passes_env_and_pool_as_one_word_each():
    result = run_invoke("simulate", "philly_2017_jobs.csv", "--env", "nope;echo INJECTED", "--pool", "cpu")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "unknown environment (got 'nope;echo INJECTED')" in output and "\nINJECTED" not in output, output


def test_an_unknown_environment_is_named_before_the_missing_terraform(tmp_path):
    result = run_invoke("plan", "--env", "nope", path=str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "unknown environment (got 'nope')" in output and "Traceback" not in output, output


def test_simulate_extra_is_options_never_a_shell_command():
    result = run_invoke("simulate", "philly_2017_jobs.csv", "--env", "nope", "--extra", "; echo INJECTED")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "\nINJECTED" not in output and "Traceback" not in output, output


def simulated(monkeypatch) -> list[list[str]]:
    """The words each tasks.simulate call hands `tidefleet` (run in the task's own process)."""
    given: list[list[str]] = []
    monkeypatch.setattr("tidefleet.cli.main", lambda args, prog_name: given.append(args))
    return given


def test_simulate_hands_tidefleet_simulate_an_argument_list_so_a_space_stays_in_its_word(monkeypatch, tmp_path):
    monkeypatch.delenv("TIDEFLEET_ENV", raising=False)
    given = simulated(monkeypatch)
    tasks.simulate(MockContext(), "philly_2017_jobs.csv", pool="gpu", policy=["keda", "oracle"],
                   extra=f"--plot '{tmp_path}/my plots/a.png' --seed 3")  # fmt: skip
    assert given == [[
        "simulate", str(ROOT / "traces" / "philly_2017_jobs.csv"),
        "--env", "prod", "--pool", "gpu", "--policy", "keda", "--policy", "oracle",
        "--plot", f"{tmp_path}/my plots/a.png", "--seed", "3",
    ]]  # fmt: skip


def test_simulate_leaves_the_pool_to_the_simulator_unless_given(monkeypatch):
    """`tidefleet simulate` picks an environment's only pool and asks which of several: the task
    passes no pool of its own (it passed gpu, which dev, whose one pool is cpu, does not have)."""
    monkeypatch.delenv("TIDEFLEET_ENV", raising=False)
    given = simulated(monkeypatch)
    tasks.simulate(MockContext(), "philly_2017_jobs.csv", env="dev")
    assert "--pool" not in given[0]
    result = run_invoke("simulate", "philly_2017_jobs.csv")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "--pool: prod has 3 pools; name one of: cpu, gpu, gpu4" in output and "Traceback" not in output, output


def test_simulate_extra_with_an_unclosed_quote_is_one_line():
    result = run_invoke("simulate", "philly_2017_jobs.csv", "--extra", "--plot 'a.png")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "--extra: cannot split \"--plot 'a.png\" into options (No closing quotation); close its quotes" in output
    assert "Traceback" not in output, output


def test_tasks_take_the_environment_from_tidefleet_env_as_the_cli_does(tmp_path, monkeypatch):
    result = run_invoke("plan", path=str(tmp_path), TIDEFLEET_ENV="nope")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "unknown environment (got 'nope')" in output and "Traceback" not in output, output
    monkeypatch.setenv("TIDEFLEET_ENV", "dev")
    given = simulated(monkeypatch)
    tasks.simulate(MockContext(), "philly_2017_jobs.csv")
    tasks.simulate(MockContext(), "philly_2017_jobs.csv", env="prod")  # --env given: it wins
    assert [args[2:4] for args in given] == [["--env", "dev"], ["--env", "prod"]]


def test_simulate_names_a_trace_path_the_os_refuses_in_one_line(tmp_path):
    """The bare-name lookup asks the OS whether each candidate is a file: a name over 255 bytes
    raised OSError there, before the simulator could name it."""
    long = tmp_path / f"{'a' * 300}.csv"
    result = run_invoke("simulate", "--trace", str(long), "--pool", "gpu")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{long}: cannot read it (File name too long)" in output and "Traceback" not in output, output


def test_simulate_shows_its_own_usage_line_for_a_bad_option():
    result = run_invoke("simulate", "philly_2017_jobs.csv", "--env", "bench", "--pool", "gpu8", "--policy", "kdea")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Usage: tidefleet simulate" in result.stderr and "python -m tidefleet.cli" not in result.stderr, result.stderr


def ctrl_c_once_started(args: list[str], started: str, *, on_stderr: bool) -> tuple[int, str, str]:
    """`invoke ARGS` as a CI job runs it (its own process group, stdin at its end): a SIGINT to the
    whole group, as a terminal's Ctrl-C or a runner's cancel, once `started` is printed (on stderr
    or stdout); (exit status, the rest of stdout, the rest of stderr)."""
    run = subprocess.Popen(as_at_a_terminal([sys.executable, "-m", "invoke", *args]), cwd=ROOT, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    watched, other = (run.stderr, run.stdout) if on_stderr else (run.stdout, run.stderr)
    try:
        while started not in (line := watched.readline()):
            assert line, other.read()  # it never started
        os.killpg(run.pid, signal.SIGINT)
        try:
            out, err = run.communicate(timeout=60)
        except subprocess.TimeoutExpired as late:
            raise AssertionError(f"still running 60 s after the SIGINT:\n{group_state(run.pid)}\nstdout: "
                                 f"{late.stdout!r}\nstderr: {late.stderr!r}") from None  # fmt: skip
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    return run.returncode, out, err


def test_ctrl_c_stops_simulate_without_a_traceback_when_stdin_is_not_a_terminal():
    """As in a CI job or a background job: invoke had closed the simulator's stdin at its own end of
    file, then wrote Ctrl-C's ^C to it and ended in a ValueError traceback."""
    code, out, err = ctrl_c_once_started(["simulate", "philly_2017_jobs.csv", "--env", "bench", "--pool", "gpu8"],
                                         "replaying", on_stderr=True)  # fmt: skip
    assert "Traceback" not in out + err and "simulate: interrupted; nothing written" in err, out + err
    assert code == 130


def test_ctrl_c_stops_invoke_test_with_no_traceback_nor_a_further_pass_when_stdin_is_not_a_terminal(tmp_path):
    """A CI job cancelled (SIGINT to the group, stdin at its end) as pytest runs: invoke wrote
    Ctrl-C's ^C into pytest's stdin, which it had closed, and ended in a ValueError traceback;
    the calibration pass would then have started after the interrupted one."""
    slow = tmp_path / "test_slow.py"
    # Short sleeps: a signal that another thread of the process took wakes no long sleep.
    slow.write_text("import time\n\n\ndef test_slow():\n    print('slow test started', flush=True)\n"
                    "    for _ in range(1200):\n        time.sleep(0.1)\n")  # fmt: skip
    code, out, err = ctrl_c_once_started(["test", "--args", f"-n 0 -p no:randomly -s {slow}"], "slow test started",
                                         on_stderr=False)  # fmt: skip
    assert "Traceback" not in out + err and "KeyboardInterrupt" in out, out + err
    assert "test session starts" not in out, out  # read above for the first pass: none started after it
    assert code == 2  # pytest's own "interrupted"


def test_a_reader_that_leaves_early_ends_invoke_without_a_traceback_and_exits_141():
    """`invoke --list | head -1`: the pipe closes before invoke prints, and its print raised
    BrokenPipeError to the top. It exits 141 (128 + SIGPIPE), as the tidefleet commands do and as a
    shell reports a Unix tool the closed pipe killed, not 1, which `set -o pipefail` reads as failure."""
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()  # the reader left before the first line
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert stderr == "", stderr


def test_bench_over_a_trace_with_nothing_to_replay_says_so_in_one_line(tmp_path):
    """A header-only trace in $TIDEFLEET_TRACES: its half had no items, and the replay's ValueError
    crossed the worker pool into a traceback (exit 1), naming a --window bench does not have."""
    from tidefleet.sim.bench import BENCH, TRACES_DIR

    for trace, _, _ in BENCH:
        (tmp_path / trace).write_text((TRACES_DIR / trace).read_text().splitlines()[0] + "\n")
    result = run_invoke("bench", "--out", str(tmp_path / "out"), TIDEFLEET_TRACES=str(tmp_path))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "philly_2017_jobs.csv: no items to replay (0 read); check the file" in result.stderr.splitlines()[-1]
    assert "--window" not in result.stderr
