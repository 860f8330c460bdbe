"""The alarms every environment gets, on both clouds: what each means and what to do first.

The AWS and GCP stacks build theirs from this table (the text becomes each alarm's description
or documentation), and the README's "Alarms and dashboard" table lists the same rows (a test
compares them). `clouds` names where the signal exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidefleet.policy.faults import FAULTS_IN_A_ROW, RETRY_AFTER_S

# An item failure rate above this, over at least MIN_ATTEMPTS finished attempts in 15 minutes.
FAILURE_RATE_PERCENT = 20
MIN_ATTEMPTS = 5
# The scaler's tick is slow when it uses this share of its timeout.
SLOW_TICK_SHARE = 0.8
# Minutes in a row in which the scaler was throttled and no run of it started.
UNSERVED_MINUTES = 15


@dataclass(frozen=True)
class Runbook:
    meaning: str
    first_action: str
    clouds: tuple[str, ...] = ("aws", "gcp")

    def text(self) -> str:
        return f"{self.meaning}. First: {self.first_action}."


RUNBOOKS = {
    "dead-letters": Runbook(
        "items of the queue ran out of retries (or were not items) and sit in its dead-letter queue",
        "`tidefleet status --env E JOB --failed` for the reasons; fix, then `tidefleet retry-failed`"),
    "failure-rate": Runbook(
        f"more than {FAILURE_RATE_PERCENT} % of the queue's finished attempts failed in 15 minutes",
        "`tidefleet logs --env E JOB ITEM` of a failed item: a bad image, input or workload release"),
    "oldest-item": Runbook(
        "an item has waited longer than the queue's `max_wait_s`",
        "`tidefleet tick --env E --dry-run`: the reasons say cap, spot shortage or boot failures"),
    "scaler-errors": Runbook(
        "control ticks failed (the next tick retries): one that could not read the groups changed nothing; one whose "
        "line starts `some pools could not be read` left out the pools whose heartbeats or one of whose queues it "
        "could not read and scaled the others; one whose line starts `some actions failed` still made its other "
        "changes, and one whose "
        "line starts `some job-store reads failed` still scaled, without those reads (no hold, release or preemption "
        "changed); `some actions and job-store reads failed` is both",
        "the scaler function's log: its last error line names each refused action and each job-store read the tick "
        "went without"),
    "scaler-throttles": Runbook(
        f"for {UNSERVED_MINUTES} minutes the scaler was throttled and started no run: nothing ticks "
        "(kicks throttled during a run are normal)",
        "the scaler function's reserved concurrency (1; at 0 it never runs), then the account's "
        "concurrent-executions limit", ("aws",)),
    "scaler-duration": Runbook(
        f"a run of the scaler (ticks for up to a minute while items wait) used more than {round(SLOW_TICK_SHARE * 100)} % "
        "of the function's timeout",
        "the scaler's log line `ms` (its slowest tick): a slow cloud API or a very large fleet; a run short of time acts "
        "on no more pools than its time holds and names the rest in one line (`skipped`, `out_of_time`), which the next "
        "tick acts on first"),
    "interruption-errors": Runbook(
        "the interruption function failed on spot notices or lifecycle hooks",
        "its log; nodes then drain only when their own agent sees the notice", ("aws",)),
    "spot-launch-failures": Runbook(
        "the group could not launch spot capacity (no capacity or price above the cap)",
        "add instance types or zones to the pool, or raise `spot_max_price`"),
    "on-demand-fallback": Runbook(
        "spot is short, so the scaler buys on-demand above the pool's base (it costs more)",
        "nothing if brief; if it lasts, add instance types or zones to the pool"),
    "stuck-booting": Runbook(
        "nodes launched longer ago than `boot_timeout_s` and their agent never reported",
        "a node's console output / boot log: image, `init_script`, or no route to the artifacts bucket"),
    "silent-nodes": Runbook(
        "running nodes whose agent stopped sending heartbeats (they are replaced after the boot timeout; "
        "a drain hook holding one releases it at once)",
        "the node's agent log (journalctl -u tidefleet-agent): a crashed agent or a lost network"),
    "launches-held": Runbook(
        f"{FAULTS_IN_A_ROW} or more of the pool's nodes in a row said at start they cannot run items (GPUs unusable, "
        "docker down, the item user missing) and no healthy node came since: the pool's launches are held (none "
        f"until the newest fault is {RETRY_AFTER_S // 60} minutes old, then one node at a time), so its items wait",
        "`tidefleet nodes --env E` shows each node's fault; fix the image (AMI), GPU driver, docker or item user and "
        "redeploy; launches resume by themselves once a node runs items"),
    "cost-over-cap": Runbook(
        "the nodes cost more per hour than the environment's (or the pool's) `cost_cap_usd_per_hour`",
        "`tidefleet nodes --env E`: prices changed or on-demand fallback; lower `max` or raise the cap"),
}
