"""Objects in Cloud Storage (the JSON API through google-auth): what
`tidefleet.agent.checkpoint` saves for a workload on GCP."""

from __future__ import annotations

import urllib.parse

import google.auth
from google.api_core.exceptions import from_http_response
from google.auth.transport.requests import AuthorizedSession

from tidefleet.cloud.gcp import reading_credentials
from tidefleet.cloud.gcp.calls import RETRY, TRY_S

GCS = "https://storage.googleapis.com"


class GcsObjects:
    """Each try gives up after TRY_S without an answer (per socket operation: a long upload that
    keeps sending is not cut) and a timed-out, 5xx or 429 one is made again for up to RETRY_FOR_S,
    as every Google call of the adapters (`calls`); an upload replaces the whole object, so
    making it twice changes nothing."""

    def __init__(self):
        scopes = ["https://www.googleapis.com/auth/devstorage.read_write"]
        with reading_credentials():  # a directory or unreadable key file: said as the credentials' fault
            credentials = google.auth.default(scopes=scopes)[0]
        self.session = AuthorizedSession(credentials, refresh_timeout=TRY_S)

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
        if reply.status_code == 404:
            return None
        if not reply.ok:
            raise from_http_response(reply)
        return reply.content

