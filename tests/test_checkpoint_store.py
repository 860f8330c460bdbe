"""Where `tidefleet.agent.checkpoint` keeps what a workload saves: a save is whole or not there
(also when two run at once or one is killed), a location means one folder on every backend, a
call to the cloud gives up within the README's bounds, and a bad location, name or value is one
clear error before anything is written."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
import requests
from botocore.exceptions import ClientError

from tidefleet.agent import checkpoint

A = b"A" * (4 << 20)
B = b"B" * (1 << 20)


def _save(base: str, data: bytes, barrier) -> None:
    barrier.wait()
    checkpoint.save("state.bin", data, base=base)


def _killed_save(base: str) -> None:
    os.replace = lambda *_: os._exit(9)  # killed after writing, before its rename
    checkpoint.save("state.bin", b"lost", base=base)


def test_two_saves_at_once_leave_one_of_them_whole_and_no_partial_behind(tmp_path):
    base = tmp_path.as_uri() + "/"
    ctx = multiprocessing.get_context("fork")
    for _ in range(12):
        barrier = ctx.Barrier(2)
        procs = [ctx.Process(target=_save, args=(base, data, barrier)) for data in (A, B)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0], "a save raised"
        assert checkpoint.load("state.bin", base=base) in (A, B)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def test_a_killed_saves_leftovers_are_swept_by_the_next_save_and_never_loaded(tmp_path):
    base = tmp_path.as_uri() + "/"
    checkpoint.save("state.bin", b"kept", base=base)
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        p = ctx.Process(target=_killed_save, args=(base,))
        p.start()
        p.join(60)
        assert p.exitcode == 9
    assert checkpoint.load("state.bin", base=base) == b"kept"
    left = [p.name for p in tmp_path.iterdir() if p.name != "state.bin"]
    assert left, "the killed saves left their temporary files"
    checkpoint.save("other", b"x", base=base)  # any save in the folder sweeps them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "state.bin"]
    assert checkpoint.load("state.bin", base=base) == b"kept"


AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def test_a_save_to_an_s3_endpoint_that_never_answers_gives_up_within_half_a_minute(tmp_path):
    silent = socket.create_server(("127.0.0.1", 0), backlog=16)  # takes connections, never answers
    try:
        plain = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEFLEET_", "AWS_"))}
        env = {**plain, **AWS_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        code = "from tidefleet.agent import checkpoint; checkpoint.save('state.json', '{}', base='s3://b/run/')"
        began = time.monotonic()
        try:
            run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=45, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail("the save was still waiting after 45 s")
        took = time.monotonic() - began
    finally:
        silent.close()
    assert run.returncode == 1 and "ReadTimeoutError" in run.stderr, run.stderr[-500:]
    assert 3 * 8 <= took < 35, took  # 3 attempts of 8 s without an answer, and standard backoff


def _slow_s3(server: socket.socket, got: list[int]) -> None:
    """Reads a PutObject's body at 1 MB/s, then answers as S3 does."""
    conn, _ = server.accept()
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(65536)
        head, body = head.split(b"\r\n\r\n", 1)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        received = len(body)
        while received < length:
            received += len(conn.recv(min(100_000, length - received)))
            time.sleep(0.1)
        got.append(received)
        conn.sendall(b'HTTP/1.1 200 OK\r\nx-amz-request-id: r1\r\nETag: "e"\r\nContent-Length: 0\r\n\r\n')


def test_an_upload_longer_than_the_read_timeout_is_not_cut_while_it_is_sending(monkeypatch):
    server = socket.create_server(("127.0.0.1", 0))
    got: list[int] = []
    reader = threading.Thread(target=_slow_s3, args=(server, got), daemon=True)
    reader.start()
    for key, value in {**AWS_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.getsockname()[1]}"}.items():
        monkeypatch.setenv(key, value)
    try:
        began = time.monotonic()
        checkpoint.save("model.pt", b"w" * (10 << 20), base="s3://b/run/")  # ~10 s to send
        assert time.monotonic() - began > 8 and got == [10 << 20]
    finally:
        server.close()


class _SilentOnce:
    """A Cloud Storage session whose first try of each call goes unanswered."""

    def __init__(self):
        self.timeouts: list[float] = []
        self.stored: dict[str, bytes] = {}

    def _try(self, kwargs) -> None:
        self.timeouts.append(kwargs["timeout"])
        if len(self.timeouts) % 2:
            raise requests.ReadTimeout("no answer")

    def post(self, url, params, data, **kwargs):
        self._try(kwargs)
        self.stored[params["name"]] = data
        return _reply(200, b"{}")

    def get(self, url, params, **kwargs):
        self._try(kwargs)
        key = urllib.parse.unquote(url.rsplit("/o/", 1)[1])
        return _reply(200, self.stored[key]) if key in self.stored else _reply(404, b"{}")


def _reply(status: int, content: bytes) -> requests.Response:
    reply = requests.Response()
    reply.status_code, reply._content = status, content
    return reply


def test_a_cloud_storage_call_gives_up_a_try_after_8_s_without_an_answer_and_tries_again():
    from tidefleet.cloud.gcp.objects import GcsObjects

    store = GcsObjects.__new__(GcsObjects)
    store.session = _SilentOnce()
    store.put("b", "run/state.json", b"{}")
    assert store.get("b", "run/state.json") == b"{}"
    assert store.get("b", "run/other") is None
    assert store.session.timeouts == [8] * 6


def test_a_file_uri_with_a_host_is_refused_naming_it_and_the_three_slash_form(monkeypatch):
    monkeypatch.setenv("TIDEFLEET_CHECKPOINT_URI", "file://runA/")
    for call in (lambda: checkpoint.load("state.json"), lambda: checkpoint.save("state.json", b"v")):
        with pytest.raises(ValueError) as refused:
            call()
        assert str(refused.value) == (
            "TIDEFLEET_CHECKPOINT_URI 'file://runA/' names the host 'runA': a file:// location is a folder on this "
            "machine, written with three slashes: file:///absolute/path/"
        )
    with pytest.raises(ValueError, match=r"^checkpoint location 'file:runs/' is a relative path: .*file:///absolute"):
        checkpoint.load("state.json", base="file:runs/")
    with pytest.raises(ValueError, match=r"^checkpoint location 's3:///runs/' names no bucket: write s3://bucket/"):
        checkpoint.load("state.json", base="s3:///runs/")
    with pytest.raises(ValueError, match=r"^checkpoint location 'http://x/' is not file://, s3:// or gs://"):
        checkpoint.load("state.json", base="http://x/")


def test_a_file_uri_on_localhost_is_this_machine(tmp_path):
    checkpoint.save("state.json", b"v", base=f"file://localhost{tmp_path}/")
    assert (tmp_path / "state.json").read_bytes() == b"v"


@pytest.mark.moto
def test_an_s3_location_without_a_trailing_slash_is_a_folder_as_on_file(aws, tmp_path):
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpts")
    checkpoint.save("state.json", b"1", base="s3://ckpts/runs/exp1")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]] == ["runs/exp1/state.json"]
    assert checkpoint.load("state.json", base="s3://ckpts/runs/exp1/") == b"1"
    checkpoint.save("state.json", b"2", base="s3://ckpts")  # the bucket's top
    assert checkpoint.load("state.json", base="s3://ckpts/") == b"2"
    assert checkpoint._location("state.json", "gs://b/runs/exp1") == ("gs", "b", "runs/exp1/state.json")
    checkpoint.save("state.json", b"3", base=tmp_path.as_uri())
    assert (tmp_path / "state.json").read_bytes() == b"3"


BAD_NAMES = ["", ".", "./", "..", "x/.", "./x", "a/", "a//b", "/abs", "a/../b", "a\x00b", "a\nb", "a\rb", "tab\t", "del\x7f", "x" * 300,
             "d/" + "y" * 201, ".tidefleet-complete", ".tidefleet-0a1b2c3d4e5f.state.bin.partial"]  # fmt: skip


@pytest.mark.moto
@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n[:24]))
def test_a_name_outside_the_one_rule_is_refused_on_every_backend_before_anything_is_written(aws, tmp_path, name):
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpts")
    folder = tmp_path / "item"
    for base in (folder.as_uri() + "/", "s3://ckpts/item/"):
        with pytest.raises(ValueError, match=r"^checkpoint name .*: a checkpoint name is a relative path such as"):
            checkpoint.save(name, b"v", base=base)
        if name != checkpoint.COMPLETE_MARKER:  # the agent reads the marker
            with pytest.raises(ValueError, match=r"^checkpoint name "):
                checkpoint.load(name, base=base)
    assert not folder.exists() and "Contents" not in s3.list_objects_v2(Bucket="ckpts")


def test_the_refusal_names_the_name_why_and_the_rule_in_one_line(tmp_path):
    with pytest.raises(ValueError) as refused:
        checkpoint.save("ckpt/./model.pt", b"v", base=tmp_path.as_uri())
    assert str(refused.value) == (
        "checkpoint name 'ckpt/./model.pt': a part is '.': a checkpoint name is a relative path such as 'state.json' or "
        "'ckpt/step-100.pt': parts between single slashes, none empty, '.' or '..', no control character (NUL, newline, tab...), at most 200 bytes a "
        "part and 512 in all, not starting with '.tidefleet-' (tidefleet's own files)"
    )
    with pytest.raises(ValueError, match=r"^checkpoint name 'xxxxxxxxxx\.\.\.' \(300 characters\): a part is over 200 "):
        checkpoint.save("x" * 300, b"v", base=tmp_path.as_uri())
    with pytest.raises(TypeError, match=r"^checkpoint name 7: a name is a str such as 'state.json', not a int$"):
        checkpoint.save(7, b"v", base=tmp_path.as_uri())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.moto
@pytest.mark.parametrize("data", [{"step": 1}, None, 3], ids=["dict", "None", "int"])
def test_a_value_that_is_not_bytes_or_str_is_a_type_error_before_anything_is_written(aws, tmp_path, data):
    import boto3

    boto3.client("s3").create_bucket(Bucket="ckpts")
    for base in (tmp_path.as_uri(), "s3://ckpts/item/"):
        with pytest.raises(TypeError) as refused:
            checkpoint.save("state.json", data, base=base)
        assert str(refused.value) == (
            f"checkpoint.save('state.json', ...) got a {type(data).__name__}: save takes bytes or str "
            "(json.dumps(...) a dict; torch.save(...) into an io.BytesIO and give its getvalue())"
        )
    assert list(tmp_path.iterdir()) == []
    checkpoint.save("state.json", bytearray(b"ok"), base=tmp_path.as_uri())
    assert checkpoint.load("state.json", base=tmp_path.as_uri()) == b"ok"


def test_complete_still_leaves_its_marker_and_the_agent_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDEFLEET_CHECKPOINT_URI", tmp_path.as_uri() + "/")
    monkeypatch.setenv("TIDEFLEET_ATTEMPT", "2")
    monkeypatch.delenv("TIDEFLEET_DONE_FILE", raising=False)
    checkpoint.complete()
    assert checkpoint.load(checkpoint.COMPLETE_MARKER, base=tmp_path.as_uri() + "/") == b"2"
    for name in ("x/.", "d/./e", "a//b"):  # the same file as 'x', 'd/e', 'a/b' on disk; other keys on S3
        with pytest.raises(ValueError):
            checkpoint.save(name, b"v")


@pytest.mark.parametrize(("saved", "then"), [("a", "a/b"), ("a", "a/b/c"), ("a/b", "a"), ("a/b/c", "a")])
def test_a_name_that_is_both_a_checkpoint_and_a_folder_of_checkpoints_on_file_is_one_clear_error(tmp_path, saved, then):
    base = tmp_path.as_uri() + "/"
    checkpoint.save(saved, b"kept", base=base)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    checkpoint_first = "/" in then  # 'a' was saved, then a name under 'a/'
    for call in (lambda: checkpoint.save(then, b"v", base=base), lambda: checkpoint.load(then, base=base)):
        with pytest.raises(ValueError) as refused:
            call()
        where = f"checkpoint location {base!r}"
        rule = "on file:// a name cannot be both a checkpoint and a folder of checkpoints (S3 and GCS allow it)"
        assert str(refused.value) == (
            f"checkpoint name {then!r}: 'a' is already a checkpoint in {where}, and {rule}: give {then!r} a name "
            "outside 'a/' (or remove the checkpoint 'a' first)"
            if checkpoint_first
            else f"checkpoint name 'a': 'a' is already a folder of checkpoints in {where} (it holds {saved!r}), and "
            f"{rule}: give 'a' another name (or remove the folder 'a' first)"
        )
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before  # nothing written
    assert checkpoint.load(saved, base=base) == b"kept"


def test_a_file_location_that_is_a_file_is_refused_on_save_and_load(tmp_path):
    (tmp_path / "run").write_bytes(b"not a folder")
    base = (tmp_path / "run").as_uri()
    for call in (lambda: checkpoint.save("state.json", b"v", base=base), lambda: checkpoint.load("state.json", base=base)):
        with pytest.raises(ValueError, match=r"is a file, not a folder: point it at a folder \(file:///absolute/path/\)"):
            call()
    assert (tmp_path / "run").read_bytes() == b"not a folder"


def test_a_save_fsyncs_its_folder_after_the_rename_so_a_power_loss_keeps_it(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    target = folder / "state.bin"
    real_fsync, synced_folders = os.fsync, []

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced_folders.append((os.fstat(fd).st_ino, target.exists() and target.read_bytes()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    checkpoint.save("ckpt/state.bin", b"new", base=tmp_path.as_uri())
    assert (folder.stat().st_ino, b"new") in synced_folders, "the folder was not fsynced after the rename"


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP], ids=errno.errorcode.get)
def test_a_filesystem_that_refuses_to_fsync_a_folder_still_saves(tmp_path, monkeypatch, code):
    real_fsync, refused = os.fsync, []

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            refused.append(fd)
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    checkpoint.save("state.bin", b"v", base=tmp_path.as_uri())
    assert refused and checkpoint.load("state.bin", base=tmp_path.as_uri()) == b"v"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]




def test_the_first_save_into_new_folders_fsyncs_the_folders_that_hold_them(tmp_path, monkeypatch):
    real_fsync, synced = os.fsync, []
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real_fsync(fd)))
    checkpoint.save("ckpt/step-1/model.pt", b"w", base=(tmp_path / "run").as_uri())  # makes run/, ckpt/, step-1/
    holders = [tmp_path, tmp_path / "run", tmp_path / "run" / "ckpt", tmp_path / "run" / "ckpt" / "step-1"]
    assert [folder.name for folder in holders if folder.stat().st_ino not in synced] == []


def test_a_checkpoint_named_like_an_older_versions_partial_is_the_users_and_is_kept(tmp_path):
    # Before the '.tidefleet-' partials, a save wrote '<name>.partial'; such a file may be one a
    # killed old save left, or a checkpoint the user named 'x.partial': no save removes it.
    base = tmp_path.as_uri() + "/"
    checkpoint.save("x.partial", b"mine", base=base)
    checkpoint.save("x", b"other", base=base)
    assert checkpoint.load("x.partial", base=base) == b"mine"


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
                         ids=["ENOSPC", "KeyboardInterrupt"])  # fmt: skip
def test_a_save_that_fails_mid_write_leaves_no_partial_and_the_last_checkpoint_whole(tmp_path, monkeypatch, fault):
    base = tmp_path.as_uri() + "/"
    checkpoint.save("x.partial", b"mine", base=base)  # a user's name, as an older version's partials were
    checkpoint.save("x", b"kept", base=base)
    real_write = os.write

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".partial"):
            real_write(fd, bytes(data[:10]))
            raise fault
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(type(fault)):
        checkpoint.save("x", b"new" * 100_000, base=base)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x", "x.partial"]  # before any later save's sweep
    assert (checkpoint.load("x", base=base), checkpoint.load("x.partial", base=base)) == (b"kept", b"mine")


@pytest.fixture
def s3_clients(aws, monkeypatch):
    """boto3 clients built from here on, each still a real one (against the moto server)."""
    import boto3

    from tidefleet.cloud.aws import objects

    boto3.client("s3").create_bucket(Bucket="ckpts")
    built, real = [], boto3.session.Session.client
    monkeypatch.setattr(boto3.session.Session, "client", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    objects._CLIENTS.clear()  # none an earlier test built
    yield built
    objects._CLIENTS.clear()


@pytest.mark.moto
def test_saves_and_loads_to_s3_build_one_client_per_process_not_one_per_call(s3_clients):
    # A client per call: its build and a new connection each save (26 ms a save against the moto server, 10 ms with one).
    for step in range(5):
        checkpoint.save("state.json", str(step), base="s3://ckpts/run/")
        assert checkpoint.load("state.json", base="s3://ckpts/run/") == str(step).encode()
    assert checkpoint.load("other", base="s3://ckpts/run/") is None
    assert len(s3_clients) == 1


@pytest.mark.moto
def test_an_s3_client_is_built_again_when_the_variables_it_was_built_from_change(s3_clients, monkeypatch):
    checkpoint.save("state.json", b"1", base="s3://ckpts/run/")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    checkpoint.save("state.json", b"2", base="s3://ckpts/run/")
    assert [c.meta.region_name for c in s3_clients] == ["us-east-1", "eu-west-1"]
    checkpoint.save("state.json", b"3", base="s3://ckpts/run/")
    assert len(s3_clients) == 2


def _save_in_child(conn) -> None:
    from tidefleet.cloud.aws import objects

    checkpoint.save("state.json", b"child", base="s3://ckpts/run/")
    conn.send(objects._client() is not _PARENTS_CLIENT[0])


_PARENTS_CLIENT: list = []


@pytest.mark.moto
def test_a_forked_child_builds_its_own_s3_client_and_the_parent_keeps_its_own(s3_clients):
    # boto3 clients are not fork-safe: a child using the parent's would share its connections.
    from tidefleet.cloud.aws import objects

    checkpoint.save("state.json", b"parent", base="s3://ckpts/run/")
    _PARENTS_CLIENT[:] = [objects._client()]
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=_save_in_child, args=(child_end,))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and parent_end.recv() is True, "the child used the parent's client"
    assert checkpoint.load("state.json", base="s3://ckpts/run/") == b"child"
    assert objects._client() is _PARENTS_CLIENT[0] and len(s3_clients) == 1


@pytest.fixture
def gcs(monkeypatch):
    """The Cloud Storage fake of the GCP adapters' tests, and each time credentials are looked up."""
    import google.auth
    import responses
    from google.auth.credentials import AnonymousCredentials

    from tests.gcp_fake import FakeGcp
    from tidefleet.cloud.gcp import objects

    looked_up: list[dict] = []
    monkeypatch.setattr(google.auth, "default", lambda **k: looked_up.append(k) or (AnonymousCredentials(), "p"))
    fake = FakeGcp("p", "us-central1")
    objects._SESSIONS.clear()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake, looked_up
    objects._SESSIONS.clear()


def test_saves_to_gcs_look_up_credentials_and_build_a_session_once_per_process(gcs):
    # Each save found the credentials again and built a new session, whose token was fetched anew.
    fake, looked_up = gcs
    for step in range(5):
        checkpoint.save("state.json", str(step), base="gs://ckpts/run/")
    assert fake.objects == {"ckpts/run/state.json": b"4"}
    assert len(looked_up) == 1


def test_a_gs_checkpoint_with_a_key_directory_says_so_not_is_a_directory_error(tmp_path, monkeypatch):
    """A workload's gs:// save where GOOGLE_APPLICATION_CREDENTIALS names a folder: google-auth's
    IsADirectoryError said nothing of the variable; the CLIs' line is the error now."""
    from google.auth.exceptions import DefaultCredentialsError

    for name in [k for k in os.environ if k.startswith(("GOOGLE_", "CLOUDSDK_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with pytest.raises(DefaultCredentialsError, match=f"^GOOGLE_APPLICATION_CREDENTIALS names {tmp_path}, which is a "
                                                      "directory, not a credentials file; point it at the key file"):
        checkpoint.save("state.json", b"v", base="gs://bucket/run/")


@pytest.mark.parametrize("base", ["file:///tmp/runs/exp#1/", "s3://ckpts/exp?a/", "gs://b/runs/x#", "s3://b/x?"])
def test_a_location_with_a_query_or_fragment_is_refused_not_cut_short(base):
    """urlparse drops them: file:///tmp/runs/exp#1/ and exp#2/ were one folder, /tmp/runs/exp."""
    with pytest.raises(ValueError, match=r"has a [?#], which a location's URL reads as its query or fragment"):
        checkpoint.load("state.json", base=base)


def test_a_gcs_load_from_a_bucket_that_does_not_exist_is_an_error_not_no_checkpoint():
    """A mistyped gs:// base started training from scratch (S3 says NoSuchBucket)."""
    from google.api_core.exceptions import NotFound

    from tidefleet.cloud.gcp.objects import GcsObjects

    store = GcsObjects.__new__(GcsObjects)
    def missing_bucket(self, url, params, **kwargs):
        reply = _reply(404, json.dumps({"error": {"code": 404, "message": "The specified bucket does not exist."}}).encode())
        reply.request = requests.Request("GET", url).prepare()
        return reply

    store.session = type("Session", (), {"get": missing_bucket})()
    with pytest.raises(NotFound, match="bucket does not exist"):
        store.get("typo", "run/state.json")
    store.session = type("Session", (), {"get": lambda self, url, params, **kw: _reply(404, b"No such object: b/run/state.json")})()
    assert store.get("b", "run/state.json") is None


def test_an_s3_read_denied_with_its_listing_denied_too_says_the_reads_refusal():
    """The listing that tells missing from denied was refused as well: its error named ListObjectsV2."""
    import boto3
    from botocore.stub import Stubber

    from tidefleet.cloud.aws.objects import S3Objects

    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_client_error("get_object", "AccessDenied", "not allowed to s3:GetObject", 403)
        stub.add_client_error("list_objects_v2", "AccessDenied", "not allowed to s3:ListBucket", 403)
        store = S3Objects.__new__(S3Objects)
        store.s3 = client
        with pytest.raises(ClientError, match="GetObject"):
            store.get("ckpts", "run/state.json")


@pytest.mark.parametrize("verb", ["save", "load"])
def test_a_cloud_error_of_a_save_or_load_names_the_checkpoint_and_stays_the_clouds_own(monkeypatch, verb):
    """The audit: a denied or unreachable S3 call left the workload a bare botocore traceback that
    named neither the checkpoint nor what to check."""
    refused = ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"}}, "PutObject")

    class Refusing:
        def put(self, *args):
            raise refused

        def get(self, *args):
            raise refused

    monkeypatch.setattr(checkpoint, "object_store", lambda scheme: Refusing())
    with pytest.raises(ClientError) as raised:  # still botocore's: callers catching it still do
        checkpoint.save("state.json", b"1", base="s3://ckpts/run/") if verb == "save" else checkpoint.load(
            "state.json", base="s3://ckpts/run/")  # fmt: skip
    (note,) = raised.value.__notes__
    assert note.startswith(f"tidefleet: checkpoint {verb} of s3://ckpts/run/state.json failed (ClientError)")
