"""Shared fixtures. The AWS emulator is a real moto server on loopback, started once per
session and reset before each test that asks for it."""

from __future__ import annotations

import urllib.request

import pytest

from tidefleet.emulator import MotoServer, start_moto


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
