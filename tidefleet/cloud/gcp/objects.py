"""Objects in Cloud Storage (the JSON API through google-auth): what
`tidefleet.agent.checkpoint` saves for a workload on GCP."""

from __future__ import annotations

import urllib.parse

import google.auth
from google.auth.transport.requests import AuthorizedSession

GCS = "https://storage.googleapis.com"


class GcsObjects:
    def __init__(self):
        scopes = ["https://www.googleapis.com/auth/devstorage.read_write"]
        self.session = AuthorizedSession(google.auth.default(scopes=scopes)[0])

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.session.post(f"{GCS}/upload/storage/v1/b/{bucket}/o", params={"uploadType": "media", "name": key},
                          data=body, timeout=60).raise_for_status()  # fmt: skip

    def get(self, bucket: str, key: str) -> bytes | None:
        reply = self.session.get(f"{GCS}/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}",
                                 params={"alt": "media"}, timeout=60)  # fmt: skip
        if reply.status_code == 404:
            return None
        reply.raise_for_status()
        return reply.content
