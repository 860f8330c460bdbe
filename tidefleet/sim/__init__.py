"""Trace replay: what a pool would cost and how long items would wait, per scaling policy.

`tidefleet simulate TRACE.csv --env ENV --pool POOL --policy NAME ...` replays a workload
trace (schema in traces/README.md) through a discrete-event model of one pool.

The model
- An item needs `gpus` slots (1 when CPU-only) on one node; on a `capacity_unit = "vcpus"`
  pool it needs its `cpus` rounded up (1 where the trace has none). It joins the pool's queue with
  the smallest `slots_per_item` that holds it (else the largest) and takes
  max(gpus, that queue's slots_per_item) slots. Items larger than the pool's biggest node
  run only as gangs (below); where the pool has no gang queue, or the item spans more nodes than
  its largest gang queue's max or the pool's max, they are reported under `unfittable`, not replayed.
- An item that runs longer than its queue's `item_timeout_s` is reported under `too_long`, not
  replayed: the agent kills an attempt at the timeout and counts it failed, so deployed as
  configured it would fail `max_retries + 1` attempts and be dead-lettered, never done.
- Gangs (`Queue.nodes_per_item`): an item larger than a node (any item, where only gang queues
  feed the pool) goes to the gang queue with the smallest max that holds the nodes it spans
  (ceil(gpus / node slots)) and runs as that queue's gang, one member per whole node. A wholly
  free node that receives it leads the pool's one forming gang; other nodes join it, once wholly
  free, before they receive anything (the next gang item waits for it to fill); it starts all at
  once at `min` members. The members are billed and protected while it forms, and that time
  counts as idle. One short of `min` 600 s after its lead received it (torchrun's rendezvous
  join_timeout) lets its item go back to the head of its queue, not as an attempt. An elastic
  gang takes free nodes up to `max` while it runs, with no restart pause, and its duration does
  not depend on its members. A spot notice stops a member at once: a fixed gang stops whole, an
  elastic one runs on while `min` members remain; a stopped gang goes back whole as one
  interruption (one receive) and resumes from its checkpoint (no work redone). The scaler counts
  a gang item as its `max` nodes' worth (`tidefleet.policy.demand.gang_counts`), and so do the baselines.
- Nodes are the pool's instance types with `Pool.slots(type)` slots. The group launches
  the type with the lowest spot $/unit among those that fit the trace's largest item,
  on demand for the on-demand base and `on_demand_percent` above it, spot otherwise.
  Prices are `InstanceType.price(spot)` (config, else tidefleet.prices). A node is billed
  per second from launch to termination.
- Boot (launch to a usable OS and the agent's first heartbeat) and spot notice, defaults
  from the traces README: AWS 45 s boot, 120 s notice; GCP 35 s boot, 30 s notice
  (`--boot-s`, `--notice-s`). The submit kick reaches the scaler 2 s after a submit.
- The worker agent pulls (`tidefleet.agent.worker`): a node with free slots receives from
  its queues by priority (the environment file's order among equals), from each the oldest
  items while they fit its free slots; an item that arrives goes to any one node with room
  (a seeded uniform pick: SQS hands a message to whichever receiver it picks), never a best
  fit. So small items take the slots a wide item waits for, and nodes fragment as real ones
  do. A cordoned node and, on a spot notice, a draining one take no more items; items that
  end before the reclaim finish, the others are lost when the node goes.
- Lost work: an item whose node is reclaimed or terminated under it goes back to the head
  of its queue at once and is redone from scratch (trace items do not checkpoint);
  the time it had run counts as `work_redone_s`. Every policy shares this agent. Each
  attempt is a receive: after the queue's `max_receive_count` (config: retries + 1 +
  interruptions tolerated) the redrive policy dead-letters the item (`items_dead_lettered`,
  also counted in `items_unfinished`), so a policy that keeps killing it cannot loop forever.
- The group: when a policy lowers desired below the nodes it has, the group removes
  victims itself (default termination policy: effectively a seeded random pick) among
  nodes without scale-in protection: busy ones too, which interrupts their items
  (`busy_items_killed_by_scale_in`). Reclaimed spot capacity is replaced up to desired.
  A spot launch the market refuses is retried every 60 s and recorded as a spot failure.
- Spot interruptions: `--interruption-rate R` gives each spot node Poisson notices at R
  per node-hour; `--spot-trace FILE` (skypilot-org/spot-traces JSON, repeated over the
  run) interrupts that share of spot nodes whenever the level falls, and refuses spot
  launches while it is zero. With neither, spot is never interrupted.
- Deterministic: events are ordered by (time, sequence); random picks use generators
  seeded from `seed` (one for the market and the group, one for placement).
- The run ends when every item is done and the pool is back at min (or 6 h later, the
  remaining nodes billed to then), when work waits with nothing running for 7 days, or at
  last submit + 2 x the longest item + 7 days (work that keeps being lost); what is left
  counts as `items_unfinished`.

Policies
- `tidefleet`: the real `tidefleet.control.tick` (observe, `tidefleet.policy.decide`, act) at
  `scaler.tick_s`, on each submit kick and on a spot notice while there is backlog, against
  the ports of `tidefleet.sim.ports`: the group lists every node in service, the job store
  holds a heartbeat per booted node (so a node noticed before its first heartbeat looks
  booting, as on AWS). Busy nodes are protected.
  Each queue's mean item time is the job store's EWMA over the items finished so far in the
  run (as the agents record it), never the trace's durations of items still to finish.
- `target-tracking`: AWS target tracking on backlog per instance (visible / in-service
  instances), target one queued item per slot of an instance; out after 3 one-minute
  datapoints above target, in after 15 below, to ceil(instances x metric / target), 300 s
  cooldown; a separate alarm sets one node when the queue has items and none is in service.
  No scale-in protection.
- `clearml`: every 5 min launch one instance per queued item minus idle and booting ones;
  terminate instances idle for 15 min.
  (These two count a queued gang item as its max nodes' worth, and a forming gang's missing
  members as queued: it holds its message in flight, where they do not look.)
- `keda`: ScaledObject, aws-sqs-queue scaler defaults: ceil((visible + in flight) / 5)
  replicas per queue (a gang queue: its messages x the gang's max, each a whole node), polled every 30 s, HPA scale-down stabilization 300 s,
  cooldownPeriod 300 s before scaling to zero; a replica is one worker slot and nodes
  follow replicas; no maxReplicaCount cap beyond the pool's max. The HPA's victims are any
  pods, so scale-in kills running items (ScaledJob would not, but is not the default).
- `oracle`: the lower bound: the work itself (duration x slots, x a gang's min members) at the pool's cheapest
  spot $/slot-hour, no boot, no idle, no wait. Beside it, the zero-wait bound
  (`run.zero_wait_bound`): less than any clairvoyant schedule pays that starts every item at its
  submit, with whole nodes (of the pool's smallest size) and a billed boot or idle bridge for every
  node it adds. A policy that lets items wait can pay less than it; one that does not, cannot.

Metrics and the `--json` schema (`"schema": "tidefleet.sim/1"`, stable; fields are only added)
    trace, env, pool: the inputs; window: [start, end|null] or null; seed; boot_s; notice_s;
    interruption_rate_per_hour; spot_trace (file name or null);
    items: rows read (after the window); unfittable: {count, largest_node_slots, most_nodes
      (an item may span: > 1 only with a gang queue), by_slots: {"<slots>": count}, work_s};
    gangs: the items replayed as gangs: {count, by_nodes: {"<nodes spanned>": count}, work_s};
    too_long: the items longer than their queue's item_timeout_s, not replayed: {count, by_queue:
      {"<queue>": {count, item_timeout_s, longest_s}}, work_s, attempts, attempts_usd} (the attempts
      they would run deployed as is, each killed at the timeout, and their slot-hours at the lower
      bound's $/slot-hour);
    lower_bound_usd: the oracle's cost; zero_wait_usd: the zero-wait bound (see `oracle` above);
    results: one per policy, in the order asked, then one per --target-wait-s (policy
      "tidefleet, target_wait_s=<N>"):
      policy, cost_usd, node_hours, idle_node_hours (node time with no item running,
      boot included), wait_s: {p50, p95, p99, max} (submit to first start, nearest-rank;
      an item never started counts until the run's end), makespan_s (first submit to last
      finish), items_finished, items_unfinished, items_interrupted (attempts lost),
      items_dead_lettered, work_redone_s, busy_items_killed_by_scale_in, spot_launch_failures, peak_nodes
      (the oracle's: its most slots running at once over the slots of a node of the type it bills, rounded up),
      lower_bound_usd, cost_vs_lower_bound, cost_vs_zero_wait.
    teams (with by_team; per policy but the oracle): one per team, most work first: team, quota
      (the binding limit in words, "-" without one), quota_slots, weight, items, slot_hours,
      wait_p50_s, wait_p95_s, cost_usd (its items' share of node bills while they ran).
"""

from tidefleet.sim.engine import Interruptions, Simulation, Timing
from tidefleet.sim.run import Report, simulate
from tidefleet.sim.trace import TraceError, TraceItem, load_trace

__all__ = [
    "Interruptions",
    "Report",
    "Simulation",
    "Timing",
    "TraceError",
    "TraceItem",
    "load_trace",
    "simulate",
]
