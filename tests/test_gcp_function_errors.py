"""The GCP scaler function's line for a failed Google call is its operator's: the function runs
as its service account with what the stack deployed, so a person's fixes (gcloud auth, their
network or proxy) are wrong there. Each case fails one tick of the function on the HTTP-level
fake (tests/gcp_fake.py); the Functions Framework sets FUNCTION_TARGET and Cloud Run K_SERVICE."""

from __future__ import annotations

import json
import logging
import os

import google.auth
import pytest
import requests
import responses
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import DefaultCredentialsError

from lambdas.gcp_scaler import main
from tests.gcp_fake import FakeGcp
from tests.test_gcp_function import ENV, event
from tidefleet import naming
from tidefleet.cloud.gcp import STATUS_PAGE, function_runtime, mig
from tidefleet.cloud.gcp.calls import RETRY_FOR_S, TRY_S

FUNCTION = naming.function(ENV.name, "scaler")
ACCOUNT = f"{naming.service_account(ENV.name, 'scaler')}@{ENV.project}.iam.gserviceaccount.com"
REDEPLOY = f"deploy the environment again (invoke deploy --env {ENV.name})"
PERSISTS = f"if it persists, see {STATUS_PAGE} for {ENV.region}"
COMPUTE = "compute.googleapis.com"
GROUP = f"https://{COMPUTE}/compute/v1/projects/{ENV.project}/regions/{ENV.region}/instanceGroupManagers/tidefleet-gcp-dev-cpu"
# What a person at the CLI is told, never the fix inside the function.
CLI_ADVICE = ("gcloud", "GOOGLE_APPLICATION_CREDENTIALS", "check the account's roles", "check the network")


def google_error(code: int, status: str, message: str):
    """A callback answering as Google's REST APIs do."""
    return lambda request: (code, {}, json.dumps({"error": {"code": code, "message": message, "status": status}}))


def silent(request):
    raise requests.ReadTimeout(f"fake: no answer within {TRY_S:g} s", request=request)  # as requests raises it


@pytest.fixture
def tick(monkeypatch, caplog):
    """Runs one schedule tick of the function, its credentials or one Google service answering as
    told, and returns the one line it logged. Retries give up at once (they would take RETRY_FOR_S)."""
    monkeypatch.setenv("FUNCTION_TARGET", "on_kick")
    monkeypatch.setenv("TIDEFLEET_ENV", ENV.name)
    monkeypatch.setattr(mig, "RETRY", mig.RETRY.with_delay(0.01, 0.01).with_timeout(0.05))

    def run(*, credentials=None, compute=None, firestore=None, backlog=0) -> str:
        def default(*_, **__):
            if credentials is not None:
                raise credentials
            return AnonymousCredentials(), ENV.project

        monkeypatch.setattr(google.auth, "default", default)
        function_runtime.cache_clear()
        with responses.RequestsMock(assert_all_requests_are_fired=False) as mock, caplog.at_level(logging.INFO, "tidefleet"):
            fake = FakeGcp(ENV.project, ENV.region)
            fake.groups |= {"tidefleet-gcp-dev-cpu": 0, "tidefleet-gcp-dev-cpu-od": 0}
            fake.undelivered["tidefleet-gcp-dev-default"] = backlog  # items waiting: the tick sets desired
            fake._igm = compute or fake._igm  # install() takes the callbacks from the instance
            fake._firestore = firestore or fake._firestore
            fake.install(mock)
            result = main.on_kick(event({"tidefleet": "schedule"}))
        function_runtime.cache_clear()
        errors = [json.loads(r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [result] and result["severity"] == "ERROR" and result["trigger"] == "schedule"
        line = result["failed"]
        assert "\n" not in line
        assert not (os.environ.get("FUNCTION_TARGET") and any(advice in line for advice in CLI_ADVICE)), line
        return line

    return run


def test_no_credentials_name_the_functions_service_account(tick):
    line = tick(credentials=DefaultCredentialsError("Your default credentials were not found."))
    assert line == (f"no Google credentials in function {FUNCTION}: it runs as service account {ACCOUNT}; check "
                    f"that the account exists and is enabled, or {REDEPLOY}")  # fmt: skip


def test_permission_denied_names_the_service_account_and_a_redeploy(tick):
    denied = "Required 'compute.instanceGroupManagers.get' permission for 'projects/acme-ml-dev/...'"
    line = tick(compute=google_error(403, "PERMISSION_DENIED", denied))
    assert line == (f"permission denied in project {ENV.project} (GET {GROUP}: {denied}): function {FUNCTION}'s "
                    f"service account {ACCOUNT} lacks a role for this call; {REDEPLOY}")  # fmt: skip


def test_a_missing_database_is_an_environment_to_deploy_again(tick):
    missing = f"The database {naming.table(ENV.name)} does not exist for project {ENV.project}"
    line = tick(firestore=google_error(404, "NOT_FOUND", missing))
    assert line.endswith(f"{missing}: environment {ENV.name!r} is not (fully) deployed in project {ENV.project}; {REDEPLOY}")


@pytest.mark.parametrize("code,status,name", [
    (503, "UNAVAILABLE", "ServiceUnavailable"),
    (504, "DEADLINE_EXCEEDED", "GatewayTimeout"),
])  # fmt: skip
def test_google_unavailable_or_past_its_deadline_was_tried_again_and_points_at_its_status(tick, code, status, name):
    line = tick(compute=google_error(code, status, "The service is currently unavailable."))
    assert line == (f"Google Cloud answered function {FUNCTION} {name}: GET {GROUP}: The service is currently "
                    f"unavailable., tried again for {RETRY_FOR_S:g} s; {PERSISTS}")  # fmt: skip


def test_throttling_was_tried_again_and_the_next_run_tries_again(tick):
    line = tick(compute=google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for 'Read requests'."))
    assert line == (f"TooManyRequests: GET {GROUP}: Quota exceeded for 'Read requests'. (project {ENV.project}): Google "
                    f"Cloud still throttled function {FUNCTION}'s call, tried again for {RETRY_FOR_S:g} s; the next run "
                    "tries again; if it persists, raise the API's quota")  # fmt: skip


def test_refused_credentials_name_the_functions_service_account(monkeypatch):
    """A 401 (through the fake, AnonymousCredentials' refresh answers first: no credentials)."""
    from google.api_core import exceptions as gexc

    from tidefleet.cloud import for_env

    monkeypatch.setenv("FUNCTION_TARGET", "on_kick")
    line = for_env(ENV).explain(gexc.Unauthenticated("Request had invalid authentication credentials."))
    assert line == (f"Google Cloud did not accept function {FUNCTION}'s credentials (service account {ACCOUNT}); "
                    f"check that the account exists and is enabled, or {REDEPLOY}")  # fmt: skip


def test_a_silent_endpoint_was_tried_again_and_points_at_googles_status(tick):
    line = tick(compute=silent)
    assert line == (f"Google Cloud ({COMPUTE}) did not answer function {FUNCTION} within {TRY_S:g} s, tried again "
                    f"for {RETRY_FOR_S:g} s; {PERSISTS}")  # fmt: skip


def test_an_unreachable_google_points_at_its_status_not_at_a_persons_network(tick):
    def refused(request):
        raise requests.ConnectionError("fake: connection refused", request=request)

    line = tick(compute=refused)
    assert line == (f"function {FUNCTION} cannot reach Google Cloud ({COMPUTE}: fake: connection refused); "
                    f"{PERSISTS}, and that the function sets no HTTPS_PROXY (its stack sets none)")  # fmt: skip


def test_cloud_run_names_the_function_itself(tick, monkeypatch):
    monkeypatch.setenv("K_SERVICE", "renamed-scaler")  # the service's name, which Cloud Run sets
    assert "function renamed-scaler's service account" in tick(compute=google_error(403, "PERMISSION_DENIED", "no"))


def test_outside_a_function_a_denied_rest_call_keeps_the_clis_line(tick, monkeypatch):
    """The CLI's words, for a 403 as Google's REST APIs raise it (Forbidden, not gRPC's PermissionDenied)."""
    monkeypatch.delenv("FUNCTION_TARGET")
    line = tick(compute=google_error(403, "PERMISSION_DENIED", "no"))
    assert line == f"permission denied in project {ENV.project} (GET {GROUP}: no); check the account's roles"


def test_a_refused_resize_says_its_pool_and_action_then_the_functions_fix(tick, monkeypatch):
    """A failed action is said as a failed observe is (the service account, a redeploy), after its
    `<pool>: <action>`, not as Google's raw 'Forbidden: 403 POST ...'."""
    answer = FakeGcp._igm

    def refuse_resize(fake, request):
        if request.url.split("?")[0].endswith("/resize"):
            return google_error(403, "PERMISSION_DENIED", "Required 'compute.instanceGroupManagers.update' permission")(request)
        return answer(fake, request)

    monkeypatch.setattr(FakeGcp, "_igm", refuse_resize)
    line = tick(backlog=3)
    assert line.startswith(f"some actions failed, the next tick tries them again: cpu: set_desired: permission denied in "
                           f"project {ENV.project} (POST {GROUP}/resize")  # fmt: skip
    assert line.endswith(f"Required 'compute.instanceGroupManagers.update' permission): function {FUNCTION}'s service "
                         f"account {ACCOUNT} lacks a role for this call; {REDEPLOY}")  # fmt: skip
