"""`tidefleet simulate` on input a user can get wrong: one line naming the field, the value and the fix,
never a traceback, and exit 2 where the command line is what is wrong (a trace that cannot be read: 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tidefleet.config import load_environment
from tidefleet.sim import TraceError, TraceItem, load_trace, simulate
from tidefleet.sim.cli import simulate as simulate_command
from tidefleet.sim.run import default_timing

ROOT = Path(__file__).resolve().parent.parent
LONG = "a" * 300  # longer than any file name the OS takes (255 bytes)
MAX_SUBMIT_S = 1e11  # submit times are below it


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The installed command as a user runs it: its own process, its exit code and streams."""
    return subprocess.run([sys.executable, "-m", "tidefleet.cli", "simulate", *args], check=False,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)  # fmt: skip


def error_line(run: subprocess.CompletedProcess, code: int) -> str:
    """The one `Error:` line of a refused run (a usage error also prints click's usage lines above it)."""
    assert "Traceback" not in run.stderr and run.stdout == "", run.stdout + run.stderr
    assert run.returncode == code, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, run.stderr
    if code == 1:  # no usage lines: the error alone
        assert run.stderr.strip().splitlines() == errors, run.stderr
    return errors[0]


# 1. Submit times past what a float resolves to the millisecond.


@pytest.mark.parametrize("submit", ["1e18", "1.7e15", "1700000000000", "100000000000", "1e16"])
def test_a_submit_time_too_large_to_be_seconds_is_refused_naming_the_line_and_the_units(tmp_path, submit):
    trace = write(tmp_path, f"submit_s,duration_s,gpus\n0,10,1\n{submit},10,1\n")
    line = error_line(cli(str(trace), "--env", "bench", "--pool", "gpu"), 1)
    assert line == (
        f"Error: trace.csv line 3: column 'submit_s' must be below 100,000,000,000 s (3,171 years) (got '{submit}'); "
        "times that large are milliseconds, microseconds or nanoseconds (a Unix time in ms is about 1.7e12): "
        "convert the column to seconds (divide by 1e3, 1e6 or 1e9)"
    )


def test_invoke_simulate_refuses_a_nanosecond_submit_time_in_one_line(tmp_path):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n1e18,10,1\n")
    run = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "simulate", "--trace", str(trace),
                          "--env", "bench", "--pool", "gpu"], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "trace.csv line 2: column 'submit_s' must be below 100,000,000,000 s" in run.stderr


def test_the_largest_submit_time_allowed_replays_as_the_same_trace_at_zero(tmp_path):
    rows = [(0, 10, 1), (0, 10, 1), (30, 200, 1), (95, 10, 1), (4000, 33, 1), (4001, 0, 1)]
    results = {}
    for offset in (0, int(MAX_SUBMIT_S) - 4001 - 1):  # the last item 1 s below the limit
        trace = write(tmp_path, "submit_s,duration_s,gpus\n" + "".join(f"{s + offset},{d},{g}\n" for s, d, g in rows))
        out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--json",
                                                    "--policy", "tidefleet", "--policy", "keda", "--policy", "oracle"])  # fmt: skip
        assert out.exit_code == 0, out.output
        data = json.loads(out.stdout)
        results[offset] = (data["lower_bound_usd"], data["zero_wait_usd"], data["results"])
    at_zero, at_limit = results.values()
    assert at_limit == at_zero and all(r["items_finished"] == len(rows) for r in at_zero[2])
    # the audit's 10-s item: 45 s and $0.003325 at 0, 44 s and $0.003267 at 1e16 (now refused), and here
    trace = write(tmp_path, f"submit_s,duration_s,gpus\n{MAX_SUBMIT_S - 1:.0f},10,1\n")
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--json"])
    (result,) = json.loads(out.stdout)["results"]
    assert (result["wait_s"]["max"], round(result["cost_usd"], 6)) == (45.0, 0.003325)


def test_an_item_whose_end_rounds_to_its_start_holds_no_slot_in_the_bounds():
    # Past the reader's limit (the API takes items as given) a 10-s item's end is its start: the
    # zero-wait bound counted the end first and fell off its list of nodes (IndexError).
    env = load_environment("bench")
    report = simulate(env, "gpu", [TraceItem(1e18, 10.0, 1)], ["oracle"], timing=default_timing(env))
    assert report.zero_wait_usd == 0.0


# 2. Paths the OS refuses.


@pytest.mark.parametrize(
    ("flag", "name", "message"),
    [
        ("", f"{LONG}.csv", "Error: {path}: cannot read it (File name too long); give the path of a CSV trace"),
        ("--spot-trace", f"{LONG}.json", "Error: {path}: cannot read it (File name too long); give a skypilot spot-traces"),
        ("--plot", f"{LONG}.png", "Error: --plot: cannot write {path} (File name too long); give a writable path"),
    ],
)
def test_a_path_the_os_refuses_is_one_line_naming_it_and_the_reason(tmp_path, flag, name, message):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    path = tmp_path / name
    args = [str(path)] if not flag else [str(trace), flag, str(path)]
    line = error_line(cli(*args, "--env", "bench", "--pool", "gpu"), 2 if flag == "--plot" else 1)
    assert line.startswith(message.format(path=path)), line
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*.png"))


def test_a_plot_path_that_cannot_be_written_is_a_usage_error_as_every_flag(tmp_path):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    (tmp_path / "a-file").write_text("")
    line = error_line(cli(str(trace), "--env", "bench", "--pool", "gpu", "--plot", str(tmp_path / "a-file" / "x.png")), 2)
    assert line == f"Error: --plot: cannot write {tmp_path}/a-file/x.png ({tmp_path}/a-file is a file, not a folder); give a writable path"


def test_a_plot_name_the_os_takes_is_written_though_the_partial_file_beside_it_is_named_after_it(tmp_path):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    plot = tmp_path / ("p" * 250 + ".png")  # 254 bytes: ".<stem>.partial.png" beside it would be 263
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--plot", str(plot)])
    assert out.exit_code == 0, out.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# 3. A header of very many columns.


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("submit_s,duration_s," + ",".join(f"c{i}" for i in range(100_000)) + ",c7,c99999\n",
         "column(s) c7, c99999 named twice in the header; keep one of each"),
        (",".join(f"c{i}" for i in range(100_000)) + "\n",
         "missing column(s) submit_s, duration_s (got c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 and 99,990 more); "),
        (",".join(["x"] * 100_000) + "\n", "column(s) x named twice in the header; keep one of each"),
    ],
)
def test_a_header_of_a_hundred_thousand_columns_is_checked_at_once_in_one_short_line(tmp_path, header, message):
    trace = write(tmp_path, header + ",".join(["0"] * (header.count(",") + 1)) + "\n")
    started = time.perf_counter()
    with pytest.raises(TraceError) as err:
        load_trace(trace)
    assert time.perf_counter() - started < 5  # took 5.9 s at 30,000 columns, minutes at 100,000
    assert message in str(err.value) and len(str(err.value)) < 400, str(err.value)[:500]


# 4. Numbers past any useful replay.


def test_resume_s_is_at_most_a_day_as_boot_s_and_notice_s(tmp_path):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    line = error_line(cli(str(trace), "--env", "bench", "--pool", "gpu", "--resume-s", "1e300"), 2)
    assert line == ("Error: --resume-s: at most 86400 (s, a day; a checkpoint is saved and loaded again in seconds "
                    "to minutes) (got 1e+300)")  # fmt: skip


@pytest.mark.parametrize("duration", ["1e-300", "0.0009", "5e-324"])
def test_a_duration_shorter_than_a_millisecond_is_refused_saying_to_give_0(tmp_path, duration):
    trace = write(tmp_path, f"submit_s,duration_s,gpus\n0,10,1\n5,{duration},1\n")
    line = error_line(cli(str(trace), "--env", "bench", "--pool", "gpu"), 1)
    assert line == (f"Error: trace.csv line 3: column 'duration_s' must be 0 or at least 0.001 s (got '{duration}'); "
                    "the replay resolves milliseconds: give 0 for an item shorter than that (it holds no slot in "
                    "the bounds) or round it up to 0.001")  # fmt: skip


@pytest.mark.parametrize("duration", ["0", "0.001", "0.0010"])
def test_a_duration_of_0_or_a_millisecond_replays(tmp_path, duration):
    trace = write(tmp_path, f"submit_s,duration_s,gpus\n0,{duration},1\n")
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["results"][0]["items_finished"] == 1


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [
        ("submit_s,duration_s\n0,1e308\n", "longest duration_s is 1e+308 s (3.17e+300 years, more than 10); "),
        ("submit_s,duration_s\n0,5\n9.9e10,5\n", "submit_s spans 99,000,000,000 s (3,139 years, more than 10); "),
        ("submit_s,duration_s\n0,400000000\n", "longest duration_s is 400,000,000 s (13 years, more than 10); "),
    ],
)
def test_a_span_past_ten_years_is_said_in_a_short_number(tmp_path, csv_text, message):
    with pytest.raises(TraceError) as err:
        load_trace(write(tmp_path, csv_text))
    assert message in str(err.value) and len(str(err.value)) < 200 + len(str(tmp_path)), str(err.value)


# 5. --window.


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ("1e400:", "Error: --window: START must be a finite number of seconds, e.g. 0:86400 (got '1e400:')"),
        ("inf:", "Error: --window: START must be a finite number of seconds, e.g. 0:86400 (got 'inf:')"),
        ("100:5", "Error: --window: END must be after START (got '100:5')"),
        (":0", "Error: --window: END must be after START (0 where it is left out) (got ':0')"),
        ("5", "Error: --window: expected START:END in seconds, e.g. 0:86400 (got '5')"),
        ("nan:5", "Error: --window: START and END must be numbers of seconds, e.g. 0:86400 (got 'nan:5')"),
        ("100:", "Error: --window: no item of trace.csv has 100 <= submit_s (its 2 items: submit_s 0 to 10); widen --window"),
        ("-5:0", "Error: --window: no item of trace.csv has -5 <= submit_s < 0 (its 2 items: submit_s 0 to 10); widen --window"),
    ],
)
def test_a_window_the_replay_cannot_use_is_a_usage_error_that_says_what_is_wrong(tmp_path, window, message):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n10,10,1\n")
    assert error_line(cli(str(trace), "--env", "bench", "--pool", "gpu", f"--window={window}"), 2) == message


def test_a_window_whose_items_are_all_too_big_says_they_are_in_the_window(tmp_path):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,64\n10,10,1\n")
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--window", ":5"])
    assert out.exit_code == 1, out.output
    assert "trace.csv: no items to replay (1 in --window, 1 too big for pool gpu); " in out.output


# 6. Spot traces of the wrong shape.


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("[1, 2]", "the JSON must be an object, got a list"),
        ('{"data": [1]}', "no 'metadata' field"),
        ('{"metadata": [], "data": [1]}', "'metadata' must be an object, got a list"),
        ('{"metadata": {}, "data": [1]}', "no 'metadata.gap_seconds' field"),
        ('{"metadata": {"gap_seconds": "x"}, "data": [1]}', "'metadata.gap_seconds' must be a number, got 'x'"),
        ('{"metadata": {"gap_seconds": null}, "data": [1]}', "'metadata.gap_seconds' must be a number, got null"),
        ('{"metadata": {"gap_seconds": 60}}', "no 'data' field"),
        ('{"metadata": {"gap_seconds": 60}, "data": 5}', "'data' must be a list, got a number"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, [2]]}', "data[1] must be a number, got a list"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, "x"]}', "data[1] must be a number, got 'x'"),
        ("{", "not JSON (Expecting property name enclosed in double quotes: line 1 column 2)"),
    ],
)
def test_a_spot_trace_of_the_wrong_shape_names_the_field_and_what_was_expected(tmp_path, text, what):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    spot = write(tmp_path, text, "spot.json")
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--spot-trace", str(spot)])
    assert out.exit_code == 1 and "Traceback" not in out.output, out.output
    shape = '{"metadata": {"gap_seconds": N}, "data": [N, ...]} (a skypilot spot-traces file)'
    assert out.output.strip().splitlines() == [f"Error: {spot}: not a spot trace: {what}; a spot trace is JSON {shape}"]


def test_pool_may_be_left_out_where_the_environment_has_one_and_is_named_where_it_has_several(tmp_path):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    one = CliRunner().invoke(simulate_command, [str(trace), "--env", "dev", "--json"])
    named = CliRunner().invoke(simulate_command, [str(trace), "--env", "dev", "--pool", "cpu", "--json"])
    assert one.exit_code == named.exit_code == 0, one.output + named.output
    assert json.loads(one.stdout)["pool"] == "cpu" and json.loads(one.stdout) == json.loads(named.stdout)
    line = error_line(cli(str(trace), "--env", "prod"), 2)
    assert line == "Error: --pool: prod has 3 pools; name one of: cpu, gpu, gpu4"


def test_an_unknown_pool_is_a_usage_error_before_the_trace_is_read(tmp_path):
    """It exited 1 after reading the trace; leaving --pool out of a two-pool environment exits 2."""
    line = error_line(cli(str(tmp_path / "not-read.csv"), "--env", "bench", "--pool", "nope"), 2)
    assert line == "Error: --pool: unknown pool (got 'nope'); pools of bench: gpu, gpu8"
