"""Objects in Cloud Storage (the JSON API through google-auth): what
`tidefleet.agent.checkpoint` saves for a workload on GCP."""

from __future__ import annotations

import os
import urllib.parse

import google.auth
from google.api_core.exceptions import from_http_response
from google.auth.transport.requests import AuthorizedSession

from tidefleet.cloud.gcp import reading_credentials
from tidefleet.cloud.gcp.calls import RETRY, TRY_S
from tidefleet.cloud.per_process import PerProcess

GCS = "https://storage.googleapis.com"
# What the credentials are found from: the variables google-auth reads (the key file, gcloud's
# folder, the project, the metadata server's address and whether to ask it).
READ = ("GOOGLE_", "CLOUDSDK_", "GCE_", "NO_GCE_CHECK")
_SESSIONS: PerProcess = PerProcess()


def _session() -> AuthorizedSession:
    """This process's Cloud Storage session for the checkpoints: one, built at the first save or
    load and kept while the variables it was found from stay the same (`PerProcess`), so its access
    token is fetched once and refreshed when it expires, not fetched again for every call."""
    read = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(READ)))
    return _SESSIONS.get(read, _new_session)


def _new_session() -> AuthorizedSession:
    scopes = ["https://www.googleapis.com/auth/devstorage.read_write"]
    with reading_credentials():  # a directory or unreadable key file: said as the credentials' fault
        credentials = google.auth.default(scopes=scopes)[0]
    return AuthorizedSession(credentials, refresh_timeout=TRY_S)


class GcsObjects:
    """Each try gives up after TRY_S without an answer (per socket operation: a long upload that
    keeps sending is not cut) and a timed-out, 5xx or 429 one is made again for up to RETRY_FOR_S,
    as every Google call of the adapters (`calls`); an upload replaces the whole object, so
    making it twice changes nothing."""

    def __init__(self):
        self.session = _session()

    def put(self, bucket: str, key: str, body: bytes) -> None:
        RETRY(self._put)(bucket, key, body)

    def get(self, bucket: str, key: str) -> bytes | None:
        return RETRY(self._get)(bucket, key)

    def _put(self, bucket: str, key: str, body: bytes) -> None:
        reply = self.session.post(f"{GCS}/upload/storage/v1/b/{bucket}/o", params={"uploadType": "media", "name": key},
                                  data=body, timeout=TRY_S)  # fmt: skip
        if not reply.ok:
            raise from_http_response(reply)

    def _get(self, bucket: str, key: str) -> bytes | None:
        reply = self.session.get(f"{GCS}/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}",
                                 params={"alt": "media"}, timeout=TRY_S)  # fmt: skip
        if reply.status_code == 404 and "bucket does not exist" not in reply.text:  # a missing object: none saved yet
            return None
        if not reply.ok:
            raise from_http_response(reply)
        return reply.content

