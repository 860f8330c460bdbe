"""At the CLI, Google's own failures (5xx) and a change already in progress (409 Conflict) say
what to do in their one line, as throttling does: a 5xx is Google's side and mostly passing (try
again in a minute; its status page if it persists), a Conflict another change to the same
resource still under way (wait for it, then run it again). The scaler function's lines are
`_explain_in_function`'s (tests/test_gcp_function_errors.py)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from tidefleet.cloud import for_env
from tidefleet.cloud.gcp import STATUS_PAGE
from tidefleet.cloud.gcp.calls import RETRY_FOR_S
from tidefleet.config import load_environment

ENV = load_environment("gcp-dev")


@pytest.fixture(autouse=True)
def at_the_cli(monkeypatch):
    monkeypatch.delenv("FUNCTION_TARGET", raising=False)
    monkeypatch.delenv("K_SERVICE", raising=False)


@pytest.mark.parametrize("err", [
    gexc.InternalServerError("Internal error encountered."),
    gexc.BadGateway("Bad gateway."),
    gexc.ServiceUnavailable("The service is currently unavailable."),
    gexc.GatewayTimeout("Deadline exceeded."),
], ids=lambda e: type(e).__name__)  # fmt: skip
def test_a_google_server_error_says_it_is_passing_to_try_again_and_where_googles_status_is(err):
    line = for_env(ENV).explain(err)
    assert line.startswith(f"{type(err).__name__}: {err.message} (project {ENV.project}): "), line
    assert "try again in a minute" in line and STATUS_PAGE in line and "\n" not in line, line
    assert "tried again" not in line, "one answer, not retried"


def test_a_server_error_tried_again_until_the_retry_ran_out_says_so():
    err = gexc.RetryError(f"Timeout of {RETRY_FOR_S:g}s exceeded",
                          cause=gexc.ServiceUnavailable("The service is currently unavailable."))  # fmt: skip
    line = for_env(ENV).explain(err)
    assert line.startswith(f"ServiceUnavailable: The service is currently unavailable. (project {ENV.project}): "), line
    assert f"tried again for {RETRY_FOR_S:g} s" in line and "try again in a minute" in line and STATUS_PAGE in line


@pytest.mark.parametrize("err", [
    gexc.Conflict("The resource 'projects/p/regions/r/instanceGroupManagers/g' is not ready"),
    gexc.Aborted("Too much contention on these documents. Please try again."),
], ids=lambda e: type(e).__name__)  # fmt: skip
def test_a_conflict_says_another_change_is_in_progress_and_to_run_it_again(err):
    line = for_env(ENV).explain(err)
    assert line.startswith(f"{type(err).__name__}: {err.message} (project {ENV.project}): "), line
    assert "another change" in line and "run it again" in line and "\n" not in line, line


def test_an_existing_resource_is_no_change_in_progress():
    """AlreadyExists is a 409 too, but waiting would not help: its line stays the plain one."""
    line = for_env(ENV).explain(gexc.AlreadyExists("Document already exists: projects/p/databases/d/documents/x"))
    assert line == f"AlreadyExists: Document already exists: projects/p/databases/d/documents/x (project {ENV.project})"


DISABLED = ("GET https://firestore.googleapis.com/v1/projects/acme-ml-dev/databases/tidefleet-gcp-dev/documents/jobs/x: "
            "Cloud Firestore API has not been used in project my-quota-project before or it is disabled. Enable it by "
            "visiting https://console.developers.google.com/apis/api/firestore.googleapis.com/overview?project="
            "my-quota-project then retry.")  # fmt: skip


@pytest.mark.parametrize("in_function", [False, True])
def test_an_api_not_enabled_says_which_to_enable_where_not_to_check_roles(monkeypatch, in_function):
    """Google refuses it as a 403, which read "check the account's roles": no role fixes it. With a
    person's own credentials the project is often their quota project, not the environment's."""
    if in_function:
        monkeypatch.setenv("FUNCTION_TARGET", "on_kick")
    line = for_env(ENV).explain(gexc.Forbidden(DISABLED))
    assert line.startswith("the firestore.googleapis.com API is not enabled in project my-quota-project (")
    assert "run `gcloud services enable firestore.googleapis.com --project my-quota-project`, then try again" in line
    assert "role" not in line
