"""GCP: Pub/Sub queues, the Firestore job store, managed instance groups, Cloud Logging, the
GCE metadata server. Credentials come from google.auth.default.

`GcpCloud` is what `tidefleet.cloud.for_env` returns for a `gcp` environment;
`function_runtime` is the scaler function's cold start. The Google libraries are imported
where used, so the scaler function loads only what a tick needs.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from functools import cache, cached_property
from pathlib import Path

from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.ports import Ports
from tidefleet.triggers import function_environment

# GCE gives a Spot VM about 30 s: the notice may be seen imds_poll_s (5 s) late, the agent acts on
# it once its receive in flight returns (LONGEST_POLL_S), and SETTLE_S (5 s) may follow the grace,
# so 15 s leaves 3 s to hand the items back.
GRACE_S = 15.0
LONGEST_POLL_S = 2
GCS_UPLOAD = "https://storage.googleapis.com/upload/storage/v1"
GCS_API = "https://storage.googleapis.com/storage/v1"
STATUS_PAGE = "https://status.cloud.google.com"


def _disabled_api(err: BaseException) -> tuple[str, str] | None:
    """(the API, the project) where Google refused a call as its API not enabled (SERVICE_DISABLED),
    else None. It names both in its message: "... API has not been used in project P before or it is
    disabled. Enable it by visiting https://console.developers.google.com/apis/api/API/overview?project=P"."""
    message = str(getattr(err, "message", "") or "")
    if "has not been used in project" not in message and "SERVICE_DISABLED" not in message:
        return None
    api = re.search(r"apis/api/([a-z0-9.-]+)", message) or re.search(r"\b([a-z0-9-]+\.googleapis\.com)\b", message)
    project = re.search(r"in project ([\w.:-]+)", message)
    return (api[1] if api else "required", project[1] if project else "?")


def failed_for_now(err: BaseException) -> bool:
    """Google unavailable, throttling or out of time, past the client's own retries: worth a later try."""
    from google.api_core.exceptions import RetryError, ServerError, TooManyRequests

    from tidefleet.cloud.gcp.firestore import GaveUp

    return isinstance(err, (ServerError, TooManyRequests, RetryError, GaveUp))


def errors() -> tuple[type[BaseException], ...]:
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from requests import RequestException

    return (GoogleAPIError, GoogleAuthError, RequestException)


@contextmanager
def reading_credentials():
    """google-auth opens the file GOOGLE_APPLICATION_CREDENTIALS names when a client is built and
    names a missing one, but lets any other OSError through (a directory, a file this user may not
    read): one of `errors()` instead, which the CLIs catch and say in one line (`_credentials_hint`).
    Wraps whatever builds a client or asks for credentials."""
    from google.auth.exceptions import DefaultCredentialsError

    try:
        yield
    except OSError as err:
        path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if not path or err.filename != path:  # another file's trouble: not the credentials'
            raise
        login = "`gcloud auth application-default login`"
        if isinstance(err, IsADirectoryError):
            why = f"is a directory, not a credentials file; point it at the key file (.json) in it, or unset it and run {login}"
        else:
            why = (f"cannot be read ({err.strerror}); let this user read it, point it at another credentials file, "
                   f"or unset it and run {login}")  # fmt: skip
        raise DefaultCredentialsError(f"GOOGLE_APPLICATION_CREDENTIALS names {path}, which {why}") from err


@cache
@reading_credentials()
def function_runtime() -> tuple[Environment, Ports]:
    """Settings and clients, once per cold start: the environment named by TIDEFLEET_ENV (unset or
    unknown: a ConfigError, which the function says in one line)."""
    env = function_environment()
    return env, control_ports(env)


def function_metrics(env: Environment, points: list) -> None:
    """The scaler function's emitter: Cloud Monitoring custom metrics, one session per cold start."""
    _monitoring().write(env, points)


@cache
@reading_credentials()
def _monitoring():
    from tidefleet.cloud.gcp.monitoring import MonitoringMetrics

    return MonitoringMetrics(function_runtime()[0])


@reading_credentials()
def control_ports(env: Environment) -> Ports:
    from tidefleet.cloud.gcp.firestore import FirestoreStore
    from tidefleet.cloud.gcp.mig import MigFleet
    from tidefleet.cloud.gcp.monitoring import MonitoringQueues

    store = FirestoreStore(env)  # heartbeats, and the queue stats the agents record
    return Ports(queues=MonitoringQueues(env), fleet=MigFleet(env), nodes=store, stats=store)


class GceNode:
    """A VM of a pool's managed instance groups. GCE has no scale-in protection and no
    lifecycle hooks: its scaler deletes only the idle instances it names, by their heartbeats."""

    grace_s = GRACE_S
    longest_poll_s = LONGEST_POLL_S

    def __init__(self, env: Environment, metadata=None):
        from tidefleet.cloud.gcp.metadata import GceMetadata

        self.env = env
        self.metadata = metadata or GceMetadata()

    def protect(self, pool: str, node_id: str, busy: bool) -> None:
        """Nothing to do: no group picks a victim of its own."""

    def leave(self, pool: str, node_id: str) -> None:
        """Nothing to do: no hook holds the VM."""

    @reading_credentials()
    def retire(self, pool: str, node_id: str) -> None:
        """Delete this VM from its group, whose target size drops with it (the group stops it as
        it stops any VM it deletes: the shutdown reaches the agent as SIGTERM)."""
        from tidefleet.cloud.gcp.mig import MigFleet

        if node_id not in MigFleet(self.env).terminate(pool, (node_id,)):
            raise LookupError(f"{node_id} is not running in a group of pool {pool}")

    def checkpoint_base(self) -> str:
        return f"gs://{naming.artifacts_bucket(self.env.name, self.env.project)}"


class GcpCloud:
    name = "gcp"

    def __init__(self, env: Environment):
        self.env = env
        self.errors = errors()

    # Built when first used: a kick or a status call needs only some of them.
    @cached_property
    @reading_credentials()
    def queues(self):
        from tidefleet.cloud.gcp.pubsub import PubSubWorkQueues

        return PubSubWorkQueues(self.env)

    @cached_property
    @reading_credentials()
    def store(self):
        from tidefleet.cloud.gcp.firestore import FirestoreStore

        return FirestoreStore(self.env)

    @cached_property
    @reading_credentials()
    def logs(self):
        from tidefleet.cloud.gcp.cloud_logging import CloudLoggingItemLogs

        return CloudLoggingItemLogs(self.env)

    def control_ports(self) -> Ports:
        return control_ports(self.env)

    def node_host(self, metadata=None) -> GceNode:
        return GceNode(self.env, metadata)

    @reading_credentials()
    def group_members(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """A pool is a Spot and an on-demand group, shown as one (`MigFleet`)."""
        from tidefleet.cloud.gcp.mig import MigFleet

        groups = MigFleet(self.env).groups(list(self.env.pools), 0)
        return {p: (g.desired, tuple(i.id for i in g.instances)) for p, g in groups.items()}

    @reading_credentials()
    def kick(self, payload: bytes) -> str:
        from tidefleet.cloud.gcp.pubsub import publish

        topic = naming.kick_topic(self.env.name)  # the scaler function's trigger
        publish(self.env, topic, [payload])
        return topic

    @reading_credentials()
    def upload(self, key: str, path: Path) -> str:
        """The GCS JSON API's single-request upload through google-auth (a wheel is small; no
        google-cloud-storage dependency for a few objects)."""
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        from tidefleet.cloud.gcp.cloud_logging import SCOPES

        bucket = naming.artifacts_bucket(self.env.name, self.env.project)
        session = AuthorizedSession(google.auth.default(scopes=SCOPES)[0])
        session.post(f"{GCS_UPLOAD}/b/{bucket}/o", params={"uploadType": "media", "name": key}, data=path.read_bytes(),
                     headers={"Content-Type": "application/octet-stream"}, timeout=120).raise_for_status()  # fmt: skip
        return f"gs://{bucket}/{key}"

    @reading_credentials()
    def artifacts_location(self) -> str:
        import google.auth
        from google.api_core.exceptions import from_http_response
        from google.auth.transport.requests import AuthorizedSession

        from tidefleet.cloud.gcp.cloud_logging import SCOPES

        bucket = naming.artifacts_bucket(self.env.name, self.env.project)
        session = AuthorizedSession(google.auth.default(scopes=SCOPES)[0])
        found = session.get(f"{GCS_API}/b/{bucket}", params={"fields": "name"}, timeout=30)
        if not found.ok:
            raise from_http_response(found)  # NotFound, PermissionDenied, ...: explained below
        return f"gs://{bucket}"

    @reading_credentials()
    def identity(self) -> str:
        """The account of the application default credentials (a service account's email, or the
        user account gcloud recorded); compute credentials learn theirs on refresh."""
        import google.auth
        from google.auth.exceptions import GoogleAuthError
        from google.auth.transport.requests import Request

        creds = google.auth.default()[0]
        account = getattr(creds, "service_account_email", None) or getattr(creds, "account", None)
        if account in (None, "", "default") and hasattr(creds, "service_account_email"):
            creds.refresh(Request())
            account = creds.service_account_email
        if account in (None, "", "default"):
            raise GoogleAuthError(f"the application default credentials ({type(creds).__name__}) name no account")
        return account

    def explain(self, err: BaseException) -> str:
        """For a person at the CLI or on a node; inside the scaler function, `_explain_in_function`'s
        line where the fix differs there."""
        from google.api_core import exceptions as gexc
        from google.auth.exceptions import DefaultCredentialsError
        from requests import HTTPError

        from tidefleet.cloud.gcp.calls import RETRY_FOR_S, TRY_S
        from tidefleet.config import env_argument

        env, project = self.env.name, self.env.project
        deploy = f"deploy it with `invoke deploy --env {env_argument(self.env)}`"
        retried = isinstance(err, gexc.RetryError) and err.cause is not None
        if retried:
            err = err.cause  # tried until calls.RETRY_FOR_S: the last try says what is wrong
        if isinstance(err, HTTPError) and err.response is not None:  # a REST call of ours (raise_for_status)
            err = gexc.from_http_response(err.response)  # NotFound, Forbidden, ...: as the clients raise them
        if disabled := _disabled_api(err):  # a 403 too, but no role would fix it
            api, where = disabled
            return (f"the {api} API is not enabled in project {where} (it answered: {_one_line(err.message, 120)}); "
                    f"run `gcloud services enable {api} --project {where}`, then try again (with your own "
                    f"credentials, project {where} may be their quota project, not {project})")  # fmt: skip
        if (function := _function(self.env)) and (line := self._explain_in_function(err, function, retried)):
            return line
        if _unanswered(err):  # a black-holed network, a stuck proxy
            return (f"Google Cloud ({_host(err) or 'its API'}) did not answer {env!r} within {TRY_S:g} s; "
                    "check the network and any HTTPS_PROXY, then try again")  # fmt: skip
        if isinstance(err, DefaultCredentialsError):
            return _credentials_hint(err)
        if _refused_credentials(err):  # 401, or a refresh token that no longer works
            said = err.message if isinstance(err, gexc.Unauthorized) else str(err)
            return (f"Google Cloud did not accept the credentials ({_one_line(said, 150)}): they have expired or were "
                    "revoked; run `gcloud auth application-default login` again, or check GOOGLE_APPLICATION_CREDENTIALS")  # fmt: skip
        if isinstance(err, gexc.TooManyRequests):  # ResourceExhausted too
            tried = f", tried again for {RETRY_FOR_S:g} s" if retried else ""
            return (f"{type(err).__name__}: {_one_line(err.message)} (project {project}): Google Cloud throttled "
                    f"the call{tried}; wait a minute and run it again")  # fmt: skip
        if isinstance(err, gexc.ServerError):  # 500, 502, 503, 504: Google's side, mostly passing
            tried = f", tried again for {RETRY_FOR_S:g} s" if retried else ""
            return (f"{type(err).__name__}: {_one_line(err.message)} (project {project}): Google Cloud failed on its "
                    f"side{tried}; this usually passes: try again in a minute; if it persists, see {STATUS_PAGE} "
                    f"for {self.env.region}")  # fmt: skip
        # 409: another change to the resource still under way (a group being resized or updated, a
        # contended Firestore document: Aborted). AlreadyExists is a 409 too, but waiting fixes nothing.
        if isinstance(err, gexc.Conflict) and not isinstance(err, gexc.AlreadyExists):
            return (f"{type(err).__name__}: {_one_line(err.message)} (project {project}): another change to it is "
                    "still in progress; wait for it to finish and run it again")  # fmt: skip
        if isinstance(err, gexc.NotFound):
            return f"{err.message}: environment {env!r} is not deployed in project {project}; {deploy}"
        # REST clients raise a 403 as Forbidden, gRPC ones as PermissionDenied (a Forbidden).
        if isinstance(err, gexc.Forbidden):
            return f"permission denied in project {project} ({err.message}); check the account's roles"
        if isinstance(err, gexc.GoogleAPICallError):
            return f"{type(err).__name__}: {err.message} (project {project})"
        return f"cannot reach Google Cloud for {env!r} ({err}); check credentials and network"  # deploying reaches nothing

    def _explain_in_function(self, err: BaseException, function: str, retried: bool) -> str | None:
        """The line for an operator reading the function's log, where a person's fixes (gcloud auth,
        GOOGLE_APPLICATION_CREDENTIALS, their network or proxy) are wrong: its credentials are its
        service account's and its settings what the stack deployed. None: the same as at the CLI."""
        from google.api_core import exceptions as gexc
        from google.auth.exceptions import DefaultCredentialsError
        from requests import ConnectionError as RequestsConnectionError

        from tidefleet.cloud.gcp.calls import RETRY_FOR_S, TRY_S

        env, project = self.env.name, self.env.project
        account = f"{naming.service_account(env, 'scaler')}@{project}.iam.gserviceaccount.com"  # stacks/gcp/control.py
        redeploy = f"deploy the environment again (invoke deploy --env {env})"
        persists = f"if it persists, see {STATUS_PAGE} for {self.env.region}"
        again = f", tried again for {RETRY_FOR_S:g} s" if retried else ""
        if _unanswered(err):
            return (f"Google Cloud ({_host(err) or 'its API'}) did not answer function {function} within {TRY_S:g} s"
                    f"{again}; {persists}")  # fmt: skip
        if isinstance(err, DefaultCredentialsError):
            return (f"no Google credentials in function {function}: it runs as service account {account}; check "
                    f"that the account exists and is enabled, or {redeploy}")  # fmt: skip
        if isinstance(err, gexc.Forbidden):
            return (f"permission denied in project {project} ({_one_line(err.message)}): function {function}'s "
                    f"service account {account} lacks a role for this call; {redeploy}")  # fmt: skip
        if isinstance(err, gexc.NotFound):
            return f"{_one_line(err.message)}: environment {env!r} is not (fully) deployed in project {project}; {redeploy}"
        if isinstance(err, gexc.TooManyRequests):  # a person's "wait and run it again" is the next run's
            return (f"{type(err).__name__}: {_one_line(err.message)} (project {project}): Google Cloud still "
                    f"throttled function {function}'s call{again}; the next run tries again; if it persists, raise "
                    "the API's quota")  # fmt: skip
        if _refused_credentials(err):
            return (f"Google Cloud did not accept function {function}'s credentials (service account {account}); "
                    f"check that the account exists and is enabled, or {redeploy}")  # fmt: skip
        # 503, and 504 (DeadlineExceeded is a GatewayTimeout): the service, not the function's settings.
        if isinstance(err, (gexc.ServiceUnavailable, gexc.GatewayTimeout)):
            return (f"Google Cloud answered function {function} {type(err).__name__}: {_one_line(err.message)}"
                    f"{again}; {persists}")  # fmt: skip
        if isinstance(err, RequestsConnectionError):  # refused, unresolved, a proxy's refused tunnel
            return (f"function {function} cannot reach Google Cloud ({_host(err) or 'its API'}: {_one_line(str(err))}); "
                    f"{persists}, and that the function sets no HTTPS_PROXY (its stack sets none)")  # fmt: skip
        return None


def _credentials_hint(err: BaseException) -> str:
    """No application-default credentials: the file GOOGLE_APPLICATION_CREDENTIALS names, where
    it names one (google-auth reads it first and stops there), else how to log in."""
    login = "`gcloud auth application-default login`"
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if not path:
        return f"no Google credentials: run {login} or set GOOGLE_APPLICATION_CREDENTIALS"
    if isinstance(err.__cause__, OSError):  # reading_credentials: said with the fix already
        return str(err)
    if not os.path.exists(path):
        return (f"GOOGLE_APPLICATION_CREDENTIALS names {path}, which does not exist; point it at a credentials file, "
                f"or unset it and run {login}")  # fmt: skip
    said = err.args[0] if err.args else err  # google-auth's words, without the parse error it may add
    return (f"GOOGLE_APPLICATION_CREDENTIALS names {path}, which holds no usable credentials ({_one_line(said, 150)}); "
            f"point it at a service account key or an application-default credentials file, or unset it and run {login}")


def _function(env: Environment) -> str | None:
    """The name of the Cloud Function this process serves, or None. The Functions Framework sets
    FUNCTION_TARGET in every function it serves (locally too); Cloud Run adds K_SERVICE, the
    function's name, which is the stack's (`naming.function`) where it does not."""
    if not os.environ.get("FUNCTION_TARGET"):
        return None
    return os.environ.get("K_SERVICE") or naming.function(env.name, "scaler")


def _host(err: BaseException) -> str:
    """The host a failed request asked, or ''; a token refresh wraps the request's own error."""
    from urllib.parse import urlsplit

    from requests import RequestException

    asked = err if isinstance(err, RequestException) else err.__cause__
    return urlsplit(getattr(getattr(asked, "request", None), "url", None) or "").netloc


def _one_line(text: str, limit: int = 300) -> str:
    """An error's text on one line, cut to `limit` characters (a URL and Google's message fit)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else f"{text[:limit]}..."


def _refused_credentials(err: BaseException) -> bool:
    """A 401, or a token refresh the token endpoint refused (an expired or revoked login); not a
    refresh that could not reach it (the metadata server's: a RefreshError over a TransportError)."""
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import RefreshError, TransportError

    return isinstance(err, gexc.Unauthorized) or (isinstance(err, RefreshError)
                                                   and not isinstance(err.__cause__, TransportError))  # fmt: skip


def _unanswered(err: BaseException) -> bool:
    """Whether a call failed on silence: a read timeout, or a proxy that took the connection and
    never answered its CONNECT (requests' ProxyError over urllib3's, over a socket timeout)."""
    from requests import Timeout
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    seen, stack = set(), [err]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (Timeout, TimeoutError, Urllib3Timeout)):
            return True
        stack += [e.__cause__, getattr(e, "reason", None),
                  *(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))]  # fmt: skip
    return False
