"""The workload of `tidefleet sandbox --train`: GPU items and a multi-node training item.

    python -m tidefleet.sandbox.train_work infer SECONDS EVENTS_FILE    (--help explains them)
        holds its GPUs SECONDS and records which ones it saw (CUDA_VISIBLE_DEVICES)
    python -m tidefleet.sandbox.train_work train STEPS EVENTS_FILE
        one node's part of a gang: checks its rank environment, meets the other nodes at
        MASTER_ADDR:MASTER_PORT (rank 0 serves, the others connect, as torch.distributed's TCP
        store does), then steps; on a stop every rank leaves, rank 0 having saved the step in the
        checkpoint the gang shares, and every rank of the next attempt resumes there

Each event is a JSON line in EVENTS_FILE: the sandbox's own evidence, apart from the job store.
Standard library and the agent's checkpoint API only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from tidefleet.agent import checkpoint

STEP_S = 0.05
RENDEZVOUS_S = 60.0
GANG_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "TIDEFLEET_NNODES")
USAGE = "usage: python -m tidefleet.sandbox.train_work {infer SECONDS | train STEPS} EVENTS_FILE"
HELP = f"""{USAGE}

The workload of `tidefleet sandbox --train` (environments/sandbox-train.toml), run by the agent
with an item's args; each event is a JSON line appended to EVENTS_FILE (created if missing).

  infer SECONDS EVENTS_FILE  a GPU item: holds its GPUs SECONDS (a number, 0 or more) and records
                             which ones it saw (CUDA_VISIBLE_DEVICES)
  train STEPS EVENTS_FILE    one node's part of a gang (a queue with nodes_per_item > 1, whose
                             agent sets MASTER_ADDR, MASTER_PORT, NODE_RANK, TIDEFLEET_GANG_NODES):
                             meets the other nodes at MASTER_ADDR:MASTER_PORT, then runs STEPS
                             steps (a whole number, 0 or more) of {STEP_S} s; on a stop, rank 0 saves
                             the step in the gang's checkpoint and the next attempt resumes there

Exit 0: done; 2: bad arguments; 75: interrupted (checkpointed)."""


def _arguments(argv: list[str]) -> tuple[str, float | int, Path] | str:
    """(mode, SECONDS or STEPS, EVENTS_FILE), or the one line that says what is wrong with them."""
    if len(argv) != 3:
        return f"train_work: takes 3 arguments, infer SECONDS or train STEPS, then EVENTS_FILE (got {len(argv)}); {USAGE}"
    mode, amount, events = argv
    if mode not in ("infer", "train"):
        return f"train_work: the first argument is infer or train (got {mode!r}); {USAGE}"
    try:
        value = float(amount) if mode == "infer" else int(amount)
    except ValueError:
        value = -1
    if not 0 <= value < float("inf"):
        what = "SECONDS must be a number of seconds" if mode == "infer" else "STEPS must be a whole number"
        return f"train_work: {what}, 0 or more (got {amount!r}); {USAGE}"
    if mode == "train" and (unset := [k for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "TIDEFLEET_GANG_NODES")
                                      if not os.environ.get(k)]):  # fmt: skip
        return (f"train_work: train runs as one node of a gang, and {', '.join(unset)} {'is' if len(unset) == 1 else 'are'} "
                "not set; run it as an item of a queue with nodes_per_item > 1, whose agent sets them")
    return mode, value, Path(events)


def record(events: Path, event: str, **fields) -> None:
    line = json.dumps({"event": event, "item": os.environ.get("TIDEFLEET_ITEM_ID", ""), "attempt": checkpoint.attempt(),
                       "node": os.environ.get("TIDEFLEET_NODE_ID", ""), "at": time.time(), **fields})  # fmt: skip
    fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # one write per line: never interleaved
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def infer(seconds: float, events: Path) -> int:
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    start = time.time()
    print(f"sees GPUs {devices}", flush=True)
    time.sleep(seconds)
    record(events, "gpu", devices=devices, start=start, end=time.time())
    return 0


def rendezvous(rank: int, nodes: int, addr: str, port: int) -> list[int]:
    """Rank 0: the other ranks that reached it; the others: [] once they reached rank 0."""
    deadline = time.monotonic() + RENDEZVOUS_S
    if rank == 0:
        with socket.create_server((addr, port)) as server:
            server.settimeout(RENDEZVOUS_S)
            peers = []
            for _ in range(nodes - 1):
                conn, _ = server.accept()
                with conn:
                    peers.append(int(conn.recv(16)))
            return sorted(peers)
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1) as conn:
                conn.sendall(str(rank).encode())
            return []
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"rank {rank}: could not reach rank 0 at {addr}:{port} in {RENDEZVOUS_S:.0f}s")


def train(steps: int, events: Path) -> int:
    env = {k: os.environ.get(k, "") for k in GANG_VARS}
    rank, nodes = int(env["NODE_RANK"]), int(os.environ["TIDEFLEET_GANG_NODES"])
    saved = checkpoint.load("step")
    start = int(saved) if saved else 0
    record(events, "start", rank=rank, nodes=nodes, env=env, resumed_from=start)
    print(f"node rank {rank} of {nodes}, world size {env['WORLD_SIZE']}, from step {start}", flush=True)
    peers = rendezvous(rank, nodes, env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    if rank == 0:
        record(events, "rendezvous", peers=peers)
    for step in range(start, steps):
        if checkpoint.should_stop():
            if rank == 0:
                checkpoint.save("step", str(step))
                record(events, "checkpoint", rank=rank, step=step)
            checkpoint.exit_interrupted()
        time.sleep(STEP_S)
    if rank == 0:
        checkpoint.complete()
    record(events, "done", rank=rank)
    return 0


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    if isinstance(parsed := _arguments(argv), str):
        print(parsed, file=sys.stderr)
        return 2
    mode, amount, events = parsed
    return infer(amount, events) if mode == "infer" else train(amount, events)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
