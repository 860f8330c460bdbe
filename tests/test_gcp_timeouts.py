"""A Google endpoint that takes the connection and never answers (a black-holed network, a stuck
proxy) is reported within half a minute by every client the adapters use, in one of the cloud's
errors that `explain` puts in one line: the libraries' own read timeouts (60 s for Pub/Sub and
Firestore, 300 s for batchGet, 600 s for Compute Engine) held the agent, the scaler function and
the CLI for minutes. A pull still waits its wait, and a write whose answer was lost is tried again
only where doing it twice changes nothing (`tidefleet.cloud.gcp.calls`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import bad_endpoints
import pytest
import requests
import responses
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from google.cloud.firestore_v1.services.firestore import FirestoreClient
from google.pubsub_v1.services.publisher import PublisherClient
from google.pubsub_v1.services.subscriber import SubscriberClient
from urllib3.exceptions import MaxRetryError
from urllib3.exceptions import ProxyError as Urllib3ProxyError

from tidefleet import naming
from tidefleet.cloud import for_env
from tidefleet.cloud.gcp.calls import TRY_S
from tidefleet.cloud.gcp.firestore import FirestoreStore
from tidefleet.cloud.gcp.mig import MigFleet
from tidefleet.cloud.gcp.pubsub import PubSubWorkQueues
from tidefleet.config import load_environment
from tidefleet.records import Job

ENV = load_environment("gcp-dev")
ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 45  # three tries of TRY_S, and room for a loaded CI worker; the libraries took 60 s to 10 minutes
DOCUMENTS = f"https://firestore.googleapis.com/v1/projects/{ENV.project}/databases/{naming.table(ENV.name)}/documents"


def adapters(url: str) -> tuple[PubSubWorkQueues, FirestoreStore, MigFleet]:
    """The adapters on their real clients, every client's endpoint the given URL."""
    options, creds = {"api_endpoint": url}, AnonymousCredentials()
    queues = PubSubWorkQueues(ENV, subscriber=SubscriberClient(transport="rest", credentials=creds, client_options=options),
                              publisher=PublisherClient(transport="rest", credentials=creds, client_options=options))  # fmt: skip
    store = FirestoreStore(ENV, client=FirestoreClient(transport="rest", credentials=creds, client_options=options))
    fleet = MigFleet(ENV, groups=compute_v1.RegionInstanceGroupManagersClient(credentials=creds, client_options=options),
                     instances=compute_v1.InstancesClient(credentials=creds, client_options=options))  # fmt: skip
    return queues, store, fleet


def test_a_silent_endpoint_ends_a_call_of_each_client_in_one_explained_line():
    cloud = for_env(ENV)
    with bad_endpoints.silent() as url:
        queues, store, fleet = adapters(url)
        calls = {
            "Pub/Sub publish": lambda: queues.send("default", ["item"]),
            "Pub/Sub modifyAckDeadline": lambda: queues.extend("default", ["ack-1"], 60),
            "Firestore get": lambda: store.job("x-1"),
            "Firestore create (not tried again)": lambda: store.put_job(Job("x-1", "x", "default", 0.0, 1)),
            "Firestore batchGet": lambda: store.items_by_id("x-1", ["a"]),
            "Compute Engine get": lambda: fleet.groups(["cpu"], 0),
        }
        pool = ThreadPoolExecutor(len(calls))
        running = {name: pool.submit(call) for name, call in calls.items()}
        wait(running.values(), timeout=LIMIT_S)
        stuck = [name for name, future in running.items() if not future.done()]
        pool.shutdown(wait=False)  # leaving the block closes the held connections: stuck calls end
    assert not stuck, f"still waiting after {LIMIT_S} s: {stuck}"
    for name, future in running.items():
        err = future.exception()
        assert isinstance(err, cloud.errors), (name, err)
        line = cloud.explain(err)
        assert line == (f"Google Cloud ({url.removeprefix('http://')}) did not answer 'gcp-dev' within {TRY_S:g} s; "
                        "check the network and any HTTPS_PROXY, then try again"), (name, err)  # fmt: skip


def test_a_pull_on_a_silent_endpoint_waits_its_wait_and_comes_back_empty():
    """Its timeout is the long poll's wait, not a failure: not an error, not tried again."""
    with bad_endpoints.silent() as url:
        queues = adapters(url)[0]
        started = time.monotonic()
        assert queues.receive("default", 1, 2) == []
    assert 2 <= time.monotonic() - started < LIMIT_S


@pytest.fixture
def google():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def lost_then(answer: tuple[int, dict, str]):
    """The first request's answer never comes (read timeout); the next ones get `answer`."""
    seen = []

    def reply(request):
        seen.append(request)
        if len(seen) == 1:
            raise requests.exceptions.ReadTimeout(f"read timed out ({TRY_S} s)", request=request)
        return answer

    return reply, seen


def test_a_read_whose_answer_was_lost_is_asked_again(google):
    reply, seen = lost_then((404, {}, json.dumps({"error": {"code": 404, "status": "NOT_FOUND"}})))
    google.add_callback(responses.GET, f"{DOCUMENTS}/jobs/x-1", callback=reply)
    assert FirestoreStore(ENV, credentials=AnonymousCredentials()).job("x-1") is None
    assert len(seen) == 2


def test_a_create_whose_answer_was_lost_is_not_made_again(google):
    """Made again, a create that landed finds its own document and takes it for someone else's."""
    reply, seen = lost_then((200, {}, "{}"))
    google.add_callback(responses.PATCH, f"{DOCUMENTS}/jobs/x-1", callback=reply)
    with pytest.raises(requests.exceptions.ReadTimeout):
        FirestoreStore(ENV, credentials=AnonymousCredentials()).put_job(Job("x-1", "x", "default", 0.0, 1))
    assert len(seen) == 1


def test_the_cli_behind_a_proxy_that_never_answers_says_so_in_one_line(tmp_path):
    """As a user runs it: a service account key (its self-signed tokens need no token endpoint) and
    an HTTPS_PROXY that takes the connection and says nothing."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    credentials = tmp_path / "key.json"
    credentials.write_text(json.dumps({
        "type": "service_account", "project_id": ENV.project, "private_key_id": "1", "private_key": key.decode(),
        "client_email": f"cli@{ENV.project}.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "TIDEFLEET_")) and k.lower() != "no_proxy"}  # fmt: skip
    commands = [["status", "x-1"], ["nodes"]]  # Firestore, then Compute Engine
    with bad_endpoints.silent() as proxy:
        env |= {"HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "NO_GCE_CHECK": "True",
                "GOOGLE_APPLICATION_CREDENTIALS": str(credentials), "HTTPS_PROXY": proxy, "https_proxy": proxy}  # fmt: skip
        runs = [subprocess.Popen([sys.executable, "-m", "tidefleet.cli", *c, "--env", ENV.name], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]  # fmt: skip
        try:
            outputs = [run.communicate(timeout=LIMIT_S + 15) for run in runs]  # the interpreter's start too
        finally:
            for run in runs:
                if run.poll() is None:
                    run.kill()
    for command, run, (out, err) in zip(commands, runs, outputs, strict=True):
        lines = [line for line in err.splitlines() if line.strip()]
        assert run.returncode == 1 and len(lines) == 1 and "Traceback" not in out + err, (command, err)
        assert f"googleapis.com) did not answer 'gcp-dev' within {TRY_S:g} s; check the network" in lines[0], (command, err)


def test_a_proxy_that_never_answers_its_connect_is_explained_as_silence_too():
    """Which error a silent proxy gives depends on where the wait ends: a read timeout, or (under
    load, the CONNECT's answer not read within the connect timeout) requests' ProxyError over a
    socket timeout. Both are the same one line."""
    request = requests.Request("GET", "https://firestore.googleapis.com/v1/projects/p").prepare()
    reason = Urllib3ProxyError("Unable to connect to proxy", TimeoutError("timed out"))
    err = requests.exceptions.ProxyError(MaxRetryError(None, request.url, reason), request=request)
    line = for_env(ENV).explain(err)
    assert line.startswith("Google Cloud (firestore.googleapis.com) did not answer 'gcp-dev' within"), line
    refused = requests.exceptions.ConnectionError(MaxRetryError(None, request.url, ConnectionRefusedError(111)),
                                                  request=request)  # fmt: skip
    assert "cannot reach Google Cloud" in for_env(ENV).explain(refused)
