"""Every cloud error a user can reach through the CLIs becomes one line that says what is wrong
and what to do (`Cloud.explain`), on both clouds; and each is one of the cloud's `errors`, so
the CLIs catch it instead of showing a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import bad_endpoints
import pytest
import requests
from botocore.exceptions import (
    ClientError,
    ConfigParseError,
    EndpointConnectionError,
    NoCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError
from google.api_core import exceptions as gexc
from google.api_core.exceptions import RetryError
from google.auth.exceptions import DefaultCredentialsError, RefreshError

from tidefleet.cloud import for_env
from tidefleet.cloud.aws import EndpointInvalid, dynamodb
from tidefleet.cloud.aws.endpoint import READ_TIMEOUT_S, NotAws
from tidefleet.cloud.aws.provision import provision
from tidefleet.cloud.aws.sqs import QueueMissing, SqsWorkQueues
from tidefleet.config import load_environment
from tidefleet.emulator import FAKE_CREDENTIALS

AWS, GCP = load_environment("dev"), load_environment("gcp-dev")
ROOT = Path(__file__).resolve().parents[1]
PAGE = "<!DOCTYPE HTML>\n<html lang=\"en\">\n<head>\n<title>Error response</title>\n</head>\n<body>\n" + "x" * 400


def client_error(code: str, message: str | None = None) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message or f"{code} happened"}}, "Call")


# What AWS answers a person whose session ran out, whose identity lacks an action, or who is
# throttled past the client's retries (messages as AWS words them).
EXPIRED = ("ExpiredTokenException", "The security token included in the request is expired")
DENIED_SCAN = ("AccessDeniedException", ("User: arn:aws:iam::123456789012:user/ana is not authorized to perform: "
               "dynamodb:Scan on resource: arn:aws:dynamodb:us-east-1:123456789012:table/tidefleet-dev because no "
               "identity-based policy allows the dynamodb:Scan action"))  # fmt: skip
THROTTLED = ("ThrottlingException", "Rate exceeded")
REFRESH = "refresh them (`aws sso login`, or set AWS_PROFILE to a profile with current keys) and run it again"


@pytest.mark.parametrize(
    ("env", "err", "says"),
    [
        (AWS, NoCredentialsError(), "no AWS credentials: set AWS_PROFILE"),
        (AWS, client_error("ResourceNotFoundException"), ("ResourceNotFoundException happened: environment 'dev' is not "
                                                          "(fully) deployed in us-east-1; deploy it with `invoke deploy")),
        (AWS, ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "The specified log group does not "
                                     "exist."}}, "DescribeLogStreams"),
         ("CloudWatch Logs log group '/tidefleet/dev/items' does not exist: environment 'dev' is not (fully) deployed "
          "in us-east-1; deploy it with `invoke deploy --env dev`")),
        (AWS, ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "Requested resource not found"}},
                          "Scan"), "DynamoDB table 'tidefleet-dev' does not exist: environment 'dev' is not (fully)"),
        (AWS, ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "Function not found: arn:aws:"
                                     "lambda:us-east-1:1:function:tidefleet-dev-scaler"}}, "Invoke"),
         "Lambda function 'tidefleet-dev-scaler' does not exist: environment 'dev' is not (fully)"),
        (AWS, ClientError({"Error": {"Code": "NoSuchBucket", "Message": "The specified bucket does not exist",
                                     "BucketName": "tidefleet-dev-artifacts-1"}}, "PutObject"),
         "S3 bucket 'tidefleet-dev-artifacts-1' does not exist: environment 'dev' is not (fully)"),
        (AWS, client_error("AccessDenied"), "AccessDenied: AccessDenied happened (region us-east-1)"),
        (AWS, client_error(*EXPIRED), f"{EXPIRED[1]} (region us-east-1): your AWS credentials have expired; {REFRESH}"),
        (AWS, client_error("UnrecognizedClientException", "The security token included in the request is invalid."),
         f"is invalid (region us-east-1): your AWS credentials are not accepted; {REFRESH}"),
        (AWS, client_error(*DENIED_SCAN),
         ("AccessDeniedException: User: arn:aws:iam::123456789012:user/ana is not authorized to perform: dynamodb:Scan "
          "on resource: arn:aws:dynamodb:us-east-1:123456789012:table/tidefleet-dev (region us-east-1): this AWS "
          'identity may not call dynamodb:Scan; use one that may (AWS_PROFILE) or have it allowed (README "What each '
          'identity may do")')),
        (AWS, client_error("UnauthorizedOperation", "You are not authorized to perform this operation. User: "
                           "arn:aws:iam::1:user/ana is not authorized to perform: ec2:DescribeInstances because no "
                           "identity-based policy allows it. Encoded authorization failure message: " + "x" * 900),
         ("is not authorized to perform: ec2:DescribeInstances (region us-east-1): this AWS identity may not call "
         "ec2:DescribeInstances")),
        (AWS, client_error(*THROTTLED), ("ThrottlingException: Rate exceeded (region us-east-1): AWS still throttled the "
                                         "call after 3 tries with backoff; wait a minute and run it again")),
        (AWS, client_error("RequestLimitExceeded", "Request limit exceeded."), "after 3 tries with backoff; wait a minute"),
        (AWS, EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "cannot reach AWS for 'dev'"),
        (AWS, QueueMissing("queues.default: SQS queue 'x' does not exist"), "queues.default: SQS queue 'x' does not exist"),
        (AWS, EndpointInvalid(endpoint="not a url"), "'not a url' is not a URL; write a URL like http://localhost:4566"),
        (AWS, NotAws(endpoint="http://127.0.0.1:9", status=501),
         "the endpoint http://127.0.0.1:9 did not answer like the AWS API (HTTP 501); check AWS_ENDPOINT_URL"),
        (AWS, ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
         f"the endpoint http://127.0.0.1:9 took the connection but did not answer within {READ_TIMEOUT_S} s"),
        (AWS, ClientError({"Error": {"Code": "501", "Message": PAGE}}, "GetItem"), "501: <!DOCTYPE HTML> <html"),
        (AWS, ResponseParserError(f"Unable to parse response, invalid XML received:\n{PAGE}"), "does not parse"),
        (GCP, DefaultCredentialsError("none found"), "no Google credentials: run `gcloud auth application-default login`"),
        (GCP, gexc.NotFound("subscription gone"), "is not deployed in project acme-ml-dev; deploy it with"),
        (GCP, gexc.PermissionDenied("no role"), "permission denied in project acme-ml-dev (no role)"),
        (GCP, gexc.TooManyRequests("slow down"), ("TooManyRequests: slow down (project acme-ml-dev): Google Cloud "
                                                  "throttled the call; wait a minute and run it again")),
        (GCP, RetryError("Timeout of 20.0s exceeded", gexc.ResourceExhausted("Quota exceeded for reads")),
         ("ResourceExhausted: Quota exceeded for reads (project acme-ml-dev): Google Cloud throttled the call, tried "
         "again for 20 s; wait a minute and run it again")),
        (GCP, gexc.Unauthenticated("Request had invalid authentication credentials."),
         ("Google Cloud did not accept the credentials (Request had invalid authentication credentials.): they have "
         "expired or were revoked; run `gcloud auth application-default login` again")),
        (GCP, RefreshError("Reauthentication is needed. Please run `gcloud auth application-default login`"),
         "did not accept the credentials (Reauthentication is needed."),
        (GCP, requests.ConnectionError("refused"), "cannot reach Google Cloud for 'gcp-dev' (refused)"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_a_cloud_error_is_caught_and_explained_in_one_line(env, err, says):
    cloud = for_env(env)
    assert isinstance(err, cloud.errors)
    line = cloud.explain(err)
    assert says in line and "\n" not in line and len(line) < 400, line


FUNCTION = "tidefleet-dev-scaler"
REDEPLOY = "deploy the environment again (invoke deploy --env dev)"
AWS_SQS = "https://sqs.us-east-1.amazonaws.com/"


@pytest.mark.parametrize(
    ("err", "says"),
    [
        (NoCredentialsError(), (f"no AWS credentials in function {FUNCTION}: Lambda gives it its execution role's; "
                               f"check that role {FUNCTION} exists and trusts lambda.amazonaws.com, or {REDEPLOY}")),
        (client_error("AccessDeniedException"), (f"(region us-east-1): function {FUNCTION}'s role may not make this "
                                                f"call; {REDEPLOY}")),
        (client_error("ResourceNotFoundException"), f"environment 'dev' is not (fully) deployed in us-east-1; {REDEPLOY}"),
        (ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "Requested resource not found"}},
                     "GetItem"), (f"DynamoDB table 'tidefleet-dev' does not exist: environment 'dev' is not (fully) "
                                  f"deployed in us-east-1; {REDEPLOY}")),
        (QueueMissing("queues.default: SQS queue 'tidefleet-dev-default' does not exist in us-east-1; deploy the "
                      "environment first (invoke deploy --env dev)"), "deploy the environment first (invoke deploy"),
        (ReadTimeoutError(endpoint_url=AWS_SQS), (f"{AWS_SQS} took the connection but did not answer function "
                                                 f"{FUNCTION} within 5 s (3 tries); if it persists, see the AWS Health "
                                                 "Dashboard for us-east-1")),
        (EndpointConnectionError(endpoint_url=AWS_SQS), (f"function {FUNCTION} cannot reach AWS for 'dev' (Could not "
                                                        f'connect to the endpoint URL: "{AWS_SQS}"); if it persists, '
                                                        "see the AWS Health Dashboard for us-east-1, and that the "
                                                        "function sets no AWS_ENDPOINT_URL (its stack sets none)")),
        (client_error(*EXPIRED), (f"{EXPIRED[1]} (region us-east-1): AWS refused function {FUNCTION}'s credentials "
                                  "(its execution role's, which Lambda renews); if it persists, check that role "
                                  f"{FUNCTION} exists, or {REDEPLOY}")),
        (client_error(*THROTTLED), (f"ThrottlingException: Rate exceeded (region us-east-1): AWS still throttled "
                                    f"function {FUNCTION}'s call after 3 tries; the next run tries again")),
    ],
    ids=["no-credentials", "access-denied", "missing-resource", "missing-table", "missing-queue", "silent", "unreachable",
         "expired-token", "throttled"],
)  # fmt: skip
def test_inside_a_function_a_cloud_error_says_what_its_operator_should_do(monkeypatch, err, says):
    """A function's line is read in its log: its credentials are its role's and its settings what
    the stack deployed, so a person's fixes (a profile, the sandbox, an endpoint variable) are wrong there."""
    cloud = for_env(AWS)  # built first: this process's clients stay the CLI's
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)  # what Lambda sets in every function
    line = cloud.explain(err)
    assert says in line and "\n" not in line
    assert not any(cli in line for cli in ("AWS_PROFILE", "sandbox", "emulator", "check AWS_ENDPOINT_URL"))


@pytest.mark.parametrize("in_function", [False, True], ids=["outside", "in-a-function"])
@pytest.mark.parametrize(("left", "operation", "then"), [
    ("3 of 3 item(s) unwritten", "BatchWriteItem", "run the same submit again"),
    ("keys unread (3 of 3)", "BatchGetItem", "try again"),
], ids=["write", "read"])  # fmt: skip
def test_a_dynamodb_batch_still_throttled_is_said_in_its_own_count_of_calls_not_also_in_tries(
    monkeypatch, in_function, left, operation, then
):
    """Its message counts the calls made (dynamodb.RETRIES + 1) and says what to do: the client's
    ATTEMPTS never applied (botocore does not retry a 200 answer), so no other count is added."""
    cloud = for_env(AWS)
    if in_function:
        monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    err = dynamodb.still_throttled(left, operation, "tidefleet-dev", then)
    said = err.response["Error"]["Message"]
    assert cloud.explain(err) == f"ProvisionedThroughputExceededException: {said} (region us-east-1)"


def test_a_page_or_garbled_answer_is_not_printed_whole():
    cloud = for_env(AWS)
    for err in (ClientError({"Error": {"Code": "501", "Message": PAGE}}, "GetItem"),
                ResponseParserError(f"Unable to parse response, invalid XML received:\n{PAGE}")):  # fmt: skip
        assert len(cloud.explain(err)) < 400


def test_an_endpoint_without_a_scheme_names_the_variable_and_the_fix(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "localhost:4566")
    assert for_env(AWS).explain(EndpointInvalid(endpoint="localhost:4566")) == (
        "AWS_ENDPOINT_URL 'localhost:4566' is not a URL; write http://localhost:4566"
    )


def test_building_a_client_on_an_endpoint_without_a_scheme_fails_in_the_clouds_errors(monkeypatch):
    """Clients are built lazily, inside whatever command first needs one: botocore's ValueError
    must come out as one of `errors`, wherever that is."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "localhost:4566")
    cloud = for_env(AWS)
    with pytest.raises(cloud.errors) as caught:
        cloud.store.job("x-1")
    assert cloud.explain(caught.value) == "AWS_ENDPOINT_URL 'localhost:4566' is not a URL; write http://localhost:4566"


def test_building_a_client_on_an_endpoint_that_does_not_parse_fails_in_the_clouds_errors(monkeypatch):
    """urlsplit refuses some URLs ("Invalid IPv6 URL") before botocore's own check can name them:
    still the endpoint named, with why, not a ValueError."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://[::1")
    cloud = for_env(AWS)
    with pytest.raises(cloud.errors) as caught:
        cloud.store.job("x-1")
    assert cloud.explain(caught.value) == (
        "AWS_ENDPOINT_URL 'http://[::1' is not a URL (Invalid IPv6 URL); write a URL like http://localhost:4566"
    )


def test_a_profile_no_file_has_names_the_variable_the_files_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_DEFAULT_PROFILE", raising=False)
    monkeypatch.setenv("AWS_PROFILE", "nosuch")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
    assert for_env(AWS).explain(ProfileNotFound(profile="nosuch")) == (
        f"AWS profile 'nosuch' (AWS_PROFILE) is not in the AWS config or credentials file ({tmp_path / 'config'}, "
        "~/.aws/credentials); create it with `aws configure --profile nosuch`, or unset AWS_PROFILE"
    )


def test_a_key_id_without_its_secret_is_said_as_incomplete_credentials_not_an_unreachable_aws(monkeypatch, tmp_path):
    import boto3

    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    with pytest.raises(for_env(AWS).errors) as refused:
        boto3.Session().client("sts", region_name="us-east-1").get_caller_identity()
    assert for_env(AWS).explain(refused.value) == (
        "incomplete AWS credentials: the environment has no AWS_SECRET_ACCESS_KEY; set it too, or use a profile "
        "with both keys (AWS_PROFILE)")


@pytest.mark.parametrize(("text", "where"), [
    ("[default\nx", "line 1: '[default'"),
    ("[default]\nx\n", "line 2: 'x'"),
    ("[a]\nk = 1\nk = 2\n", "line 3: option 'k' in section 'a' already exists"),
    ("[a]\n[a]\n", "line 2: section 'a' already exists"),
])
@pytest.mark.parametrize("variable", ["AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"])
def test_a_config_file_that_does_not_parse_is_named_with_the_line(monkeypatch, tmp_path, variable, text, where):
    """botocore reads both files when a client is built: the one named by the variable, where it went wrong."""
    import boto3

    bad = tmp_path / "badcfg"
    bad.write_text(text)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, str(bad) if name == variable else str(tmp_path / "none"))
    with pytest.raises(ConfigParseError) as caught:
        boto3.session.Session().client("sqs", region_name="us-east-1")
    what = "config" if variable == "AWS_CONFIG_FILE" else "credentials"
    assert for_env(AWS).explain(caught.value) == (
        f"the AWS {what} file {bad} ({variable}) does not parse ({where}); fix it, or point {variable} at another file"
    )


def test_a_google_credentials_file_that_is_missing_or_unusable_is_named(monkeypatch, tmp_path):
    """google-auth reads the file GOOGLE_APPLICATION_CREDENTIALS names and stops there: "set
    GOOGLE_APPLICATION_CREDENTIALS" is no advice when it is set. The real error of a real lookup."""
    import google.auth

    login = "`gcloud auth application-default login`"
    gone, bad = tmp_path / "gone.json", tmp_path / "bad.json"
    bad.write_text("{")
    lines = []
    for path in (gone, bad):
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
        with pytest.raises(DefaultCredentialsError) as caught:
            google.auth.default()
        lines.append(for_env(GCP).explain(caught.value))
    assert lines == [
        (f"GOOGLE_APPLICATION_CREDENTIALS names {gone}, which does not exist; point it at a credentials file, or unset "
         f"it and run {login}"),
        (f"GOOGLE_APPLICATION_CREDENTIALS names {bad}, which holds no usable credentials (File {bad} is not a valid json "
         f"file.); point it at a service account key or an application-default credentials file, or unset it and run "
         f"{login}"),
    ]


def test_a_google_credentials_variable_naming_a_directory_is_one_line_from_every_kind_of_command(tmp_path):
    """google-auth opens the file GOOGLE_APPLICATION_CREDENTIALS names when a client is built and
    let the IsADirectoryError through: a traceback from every GCP command. A job command, the tick
    (the scaler's clients) and the agent (a node's)."""
    folder = tmp_path / "keys"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_", "TIDEFLEET_"))}
    env |= {"GOOGLE_APPLICATION_CREDENTIALS": str(folder), "HOME": str(tmp_path), "NO_GCE_CHECK": "True"}
    commands = [["nodes"], ["tick", "--dry-run"], ["agent", "--pool", "cpu", "--work-dir", str(tmp_path)]]
    runs = [subprocess.Popen([sys.executable, "-m", "tidefleet.cli", *c, "--env", "gcp-dev"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]  # fmt: skip
    says = (f"GOOGLE_APPLICATION_CREDENTIALS names {folder}, which is a directory, not a credentials file; point it "
            "at the key file (.json) in it, or unset it and run `gcloud auth application-default login`")
    for command, run in zip(commands, runs, strict=True):
        out, err = run.communicate(timeout=90)
        lines = [line for line in err.splitlines() if line.strip() and " INFO " not in line]
        assert run.returncode == 1 and "Traceback" not in out + err, (command, err[-2000:])
        assert lines == [f"Error: {says}"], (command, err[-2000:])


def test_a_google_credentials_file_that_cannot_be_read_is_named_with_why(monkeypatch, tmp_path):
    """No permission to read the file: google-auth lets the PermissionError through as it does a
    directory's error (made here by google-auth's open, as root reads any file)."""
    import google.auth._default
    from google.auth.exceptions import DefaultCredentialsError

    key = tmp_path / "key.json"
    key.write_text("{}")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))

    def unreadable(filename, *args, **kwargs):
        raise PermissionError(13, "Permission denied", filename)

    monkeypatch.setattr(google.auth._default.io, "open", unreadable)
    cloud = for_env(GCP)
    with pytest.raises(DefaultCredentialsError) as caught:
        cloud.store  # noqa: B018 (building the client reads the credentials)
    assert cloud.explain(caught.value) == (
        f"GOOGLE_APPLICATION_CREDENTIALS names {key}, which cannot be read (Permission denied); let this user read "
        "it, point it at another credentials file, or unset it and run `gcloud auth application-default login`"
    )


@pytest.fixture
def sandbox_aws(aws):
    env = load_environment("sandbox")
    provision(env, user_data={"cpu": "#!/bin/sh\n"})
    return env


def test_a_job_that_is_not_there_is_not_found_but_an_empty_answer_is_not_aws(sandbox_aws, monkeypatch):
    """GetItem of a missing key is a well-formed `{}` (no Item): "not found". An empty 202 from a
    web server parses the same way, and must not be taken for it."""
    assert for_env(sandbox_aws).store.job("nope-1") is None  # moto: the real answer, no Item
    with bad_endpoints.empty_answers() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        cloud = for_env(sandbox_aws)
        with pytest.raises(NotAws) as caught:
            cloud.store.job("nope-1")
        assert cloud.explain(caught.value) == (
            f"the endpoint {url} did not answer like the AWS API (HTTP 202); check AWS_ENDPOINT_URL"
        )


def test_a_queue_url_missing_from_a_well_formed_answer_is_not_a_key_error(monkeypatch):
    for_env(AWS)  # the process's clients check answers
    with bad_endpoints.empty_objects() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for key, value in FAKE_CREDENTIALS.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(NotAws, match="did not answer like the AWS API"):
            SqsWorkQueues(AWS).url("default")


def test_a_long_poll_waits_longer_than_the_read_timeout(sandbox_aws):
    """Every other call gives up after READ_TIMEOUT_S of silence; an agent's long poll on an
    empty queue is silent for its whole wait, and must come back empty, not time out."""
    queues = for_env(sandbox_aws).queues
    queue = next(iter(sandbox_aws.queues))
    started = time.monotonic()
    assert queues.receive(queue, 1, READ_TIMEOUT_S + 2) == []
    assert time.monotonic() - started >= READ_TIMEOUT_S


def test_an_endpoint_that_never_answers_is_reported_within_half_a_minute(tmp_path):
    """A port that takes the connection and says nothing (a paused emulator): botocore's 60 s read
    timeout times its retries made this four minutes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIDEFLEET_"))}
    items = tmp_path / "items.txt"
    items.write_text("s3://bucket/a\n")
    commands = [["status", "x-1"], ["submit", "--queue", "default", "--name", "t", "--items", str(items)], ["nodes"]]
    with bad_endpoints.silent() as url:
        env |= {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": url, "AWS_DEFAULT_REGION": "us-east-1",
                "HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "none")}  # fmt: skip
        started = time.monotonic()
        runs = [subprocess.Popen([sys.executable, "-m", "tidefleet.cli", *c, "--env", "dev"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]  # fmt: skip
        outputs = [run.communicate(timeout=90) for run in runs]
        took = time.monotonic() - started
    for command, run, (out, err) in zip(commands, runs, outputs, strict=True):
        lines = [line for line in err.splitlines() if line.strip()]
        assert run.returncode == 1 and len(lines) == 1 and "Traceback" not in out + err, (command, err)
        assert f"{url}/ took the connection but did not answer within {READ_TIMEOUT_S} s" in lines[0], (command, err)
    assert took < 45, f"took {took:.0f}s"


@pytest.mark.parametrize(("answer", "says"), [
    (EXPIRED, f"your AWS credentials have expired; {REFRESH}"),
    (DENIED_SCAN, ("this AWS identity may not call dynamodb:Scan; use one that may (AWS_PROFILE) or have it allowed "
                  '(README "What each identity may do")')),
    (THROTTLED, "AWS still throttled the call after 3 tries with backoff; wait a minute and run it again"),
], ids=["expired-token", "access-denied", "throttled"])  # fmt: skip
def test_the_cli_says_what_to_do_about_an_expired_token_a_denied_action_and_throttling(tmp_path, answer, says):
    """What AWS answered, short, then the fix: a person's (log in again, another identity, wait),
    from every command that reads the job table or ticks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIDEFLEET_"))}
    commands = [["cost"], ["tick", "--dry-run"], ["logs", "x-1"], ["rightsize"]]
    with bad_endpoints.aws_errors(*answer) as url:
        env |= {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": url, "AWS_DEFAULT_REGION": "us-east-1",
                "HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "none")}  # fmt: skip
        runs = [subprocess.Popen([sys.executable, "-m", "tidefleet.cli", *c, "--env", "sandbox"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]  # fmt: skip
        outputs = [run.communicate(timeout=90) for run in runs]
    for command, run, (out, err) in zip(commands, runs, outputs, strict=True):
        lines = [line for line in err.splitlines() if line.strip()]
        assert run.returncode == 1 and len(lines) == 1 and "Traceback" not in out + err, (command, err)
        assert f"Error: {answer[0]}: " in lines[0] and says in lines[0], (command, lines[0])
        assert "because no identity-based policy" not in lines[0]


def test_a_partly_deployed_environment_names_what_is_missing_and_the_env_the_user_gave(sandbox_aws, tmp_path):
    """A deleted log group (or table) is that resource missing, not AWS's bare "does not exist.:";
    the deploy hint names the environment as the user did (a path its name would not find)."""
    import boto3
    from click.testing import CliRunner

    from tidefleet import naming
    from tidefleet.cli import main
    from tidefleet.jobs import sdk

    given = tmp_path / "elsewhere" / "sandbox.toml"
    given.parent.mkdir()
    given.write_text((ROOT / "environments" / "sandbox.toml").read_text())
    job = sdk.submit(sandbox_aws, "partly", "demo", sdk.read_items(["a"]), kick=False).job_id
    boto3.client("logs", region_name="us-east-1").delete_log_group(logGroupName=naming.item_log_group("sandbox"))
    deploy = f"deploy it with `invoke deploy --env {given}`"
    logs = CliRunner().invoke(main, ["logs", "--env", str(given), job])
    assert logs.exit_code == 1 and "Traceback" not in logs.output, logs.output
    assert ("Error: CloudWatch Logs log group '/tidefleet/sandbox/items' does not exist: environment 'sandbox' is not "
            f"(fully) deployed in us-east-1; {deploy}") in logs.output, logs.output
    boto3.client("dynamodb", region_name="us-east-1").delete_table(TableName=naming.table("sandbox"))
    for command in (["cost"], ["tick", "--dry-run"]):
        out = CliRunner().invoke(main, [*command, "--env", str(given)])
        assert out.exit_code == 1 and "Traceback" not in out.output, out.output
        assert ("DynamoDB table 'tidefleet-sandbox' does not exist: environment 'sandbox' is not (fully) deployed in "
                f"us-east-1; {deploy}") in out.output, (command, out.output)


def test_a_pool_without_a_group_names_the_env_the_user_gave(aws, tmp_path):
    from click.testing import CliRunner

    from tidefleet.cli import main

    env = load_environment("sandbox")
    provision(env, user_data={"cpu": "#!/bin/sh\n"})
    given = tmp_path / "sandbox.toml"
    given.write_text((ROOT / "environments" / "sandbox.toml").read_text().replace("[pools.cpu]", "[pools.more]\n"
                     "capacity_unit = \"nodes\"\nmin = 0\nmax = 1\ncommand = \"true\"\ninstance_types = [{ type = "
                     "\"c6i.large\" }]\n\n[pools.cpu]", 1))  # fmt: skip
    out = CliRunner().invoke(main, ["tick", "--dry-run", "--env", str(given)])
    assert out.exit_code == 1 and "Traceback" not in out.output, out.output
    assert f"no group for pool(s) more: sandbox is not deployed in us-east-1; deploy it with `invoke deploy --env {given}`" \
        in out.output, out.output


def test_a_queue_added_since_the_deploy_names_the_env_the_user_gave(aws, tmp_path):
    """tick reads each queue's backlog: a queue the environment file has and the cloud does not is
    QueueMissing, whose deploy hint repeats --env as given (a path its name would not find)."""
    from click.testing import CliRunner

    from tidefleet.cli import main

    provision(load_environment("sandbox"), user_data={"cpu": "#!/bin/sh\n"})
    given = tmp_path / "elsewhere" / "sandbox.toml"
    given.parent.mkdir()
    given.write_text((ROOT / "environments" / "sandbox.toml").read_text() + '\n[queues.more]\npool = "cpu"\n')
    out = CliRunner().invoke(main, ["tick", "--dry-run", "--env", str(given)])
    assert out.exit_code == 1 and "Traceback" not in out.output, out.output
    assert ("queues.more: SQS queue 'tidefleet-sandbox-more' does not exist in us-east-1; deploy the environment "
            f"first (invoke deploy --env {given})") in out.output, out.output  # fmt: skip


def test_an_agent_whose_queue_is_missing_names_it(aws, tmp_path):
    """The table is there, the queues are not (a deploy that stopped half way): the agent's first
    queue lookup names the queue, as submit and tick do, not AWS's bare "The specified queue does
    not exist"."""
    from tidefleet.cloud.aws.dynamodb import create_table
    from tidefleet.emulator import free_port

    create_table("dev", "us-east-1")
    env = {**os.environ, "TIDEFLEET_IMDS_URL": f"http://127.0.0.1:{free_port()}", "TIDEFLEET_NODE_ID": "n-1"}
    run = subprocess.run([sys.executable, "-m", "tidefleet.cli", "agent", "--env", "dev", "--pool", "cpu",
                          "--work-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                         check=False)  # fmt: skip
    lines = [line for line in run.stderr.splitlines() if line.strip() and " INFO " not in line]
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    says = ("Error: queues.default: SQS queue 'tidefleet-dev-default' does not exist in us-east-1; deploy the "
            "environment first (invoke deploy --env dev)")
    assert lines == [says], run.stderr


def test_the_deploy_hint_names_an_environment_given_as_a_path_by_its_path(tmp_path):
    for name in ("dev", "gcp-dev"):
        given = tmp_path / f"{name}.toml"
        given.write_text((ROOT / "environments" / f"{name}.toml").read_text())
        cloud = for_env(load_environment(str(given)))
        missing = client_error("ResourceNotFoundException") if name == "dev" else gexc.NotFound("subscription gone")
        assert f"deploy it with `invoke deploy --env {given}`" in cloud.explain(missing)
        assert "deploy it with `invoke deploy --env dev`" in for_env(AWS).explain(client_error("ResourceNotFoundException"))


def test_an_unreachable_endpoint_suggests_the_emulator_only_where_one_is_configured(monkeypatch):
    """Deploying makes no endpoint reachable (the line used to say "or deploy it", mid-deploy too)."""
    unreachable = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    for variable in [k for k in os.environ if k.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(variable)
    line = for_env(AWS).explain(unreachable)
    assert line.endswith("check AWS_ENDPOINT_URL, credentials and network") and "deploy" not in line, line
    for variable in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS"):  # botocore reads per-service ones too
        monkeypatch.setenv(variable, "http://127.0.0.1:9")
        assert for_env(AWS).explain(unreachable).endswith(
            "check AWS_ENDPOINT_URL, credentials and network, or start the emulator (`tidefleet sandbox --keep`) and "
            "export what it prints")
        monkeypatch.delenv(variable)
    gcp = for_env(GCP).explain(requests.ConnectionError("refused"))
    assert gcp.endswith("check credentials and network") and "deploy" not in gcp, gcp
