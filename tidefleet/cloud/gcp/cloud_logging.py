"""Item logs on GCP: Cloud Logging (the REST entries API through google-auth).

Item logs: one Cloud Logging entry per output line, in log naming.item_log(env) (the stack's
log bucket and sink select it), with labels job / item / attempt; a "stream" is
`job/item/attempt` as on AWS. Each finished attempt also writes one structured entry
(jsonPayload with its outcome and queue): the stack's `item-outcomes` log-based metric counts those.

Cloud Logging stores an entry only if its timestamp is at most a day ahead of its clock (further:
the whole request is refused, 400 INVALID_ARGUMENT) and no further back than the log bucket's
retention (the stack's item-log bucket: `LOG_RETENTION_DAYS`; older: taken, answered 200, and not
stored: nothing in the answer says so). Entries from a node whose clock is that far off
are written again at Cloud Logging's time, as CloudWatch's are (`restamp`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cached_property

import requests
from google.api_core.retry import Retry
from google.auth.transport.requests import AuthorizedSession

from tidefleet import naming
from tidefleet.cloud.gcp.calls import TRY_S
from tidefleet.config import Environment
from tidefleet.logstream import (
    BufferedStream,
    Outage,
    put_again,
    restamped_notice,
    service_time,
    stream_name,
    stream_order,
)
from tidefleet.records import AttemptOutcome
from tidefleet.resources import LOG_RETENTION_DAYS

LOGGING = "https://logging.googleapis.com/v2"
# entries.write takes up to 10 MB a request. A line counts as its JSON text (requests escapes
# non-ASCII as \uXXXX: up to 12 bytes a character) plus its entry's keys and timestamp; the
# margin covers the request's logName, resource and labels.
WRITE_BATCH_BYTES = 9_000_000
ENTRY_OVERHEAD_BYTES = 100
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
READ_RETRY_S = 75.0  # a read's retries: past a minute, Cloud Logging's read quota window
# What Cloud Logging stores, by its clock (its answer's Date), with a margin for that header's
# second and the time the request took: the Logging API's documented bounds, back as far as the
# bucket keeps entries (30 days is only a default bucket's: this one's keeps them longer).
AHEAD_S, BACK_S, MARGIN_S = 86_400.0, LOG_RETENTION_DAYS * 86_400.0, 600.0
RESTAMPED = restamped_notice("Cloud Logging", f"over {LOG_RETENTION_DAYS} days back or a day ahead")


class CloudLoggingItemLogs:
    def __init__(self, env: Environment, *, session: AuthorizedSession | None = None):
        self.env, self._session = env, session
        self.log_name = f"projects/{env.project}/logs/{naming.item_log(env.name)}"
        self.outage = Outage()  # the streams' one warning while Cloud Logging fails

    @cached_property
    def session(self) -> AuthorizedSession:
        if self._session is not None:
            return self._session
        import google.auth

        return AuthorizedSession(google.auth.default(scopes=SCOPES)[0])

    def _write(self, entries: list[dict], labels: dict | None = None) -> requests.Response:
        body = {"logName": self.log_name, "resource": {"type": "global"}, "labels": labels or {}, "entries": entries}
        response = self.session.post(f"{LOGGING}/entries:write", json=body, timeout=TRY_S)
        response.raise_for_status()
        return response

    def _write_in_time(self, entries: list[dict], labels: dict | None = None, *, said: bool) -> bool:
        """entries.write, and the entries Cloud Logging does not store at their own time (`restamp`)
        written again at its time, after a line saying so unless `said`; whether there were any."""
        try:
            answer = self._write(entries, labels)
        except requests.HTTPError as err:  # nothing of the request was stored: a failed rewrite fails the send
            if (again := restamp(entries, err.response, refused=True)) is None:
                raise
            self._write([{"textPayload": RESTAMPED}][said:] + again, labels)
            return True
        if (again := restamp(entries, answer, refused=False)) is None:
            return False
        # The rest was stored: a failed rewrite must not send the whole batch again.
        put_again(lambda: self._write([{"textPayload": RESTAMPED}][said:] + again, labels), self.log_name, len(again))
        return True

    def stream(self, queue: str, job: str, item: str, attempt: int) -> BufferedStream:
        labels, restamping = {"job": job, "item": item, "attempt": str(attempt)}, []

        # Each line's insertId is its place in the stream (lines sent before it, and its place in the
        # batch): a batch sent again after a write that landed but timed out is stored once (Cloud
        # Logging drops an entry whose timestamp and insertId it has), and lines of one timestamp (a
        # clock that stepped back, held) read in their order.
        prefix, sent = hashlib.sha1(f"{job}/{item}/{attempt}".encode()).hexdigest()[:16], [0]

        def send(batch: list[tuple[float, str]]) -> None:
            entries = [{"textPayload": line, "timestamp": _stamp(at), "insertId": f"{prefix}-{sent[0] + i:012d}"}
                       for i, (at, line) in enumerate(batch)]  # fmt: skip
            if self._write_in_time(entries, labels, said=bool(restamping)):
                restamping.append(True)
            sent[0] += len(batch)

        return BufferedStream(stream_name(job, item, attempt), send, batch_bytes=WRITE_BATCH_BYTES,
                              event_bytes=_entry_bytes, refused=refused, outage=self.outage)

    def record_outcomes(self, queue: str, outcomes: list[AttemptOutcome]) -> None:
        """One structured entry per attempt; those from a node whose clock is far off are counted at
        Cloud Logging's time, with no line saying so (no one reads these entries, the metric does)."""
        entries = [{"jsonPayload": {"outcome": o.outcome, "queue": queue, "job": o.job, "item": o.item,
                                    "attempt": o.attempt, "seconds": o.seconds},
                    "labels": {"job": o.job, "item": o.item, "attempt": str(o.attempt)},
                    "timestamp": _stamp(o.at)} for o in outcomes]  # fmt: skip
        if entries:
            self._write_in_time(entries, said=True)

    def lines(self, queue: str, job: str, item: str | None = None) -> Iterator[tuple[str, str]]:
        # textPayload:* leaves out the outcome entries (jsonPayload), which are not output.
        query = f'logName="{self.log_name}" AND textPayload:* AND labels.job="{job}"' + (
            f' AND labels.item="{item}"' if item else "")
        body = {"resourceNames": [f"projects/{self.env.project}"], "filter": query, "orderBy": "timestamp asc",
                "pageSize": 1000}  # fmt: skip
        by_stream: dict[str, list[str]] = {}
        while True:
            page = READ_RETRY(_read_page)(self.session, body)
            for entry in page.get("entries", []):
                labels = entry.get("labels", {})
                name = stream_name(labels.get("job", job), labels.get("item", "?"), labels.get("attempt", "0"))
                by_stream.setdefault(name, []).append(entry.get("textPayload", ""))
            if not page.get("nextPageToken"):
                break
            body["pageToken"] = page["nextPageToken"]
        for name in sorted(by_stream, key=stream_order):
            for line in by_stream[name]:
                yield name, line


def _passes(err: BaseException) -> bool:
    """A read's failure that passes: refused (429: Cloud Logging's read quota is per minute, so a big
    job's pages meet it, and a rerun met it again), Google's side (5xx), silence, a lost connection."""
    if isinstance(err, requests.HTTPError):
        return err.response is not None and (err.response.status_code == 429 or err.response.status_code >= 500)
    return isinstance(err, (requests.Timeout, requests.ConnectionError))


# A page read, tried again past the read quota's minute (the other calls' `calls.RETRY`, longer).
READ_RETRY = Retry(_passes, initial=1.0, maximum=16.0, multiplier=2.0, timeout=READ_RETRY_S)


def _read_page(session, body: dict) -> dict:
    """One try of a page of entries:list."""
    response = session.post(f"{LOGGING}/entries:list", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def refused(err: Exception) -> str | None:
    """Why Cloud Logging will never take the entries a send failed with (`BufferedStream`'s
    `refused`), or None to send them again. A 400 (INVALID_ARGUMENT: an entry over its size, one
    stamped over a day ahead) is about the request, which wrote nothing; 403 (a service account
    given logging.logWriter while the attempt runs), 429 and 5xx pass."""
    response = err.response if isinstance(err, requests.HTTPError) else None
    if response is None or response.status_code != 400:
        return None
    try:
        error = response.json()["error"]
        said = f"{error.get('status', 'INVALID_ARGUMENT')}: {error.get('message', '')}"
    except (ValueError, KeyError, TypeError, AttributeError):  # not Google's JSON error: a proxy's page
        said = response.reason or "Bad Request"
    return f"Cloud Logging refused them: 400 {said}"


def restamp(entries: list[dict], answer: requests.Response | None, *, refused: bool) -> list[dict] | None:
    """What of `entries` to write again, unstamped (Cloud Logging stamps them, in their order), so
    that it stores them, by its clock (its answer's Date); None: nothing. One over a day ahead
    got the request a 400 (`refused`): all of it again, those off its time unstamped. One further
    back than the bucket keeps was taken and not stored: those again. A request refused for
    anything else, or an answer without a Date, is left as it was."""
    now = service_time(answer.headers.get("Date")) if answer is not None else None
    if now is None or (refused and answer.status_code != 400):
        return None
    at = [datetime.fromisoformat(entry["timestamp"]).timestamp() for entry in entries]
    ahead = [stamp > now + AHEAD_S - MARGIN_S for stamp in at]
    off = [far or stamp < now - BACK_S + MARGIN_S for far, stamp in zip(ahead, at, strict=True)]
    if not any(ahead if refused else off):
        return None
    unstamped = [{k: v for k, v in entry.items() if k != "timestamp"} if far else entry
                 for entry, far in zip(entries, off, strict=True)]  # fmt: skip
    return unstamped if refused else [entry for entry, far in zip(unstamped, off, strict=True) if far]


def _entry_bytes(line: str) -> int:
    return len(json.dumps(line)) + ENTRY_OVERHEAD_BYTES


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat()
