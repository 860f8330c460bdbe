"""Fair share on Philly: its 15 virtual clusters as 15 teams with quotas, against no quotas.

    python benchmarks/bench_teams.py [--window 2592000:3801600]

Replays the window of `traces/philly_2017_jobs.csv` on `environments/philly-teams.toml` (one pool
of 8-GPU nodes, max = the sum of the quotas) twice with the tidefleet policy: with its `[teams]`
quotas and without them (every queue of equal priority: agents take from the queues in file
order). Prints one Markdown table: per team, its quota, its work, its wait (p50 / p95) and the cost
of its work (its share of the lower bound) in both runs, then what each run paid beyond the teams'
work, then the totals. Default window: days 30-44, two weeks where demand exceeds the pool.
"""

from __future__ import annotations

import argparse
import time

from tidefleet.config import load_environment
from tidefleet.sim.bench import TRACES_DIR
from tidefleet.sim.run import simulate
from tidefleet.sim.trace import TraceError, load_trace, parse_window
from tidefleet.sim.words import too_long_line

DEFAULT_WINDOW = "2592000:3801600"  # days 30 to 44


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", default=DEFAULT_WINDOW, help="START:END seconds into the trace")
    try:
        window = parse_window(parser.parse_args().window)
    except TraceError as err:  # its message names --window, the value and the form
        parser.error(str(err))
    env = load_environment("philly-teams")
    items = load_trace(TRACES_DIR / "philly_2017_jobs.csv", window)
    started = time.perf_counter()
    runs = {
        "quotas": simulate(env, "gpu8", items, ["tidefleet"], by_team=True, window=window),
        "none": simulate(env.model_copy(update={"teams": {}}), "gpu8", items, ["tidefleet"], by_team=True, window=window),
    }  # fmt: skip
    rows = {label: {r.team: r for r in report.teams["tidefleet"]} for label, report in runs.items()}
    print("| team | quota | items | GPU-h of work | wait p50 / p95 h, quotas | wait p50 / p95 h, none | "
          "cost $, quotas | cost $, none |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for team, q in rows["quotas"].items():
        n = rows["none"][team]
        print(f"| {team} | {q.quota} | {q.items:,} | {q.slot_hours:,.0f} | {q.wait_p50_s / 3600:,.2f} / "
              f"{q.wait_p95_s / 3600:,.2f} | {n.wait_p50_s / 3600:,.2f} / {n.wait_p95_s / 3600:,.2f} | "
              f"{q.cost_usd:,.0f} | {n.cost_usd:,.0f} |")  # fmt: skip
    q, n = (runs[label].results[0] for label in ("quotas", "none"))
    # A team's cost is its work's (its share of the lower bound); the rest of what each run paid is no team's.
    rest = {label: runs[label].results[0].cost_usd - sum(r.cost_usd for r in rows[label].values()) for label in runs}
    print(f"| (no team: idle nodes, unused slots, boots) | | | | | | {rest['quotas']:,.0f} | {rest['none']:,.0f} |")
    print(f"| all | {env.pools['gpu8'].max} GPUs (pool max) | {q.items_finished + q.items_unfinished:,} | | "
          f"{q.wait_s['p50'] / 3600:,.2f} / {q.wait_s['p95'] / 3600:,.2f} | "
          f"{n.wait_s['p50'] / 3600:,.2f} / {n.wait_s['p95'] / 3600:,.2f} | {q.cost_usd:,.0f} | {n.cost_usd:,.0f} |")
    if left_out := too_long_line(runs["quotas"].too_long):  # the items the rows count are those replayed
        print(f"\n{left_out}")
    print(f"\n{time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
