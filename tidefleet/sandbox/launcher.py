"""The local node launcher: every in-service instance of a sandbox group becomes a real node.

The emulator's groups launch instances that are only records. This loop watches them and,
for each new one, after a short boot delay runs the instance's own user-data (the pool's
rendered template, read back from EC2) with bash as a local process group; its instance
metadata is served by `imds.MetadataServer`. An instance that leaves its group (the scaler
terminated it, or EC2 reclaimed it) gets the termination path a real node gets: the
lifecycle state turns to Terminated, the agent receives SIGTERM, and after a grace the
node's whole process tree is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tidefleet import lifeline
from tidefleet.cloud.aws.machines import EmulatedMachines
from tidefleet.config import Environment
from tidefleet.sandbox.imds import MetadataServer

log = logging.getLogger("tidefleet.sandbox.launcher")  # the sandbox writes it to launcher.log


@dataclass
class LocalNode:
    instance_id: str
    pool: str
    instance_type: str
    spot: bool
    seen_at: float  # the group reported it in service
    imds_url: str
    started_at: float | None = None  # its user-data started
    leaving_at: float | None = None  # it left the group; termination path under way
    gone_at: float | None = None  # every process of it has exited
    process: subprocess.Popen | None = None
    fate: str = ""  # "", "scaled in", "killed", "reclaimed"

    @property
    def state(self) -> str:
        if self.gone_at is not None:
            return "gone"
        if self.leaving_at is not None:
            return "terminating"
        return "booting" if self.started_at is None else "up"

    def seconds(self, now: float) -> float:
        return (self.gone_at or now) - self.seen_at


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, including workloads the agent put in their own group."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=5)


class Launcher:
    def __init__(
        self,
        env: Environment,
        imds: MetadataServer,
        *,
        workdir: Path,
        node_env: dict[str, str],
        boot_delay_s: float,
        grace_s: float,
        reclaim_after_s: float,
    ):
        self.env = env
        self.imds = imds
        self.workdir = workdir
        self.node_env = node_env
        self.boot_delay_s = boot_delay_s
        self.grace_s = grace_s
        self.reclaim_after_s = reclaim_after_s
        self.nodes: dict[str, LocalNode] = {}
        self.peak_nodes = 0
        self.in_service_count = 0  # instances the groups reported at the last look
        self._reclaims: dict[str, float] = {}  # instance id -> when EC2 takes it back
        self._lock = threading.Lock()
        self.machines = EmulatedMachines(env)
        self.error = ""  # the last round's failure, "" once a round goes through (shown in the view)

    # -- the loop -------------------------------------------------------------------------
    def step(self, now: float) -> None:
        """One look at the groups: start new nodes, boot due ones, terminate leavers, reap."""
        in_service = self.machines.in_service()
        self.in_service_count = len(in_service)
        with self._lock:
            for instance_id, (pool, instance_type) in in_service.items():
                if instance_id not in self.nodes:
                    spot = self.machines.is_spot(instance_id)
                    url = self.imds.add(
                        instance_id, instance_type, spot=spot, availability_zone=f"{self.env.region}a"
                    )
                    self.nodes[instance_id] = LocalNode(instance_id, pool, instance_type, spot, now, url)
            live = [n for n in self.nodes.values() if n.gone_at is None]
            self.peak_nodes = max(self.peak_nodes, len(live))
            for node in live:
                if node.leaving_at is None and node.instance_id not in in_service:
                    self._begin_termination(node, now, fate=node.fate or "scaled in")
                elif (
                    node.leaving_at is None
                    and node.started_at is None
                    and now - node.seen_at >= self.boot_delay_s
                ):
                    self._boot(node, now)
                elif node.leaving_at is not None:
                    self._finish_termination(node, now)
        for instance_id, due in list(self._reclaims.items()):
            if now >= due:
                del self._reclaims[instance_id]
                self.machines.reclaim(instance_id)

    def _boot(self, node: LocalNode, now: float) -> None:
        script = self.machines.user_data(node.instance_id)
        node_dir = self.workdir / "nodes" / node.instance_id
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "user-data.sh").write_text(script)
        env = {
            **self.node_env,
            "TIDEFLEET_IMDS_URL": node.imds_url,
            "TIDEFLEET_NODE_ID": node.instance_id,
            "TIDEFLEET_AGENT_WORK_DIR": str(node_dir / "work"),
            # The emulated driver's device count (`fake_nvidia_smi`), as the node's type has.
            "FAKE_GPUS": str(next((t.gpus for t in self.env.pools[node.pool].instance_types
                                   if t.type == node.instance_type), 0)),
        }
        tie, fds = lifeline.for_child()  # its agent ends with the sandbox, even a SIGKILLed one
        with open(node_dir / "console.log", "ab") as console:
            node.process = subprocess.Popen(
                ["bash", str(node_dir / "user-data.sh")],
                cwd=node_dir,
                env={**env, **tie},
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a node is killed as a whole
            )
        node.started_at = now

    def _begin_termination(self, node: LocalNode, now: float, *, fate: str) -> None:
        node.leaving_at = now
        node.fate = fate
        self.imds.set_target_lifecycle_state(node.instance_id, "Terminated")
        if node.process is not None and node.process.poll() is None:
            # The shutdown signal a real node's init sends; the agent hands its items back.
            os.killpg(node.process.pid, signal.SIGTERM)

    def _finish_termination(self, node: LocalNode, now: float) -> None:
        if node.process is None or node.process.poll() is not None or now - node.leaving_at >= self.grace_s:
            if node.process is not None:
                kill_tree(node.process.pid)
            node.gone_at = now
            self.imds.remove(node.instance_id)

    def run(self, stop: threading.Event, interval_s: float = 0.5) -> None:
        """Rounds until `stop`. A failed round (the emulator slow, restarting or gone) is one log
        line, and the next round tries again, as the control loop does: the thread never dies."""
        while not stop.is_set():
            try:
                self.step(time.time())
            except Exception as err:  # noqa: BLE001 - the next round retries; the view shows it
                error = " ".join(f"{type(err).__name__}: {err}".split())
                if error != self.error:  # once while it lasts, not twice a second
                    log.warning("launcher round failed, retrying: %s", error)
                self.error = error
            else:
                if self.error:
                    log.warning("launcher rounds go through again")
                self.error = ""
            stop.wait(interval_s)

    # -- chaos ----------------------------------------------------------------------------
    def kill(self, instance_id: str) -> None:
        """The node dies at once (SIGKILL to every process) and EC2 loses the instance."""
        with self._lock:
            node = self.nodes[instance_id]
            node.fate = "killed"
            if node.process is not None:
                kill_tree(node.process.pid)
            now = time.time()
            node.leaving_at = node.gone_at = now
            self.imds.remove(instance_id)
        self.machines.reclaim(instance_id)

    def send_spot_notice(self, instance_id: str) -> None:
        """The two-minute warning (shortened to `reclaim_after_s`), then EC2 reclaims the instance."""
        with self._lock:
            self.nodes[instance_id].fate = "reclaimed"
            self.imds.send_spot_notice(instance_id, in_s=self.reclaim_after_s)
            self._reclaims[instance_id] = time.time() + self.reclaim_after_s

    # -- views ----------------------------------------------------------------------------
    def snapshot(self) -> list[LocalNode]:
        with self._lock:
            return [LocalNode(**vars(n)) for n in self.nodes.values()]

    def node_seconds(self, now: float) -> float:
        with self._lock:
            return sum(n.seconds(now) for n in self.nodes.values())

    def shutdown(self) -> None:
        """Kill every node process (Ctrl-C, or the end of the run)."""
        with self._lock:
            for node in self.nodes.values():
                if node.process is not None:
                    kill_tree(node.process.pid)
                if node.gone_at is None:
                    node.gone_at = time.time()
