"""Shared fixtures. The AWS emulator is a real moto server on loopback, started once per
session and reset before each test that asks for it."""

from __future__ import annotations

import threading
import urllib.request

import pytest
from hypothesis import Phase, settings

from tidefleet.emulator import MotoServer, start_moto

# `invoke mutate` runs the property tests once per mutant (`--hypothesis-profile mutation`): fewer
# examples, the same ones every run (a mutant's verdict must not depend on luck), no shrinking
# (a failure is all it needs to know).
settings.register_profile(
    "mutation", max_examples=10, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate]
)
# A long search before a change lands: `invoke test --args '--hypothesis-profile deep -k properties'`.
settings.register_profile("deep", max_examples=5000, deadline=None)


@pytest.fixture(scope="session")
def moto_server() -> MotoServer:
    server = start_moto()
    yield server
    server.stop()


@pytest.fixture
def aws(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """A clean emulated AWS account; boto3 in this process and in children points at it."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_server.url}/moto-api/reset", method="POST")).close()
    for key, value in moto_server.env().items():
        monkeypatch.setenv(key, value)
    return moto_server


SHIPPED_ENVS = ("sandbox", "dev", "prod", "bench", "train")


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every shipped environment synthesized once per session: name -> (stack dir, parsed cdk.tf.json).
    The provider import costs seconds, so synth and scan tests share this."""
    import json

    from stacks.app import synth
    from tidefleet.config import load_environment

    out = {}
    for name in SHIPPED_ENVS:
        stack_dir = synth(load_environment(name), tmp_path_factory.mktemp(f"synth-{name}"))
        out[name] = (stack_dir, json.loads((stack_dir / "cdk.tf.json").read_text()))
    return out


ATTEMPT_JOIN_S = 30  # a killed workload's attempt ends in well under a second


@pytest.fixture(autouse=True)
def _no_attempt_outlives_its_test():
    """An in-process agent's attempt thread records its outcome once its workload is killed at
    teardown. Left running, it wrote that outcome into the next test's emulator (reset to the same
    queue and table names): a stray dead letter there failed an unrelated test."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.name.startswith(("attempt ", "gang member "))]
    for thread in left:
        thread.join(ATTEMPT_JOIN_S)
    if alive := [t.name for t in left if t.is_alive()]:
        pytest.fail(f"attempt threads still running {ATTEMPT_JOIN_S}s after the test: {alive}")
