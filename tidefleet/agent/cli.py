"""`tidefleet agent`: started by a node's user-data (or by the sandbox as a local process)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

import click

from tidefleet import lifeline
from tidefleet.agent.gpus import GpuProblem
from tidefleet.agent.runner import NodeFault
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud import for_env
from tidefleet.config import ConfigError, load_environment
from tidefleet.options import finite


@click.command()
@click.option("--env", "env_name", envvar="TIDEFLEET_ENV", required=True, help="environment name or .toml path")
@click.option("--pool", envvar="TIDEFLEET_POOL", required=True, help="the pool this node belongs to")
@click.option("--heartbeat-s", envvar="TIDEFLEET_AGENT_HEARTBEAT_S", type=click.FloatRange(0.1, 300), default=5.0,
              callback=finite,
              show_default=True,
              help="heartbeat, visibility extension and cancel check interval")
@click.option("--imds-poll-s", envvar="TIDEFLEET_IMDS_POLL_S", type=click.FloatRange(0.1, 60), default=5.0,
              callback=finite,
              show_default=True,
              help="how often to read the spot notice and lifecycle state")
@click.option("--grace-s", envvar="TIDEFLEET_AGENT_GRACE_S", type=click.FloatRange(0, 3600), default=None,
              callback=finite,
              help="time workloads get to checkpoint after a stop request "
                   "[default: 90 on AWS (2-minute spot notice), 15 on GCP (about 30 s)]")
@click.option("--wait-s", envvar="TIDEFLEET_AGENT_WAIT_S", type=click.IntRange(0, 20), default=10, show_default=True,
              help="queue long poll when every queue is empty")
@click.option("--item-user", envvar="TIDEFLEET_ITEM_USER", default=None,
              help="run each item as this user (node user-data sets tidefleet-item unless the pool has run_as_root)")
@click.option("--work-dir", envvar="TIDEFLEET_AGENT_WORK_DIR", type=click.Path(path_type=Path), default=None,
              help="per-attempt working directories (default: a temp dir)")
def agent(env_name, pool, heartbeat_s, imds_poll_s, grace_s, wait_s, item_user, work_dir) -> None:
    """Run items from POOL's queues on this node until it is interrupted or told to drain."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # not a line per client it creates
    lifeline.watch(_sandbox_gone)  # a sandbox's emulated node only: it ends with its sandbox
    try:
        env = load_environment(env_name)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    if pool not in env.pools:
        raise click.ClickException(f"--pool: unknown pool {pool!r} in {env.name}; known pools: {', '.join(sorted(env.pools))}")
    cloud = for_env(env)
    metadata = cloud.node_host().metadata
    instance_id, instance_type, spot = metadata.identity()
    node_id = os.environ.get("TIDEFLEET_NODE_ID") or instance_id or socket.gethostname()
    instance_type = instance_type or env.pools[pool].instance_types[0].type
    root = os.environ.get("TIDEFLEET_CHECKPOINT_ROOT")
    # Absolute once, here: docker refuses a relative bind mount, and a workload runs in its attempt's
    # folder, where a relative stop or done file would name another place.
    work_dir = (work_dir or Path(tempfile.gettempdir()) / f"tidefleet-agent-{node_id}").absolute()
    settings = Settings(
        node_id=node_id, instance_type=instance_type, spot=spot, work_dir=work_dir,
        checkpoint_root=Path(root) if root else None,
        heartbeat_s=heartbeat_s, imds_poll_s=imds_poll_s, grace_s=grace_s, wait_s=wait_s, item_user=item_user,
    )
    try:
        code = Agent(env, pool, settings, metadata).run()
    except cloud.errors as err:
        raise click.ClickException(cloud.explain(err)) from None
    except (GpuProblem, NodeFault) as err:  # it takes nothing, marked draining: one line says why
        raise click.ClickException(str(err)) from None
    sys.exit(code)


def _sandbox_gone() -> None:
    logging.getLogger("tidefleet.agent").warning("the sandbox running this node is gone: ending the agent and its "
                                                 "workloads (nothing is left to hand items back to)")  # fmt: skip
    lifeline.end_tree()
