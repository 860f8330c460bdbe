"""The README's SDK example, read from README.md itself and run as written in a fresh
interpreter against the moto server, with the environment it names (`prod`) deployed there:
it submits the job, prints its counts, and a second run is the same job (idempotent)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3

from tidefleet.cloud.aws.dynamodb import create_table
from tidefleet.cloud.aws.provision import EMULATOR_ACCOUNT, create_queues
from tidefleet.config import load_environment
from tidefleet.jobs import sdk
from tidefleet.resources import resources

ROOT = Path(__file__).resolve().parent.parent
SECTION = (ROOT / "README.md").read_text().split("From Python, the same SDK the CLI uses:\n", 1)[1]
BLOCK = re.search(r"```python\n(.*?)```", SECTION, re.DOTALL).group(1)
ENV_NAME = re.search(r'load_environment\("([^"]+)"\)', BLOCK).group(1)
JOB_NAME, QUEUE = re.search(r'sdk\.submit\(env, "([^"]+)", "([^"]+)"', BLOCK).groups()
TOTAL = len(ast.literal_eval(re.search(r"range\(([\d_]+)\)", BLOCK).group(1)) * [0])


def run_block(aws) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **aws.env()}, check=False)  # fmt: skip


def test_the_readme_sdk_example_submits_its_job_and_prints_its_counts(aws):
    env = load_environment(ENV_NAME)
    create_queues(env)
    create_table(env.name, env.region)
    first = run_block(aws)
    assert first.returncode == 0, first.stderr
    counts = ast.literal_eval(first.stdout.strip().splitlines()[-1])
    assert set(counts) == {"succeeded", "running", "queued", "failed", "cancelled"}
    assert sum(counts.values()) == TOTAL and counts["queued"] == TOTAL  # no node runs them here
    again = run_block(aws)  # same name, same job: nothing recorded or sent twice
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == first.stdout.strip().splitlines()[-1]
    assert [(j.job.name, j.job.total) for j in sdk.jobs(env)] == [(JOB_NAME, TOTAL)]
    sqs = boto3.client("sqs", region_name=env.region)
    url = sqs.get_queue_url(QueueName=resources(env, account=EMULATOR_ACCOUNT).queues[QUEUE].name)["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert int(attributes["Attributes"]["ApproximateNumberOfMessages"]) == TOTAL


def test_the_readme_sdk_example_without_credentials_raises_botocores_error_with_the_clis_advice(tmp_path):
    """A Python API raises, but what it raises says what the CLI would: the same botocore
    exception (callers that catch it still do), with the CLI's line as its note (PEP 678), so the
    traceback ends in what to do."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIDEFLEET_"))}
    none = str(tmp_path / "none")
    env = {**clean, "HOME": str(tmp_path), "AWS_CONFIG_FILE": none, "AWS_SHARED_CREDENTIALS_FILE": none,
           "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", BLOCK], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=env, check=False)  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-2:] == [
        "botocore.exceptions.NoCredentialsError: Unable to locate credentials",
        ("no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (for the sandbox: the "
         "export lines `tidefleet sandbox --keep` prints)"),
    ], run.stderr
