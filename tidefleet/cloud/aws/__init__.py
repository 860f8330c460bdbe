"""AWS: SQS queues, the DynamoDB job store, Auto Scaling groups, CloudWatch Logs, instance
metadata. boto3 honours AWS_ENDPOINT_URL, so the same code runs against AWS and the moto server.

`AwsCloud` is what `tidefleet.cloud.for_env` returns for an `aws` environment; `lambda_runtime`
is the functions' cold start.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
from functools import cache, cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.configprovider import ConfiguredEndpointProvider
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConfigParseError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.loaders import create_loader
from botocore.parsers import ResponseParserError

from tidefleet import naming
from tidefleet.cloud.aws.autoscaling import CALLS_IN_FLIGHT, AutoScalingFleet, _no_active_action
from tidefleet.cloud.aws.dynamodb import DynamoStore, Unprocessed
from tidefleet.cloud.aws.endpoint import READ_TIMEOUT_S, NotAws, looks_like_aws
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.cloud.aws.logs import CloudWatchItemLogs
from tidefleet.cloud.aws.sqs import NO_QUEUE, QueueMissing, SqsQueues, SqsWorkQueues
from tidefleet.ports import Ports

if TYPE_CHECKING:
    from tidefleet.config import Environment

# What a call may raise: API errors, transport errors, a garbled answer (a 500 page);
# QueueMissing is a queue lookup's "not deployed", naming the queue.
ERRORS: tuple[type[BaseException], ...] = (BotoCoreError, ClientError, ResponseParserError, QueueMissing, NotAws)
MISSING = {"ResourceNotFoundException", *NO_QUEUE, "NoSuchBucket", "404"}  # a HeadBucket of a missing bucket: a bare 404
# From a spot notice to the reclaim AWS gives 2 minutes, of which the notice may be seen up to
# imds_poll_s late and SETTLE_S may follow the grace: 90 s leaves time to hand items back.
GRACE_S = 90.0
# Someone waits on every call the CLI and the agent make: a refused or silent endpoint ends in
# seconds, not after botocore's legacy retries (ten attempts on DynamoDB: ~26 s) nor after its
# 60 s read timeout per attempt (an endpoint that accepts and never answers: 4 minutes). Three
# attempts of READ_TIMEOUT_S, with standard backoff, report a silent endpoint within ~30 s;
# standard mode still backs off on throttling, and the SDK retries throttled batch writes itself.
# SQS long polls wait longer than READ_TIMEOUT_S: their client has its own (`sqs.LONG_POLL`).
ATTEMPTS = 3
CLIENT_CONFIG = Config(connect_timeout=5, read_timeout=READ_TIMEOUT_S,
                       retries={"mode": "standard", "total_max_attempts": ATTEMPTS})  # fmt: skip
# In a cloud function nobody waits, but its timeout (stacks/aws/functions.py: the interruption
# function's 30 s, the shortest) ends an invocation with no line of ours when one call eats it.
# Calls inside AWS answer in well under a second: a silent endpoint is reported within
# 3 tries x 5 s + at most 3 s of standard backoff = 18 s, a black-holed connect within 12 s,
# leaving the function time to make its other calls and log the failure.
FUNCTION_READ_TIMEOUT_S = 5
FUNCTION_CLIENT_CONFIG = CLIENT_CONFIG.merge(Config(connect_timeout=3, read_timeout=FUNCTION_READ_TIMEOUT_S))
# Error codes of a call the caller's IAM policy does not allow (EC2 says UnauthorizedOperation).
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}
# Credentials AWS no longer (or never did) accept: an expired session (SSO, assumed role), a deleted
# or mistyped key. STS says ExpiredToken, the JSON APIs ExpiredTokenException, EC2 AuthFailure.
EXPIRED = {"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired"}
REFUSED_CREDENTIALS = EXPIRED | {"InvalidClientTokenId", "UnrecognizedClientException", "InvalidAccessKeyId",
                                 "InvalidToken", "SignatureDoesNotMatch", "AuthFailure"}  # fmt: skip
# Throttling, as botocore's standard retry mode counts it (retries/standard.py), less its quota-like
# codes (LimitExceededException: too many log groups, not too many calls): still so after ATTEMPTS.
# Not DynamoDB's batch give-up (`Unprocessed`): a 200 answer botocore never retried, whose own
# message counts the calls made and says what to do.
THROTTLED = {"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
             "TooManyRequestsException", "ProvisionedThroughputExceededException", "RequestLimitExceeded",
             "BandwidthLimitExceeded", "RequestThrottled", "SlowDown", "EC2ThrottledException"}  # fmt: skip
# Calls on the job table: their "does not exist" is the table's.
TABLE_CALLS = {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem", "BatchWriteItem",
               "TransactGetItems", "TransactWriteItems", "DescribeTable"}  # fmt: skip
# The README section that says which calls each identity may make.
IDENTITIES_DOC = 'README "What each identity may do"'


class EndpointInvalid(BotoCoreError):
    """The endpoint URL (AWS_ENDPOINT_URL) is not a URL: botocore's ValueError at client creation.
    `reason`, where given: why it does not parse ("Invalid IPv6 URL")."""

    fmt = "invalid endpoint: {endpoint}"


# Files a profile lives in, where botocore looks when no variable names another.
AWS_FILES = {"AWS_CONFIG_FILE": ("config", "~/.aws/config"),
             "AWS_SHARED_CREDENTIALS_FILE": ("credentials", "~/.aws/credentials")}  # fmt: skip


class _Session(botocore.session.Session):
    """Clients that fail in the cloud's errors: a bad endpoint URL is an `EndpointInvalid` (not a
    ValueError, raised wherever a client is first built), an answer that is not AWS's a `NotAws`.

    Installing it (`_fail_fast`, in every `AwsCloud()`, before any caller's try) reads no profile:
    boto3 builds the model loader there, whose data_path botocore looks up in the config file, so a
    missing AWS_PROFILE or a config file that does not parse raised as a traceback. The first client
    raises them again (`create_client` reads the profile), inside the call its caller explains."""

    def __init__(self):
        super().__init__()
        try:
            data_path = self.get_config_variable("data_path")
        except (ProfileNotFound, ConfigParseError):
            data_path = os.environ.get("AWS_DATA_PATH")
        self.register_component("data_loader", create_loader(data_path))

    def create_client(self, service_name, *args, **kwargs):
        try:
            client = super().create_client(service_name, *args, **kwargs)
        except ValueError as err:
            endpoint = str(err).removeprefix("Invalid endpoint: ")
            if endpoint != str(err):
                raise EndpointInvalid(endpoint=endpoint) from None
            # urlsplit's own refusal ("Invalid IPv6 URL"), before botocore's check could say which URL
            endpoint = kwargs.get("endpoint_url") or ConfiguredEndpointProvider(
                full_config=self.full_config, scoped_config=self.get_scoped_config(), client_name=service_name
            ).provide()
            if not endpoint or _unparsable(endpoint) is None:
                raise
            raise EndpointInvalid(endpoint=endpoint, reason=_unparsable(endpoint)) from None
        client.meta.events.register("before-parse", partial(_check_answer, client.meta.endpoint_url))
        return client


def _unparsable(url: str) -> str | None:
    """Why urlsplit refuses a URL, or None."""
    try:
        urlsplit(url)
    except ValueError as err:
        return str(err)
    return None


def _check_answer(endpoint: str, operation_model, response_dict, **_) -> None:
    """Before botocore parses it: an empty answer (a web server's 202) or a web page is not AWS's,
    which would otherwise parse as an empty result ("job not found") or print the page."""
    body, status = response_dict.get("body"), response_dict["status_code"]
    output = operation_model.output_shape
    if isinstance(body, bytes) and not looks_like_aws(operation_model.metadata["protocol"], status, body,
                                                      response_dict.get("headers", {}),
                                                      has_output=bool(output and output.members)):  # fmt: skip
        raise NotAws(endpoint=endpoint, status=status)


def _function() -> str | None:
    """The name of the Lambda function this process runs (Lambda sets it in every one), or None:
    a function's clients and its error lines are for a function, not for a person at a terminal."""
    return os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or None


@cache
def _fail_fast() -> None:
    """Every boto3 client of this process (`boto3.client(...)`) gets CLIENT_CONFIG (a function's:
    FUNCTION_CLIENT_CONFIG), and fails in ERRORS."""
    session = _Session()
    session.set_default_client_config(FUNCTION_CLIENT_CONFIG if _function() else CLIENT_CONFIG)
    boto3.setup_default_session(botocore_session=session)


def _endpoint_hint(endpoint: str, reason: str | None = None) -> str:
    """'AWS_ENDPOINT_URL 'x' is not a URL; write http://x', naming the variable that set it."""
    variable = next((k for k, v in sorted(os.environ.items()) if k.startswith("AWS_ENDPOINT_URL") and v == endpoint),
                    "the AWS endpoint URL")  # fmt: skip
    fix = f"http://{endpoint}" if re.fullmatch(r"[\w.-]+(:\d+)?(/\S*)?", endpoint) else "a URL like http://localhost:4566"
    return f"{variable} {endpoint!r} is not a URL{f' ({reason})' if reason else ''}; write {fix}"


def _profile_hint(profile: str) -> str:
    """A profile no file has: the variable that named it, the files looked in, and the fix."""
    variable = next((k for k in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE") if os.environ.get(k) == profile), None)
    files = dict.fromkeys(os.environ.get(k) or default for k, (_, default) in AWS_FILES.items())
    unset = f", or unset {variable}" if variable else ""
    return (f"AWS profile {profile!r}{f' ({variable})' if variable else ''} is not in the AWS config or credentials "
            f"file ({', '.join(files)}); create it with `aws configure --profile {profile}`{unset}")  # fmt: skip


def _config_file_hint(err: ConfigParseError) -> str:
    """A config or credentials file that does not parse: which one, the variable that named it, where."""
    path, problem = err.kwargs["path"], err.kwargs.get("error")
    what, variable = "config", None
    for name, (kind, default) in AWS_FILES.items():
        if os.path.realpath(os.path.expanduser(os.environ.get(name) or default)) == os.path.realpath(path):
            what, variable = kind, name if os.environ.get(name) else None
            break
    if isinstance(problem, configparser.ParsingError) and getattr(problem, "errors", None):
        lineno, said = problem.errors[0]  # the line as its repr
        where = f"line {lineno}: {ast.literal_eval(said).strip()!r}"
    elif isinstance(problem, configparser.MissingSectionHeaderError):
        where = f"line {problem.lineno}: {problem.line.strip()!r}"
    elif isinstance(problem, configparser.Error) and getattr(problem, "lineno", None):  # a section or key twice
        where = f"line {problem.lineno}: {str(problem).rpartition(']: ')[2]}"
    else:  # not UTF-8, an indented value that is not `key = value`
        where = _one_line(str(problem or "unreadable"), 100)
    fix = f"fix it, or point {variable} at another file" if variable else "fix it"
    return f"the AWS {what} file {path}{f' ({variable})' if variable else ''} does not parse ({where}); {fix}"


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else f"{line[: limit - 3]}..."


def _aws_says(err: ClientError) -> str:
    """The answer's code and message, short: a refusal's message up to where it restates itself
    ("... because no identity-based policy allows the dynamodb:Scan action") or carries EC2's
    encoded authorization message (hundreds of characters of base64)."""
    code = err.response["Error"]["Code"]
    message = err.response["Error"].get("Message") or code
    if code in DENIED:
        message = re.split(r"\s+because\s|\s*Encoded authorization failure message:", message)[0]
    return f"{code}: {_one_line(message).rstrip('.')}"


def _missing(err: ClientError, env: str) -> str:
    """Which of the environment's resources a "does not exist" answer is about, as the missing
    queue's line names it ("DynamoDB table 'tidefleet-dev' does not exist"): AWS's own words
    ("Requested resource not found") do not say. AWS's words where the call does not tell."""
    error = err.response["Error"]
    said = _one_line(error.get("Message") or error["Code"]).rstrip(".")
    if "log group" in said.lower():  # the only log group the CLI and the agents use
        return f"CloudWatch Logs log group {naming.item_log_group(env)!r} does not exist"
    if err.operation_name in TABLE_CALLS:
        return f"DynamoDB table {naming.table(env)!r} does not exist"
    if err.operation_name == "Invoke":  # a kick
        return f"Lambda function {naming.function(env, 'scaler')!r} does not exist"
    if error.get("BucketName"):
        return f"S3 bucket {error['BucketName']!r} does not exist"
    if err.operation_name == "HeadBucket":  # a bare 404: the artifacts bucket, the only one asked about
        return "the artifacts bucket does not exist"
    return said


def _denied_action(err: ClientError) -> str:
    """The action a refusal names ("... is not authorized to perform: dynamodb:Scan ..."), or "this call"."""
    found = re.search(r"perform:?\s+([\w-]+:[\w*]+)", err.response["Error"].get("Message") or "")
    return found[1] if found else "this call"


def aws_ports(env: Environment) -> Ports:
    _fail_fast()  # the functions' cold start builds its clients here, not through AwsCloud
    store = DynamoStore(env.name, env.region)  # heartbeats, and the queue stats the agents record
    return Ports(queues=SqsQueues(env), fleet=AutoScalingFleet(env), nodes=store, stats=store,
                 calls_in_flight=CALLS_IN_FLIGHT)  # fmt: skip


@cache
def lambda_runtime() -> tuple[Environment, Ports]:
    """Settings and clients, once per cold start: the environment named by TIDEFLEET_ENV.
    The settings (pydantic) load here, on the first trigger, not when the handler is imported."""
    from tidefleet.triggers import function_environment

    env = function_environment()
    return env, aws_ports(env)


class AwsNode:
    """An EC2 instance in a pool's Auto Scaling group."""

    grace_s = GRACE_S
    longest_poll_s = 20  # SQS's longest wait; the 2-minute notice leaves room for it

    def __init__(self, env: Environment, metadata: Metadata | None = None):
        self.env = env
        self.metadata = metadata or Metadata()

    @cached_property
    def autoscaling(self):
        """Built when first used, where its errors are caught (not when the agent starts)."""
        return boto3.client("autoscaling", region_name=self.env.region)

    def protect(self, pool: str, node_id: str, busy: bool) -> None:
        self.autoscaling.set_instance_protection(
            InstanceIds=[node_id], AutoScalingGroupName=naming.group(self.env.name, pool), ProtectedFromScaleIn=busy
        )

    def leave(self, pool: str, node_id: str) -> None:
        """Complete the terminate hook's action by instance id. One no longer active is done
        already: the interruption function released the node first (idle, or its agent silent)."""
        try:
            self.autoscaling.complete_lifecycle_action(
                LifecycleHookName=naming.lifecycle_hook(self.env.name, pool),
                AutoScalingGroupName=naming.group(self.env.name, pool),
                LifecycleActionResult="CONTINUE",
                InstanceId=node_id,
            )
        except ClientError as err:
            if not _no_active_action(err):
                raise

    def retire(self, pool: str, node_id: str) -> None:
        self.autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=node_id, ShouldDecrementDesiredCapacity=True)

    def checkpoint_base(self) -> str:
        return f"s3://{artifacts_bucket(self.env)}"


def artifacts_bucket(env: Environment) -> str:
    """The environment's artifacts bucket: its name carries the account id (names are global)."""
    account = boto3.client("sts", region_name=env.region).get_caller_identity()["Account"]
    return naming.artifacts_bucket(env.name, account)


class AwsCloud:
    name = "aws"
    errors = ERRORS

    def __init__(self, env: Environment):
        self.env = env
        _fail_fast()

    # Built when first used: a kick or a status call needs only some of them.
    @cached_property
    def queues(self) -> SqsWorkQueues:
        return SqsWorkQueues(self.env)

    @cached_property
    def store(self) -> DynamoStore:
        return DynamoStore(self.env.name, self.env.region)

    @cached_property
    def logs(self) -> CloudWatchItemLogs:
        return CloudWatchItemLogs(self.env)

    def control_ports(self) -> Ports:
        return aws_ports(self.env)

    def node_host(self, metadata: Metadata | None = None) -> AwsNode:
        return AwsNode(self.env, metadata)

    def group_members(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """One DescribeAutoScalingGroups call: all `tidefleet nodes` needs (and an operator may)."""
        autoscaling = boto3.client("autoscaling", region_name=self.env.region)
        names = {naming.group(self.env.name, p): p for p in self.env.pools}
        found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=list(names))["AutoScalingGroups"]
        return {names[g["AutoScalingGroupName"]]: (g["DesiredCapacity"], tuple(i["InstanceId"] for i in g["Instances"]))
                for g in found}  # fmt: skip

    def kick(self, payload: bytes) -> str:
        function = naming.function(self.env.name, "scaler")
        boto3.client("lambda", region_name=self.env.region).invoke(
            FunctionName=function, InvocationType="Event", Payload=payload
        )
        return function

    def upload(self, key: str, path: Path) -> str:
        bucket = artifacts_bucket(self.env)
        boto3.client("s3", region_name=self.env.region).upload_file(str(path), bucket, key)
        return f"s3://{bucket}/{key}"

    def artifacts_location(self) -> str:
        bucket = artifacts_bucket(self.env)
        boto3.client("s3", region_name=self.env.region).head_bucket(Bucket=bucket)
        return f"s3://{bucket}"

    def identity(self) -> str:
        return boto3.client("sts", region_name=self.env.region).get_caller_identity()["Arn"]

    def explain(self, err: BaseException) -> str:
        """For a person at the CLI or on a node; inside a function, `_explain_in_function`'s line
        where the fix differs there."""
        if (function := _function()) and (line := self._explain_in_function(err, function)):
            return line
        # loaded already (self.env is one); not on import: a function's cold start loads settings later
        from tidefleet.config import env_argument

        env = self.env.name
        deploy = f"deploy it with `invoke deploy --env {env_argument(self.env)}` or start `tidefleet sandbox --keep`"
        if isinstance(err, NoCredentialsError):
            return ("no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (for the sandbox: "
                    "the export lines `tidefleet sandbox --keep` prints)")
        if isinstance(err, (QueueMissing, NotAws)):
            return str(err)
        if isinstance(err, EndpointInvalid):
            return _endpoint_hint(err.kwargs["endpoint"], err.kwargs.get("reason"))
        if isinstance(err, ProfileNotFound):
            return _profile_hint(err.kwargs["profile"])
        if isinstance(err, PartialCredentialsError):  # a key id without its secret: nothing unreachable
            where = "the environment" if err.kwargs["provider"] == "env" else f"the {err.kwargs['provider']} credentials"
            return (f"incomplete AWS credentials: {where} has no {err.kwargs['cred_var']}; set it too, or use a "
                    "profile with both keys (AWS_PROFILE)")  # fmt: skip
        if isinstance(err, ConfigParseError):
            return _config_file_hint(err)
        if isinstance(err, ClientError):
            code = err.response["Error"]["Code"]
            if code in MISSING:
                return f"{_missing(err, env)}: environment {env!r} is not (fully) deployed in {self.env.region}; {deploy}"
            said = f"{_aws_says(err)} (region {self.env.region})"
            if code in REFUSED_CREDENTIALS:
                what = "have expired" if code in EXPIRED else "are not accepted"
                return (f"{said}: your AWS credentials {what}; refresh them (`aws sso login`, or set AWS_PROFILE to a "
                        "profile with current keys) and run it again")  # fmt: skip
            if code in DENIED:
                return (f"{said}: this AWS identity may not call {_denied_action(err)}; use one that may (AWS_PROFILE) "
                        f"or have it allowed ({IDENTITIES_DOC})")  # fmt: skip
            if code in THROTTLED and not isinstance(err, Unprocessed):  # it says its own count and fix
                return (f"{said}: AWS still throttled the call after {ATTEMPTS} tries with backoff; wait a minute and "
                        "run it again (other callers in the account share the rate)")  # fmt: skip
            return said
        if isinstance(err, ReadTimeoutError):  # a paused emulator, a port that is not an HTTP server
            return (f"the endpoint {err.kwargs.get('endpoint_url')} took the connection but did not answer within "
                    f"{READ_TIMEOUT_S} s ({ATTEMPTS} tries); check AWS_ENDPOINT_URL, or whether the emulator is stuck")
        if isinstance(err, ResponseParserError):  # a garbled answer: its first words, not its bytes
            return f"AWS for {env!r} sent an answer that does not parse ({_one_line(str(err), 80)}); check AWS_ENDPOINT_URL"
        if isinstance(err, ParamValidationError):  # botocore refused to send it: nothing was unreachable
            return f"bad request to AWS for {env!r}, not sent ({_one_line(str(err))})"
        # Deploying makes no endpoint reachable; an emulator's endpoint may just need the emulator,
        # which comes up on a new port: its printed exports replace the stale ones.
        emulator = (", or start the emulator (`tidefleet sandbox --keep`) and export what it prints"
                    if any(k.startswith("AWS_ENDPOINT_URL") for k in os.environ) else "")  # fmt: skip
        return f"cannot reach AWS for {env!r} ({_one_line(str(err))}); check AWS_ENDPOINT_URL, credentials and network{emulator}"

    def _explain_in_function(self, err: BaseException, function: str) -> str | None:
        """The line for an operator reading a function's log, where the fix is not a person's
        (no profile to set, no sandbox to start, no AWS_ENDPOINT_URL of theirs): its credentials
        are its role's and its settings what the stack deployed. None: the same as at the CLI."""
        env, region = self.env.name, self.env.region
        redeploy = f"deploy the environment again (invoke deploy --env {env})"
        if isinstance(err, NoCredentialsError):
            return (f"no AWS credentials in function {function}: Lambda gives it its execution role's; check that "
                    f"role {function} exists and trusts lambda.amazonaws.com, or {redeploy}")  # fmt: skip
        if isinstance(err, ClientError):
            code = err.response["Error"]["Code"]
            if code in DENIED:
                return f"{_aws_says(err)} (region {region}): function {function}'s role may not make this call; {redeploy}"
            if code in MISSING:
                return f"{_missing(err, env)}: environment {env!r} is not (fully) deployed in {region}; {redeploy}"
            if code in REFUSED_CREDENTIALS:  # Lambda renews its role's session: no login of a person's helps
                return (f"{_aws_says(err)} (region {region}): AWS refused function {function}'s credentials (its "
                        f"execution role's, which Lambda renews); if it persists, check that role {function} exists, "
                        f"or {redeploy}")  # fmt: skip
            if code in THROTTLED and not isinstance(err, Unprocessed):  # as at the CLI: its own words
                return (f"{_aws_says(err)} (region {region}): AWS still throttled function {function}'s call after "
                        f"{ATTEMPTS} tries; the next run tries again; if it persists, raise the call's quota "
                        "(Service Quotas) or lengthen the environment's tick_s")  # fmt: skip
            return None
        persists = f"if it persists, see the AWS Health Dashboard for {region}"
        if isinstance(err, ReadTimeoutError):
            return (f"the endpoint {err.kwargs.get('endpoint_url')} took the connection but did not answer function "
                    f"{function} within {FUNCTION_READ_TIMEOUT_S} s ({ATTEMPTS} tries); {persists}")  # fmt: skip
        if isinstance(err, (BotoConnectionError, HTTPClientError)):  # refused, unresolved, cut, no connect in time
            return (f"function {function} cannot reach AWS for {env!r} ({_one_line(str(err))}); {persists}, and that "
                    f"the function sets no AWS_ENDPOINT_URL (its stack sets none)")  # fmt: skip
        return None
