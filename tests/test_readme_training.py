"""README's "Training on spot": the pool and queue it shows are environments/train.toml's, and its
PyTorch script runs as written under torchrun (the pool's command) on a 2-node gang of real agents
against the moto server: one rendezvous, a spot notice on the non-lead node stops both ranks at
one step, the item goes back once, resumes from rank 0's checkpoint on a new pair and succeeds once."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
from agent_harness import Harness, Imds, wait_until

from tidefleet.config import load_environment
from tidefleet.jobs import sdk

ROOT = Path(__file__).resolve().parent.parent
SECTION = (ROOT / "README.md").read_text().split("## Training on spot\n", 1)[1].split("\n## ", 1)[0]
CONFIG = tomllib.loads(re.search(r"```toml\n(.*?)```", SECTION, re.DOTALL).group(1))
SCRIPT = re.search(r"```python\n(.*?)```", SECTION, re.DOTALL).group(1)
STEPS = 6000  # long enough to interrupt on a loaded 2-core machine, short enough to finish twice


def test_the_readme_training_config_is_what_environments_train_toml_says():
    env = load_environment("train")
    for table, values in CONFIG.items():
        for name, section in values.items():
            shipped = getattr(env, table)[name].model_dump(mode="json")
            for key, value in section.items():
                got = shipped[key]
                if key == "instance_types":
                    got = [{k: t[k] for k in value[0]} for t in got]
                assert got == value, f"README {table}.{name}.{key} = {value!r}, train.toml has {got!r}"


def pool_command(script: Path) -> str:
    """The README pool's command, with the script where a test wrote it and this interpreter's torchrun
    (beside it, else `python -m torch.distributed.run`, the module torchrun runs)."""
    beside = Path(sys.executable).parent / "torchrun"
    torchrun = [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]
    words = shlex.split(CONFIG["pools"]["gpu8"]["command"])
    return shlex.join([part for w in words for part in (torchrun if w == "torchrun" else
                                                         [str(script)] if w.endswith("train.py") else [w])])  # fmt: skip


# A harness template ({ledger}, {max_retries}); @COMMAND@, @LOW@ and @HIGH@ come from the README.
ENV_TOML = """
region = "us-east-1"

[pools.cpu]
max = 4
command = "@COMMAND@"
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.train]
pool = "cpu"
max_retries = {max_retries}
item_timeout_s = 600
nodes_per_item = {{ min = @LOW@, max = @HIGH@ }}
"""


@pytest.fixture
def torch_gang(tmp_path, aws, request) -> Harness:
    pytest.importorskip("torch", reason="PyTorch is not installed: .ci/run installs its CPU wheel for this test")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    low, high = CONFIG["queues"]["train"]["nodes_per_item"].values()
    env_toml = ENV_TOML.replace("@COMMAND@", pool_command(script)).replace("@LOW@", str(low)).replace("@HIGH@", str(high))
    h = Harness(tmp_path, aws, env_toml=env_toml, workload="", max_retries=1)
    request.addfinalizer(h.stop_agents)
    return h


@pytest.mark.moto
def test_the_readme_training_script_survives_a_spot_notice_on_a_member_and_succeeds_once(torch_gang):
    h, notices = torch_gang, {n: Imds(n) for n in ("node-a", "node-b")}
    try:
        job = sdk.submit(h.env, "train", "train", sdk.read_items([[str(STEPS)]]), kick=False).job_id
        agents = {n: h.start_agent(n, notices[n].url) for n in notices}
        item = wait_until(lambda: (i := h.items(job)["000000"]).gang == "running" and i, 90, "the gang to form")
        member = item.members[1]["node"]  # not the lead: the lead holds the message and hands it back
        checkpoints = h.tmp / "checkpoints"
        wait_until(lambda: list(checkpoints.rglob("train.pt")), 120, "rank 0's first checkpoint")
        notices[member].spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert agents[member].wait(timeout=60) == 0
        item = wait_until(lambda: (i := h.items(job)["000000"]).interruptions == 1 and i, 90, "the item back whole")
        assert item.failures == 0 and item.history[0]["outcome"] == "interrupted"
        h.start_agent("node-c")
        item = wait_until(lambda: (i := h.items(job)["000000"]).status in ("succeeded", "failed") and i, 240,
                          "the resumed gang to finish")  # fmt: skip
        assert (item.status, item.attempts, item.interruptions, item.failures) == ("succeeded", 2, 1, 0)
        # Each rank printed where it started, into the item's log; the second attempt resumed.
        starts = [int(s) for s in re.findall(r"rank \d of 2 starts at step (\d+)",
                                             "\n".join(line for _, line in sdk.log_lines(h.env, job)))]  # fmt: skip
        assert len(starts) == 4 and sorted(starts)[:2] == [0, 0] and min(sorted(starts)[2:]) > 0, starts
    finally:
        for imds in notices.values():
            imds.close()
