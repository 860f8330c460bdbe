"""`tidefleet cost` and `tidefleet rightsize` against a run with known usage: real agents on the
moto server run a workload that burns a set amount of CPU, holds a set amount of memory, sleeps a
set time, and is killed like the OOM killer kills or runs past its timeout. Plus the submitter
recorded at submit, and the one-line errors."""

from __future__ import annotations

import csv
import io
import json
import logging

import boto3
import pytest
from agent_harness import Harness, Imds, wait_until
from click.testing import CliRunner
from google.auth.credentials import AnonymousCredentials

from tidefleet import costs
from tidefleet.cli import main
from tidefleet.cloud import for_env
from tidefleet.config import load_environment
from tidefleet.jobs import identity, sdk
from tidefleet.records import FINAL

pytestmark = pytest.mark.moto

# cpu=S burns S seconds of CPU time, mem=MB holds MB of touched memory, sleep=S waits, then
# oom=1 dies by SIGKILL (what the kernel's OOM killer sends) or the item exits 0.
WORKLOAD = r'''
import os, signal, sys, time
args = dict(a.split("=", 1) for a in sys.argv[1:])
held = bytearray(int(float(args.get("mem", 0)) * 2**20))
for i in range(0, len(held), 4096):
    held[i] = 1
start = time.process_time()
while time.process_time() - start < float(args.get("cpu", 0)):
    pass
time.sleep(float(args.get("sleep", 0)))
if args.get("oom"):
    os.kill(os.getpid(), signal.SIGKILL)
'''
PRICE = 0.034  # c6i.large spot, tidefleet/prices.py: the harness's only type, two slots a node
BURN_S, HOLD_MB, SLEEP_S = 0.3, 120, 1.0


@pytest.fixture(scope="module")
def run(tmp_path_factory, moto_server):
    """One run shared by the module's tests: a render job (two measured items) for team infra, one
    item the OOM killer ends, one that times out on the nlp team's queue."""
    import os
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{moto_server.url}/moto-api/reset", method="POST")).close()
    saved = {k: os.environ.get(k) for k in moto_server.env()}
    os.environ.update(moto_server.env())
    tmp = tmp_path_factory.mktemp("cost")
    h = Harness(tmp, moto_server, max_retries=0)
    (tmp / "workload.py").write_text(WORKLOAD)
    text = h.env_path.read_text().replace('slots_per_unit = 2', 'slots_per_unit = 2\nteam = "infra"')
    h.env_path.write_text(text.replace('[queues.short]\npool = "cpu"', '[queues.short]\npool = "cpu"\nteam = "nlp"'))
    h.env = load_environment(str(h.env_path))
    imds = Imds("i-0cost")
    try:
        measured = sdk.submit(h.env, "measured", "work", sdk.read_items(
            [[f"cpu={BURN_S}", f"mem={HOLD_MB}", f"sleep={SLEEP_S}"]] * 2), kick=False).job_id  # fmt: skip
        killed = sdk.submit(h.env, "killed", "work", sdk.read_items([{"id": "big", "args": ["mem=50", "oom=1"]}]),
                            kick=False).job_id  # fmt: skip
        slow = sdk.submit(h.env, "slow", "short", sdk.read_items([{"id": "slow", "args": ["sleep=30"]}]),
                          kick=False).job_id  # fmt: skip
        h.start_agent("node-a", imds.url)
        for job_id, n in ((measured, 2), (killed, 1), (slow, 1)):
            wait_until(lambda j=job_id, n=n: len(items := h.items(j)) == n and all(i.status in FINAL for i in items.values()),
                       90, f"job {job_id} to finish")  # fmt: skip
        yield h, {"measured": measured, "killed": killed, "slow": slow}
    finally:
        h.stop_agents()
        imds.close()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def cli(h: Harness, *args: str):
    out = CliRunner().invoke(main, [*args, "--env", str(h.env_path)])
    assert "Traceback" not in out.output
    return out


def recorded_seconds(h: Harness, job_id: str) -> list[float]:
    return [e["seconds"] for i in h.items(job_id).values() for e in i.history]


def test_each_attempt_records_what_it_ran_on_and_its_known_usage(run):
    h, jobs = run
    (first, second) = [i.history[-1] for i in h.items(jobs["measured"]).values()]
    for e in (first, second):
        assert (e["instance_type"], e["spot"], e["slots"], e["node_slots"]) == ("c6i.large", True, 1, 2)
        assert e["cpu_s"] >= BURN_S and e["peak_rss_mb"] >= HOLD_MB
        assert SLEEP_S + BURN_S <= e["seconds"] < 30 and e["ended_at"] > 0


def test_cost_by_job_is_each_attempts_seconds_times_half_a_node_times_the_spot_price(run):
    h, jobs = run
    out = cli(h, "cost", "--by", "job", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["schema"] == "tidefleet.cost/1" and doc["by"] == "job" and doc["currency"] == "USD"
    rows = {r["key"]: r for r in doc["rows"]}
    for name, job_id in jobs.items():
        seconds = recorded_seconds(h, job_id)
        assert rows[job_id]["attempts"] == len(seconds), name
        assert rows[job_id]["cost_usd"] == pytest.approx(sum(seconds) / 3600 * PRICE / 2, abs=1e-8), name
    # The measured job ran at least its known sleep and burn twice, on half a node each time.
    assert rows[jobs["measured"]]["node_hours"] >= 2 * (SLEEP_S + BURN_S) / 2 / 3600
    assert doc["total_usd"] == pytest.approx(sum(r["cost_usd"] for r in doc["rows"]), abs=1e-8)
    assert doc["unpriced"] == {} and "busy time only" in doc["idle"]


def test_cost_by_team_uses_the_queues_team_else_the_pools_and_by_user_the_cloud_identity(run):
    h, _ = run
    teams = {r["key"]: r["attempts"] for r in json.loads(cli(h, "cost", "--json").output)["rows"]}
    assert teams == {"infra": 3, "nlp": 1}
    (user,) = json.loads(cli(h, "cost", "--by", "user", "--json").output)["rows"]
    assert user["key"] == boto3.client("sts", region_name="us-east-1").get_caller_identity()["Arn"]
    assert user["attempts"] == 4


def test_cost_as_csv_and_text_and_monthly_show_the_same_numbers(run):
    h, _ = run
    as_json = json.loads(cli(h, "cost", "--by", "queue", "--json").output)
    as_csv = cli(h, "cost", "--by", "queue", "--csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert costs.IDLE_NOTE in as_csv.stderr, "what the CSV leaves out is said on stderr, the CSV left clean"
    assert [(r["queue"], float(r["cost_usd"])) for r in rows] == \
        [(r["key"], pytest.approx(r["cost_usd"], abs=1e-8)) for r in as_json["rows"]]  # fmt: skip
    monthly = list(csv.DictReader(io.StringIO(cli(h, "cost", "--by", "queue", "--monthly", "--csv").stdout)))
    assert {r["month"] for r in monthly} == {costs.datetime.now(costs.UTC).strftime("%Y-%m")}
    text = cli(h, "cost", "--by", "queue").output
    assert f"total ${as_json['total_usd']:,.4f} (USD, 4 attempt(s))" in text and costs.IDLE_NOTE in text
    header, first = text.splitlines()[:2]  # the columns named over the rows, aligned with them
    assert header.split() == ["queue", "cost", "(USD)", "node-hours", "attempts"], text
    assert header.index("(USD)") + len("(USD)") == first.index("$") + 13, text  # $ and 12 digits, right-aligned
    assert header.index("node-hours") + len("node-hours") == first.index(" node-h") + len(" node-h"), text
    assert header.index("attempts") == first.index("node-h  ") + len("node-h  "), text
    monthly_text = cli(h, "cost", "--by", "queue", "--monthly").output
    assert monthly_text.splitlines()[0].split()[:2] == ["month", "queue"], monthly_text


def test_since_leaves_out_attempts_that_ended_before_it(run):
    h, _ = run
    doc = json.loads(cli(h, "cost", "--since", "2999-01-01", "--json").output)
    assert doc["rows"] == [] and doc["total_usd"] == 0


@pytest.mark.parametrize("since", ["1000000000000d", "99999999999999999999d"])
def test_a_since_that_reaches_before_1970_is_all_of_it_not_a_traceback(run, since):
    """now - 1e12 days is before 1970: OSError (EOVERFLOW) there, OverflowError at 1e20 days."""
    h, _ = run
    out = cli(h, "cost", "--since", since, "--json")
    assert out.exit_code == 0 and out.output == cli(h, "cost", "--since", "all", "--json").output, out.output


def test_rightsize_reads_the_known_usage_and_flags_the_oom_kill_and_the_timeout(run):
    h, jobs = run
    out = cli(h, "rightsize", "--queue", "work", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["schema"] == "tidefleet.rightsize/1"
    (advice,) = doc["advice"]
    assert advice["scope"] == "queue work" and advice["attempts"] == 3 and advice["spot"] is True
    assert advice["measured"]["peak_rss_mb"] >= HOLD_MB
    assert advice["need"]["memory_mb"] == pytest.approx(advice["measured"]["peak_rss_mb"] * 1.2, abs=0.1)
    (now,) = advice["now"]
    assert (now["instance_type"], now["items_per_node"]) == ("c6i.large", 2)
    assert now["fits"]["items_per_node"] >= 1 and now["slots_per_unit"] == now["fits"]["items_per_node"]
    assert advice["spent_usd"] == pytest.approx(sum(recorded_seconds(h, jobs["measured"]) + recorded_seconds(
        h, jobs["killed"])) / 3600 * PRICE / 2, abs=1e-8)  # fmt: skip
    assert advice["saving_usd"] == pytest.approx(max(0, advice["spent_usd"] - advice["expected_usd"]), abs=1e-8)
    assert advice["hit_memory"] == ["big"] and advice["hit_time"] == []
    (slow,) = json.loads(cli(h, "rightsize", "--job", jobs["slow"], "--json").output)["advice"]
    assert slow["hit_time"] == ["slow"] and slow["scope"] == f"job {jobs['slow']}"
    text = cli(h, "rightsize", "--job", jobs["slow"]).output
    assert "hit their time limit: 1 item(s) (slow): raise the queue's item_timeout_s" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (("cost", "--since", "last week"), "--since: not a duration or a date (got 'last week')"),
        (("cost", "--by", "colour"), "Invalid value for '--by'"),
        (("rightsize", "--queue", "nope"), "queue: unknown queue 'nope'"),
        (("rightsize", "--job", "nope"), "job 'nope' not found"),
        (("rightsize", "--queue", "work", "--job", "x"), "--queue and --job: choose one"),
        (("cost", "--json", "--csv"), "--json and --csv: choose one"),
    ],
)
def test_bad_input_is_one_line_naming_the_option_and_the_fix(run, args, message):
    h, _ = run
    out = cli(h, *args)
    assert out.exit_code != 0 and message in out.output
    if args[0] == "cost" or "--job" in args and "--queue" in args:  # a usage error: exit 2, as any bad option's
        assert out.exit_code == 2, out.output


def test_an_unreachable_cloud_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    for command in ("cost", "rightsize"):
        out = CliRunner().invoke(main, [command, "--env", "sandbox"])
        assert out.exit_code == 1 and "Traceback" not in out.output
        assert out.output.startswith("Error: cannot reach AWS for 'sandbox'")


# -- the submitter ------------------------------------------------------------------------------
def test_a_submit_records_the_cloud_identity_as_the_submitter(run):
    h, jobs = run
    arn = boto3.client("sts", region_name="us-east-1").get_caller_identity()["Arn"]
    assert for_env(h.env).store.job(jobs["measured"]).submitter == arn


def test_without_a_cloud_identity_the_submitter_is_the_os_user_and_a_warning_says_so(monkeypatch, caplog):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("USER", "ana")
    monkeypatch.setenv("LOGNAME", "ana")
    with caplog.at_level(logging.WARNING, "tidefleet.jobs"):
        assert identity.submitter(for_env(load_environment("sandbox"))) == "os:ana"
    assert "could not read the aws caller identity" in caplog.text and "recording the submitter as os:ana" in caplog.text


GCP = load_environment("gcp-dev")


class ServiceAccount(AnonymousCredentials):
    service_account_email = "submitter@acme.iam.gserviceaccount.com"


@pytest.mark.parametrize(
    "creds, expected",
    [(ServiceAccount(), "submitter@acme.iam.gserviceaccount.com"), (AnonymousCredentials(), "os:ana")],
)
def test_on_gcp_the_submitter_is_the_application_default_account(monkeypatch, creds, expected):
    import google.auth

    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (creds, GCP.project))
    monkeypatch.setenv("USER", "ana")
    monkeypatch.setenv("LOGNAME", "ana")
    assert identity.submitter(for_env(GCP)) == expected


def test_the_readmes_cost_commands_run_as_written(run):
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("\n## What did it cost?\n", 1)[1].split("\n## ", 1)[0]
    commands = [line.split()[1:] for line in section.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()]
    assert [c[0] for c in commands] == ["cost", "cost", "rightsize"]
    h, _ = run
    prod = load_environment("prod")
    for args in commands:  # the harness's environment stands in for prod (the last --env wins)
        assert args[args.index("--env") + 1] == prod.name
        if "--queue" in args:  # one of prod's queues as written; the harness's own queue here
            at = args.index("--queue") + 1
            assert args[at] in prod.queues, (args[at], sorted(prod.queues))
            args = [*args[:at], "work", *args[at + 1:]]
        out = cli(h, *args)
        assert out.exit_code == 0 and "attempt" in out.output, (args, out.output)


def test_rightsize_says_how_much_of_its_saving_packing_the_same_type_gives():
    """The audit's case: 2 items per c6i.large where 22 fit, cheapest fit c6i.4xlarge: nearly all the
    saving was packing, which the line credited to the type change, and it printed $0.0000."""
    from tidefleet import rightsize
    from tidefleet.jobs.cost_cli import _advice_lines

    fits_now = rightsize.Fit("c6i.large", 22, 0.003864, "memory")
    best = rightsize.Fit("c6i.4xlarge", 177, 0.003842, "memory")
    advice = rightsize.Advice(
        scope="queue work", attempts=18, cores_p95=0.01, peak_rss_mb=50, gpu_util_pct=None, gpu_mem_peak_mb=None,
        need=rightsize.Need(0.05, 60, 0, 0), now=(rightsize.Now("c6i.large", 2, fits_now, 22),), best=best,
        spot=True, item_hours=0.005, spent_usd=0.005 * 0.0425, expected_usd=0.005 * 0.003842,
        hit_memory=(), hit_time=())  # fmt: skip
    (line,) = [x for x in _advice_lines(advice) if x.startswith("  cheapest fit")]
    assert line == ("  cheapest fit: c6i.4xlarge, 177 item(s) per node, $0.003842 per item-hour: $0.00001921 for the "
                    "same work, saving $0.0001933, of which $0.0001932 by packing c6i.large as it fits")  # fmt: skip
