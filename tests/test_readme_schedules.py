"""The README's scheduled-job example, read from README.md itself: it is a valid schedule for an
environment that has its queue, and the job it fires carries its items as written."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

from tidefleet.config import parse_environment
from tidefleet.jobs.sdk import read_items

ROOT = Path(__file__).resolve().parents[1]
SECTION = (ROOT / "README.md").read_text().split("\n### Scheduled jobs and dependencies\n", 1)[1].split("\n## ", 1)[0]


def test_the_readmes_schedule_example_loads_and_its_items_are_submittable():
    (example,) = re.findall(r"```toml\n(.*?)```", SECTION, re.DOTALL)
    data = copy.deepcopy(tomllib.loads((ROOT / "environments" / "prod.toml").read_text()))
    data["schedules"] = tomllib.loads(example)["schedules"]
    env = parse_environment(data, name="prod")
    merge = env.schedules["model-merge"]
    assert (merge.rate, merge.queue, merge.admission, merge.timeout_s) == ("10 hours", "merge", "skip", 14400)
    assert [s.args for s in read_items(merge.items)] == [["--merge", "s3://acme-ml/checkpoints/latest"],
                                                         ["s3://acme-ml/eval/suite-a"]]  # fmt: skip
