"""`tidefleet sandbox --train`: GPU items and a multi-node training item on the sandbox.

Runs on an environment whose pools run `tidefleet.sandbox.train_work` (`environments/sandbox-train.toml`):
GPU items that share nodes, each on devices of its own, and one gang item. Once the gang runs, the
non-lead node gets a spot notice. The summary checks, from the workload's own events and the job
store: items that ran at once on one node saw disjoint GPUs; the gang started on distinct nodes
with one rendezvous at the lead; the notice sent it back whole, once, not as a failure; the next
attempt resumed from the saved step; it succeeded once; the fleet went back to zero.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tidefleet import costs
from tidefleet.cloud import for_env
from tidefleet.config import Environment
from tidefleet.jobs import sdk
from tidefleet.sandbox.run import Sandbox

WORKLOAD = "tidefleet.sandbox.train_work"
INFER_S = 4.0  # how long each GPU item holds its devices: long enough to overlap on a node
STEPS = 400  # the training item's steps (train_work.STEP_S each: about 20 s)
NOTICE_AFTER_S = 2.0  # of the gang's running time, before the notice: it has steps to save


class NotATrainingEnvironment(Exception):
    """The environment lacks what the scenario needs; says what."""


@dataclass(frozen=True)
class Queues:
    infer: str
    train: str

    @classmethod
    def of(cls, env: Environment) -> Queues:
        """Its GPU item queue and its gang queue, both on pools that run the scenario's workload."""
        ours = {n: q for n, q in env.queues.items() if WORKLOAD in (env.pools[q.pool].command or "")}
        gangs = [n for n, q in ours.items() if q.gang[1] > 1]
        gpu_items = [n for n, q in ours.items() if q.gang[1] == 1 and any(t.gpus for t in env.pools[q.pool].instance_types)]
        if not gangs or not gpu_items:
            raise NotATrainingEnvironment(
                f"{env.name}: --train needs a queue with nodes_per_item > 1 and a GPU queue, on pools whose command "
                f"runs {WORKLOAD} (got gang queues {gangs or 'none'}, GPU queues {gpu_items or 'none'}); "
                "use --env sandbox-train")  # fmt: skip
        return cls(gpu_items[0], gangs[0])


@dataclass
class TrainingSummary:
    gpu_items: int
    gpu_items_succeeded: int
    overlapping_pairs: int  # GPU items that ran at the same time on the same node
    devices_disjoint: bool  # every such pair saw different GPUs
    gang_size: int  # the nodes the gang queue's item needs (nodes_per_item)
    gang_nodes: int  # nodes of the gang's first attempt
    ranks_on_distinct_nodes: bool  # gang_size ranks, each on a node of its own
    rendezvous_ok: bool  # every attempt's rank 0 was reached by every other rank
    billed_nodes: list[int]  # per attempt that ran, the nodes `tidefleet cost` bills: the lead's entry, the members' parts
    noticed_node: str
    interruptions: int
    failures: int
    resumed_from: int  # the step the second attempt started at
    succeeded_once: bool
    fleet_at_zero: bool
    time_limit_hit: bool
    wall_s: float
    workdir: str
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.gpu_items_succeeded == self.gpu_items and self.overlapping_pairs > 0 and self.devices_disjoint
                and self.gang_nodes == self.gang_size and self.ranks_on_distinct_nodes and self.rendezvous_ok
                and self.billed_nodes == [self.gang_size] * (self.interruptions + 1)
                and bool(self.noticed_node) and self.interruptions == 1 and self.failures == 0
                and self.resumed_from > 0 and self.succeeded_once and self.fleet_at_zero
                and not self.time_limit_hit)  # fmt: skip

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, indent=2, sort_keys=True)

    def rows(self) -> list[tuple[str, str]]:
        def yes(flag: bool) -> str:
            return "yes" if flag else "NO"

        return [
            ("GPU items succeeded", f"{self.gpu_items_succeeded} of {self.gpu_items}"),
            ("GPU items side by side on a node", f"{self.overlapping_pairs} pair(s); disjoint GPUs: {yes(self.devices_disjoint)}"),
            ("gang: nodes, distinct ranks, rendezvous",
             f"{self.gang_nodes} of {self.gang_size}, {yes(self.ranks_on_distinct_nodes)}, {yes(self.rendezvous_ok)}"),
            ("gang nodes billed, per attempt", ", ".join(f"{n} of {self.gang_size}" for n in self.billed_nodes) or "none"),
            ("spot notice sent to", self.noticed_node or "NO ONE"),
            ("gang handed back / failed", f"{self.interruptions} / {self.failures}"),
            ("resumed from step", str(self.resumed_from)),
            ("training succeeded once", yes(self.succeeded_once)),
            ("fleet back at zero", yes(self.fleet_at_zero)),
            # Cut short, every NO above may be the limit's, not a fault: say so, as the exit status 2 does.
            ("time limit (--time-limit) hit", "YES: the run was cut short" if self.time_limit_hit else "no"),
            # The progress lines count from the command's start (as --time-limit does), before the sandbox came up.
            ("wall time, sandbox up to the end", f"{self.wall_s:.1f}s"),
        ]


def run_training(sandbox: Sandbox, *, deadline: float, on_progress: Callable[[dict], None]) -> TrainingSummary:
    started = time.time()
    env, store = sandbox.env, for_env(sandbox.env).store
    queues = Queues.of(env)
    events = sandbox.workdir / "train-events.jsonl"
    pool = env.pools[env.queues[queues.infer].pool]
    node_slots = max(pool.slots(t) for t in pool.instance_types)
    n_gpu_items = 2 * max(1, node_slots // env.queues[queues.infer].slots_per_item)  # two nodes' worth
    gpu_job = sdk.submit(env, "sandbox-gpu-items", queues.infer,
                         [sdk.ItemSpec(f"gpu-{i}", ["infer", str(INFER_S), str(events)]) for i in range(n_gpu_items)])  # fmt: skip
    train_job = sdk.submit(env, "sandbox-training", queues.train, [sdk.ItemSpec("train", ["train", str(STEPS), str(events)])])
    noticed, gang_running_since, done_at, zero_at = "", None, None, None
    while time.time() < deadline:
        now = time.time()
        train = sdk.status(env, train_job.job_id, items=True)
        gpu = sdk.status(env, gpu_job.job_id, items=True)
        if not noticed:
            item = store.item(train_job.job_id, "train")
            ranks = {e["rank"] for e in _events(events, "start") if e["attempt"] == 1}
            if item is not None and item.gang == "running" and len(ranks) >= 2:
                gang_running_since = gang_running_since or now
                if now - gang_running_since >= NOTICE_AFTER_S and len(item.members) > 1:
                    noticed = item.members[1]["node"]
                    sandbox.launcher.send_spot_notice(noticed)
        if train.done and gpu.done and done_at is None:
            done_at = now
        on_progress({"status": both(gpu, train), "queues": sandbox.queue_depths(), "job": train_job.job_id})
        if done_at is not None and sandbox.fleet_at_zero():
            zero_at = now
            break
        time.sleep(0.5)
    item, job = store.item(train_job.job_id, "train"), store.job(train_job.job_id)
    charged = costs.charges(env, job, [item], parts=store.parts(job.job_id)) if item and job else []  # what `cost` bills
    return _summarise(sandbox, events, item, gpu, noticed, started, zero_at, gang_size=env.queues[queues.train].gang[1],
                      charged=charged)  # fmt: skip


def both(gpu: sdk.JobStatus, train: sdk.JobStatus) -> sdk.JobStatus:
    """The scenario's two jobs as one for the progress view, so its 'N/M final' counts every item
    submitted, as its 'waiting' (the queues' depths) does."""
    counts = {state: n + gpu.counts.get(state, 0) for state, n in train.counts.items()}
    job = replace(train.job, job_id=f"{gpu.job.job_id} + {train.job.job_id}", total=gpu.job.total + train.job.total)
    return replace(train, job=job, counts=counts, items=[*gpu.items, *train.items])


def _events(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["event"] == kind]


def _summarise(sandbox: Sandbox, events: Path, train_item, gpu: sdk.JobStatus, noticed: str, started: float,
               zero_at: float | None, *, gang_size: int, charged: list[costs.Charge]) -> TrainingSummary:  # fmt: skip
    runs = _events(events, "gpu")
    pairs = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
             if a["node"] == b["node"] and a["start"] < b["end"] and b["start"] < a["end"]]  # fmt: skip
    disjoint = all(not set(a["devices"].split(",")) & set(b["devices"].split(",")) for a, b in pairs)
    starts = _events(events, "start")
    first = [e for e in starts if e["attempt"] == 1]
    rendezvous = {e["attempt"]: e["peers"] for e in _events(events, "rendezvous")}
    # Against the gang's size, not the ranks that started: a lone rank 0 meets no one and would pass.
    rendezvous_ok = bool(rendezvous) and all(peers == list(range(1, gang_size)) for peers in rendezvous.values())
    later = [e["resumed_from"] for e in starts if e["attempt"] > 1]
    done_by_lead = [e for e in _events(events, "done") if e["rank"] == 0]
    billed = [c.entry for c in charged]
    billed_nodes = [len({e["node"] for e in billed if e["attempt"] == a}) for a in sorted({e["attempt"] for e in billed})]
    notes = [] if sandbox.tick_error == "" else [f"scaler error: {sandbox.tick_error}"]
    return TrainingSummary(
        gpu_items=len(gpu.items),
        gpu_items_succeeded=sum(1 for i in gpu.items if i.status == "succeeded"),
        overlapping_pairs=len(pairs),
        devices_disjoint=disjoint,
        gang_size=gang_size,
        gang_nodes=len(first),
        ranks_on_distinct_nodes=len(first) == len({e["node"] for e in first}) == len({e["rank"] for e in first}) == gang_size,
        rendezvous_ok=rendezvous_ok,
        billed_nodes=billed_nodes,
        noticed_node=noticed,
        interruptions=train_item.interruptions if train_item else 0,
        failures=train_item.failures if train_item else 0,
        resumed_from=min(later) if later else 0,
        succeeded_once=bool(train_item and train_item.status == "succeeded" and len(done_by_lead) == 1),
        fleet_at_zero=zero_at is not None,
        time_limit_hit=zero_at is None,
        wall_s=round(time.time() - started, 1),
        workdir=str(sandbox.workdir),
        notes=notes,
    )
