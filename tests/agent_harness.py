"""Test harness for the agent and job SDK: an environment file in tmp_path, its resources on
the moto server, a local instance-metadata server, real agent processes, and a workload that
records every start and finish in a ledger file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import psutil

from tidefleet import naming
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import Environment, load_environment

WORKLOAD = r'''
import json, os, pathlib, signal, sys, time, urllib.parse
from tidefleet.agent import checkpoint

args = dict(a.split("=", 1) for a in sys.argv[1:])
item, attempt = os.environ["TIDEFLEET_ITEM_ID"], checkpoint.attempt()
saved = pathlib.Path(urllib.parse.urlparse(checkpoint.checkpoint_uri()).path) / "progress"
start = int(saved.read_text()) if saved.exists() else 0

def record(event, **extra):
    with open(os.environ["LEDGER"], "a") as f:
        f.write(json.dumps({"event": event, "job": os.environ["TIDEFLEET_JOB_ID"], "item": item, "attempt": attempt,
                            "pid": os.getpid(), **extra}) + "\n")

record("start", resumed_from=start)
print(f"item {item} attempt {attempt} job {os.environ['TIDEFLEET_JOB_ID']} from step {start}", flush=True)
if "fail_until" in args and not os.path.exists(args["fail_until"]):
    print("not yet", flush=True)
    sys.exit(3)
if args.get("hang"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
for step in range(start, int(args.get("steps", 0))):
    if checkpoint.should_stop():
        saved.write_text(str(step))
        record("checkpoint", step=step)
        checkpoint.exit_interrupted()
    time.sleep(0.1)
record("done")
sys.exit(int(args.get("exit", 0)))
'''

ENV_TOML = """
region = "us-east-1"

[pools.cpu]
max = 4
command = "{python} {workload}"
slots_per_unit = 2
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.work]
pool = "cpu"
priority = 10
max_retries = {max_retries}
item_timeout_s = 60
accept_commands = ["{python} *"]

[queues.short]
pool = "cpu"
priority = 1
max_retries = 0
item_timeout_s = 2
"""


class Harness:
    def __init__(self, tmp_path: Path, aws, *, max_retries: int = 2, visibility_s: int = 30,
                 env_toml: str = ENV_TOML, workload: str = WORKLOAD, pool: str = "cpu"):  # fmt: skip
        """`env_toml`: an environment with {python}, {workload}, {ledger} and {max_retries} to fill in."""
        self.tmp, self.aws, self.pool = tmp_path, aws, pool
        self.ledger = tmp_path / "ledger.jsonl"
        workload_file = tmp_path / "workload.py"
        workload_file.write_text(workload)
        self.env_path = tmp_path / "t.toml"
        self.env_path.write_text(env_toml.format(python=sys.executable, workload=workload_file, ledger=self.ledger,
                                                 max_retries=max_retries))
        self.env: Environment = load_environment(str(self.env_path))
        self.agents: list[subprocess.Popen] = []
        # The sandbox's resources, with a short visibility so a lost message comes back within a test.
        provision(self.env, user_data={name: "" for name in self.env.pools}, visibility_timeout_s=visibility_s)

    def start_agent(self, node_id: str, imds_url: str = "http://127.0.0.1:9", **extra_env) -> subprocess.Popen:
        log = open(self.tmp / f"agent-{node_id}.log", "ab")  # noqa: SIM115 - the child owns it while it runs
        env = {
            **os.environ, **self.aws.env(),
            "TIDEFLEET_NODE_ID": node_id, "TIDEFLEET_IMDS_URL": imds_url,
            "TIDEFLEET_CHECKPOINT_ROOT": str(self.tmp / "checkpoints"),
            "TIDEFLEET_AGENT_WORK_DIR": str(self.tmp / "work" / node_id),
            "TIDEFLEET_AGENT_HEARTBEAT_S": "0.5", "TIDEFLEET_IMDS_POLL_S": "0.3",
            "TIDEFLEET_AGENT_GRACE_S": "5", "TIDEFLEET_AGENT_WAIT_S": "1",
            **extra_env,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidefleet.cli", "agent", "--env", str(self.env_path), "--pool", self.pool],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        self.agents.append(proc)
        return proc

    def agent_log(self, node_id: str) -> str:
        return (self.tmp / f"agent-{node_id}.log").read_text()

    def events(self, event: str | None = None) -> list[dict]:
        if not self.ledger.exists():
            return []
        rows = [json.loads(line) for line in self.ledger.read_text().splitlines()]
        return [r for r in rows if event is None or r["event"] == event]

    def items(self, job_id: str) -> dict:
        return {i.item_id: i for i in DynamoStore(self.env.name, self.env.region).items(job_id)}

    def queue_counts(self, queue: str, dead_letter: bool = False) -> tuple[int, int]:
        """(visible, hidden) messages of the queue, read with boto3 itself, not the adapter under test."""
        sqs = boto3.client("sqs", region_name=self.env.region)
        name = naming.dead_letter_queue(self.env.name, queue) if dead_letter else naming.queue(self.env.name, queue)
        attrs = sqs.get_queue_attributes(
            QueueUrl=sqs.get_queue_url(QueueName=name)["QueueUrl"],
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def queue_depth(self, queue: str, dead_letter: bool = False) -> int:
        return sum(self.queue_counts(queue, dead_letter))

    def group_instance(self) -> str:
        """One in-service instance of the pool's group on the moto server, for an agent to run as
        (its node id): the agent's own scale-in protection calls then act on a member."""
        group = naming.group(self.env.name, self.pool)
        autoscaling = boto3.client("autoscaling", region_name=self.env.region)
        autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=1)
        (instance,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0][
            "Instances"
        ]
        return instance["InstanceId"]

    def protected(self, instance_id: str) -> bool:
        """Whether the group protects the instance from scale-in (what the scaler reads)."""
        (instance,) = boto3.client("autoscaling", region_name=self.env.region).describe_auto_scaling_instances(
            InstanceIds=[instance_id]
        )["AutoScalingInstances"]
        return instance["ProtectedFromScaleIn"]

    def stop_agents(self) -> None:
        """Kill the agents, then the process groups of every workload they started: a killed agent
        leaves its workloads running, and a hung one ignores SIGTERM."""
        for proc in self.agents:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for group in self._workload_groups():
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _workload_groups(self) -> set[int]:
        """Process groups of this harness's workloads, found by the LEDGER their pool env sets."""
        groups = set()
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("LEDGER") == str(self.ledger):
                    groups.add(os.getpgid(proc.pid))
            except (psutil.Error, ProcessLookupError):
                continue  # gone meanwhile, or not ours to read
        return groups - {os.getpgrp()}  # never this test run's own group


class Imds:
    """A tiny IMDSv2 endpoint; set `.spot_action` or `.lifecycle` to serve a notice. `spot=False`:
    an on-demand instance."""

    def __init__(self, instance_id: str = "i-0test", lifecycle: str = "InService", *, spot: bool = True):
        self.spot_action: dict | None = None
        self.lifecycle = lifecycle
        self.instance_id = instance_id
        self.life_cycle = "spot" if spot else "on-demand"
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                self._reply(200, "token-1" if self.path == "/latest/api/token" else None)

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                    return self._reply(401, None)
                paths = {
                    "/latest/meta-data/instance-id": imds.instance_id,
                    "/latest/meta-data/instance-type": "c6i.large",
                    "/latest/meta-data/instance-life-cycle": imds.life_cycle,
                    "/latest/meta-data/autoscaling/target-lifecycle-state": imds.lifecycle,
                    "/latest/meta-data/spot/instance-action": json.dumps(imds.spot_action) if imds.spot_action else None,
                }
                self._reply(200 if paths.get(self.path) else 404, paths.get(self.path))

            def _reply(self, code, body):
                data = (body or "").encode()
                self.send_response(code if body is not None or code != 200 else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()



class Gone:
    """The cloud as a killed in-process node sees it: nothing it would still do gets there."""

    def __getattr__(self, name):
        def refused(*args, **kwargs):
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="http://killed-node")

        return refused


def beat(nodes, receiving, queue: str) -> None:
    """One heartbeat of each in-process agent and its batches' flush, then a receive from `queue`
    by each idle one, then a heartbeat's sleep."""
    for node in nodes:
        node._beat()
        node.records.flush()
        node.acks.flush()
    for node in receiving:
        node._receive(queue, node.env.queues[queue], wait_s=0)
    time.sleep(max(n.s.heartbeat_s for n in [*nodes, *receiving]))


def wait_until(predicate, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
