"""The BUILT function archives start under their real runtimes, with nothing of this repository
on the path.

GCP: the Cloud Function archive, unzipped, is served by the real Functions Framework CLI as the
Python buildpack runs it (`functions-framework --source main.py --target on_kick
--signature-type cloudevent`, from the source directory), in a venv holding only what the
archive's requirements.txt installs; it is sent Pub/Sub CloudEvents as Eventarc sends them.
The GCP adapters call Google's fixed https endpoints and no emulator exists for Compute Engine
or Cloud Monitoring (tests/gcp_fake.py fakes them inside the test process only), so the tick's
calls go through a loopback HTTPS proxy that also serves the OAuth token endpoint of a generated
service-account key: it records each host the adapters ask for and refuses the tunnel, so the
tick fails cleanly at Google's door, with one line naming the failure.

AWS: the Lambda archive, unzipped, is imported by Lambda's Python version in isolated mode
(`-I`: no PYTHON* variables, no user site, no script or working directory on sys.path) from a
venv holding only boto3 (what the Lambda runtime provides), with the archive's directory put
first on sys.path as Lambda puts its task root; its handlers run real events against the moto
server.

Both venvs are made once per (interpreter, requirements) under build/test-venvs/ from the pip
cache and reused. Lambda's wheels are cp312, so the AWS test needs a Python 3.12 (found on PATH
or under pyenv); the GCP test uses it too when there is one (the function's runtime is python312).
"""

from __future__ import annotations

import base64
import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from stacks.gcp.control import PUBLISHED
from stacks.package import PLATFORM, ROOT, build_aws_archive, build_gcp_archive, runtime_wheels
from tidefleet import metrics, naming
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment

VENVS = ROOT / "build" / "test-venvs"
LAMBDA_VERSION = PLATFORM[PLATFORM.index("--python-version") + 1]
EVENTS = Path(__file__).parent / "events"
GCP_ENV = load_environment("gcp-dev")
START_TIMEOUT_S = 60
PROBE = "import importlib.util as u, tidefleet; print(u.find_spec('stacks'), u.find_spec('lambdas'), tidefleet.__file__)"
AWS_MODULES = (
    "import sys, main; print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 'lambdas')"
    " or m.startswith(('tidefleet.cloud.aws', 'tidefleet.cloud.work'))))"
)


def version_of(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def lambda_python() -> str | None:
    """An interpreter of Lambda's Python version, if this machine has one."""
    candidates = [sys.executable, shutil.which(f"python{LAMBDA_VERSION}"),
                  *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{LAMBDA_VERSION}*/bin/python3")))]  # fmt: skip
    return next((c for c in candidates if c and version_of(c) == LAMBDA_VERSION), None)


def venv_with(python: str, requirements: list[str]) -> Path:
    """A venv holding only `requirements`, made once (xdist workers wait for each other)."""
    key = hashlib.sha256(repr((version_of(python), sorted(requirements))).encode()).hexdigest()[:12]
    path = VENVS / key
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "ready").exists():
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run([python, "-m", "venv", str(path)], check=True, capture_output=True, timeout=120)
            pip = subprocess.run([path / "bin" / "python", "-m", "pip", "install", "--quiet", *requirements],
                                 capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
            if pip.returncode:
                offline = any(s in pip.stderr for s in ("No matching distribution", "Failed to establish"))
                (pytest.skip if offline else pytest.fail)(f"pip install {requirements}: {pip.stderr.strip()[-1500:]}")
            (path / "ready").touch()
    return path


def unzip(archive: Path, into: Path) -> Path:
    with zipfile.ZipFile(archive) as z:
        z.extractall(into)
    return into


def clean_env(**extra: str) -> dict[str, str]:
    """Only PATH from this process: no PYTHONPATH, no virtualenv, no credentials of this machine."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- GCP ------------------------------------------------------------------------------------


class GoogleDoor(BaseHTTPRequestHandler):
    """Hands out an OAuth token (the credentials' token_uri) and refuses every tunnel to Google,
    recording the host asked for."""

    hosts: list[str]

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"access_token": "test-token", "expires_in": 3600, "token_type": "Bearer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self):
        self.server.hosts.append(self.path)
        self.send_response(403, "no Google here")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def google_door():
    server = ThreadingHTTPServer(("127.0.0.1", 0), GoogleDoor)
    server.hosts = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def cloud_function(tmp_path_factory, google_door):
    """The built Cloud Function archive served by functions-framework: its url, log, source and venv."""
    work = tmp_path_factory.mktemp("gcp-function")
    source = unzip(build_gcp_archive(work / "gcp-scaler-gcp-dev.zip", env=GCP_ENV)[0], work / "workspace")
    wanted = [line.split("#")[0].strip() for line in (source / "requirements.txt").read_text().splitlines()]
    python = venv_with(lambda_python() or sys.executable, [w for w in wanted if w])  # pip -r's lines, comments aside
    door = f"http://127.0.0.1:{google_door.server_address[1]}"
    credentials = work / "key.json"  # a service account key, as Google issues them, its token_uri aside
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    credentials.write_text(json.dumps({
        "type": "service_account", "project_id": GCP_ENV.project, "private_key_id": "1", "private_key": key.decode(),
        "client_email": f"scaler@{GCP_ENV.project}.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": f"{door}/token",
    }))  # fmt: skip
    env = clean_env(HOME=str(work), TIDEFLEET_ENV=GCP_ENV.name, GOOGLE_APPLICATION_CREDENTIALS=str(credentials),
                    GOOGLE_CLOUD_PROJECT=GCP_ENV.project, HTTPS_PROXY=door, NO_GCE_CHECK="True")  # fmt: skip
    # Nothing of the repository is importable from the workspace: no `stacks`, and `tidefleet` is the archive's.
    probe = subprocess.run(
        [python / "bin" / "python", "-c", PROBE],
        cwd=source, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert probe.stdout.split() == ["None", "None", str(source / "tidefleet" / "__init__.py")]
    port = free_port()
    log = work / "function.log"
    with open(log, "wb") as out:
        # bin/python runs the console script as its shebang would, from wherever the venv lives.
        server = subprocess.Popen(
            [python / "bin" / "python", python / "bin" / "functions-framework", "--source", "main.py",
             "--target", "on_kick", "--signature-type", "cloudevent", "--host", "127.0.0.1", "--port", str(port)],
            cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert server.poll() is None, f"functions-framework exited {server.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"functions-framework not serving after {START_TIMEOUT_S}s"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/", log=log, source=source, python=python)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def pubsub_cloud_event(data: str, *, structured: bool) -> tuple[dict[str, str], bytes]:
    """Headers and body of the POST Eventarc makes for a message on the kick topic."""
    topic = f"//pubsub.googleapis.com/projects/{GCP_ENV.project}/topics/{naming.kick_topic(GCP_ENV.name)}"
    attributes = {"specversion": "1.0", "type": PUBLISHED, "source": topic, "id": f"{time.time_ns()}",
                  "time": "2026-01-01T00:00:00.000Z"}  # fmt: skip
    payload = {"message": {"data": data, "messageId": attributes["id"], "publishTime": attributes["time"]},
               "subscription": f"projects/{GCP_ENV.project}/subscriptions/eventarc-{GCP_ENV.region}-kick-sub"}  # fmt: skip
    if structured:
        event = {**attributes, "datacontenttype": "application/json", "data": payload}
        return {"Content-Type": "application/cloudevents+json"}, json.dumps(event).encode()
    return {"Content-Type": "application/json", **{f"ce-{k}": v for k, v in attributes.items()}}, json.dumps(
        payload
    ).encode()


def b64json(message: dict) -> str:
    return base64.b64encode(json.dumps(message).encode()).decode()


def post_and_read_log(cloud_function, data: str, structured: bool) -> tuple[int, list[dict]]:
    """The HTTP status, and the JSON lines the function logged for this request."""
    url, log = cloud_function.url, cloud_function.log
    before = len(log.read_bytes())
    headers, body = pubsub_cloud_event(data, structured=structured)
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as response:
        status = response.status
    time.sleep(0.2)  # the worker's log line reaches the file
    lines = log.read_bytes()[before:].decode().splitlines()
    return status, [json.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.parametrize("structured", [False, True], ids=["binary", "structured"])
@pytest.mark.parametrize("data,reason", [
    pytest.param("not base64 !", "message data is not base64 JSON", id="not-base64"),
    pytest.param("kické", "message data is not base64 JSON", id="not-ascii"),
    pytest.param(base64.b64encode(b"[" * 1500 + b"]" * 1500).decode(), "message data nests deeper", id="nested-1500"),
    pytest.param(b64json({"hello": "world"}), "unknown event", id="unknown"),
    pytest.param(b64json({"tidefleet": "kick", "env": "prod"}), "reached the function of 'gcp-dev'", id="other-env"),
])  # fmt: skip
def test_the_built_cloud_function_ignores_malformed_messages_with_200_and_one_line(
    cloud_function, data, reason, structured
):
    status, lines = post_and_read_log(cloud_function, data, structured)
    assert status == 200
    assert len(lines) == 1 and reason in lines[0]["ignored"]


def test_the_built_cloud_function_runs_a_schedule_tick_through_the_gcp_ports_and_fails_cleanly(
    cloud_function, google_door
):
    google_door.hosts.clear()
    status, lines = post_and_read_log(cloud_function, b64json({"tidefleet": "schedule"}), structured=False)
    assert status == 200
    assert len(lines) == 1 and lines[0]["severity"] == "ERROR" and lines[0]["trigger"] == "schedule"
    assert "googleapis.com" in lines[0]["failed"]
    # The tick reached the adapters: they asked for the Google APIs of the ports (google-auth may also
    # ask iamcredentials for the key's access boundary).
    assert {h.split(".")[0] for h in google_door.hosts} & {"monitoring", "compute", "firestore"}


def test_the_cloud_function_loads_nothing_of_aws(cloud_function):
    loaded = subprocess.run(
        [cloud_function.python / "bin" / "python", "-c", AWS_MODULES],
        cwd=cloud_function.source, env=clean_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert loaded.stdout.strip() == "[]"


# -- AWS ------------------------------------------------------------------------------------


HANDLERS = """
import importlib, importlib.util, json, sys
sys.path.insert(0, sys.argv[1])  # Lambda's task root comes first
import pydantic_core, tidefleet
assert importlib.util.find_spec("stacks") is None, "the repository is importable"
print(json.dumps({"tidefleet": tidefleet.__file__, "pydantic_core": pydantic_core.__file__}))
for target, event in json.loads(sys.argv[2]):
    module, function = target.rsplit(".", 1)
    print(json.dumps(getattr(importlib.import_module(module), function)(event, None)))
"""


@pytest.fixture(scope="module")
def lambda_archive(tmp_path_factory):
    python = lambda_python()
    if python is None:
        pytest.skip(f"the Lambda archive's wheels are cp{LAMBDA_VERSION.replace('.', '')}: install Python "
                    f"{LAMBDA_VERSION} to import it here")  # fmt: skip
    try:
        wheels = runtime_wheels()
    except RuntimeError as err:
        pytest.skip(f"cannot pip download the Lambda wheels here: {err}")
    work = tmp_path_factory.mktemp("lambda")
    archive = build_aws_archive(work / "functions-sandbox.zip", wheels=wheels, env=load_environment("sandbox"))[0]
    task_root = unzip(archive, work / "task")
    return task_root, venv_with(python, ["boto3>=1.34,<2"])


def event(name: str) -> dict:
    return json.loads((EVENTS / f"{name}.json").read_text())


@pytest.mark.moto
def test_the_built_lambda_handlers_run_real_events_from_the_archive_alone(aws, lambda_archive):
    task_root, venv = lambda_archive
    env = load_environment("sandbox")
    provision(env, user_data={pool: "#!/bin/sh\n" for pool in env.pools})
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=naming.queue("sandbox", "demo"))["QueueUrl"]
    for i in range(5):  # 5 one-slot items, 2 slots a node
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"item": i}))
    calls = [("lambdas.scaler.handler.handler", event("schedule")),
             ("lambdas.interruption.handler.handler", event("malformed")),
             ("lambdas.scaler.handler.handler", "garbage"),
             ("lambdas.schedule.handler.handler", {"tidefleet": "watch"})]  # fmt: skip
    run = subprocess.run(
        [venv / "bin" / "python", "-I", "-c", HANDLERS, str(task_root), json.dumps(calls)],
        cwd=task_root, env=clean_env(**aws.env(), TIDEFLEET_ENV="sandbox", HOME=str(task_root.parent)),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    lines = run.stdout.splitlines()
    emf = [line for line in lines if line.startswith('{"_aws"')]  # the scaler's metrics (EMF)
    assert emf and all(metrics.from_emf(line)[1] for line in emf)
    paths, tick, interruption, garbage, watch = (json.loads(line) for line in lines if line not in emf)
    assert {Path(p).relative_to(task_root).parts[0] for p in paths.values()} == {"tidefleet", "pydantic_core"}
    assert tick["trigger"] == "schedule" and tick["desired"] == {"cpu": 3}
    group = boto3.client("autoscaling", region_name="us-east-1").describe_auto_scaling_groups(
        AutoScalingGroupNames=[naming.group("sandbox", "cpu")]
    )["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 3
    assert set(interruption) == {"ignored"} and set(garbage) == {"ignored"}
    assert run.stderr.count('{"ignored": ') == 2
    assert watch == {"trigger": "watch", "env": "sandbox", "watched": {}}, "the schedule function runs from the archive"


# What the Lambda runtime (awslambdaric's handle_event_request) does with a handler that raises: it
# reports the exception's type, message and stack, from the handler's frame down, in one record.
LAMBDA_RUNTIME = """
import importlib, json, logging, sys, traceback
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")  # Lambda's root logger
sys.path.insert(0, sys.argv[1])
for target, event in json.loads(sys.argv[2]):
    module, function = target.rsplit(".", 1)
    try:
        print(json.dumps({"result": getattr(importlib.import_module(module), function)(event, None)}))
    except Exception as err:
        stack = traceback.extract_tb(err.__traceback__)[1:]  # the runtime drops its own frames
        print(json.dumps({"errorType": type(err).__name__, "errorMessage": str(err),
                          "stackTrace": traceback.format_list(stack)}))
    print("-- end of invocation", file=sys.stderr, flush=True)
"""
NO_CREDENTIALS = {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                  "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
FAILURES = {  # situation -> (what the process gets besides the moto server's variables, what the line says)
    "TIDEFLEET_ENV unset": ({"TIDEFLEET_ENV": None}, "TIDEFLEET_ENV: not set; the function's stack sets it"),
    "TIDEFLEET_ENV misspelt": ({"TIDEFLEET_ENV": "sandbx"}, ("TIDEFLEET_ENV: no environment 'sandbx' in the "
                                                             "function's package (it has: sandbox); ")),
    "no credentials": ({"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None},
                       "no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    "endpoint dead": ({"AWS_ENDPOINT_URL": "dead"}, "cannot reach AWS for 'sandbox' (Could not connect to the endpoint"),
    "not deployed": ({}, ("DynamoDB table 'tidefleet-sandbox' does not exist: environment 'sandbox' is not (fully) "
                         "deployed in us-east-1; deploy it with `invoke deploy --env sandbox`")),
}  # fmt: skip


@pytest.mark.moto
@pytest.mark.parametrize("situation", FAILURES)
def test_the_built_lambda_handlers_fail_the_invocation_with_one_line_and_no_traceback(aws, lambda_archive, situation):
    task_root, venv = lambda_archive
    env = load_environment("sandbox")
    provision(env, user_data={pool: "#!/bin/sh\n" for pool in env.pools})
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    autoscaling.set_desired_capacity(AutoScalingGroupName=naming.group("sandbox", "cpu"), DesiredCapacity=1)
    (node,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[naming.group("sandbox", "cpu")])[
        "AutoScalingGroups"][0]["Instances"]  # fmt: skip
    boto3.client("dynamodb", region_name="us-east-1").delete_table(TableName=naming.table("sandbox"))
    notice = json.loads((EVENTS / "spot_warning.json").read_text().replace("i-1234567890abcdef0", node["InstanceId"]))
    calls = [("lambdas.scaler.handler.handler", event("schedule")),
             ("lambdas.interruption.handler.handler", notice),
             ("lambdas.schedule.handler.handler", {"tidefleet": "watch"})]  # fmt: skip
    changes, says = FAILURES[situation]
    variables = {**aws.env(), **NO_CREDENTIALS, "TIDEFLEET_ENV": "sandbox", "HOME": str(task_root.parent),
                 "TIDEFLEET_KICK_URL": f"http://127.0.0.1:{free_port()}/", **changes}  # fmt: skip
    if variables["AWS_ENDPOINT_URL"] == "dead":
        variables["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run(
        [venv / "bin" / "python", "-I", "-c", LAMBDA_RUNTIME, str(task_root), json.dumps(calls)],
        cwd=task_root, env=clean_env(**{k: v for k, v in variables.items() if v is not None}),
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    reports = [json.loads(line) for line in run.stdout.splitlines() if not line.startswith('{"_aws"')]
    logs = run.stderr.split("-- end of invocation\n")[:-1]
    assert len(reports) == len(logs) == 3, run.stdout + run.stderr
    for (target, _), report, log in zip(calls, reports, logs, strict=True):
        assert report["errorType"] == "FunctionFailed", (target, report)  # the invocation fails: Errors, a retry
        assert says in report["errorMessage"] and "\n" not in report["errorMessage"], (target, report)
        (frame,) = report["stackTrace"]  # the handler's own raise, nothing of the library
        assert "raise FunctionFailed(" in frame, (target, frame)
        errors = [line for line in log.splitlines() if line.startswith("ERROR ")]
        assert len(errors) == 1, (target, log)
        assert json.loads(errors[0].split(" ", 2)[2]) == {"failed": report["errorMessage"]}, (target, log)


# -- what the archives leave out ---------------------------------------------------------------


def packaged_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_the_archives_hold_no_simulator_or_sandbox_and_only_their_environments_file(cloud_function, lambda_archive):
    """The functions never import tidefleet.sim or tidefleet.sandbox (the tests above run them
    from archives without either); the environments/ folder holds the file of the environment
    the archive was built for and nothing else (the function loads environments/<TIDEFLEET_ENV>.toml)."""
    for folder, name in ((cloud_function.source, GCP_ENV.name), (lambda_archive[0], "sandbox")):
        names = packaged_files(folder)
        assert not {n for n in names if n.startswith(("tidefleet/sim/", "tidefleet/sandbox/"))}, folder
        assert {n for n in names if n.startswith("environments/")} == {f"environments/{name}.toml"}
        assert (folder / "environments" / f"{name}.toml").read_bytes() == (ROOT / "environments" / f"{name}.toml").read_bytes()
