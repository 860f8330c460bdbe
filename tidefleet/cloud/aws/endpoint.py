"""What the endpoint must look like to be AWS: how long a call may be silent, and whether an
answer is the AWS API's at all (and not a web server's page or empty reply on the wrong port)."""

from __future__ import annotations

from botocore.exceptions import BotoCoreError

# Silence on a connected socket before an attempt gives up (botocore's default: 60 s). AWS answers
# every call tidefleet makes in well under a second; an SQS long poll waits up to
# SQS_MAX_WAIT_S, so its client reads for longer (`sqs.LONG_POLL`).
READ_TIMEOUT_S = 8
SQS_MAX_WAIT_S = 20  # ReceiveMessage's WaitTimeSeconds limit
REQUEST_ID_HEADERS = {"x-amzn-requestid", "x-amz-request-id"}  # every AWS answer has one (moto's too)


class NotAws(BotoCoreError):
    """An answer no AWS API gives: an empty 2xx where a JSON or XML document is due, or a web page."""

    fmt = "the endpoint {endpoint} did not answer like the AWS API (HTTP {status}); check AWS_ENDPOINT_URL"


def looks_like_aws(protocol: str, status: int, body: bytes, headers, *, has_output: bool = True) -> bool:
    """Whether a (non-streamed) answer can be the AWS API's. JSON protocols (SQS, DynamoDB, Logs)
    send a JSON object (`{}` at least, GetItem of a missing key), or nothing for a call without a
    result (Logs' CreateLogGroup), and always a request id; query protocols (Auto Scaling, STS,
    CloudWatch, EC2) send XML; REST ones may send nothing (S3's PutObject), but never a web page."""
    head = body.lstrip()[:64].lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return False
    if not 200 <= status < 300:  # an error: botocore reports its code, or its status and first words
        return True
    # By the first byte only: botocore parses the whole answer next (every call of the agents and
    # the scaler passes here), and reports one that does not parse as a ResponseParserError.
    if protocol == "json":
        if not body.strip():
            return not has_output or any(k.lower() in REQUEST_ID_HEADERS for k in headers)
        return head.startswith(b"{")
    if protocol in ("query", "ec2"):
        return head.startswith(b"<")  # an empty body is none
    return True
