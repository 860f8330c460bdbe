"""The workload of `tidefleet sandbox --train`: GPU items and a multi-node training item.

    python -m tidefleet.sandbox.train_work infer SECONDS EVENTS_FILE
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
    mode, amount, events = argv
    return infer(float(amount), Path(events)) if mode == "infer" else train(int(amount), Path(events))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
