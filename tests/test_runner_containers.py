"""A container attempt's container ends with the attempt: the agent's signals reach the `docker run`
client only, and a container whose client is gone runs on under dockerd, holding the GPUs and
memory of the slot that the node's next item takes. Against a fake `docker` on PATH whose
containers, as under dockerd, are processes outside the client's reach."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from agent_harness import wait_until

from tidefleet.agent import runner
from tidefleet.agent.attempt import Signal
from tidefleet.agent.runner import Workload
from tidefleet.config import Pool, Queue
from tidefleet.jobs.sdk import ItemMessage
from tidefleet.jobs.spec import JobSpec, resolve

# The parts of docker's CLI the agent uses. Each call is appended to calls.log; a container is
# <id>.json (its pid and labels) in $FAKE_DOCKER_STATE; $FAKE_DOCKER_ANSWER ("verbs|exit code or
# hang|stderr", verbs comma-separated) makes those verbs answer like a broken or older docker; a
# hung call leaves hung-<pid> there, for the test to end it. As docker does, `run` refuses a bind
# mount of a relative path, runs the container outside the client's folder as --user (uid:gid),
# and passes SIGTERM on.
FAKE_DOCKER = r'''
import json, os, re, signal, subprocess, sys, time, uuid
from pathlib import Path

STATE = Path(os.environ["FAKE_DOCKER_STATE"])
args = sys.argv[1:]
with open(STATE / "calls.log", "a") as calls:
    calls.write(json.dumps(args) + "\n")
verb, forced = args[0], os.environ.get("FAKE_DOCKER_ANSWER", "").split("|")
if verb in forced[0].split(","):
    if forced[1] == "hang":
        (STATE / f"hung-{os.getpid()}").touch()
        time.sleep(600)
    print(forced[2].replace("{id}", args[-1]), file=sys.stderr)
    sys.exit(int(forced[1]))


def find(ref):  # a full id or a prefix, as docker takes either
    return next((p for p in STATE.glob("*.json") if p.stem.startswith(ref)), None)


def labelled(labels, wanted):  # label=KEY or label=KEY=VALUE
    key, has_value, value = wanted.partition("=")
    return key in labels and (not has_value or labels[key] == value)


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def refused(why):
    print(f"docker: Error response from daemon: {why}", file=sys.stderr)
    sys.exit(125)


if verb == "run":
    i, cidfile, labels, rm, user = 1, None, {}, False, {}
    while args[i].startswith("-"):
        if args[i] == "--rm":
            rm, i = True, i + 1
            continue
        option, value, i = args[i], args[i + 1], i + 2
        if option == "--cidfile":
            cidfile = value
        elif option == "--user":
            uid, gid = map(int, value.split(":"))
            user = {"user": uid, "group": gid, "extra_groups": []}
        elif option == "--label":
            key, _, text = value.partition("=")
            labels[key] = text
        elif option == "-v":  # docker's own words for a relative bind mount
            source, _, target = value.partition(":")
            if not target.startswith("/"):
                refused(f"invalid volume specification: '{value}': invalid mount config for type \"volume\": "
                        f"invalid mount path: '{target}' mount path must be absolute")
            if not source.startswith("/") and not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", source):
                refused(f'create {source}: "{source}" includes invalid characters for a local volume name, only '
                        '"[a-zA-Z0-9][a-zA-Z0-9_.-]" are allowed. If you intended to pass a host directory, use '
                        "absolute path.")
    if cidfile and os.path.exists(cidfile):
        refused(f"Container ID file found, make sure the other container isn't running or delete {cidfile}.")
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    out = STATE / f"{cid}.out"
    proxied = []  # docker run's --sig-proxy: a SIGTERM to the client reaches its container
    signal.signal(signal.SIGTERM, lambda *_: [os.kill(pid, signal.SIGTERM) for pid in proxied])
    # Its own session, output to a file, in the image's folder: like a container under dockerd,
    # the client's death (SIGKILL) reaches it neither by a signal nor by a closed pipe.
    with open(out, "wb") as sink:
        container = subprocess.Popen(args[i + 1:], stdin=subprocess.DEVNULL, stdout=sink,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd="/", **user)
    proxied.append(container.pid)
    if cidfile:  # before the container is listed, as docker writes it between create and start
        Path(cidfile).write_text(cid)
    (STATE / f"{cid}.json").write_text(json.dumps({"pid": container.pid, "labels": labels}))
    code = container.wait()
    sys.stdout.write(out.read_text())
    if rm:
        (STATE / f"{cid}.json").unlink(missing_ok=True)
    sys.exit(code if code >= 0 else 128 - code)
elif verb in ("kill", "rm"):
    missing = []
    for ref in [a for a in args[1:] if not a.startswith("-")]:
        found = find(ref)
        if found is None:
            print(f"Error response from daemon: No such container: {ref}", file=sys.stderr)
            missing.append(ref)
            continue
        pid = json.loads(found.read_text())["pid"]
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        if verb == "rm":
            found.unlink()
        print(ref)
    sys.exit(1 if missing else 0)
elif verb == "ps":
    wanted = [a.split("=", 1)[1] for a in args if a.startswith("label=")]
    template = args[args.index("--format") + 1] if "--format" in args else "{{.ID}}"
    for path in STATE.glob("*.json"):
        box = json.loads(path.read_text())
        listed = "-a" in args or alive(box["pid"])
        if not listed or not all(labelled(box["labels"], w) for w in wanted):
            continue
        line = template.replace("{{.ID}}", path.stem[:12])
        print(re.sub(r'\{\{\.Label "([^"]+)"\}\}', lambda m: box["labels"].get(m.group(1), ""), line))
else:
    sys.exit(f"fake docker: {verb} is not imitated")
'''

CONTAINER = Pool(instance_types=[{"type": "g5.xlarge", "gpus": 1}], max=1, container="ghcr.io/acme/train:1")
COMMAND = Pool(instance_types=[{"type": "c6i.large"}], max=1, command=f"{sys.executable} -c")


class FakeDocker:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.state = tmp_path / "docker"
        self.state.mkdir()
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        program = self.bin / "docker"
        program.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
        program.chmod(0o755)
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_DOCKER_STATE", str(self.state))

    def answer(self, verbs: str, code: int | str, stderr: str = "") -> None:
        """`verbs` ("rm" or "rm,kill") answer with `code` ("hang": never) and `stderr` from now on."""
        self.monkeypatch.setenv("FAKE_DOCKER_ANSWER", f"{verbs}|{code}|{stderr}")

    def calls(self) -> list[list[str]]:
        log = self.state / "calls.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def containers(self) -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text()) for p in self.state.glob("*.json")}

    def running(self) -> list[int]:
        """The pids of the containers whose process still runs, whatever docker knows of them."""
        return [c["pid"] for c in self.containers().values() if alive(c["pid"])]

    def hanging(self) -> list[int]:
        """The pids of the docker calls still hanging (a pid reused since is not one)."""
        pids = [int(p.name.removeprefix("hung-")) for p in self.state.glob("hung-*")]
        return [pid for pid in pids if str(self.bin).encode() in _cmdline(pid)]

    def close(self) -> None:
        """End what a test left: containers still running, docker calls still hanging."""
        for pid in [*self.running(), *self.hanging()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:  # a zombie is gone: nobody may be there to reap a process whose parent died
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


@pytest.fixture
def docker(tmp_path, monkeypatch):
    fake = FakeDocker(tmp_path, monkeypatch)
    yield fake
    fake.close()


class Lines:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, line: str, **_) -> None:
        self.lines.append(line)


def start(work_dir: Path, args: list[str], pool: Pool = CONTAINER, user_name: str | None = None) -> Workload:
    workload = Workload(work_dir / "job-1" / "000000" / "1")
    workload.start(resolve(JobSpec(), Queue(pool="p"), pool), ItemMessage("job-1", "000000", args), 1,
                   "file:///checkpoints/", checkpoint_root=None, user_name=user_name)  # fmt: skip
    return workload


def started(docker: FakeDocker) -> int:
    """The pid of the workload's container, once docker run has started it."""
    return wait_until(lambda: docker.running() and docker.running()[0], 10, "the container to start")


def test_a_killed_docker_run_takes_its_container_with_it(docker, tmp_path):
    """Before its runner sees the exit: after the drain's last SIGKILL the agent leaves at once,
    and its runner threads with it."""
    workload = start(tmp_path / "work", ["sleep", "600"])
    pid = started(docker)
    workload.signal(Signal.KILL)  # the item timeout, the grace after a spot notice, a cancel
    wait_until(lambda: not alive(pid), 10, "the container to die with its client")
    assert workload.wait(Lines())[0] == -signal.SIGKILL
    workload.remove()


def test_a_client_that_dies_on_its_own_leaves_no_container_once_the_attempt_ends(docker, tmp_path):
    """`wait` gives the exit at once, for the outcome to be recorded; `remove`, after it and before
    the agent frees the slot, takes the container (a hung dockerd may hold that up)."""
    workload = start(tmp_path / "work", ["sleep", "600"])
    pid = started(docker)
    os.kill(workload.proc.pid, signal.SIGKILL)  # the OOM killer, a crash: no signal of ours
    assert workload.wait(Lines())[0] == -signal.SIGKILL
    workload.remove()
    assert not alive(pid), "the slot is free only once its container is gone"


GONE = [
    ("docker 20.10 and later: a warning, exit 0", 0, "Error: No such container: {id}"),
    ("docker before 20.10", 1, "Error response from daemon: No such container: {id}"),
    ("--rm removing it", 1, "Error response from daemon: removal of container {id} is already in progress"),
]


@pytest.mark.parametrize(("case", "code", "stderr"), GONE, ids=[g[0] for g in GONE])
def test_a_container_that_ended_normally_is_removed_without_a_word(docker, tmp_path, caplog, case, code,
                                                                   stderr):  # fmt: skip
    workload = start(tmp_path / "work", ["echo", "trained"])
    docker.answer("rm", code, stderr)
    with caplog.at_level(logging.INFO):
        code, _, last_line = workload.wait(Lines())
        workload.remove()
    assert (code, last_line) == (0, "trained")
    assert [c[:2] for c in docker.calls()][-1] == ["rm", "-f"], "the container was asked to go"
    assert caplog.records == []
    assert not workload.workdir.exists()


BROKEN = [
    ("dockerd is down", 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.",
     "Cannot connect to the Docker daemon"),
    ("dockerd hangs", "hang", "", "timed out"),
]


@pytest.mark.parametrize(("case", "code", "stderr", "said"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_removal_that_fails_is_one_log_line_and_the_attempt_still_ends(docker, tmp_path, caplog,
                                                                         monkeypatch, case, code, stderr,
                                                                         said):  # fmt: skip
    monkeypatch.setattr(runner, "DOCKER_S", 1)
    workload = start(tmp_path / "work", ["echo", "trained"])
    docker.answer("rm", code, stderr)
    with caplog.at_level(logging.INFO):
        assert workload.wait(Lines())[0] == 0
        workload.remove()
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and said in caplog.text, caplog.text
    assert not workload.workdir.exists()


def test_docker_gone_by_the_end_of_an_attempt_is_one_log_line(docker, tmp_path, caplog, monkeypatch):
    workload = start(tmp_path / "work", ["echo", "trained"])
    wait_until(lambda: workload.has_exited(), 10, "the container to end")
    monkeypatch.setenv("PATH", os.environ["PATH"].replace(f"{docker.bin}{os.pathsep}", ""))
    with caplog.at_level(logging.INFO):
        assert workload.wait(Lines())[0] == 0
        workload.remove()
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "docker" in caplog.text, caplog.text


def test_an_id_file_left_in_the_attempts_folder_does_not_stop_docker_run(docker, tmp_path):
    """docker refuses to write over an id file; only an agent that died in this folder leaves one."""
    folder = tmp_path / "work" / "job-1" / "000000" / "1"
    folder.mkdir(parents=True)
    runner.cid_path(folder).write_text("0123456789ab")
    workload = start(tmp_path / "work", ["echo", "trained"])
    code, _, last_line = workload.wait(Lines())
    assert (code, last_line) == (0, "trained")
    workload.remove()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root, as the agent on a node has")
def test_a_container_run_as_the_item_user_writes_its_done_file_but_not_its_container_id(docker, request):
    """docker run --user: the attempt's folder is the item user's, as a command pool's is, so its
    done file can be written; the container's id, which the agent removes by, is not in it."""
    work = Path(tempfile.mkdtemp(prefix="tidefleet-work-"))  # pytest's tmp_path is root's alone
    work.chmod(0o755)  # as a node's work folder is: the item user may pass through it
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    folder = work / "job-1" / "000000" / "1"
    forge = 'touch "$TIDEFLEET_DONE_FILE" && echo completed; echo forged > "$1" || echo kept'
    workload = start(work, ["sh", "-c", forge, "sh", str(runner.cid_path(folder))], user_name="nobody")
    code, _, last_line = workload.wait(Lines())
    assert (code, workload.completed(), last_line) == (0, True, "kept")
    assert "forged" not in workload.cid_file.read_text()
    workload.remove()
    assert not workload.cid_file.exists() and not folder.exists()


def test_at_start_the_agent_removes_the_containers_an_agent_before_it_left(docker, tmp_path, caplog):
    killed = start(tmp_path / "work", ["sleep", "600"])  # its agent was killed -9: nobody removes it
    neighbour = start(tmp_path / "other-node-work", ["sleep", "600"])  # a sandbox node sharing this docker
    wait_until(lambda: len(docker.running()) == 2, 10, "both containers to start")
    leftover = next(c["pid"] for c in docker.containers().values()
                    if Path(c["labels"][runner.LABEL]).is_relative_to(tmp_path / "work"))
    os.killpg(killed.proc.pid, signal.SIGKILL)
    killed.proc.wait()
    with caplog.at_level(logging.INFO):
        runner.remove_leftover_containers(CONTAINER, tmp_path / "work")
    assert not alive(leftover), "the leftover is gone"
    assert len(docker.running()) == 1, "another agent's container runs on"
    assert [r.levelno for r in caplog.records] == [logging.INFO] and "1 container" in caplog.text, caplog.text
    neighbour.signal(Signal.KILL)
    neighbour.wait(Lines())
    neighbour.remove()


def test_with_no_docker_on_the_node_the_start_up_sweep_says_docker_does_not_answer(tmp_path, caplog, monkeypatch):
    """The agent makes it the one line of a node that takes nothing (tests/test_agent_node_faults.py)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker there
    with caplog.at_level(logging.INFO):
        unanswered = runner.remove_leftover_containers(CONTAINER, tmp_path / "work")
    assert "No such file or directory: 'docker'" in unanswered and caplog.records == [], caplog.text


def test_a_removal_that_fails_at_start_is_one_log_line_not_an_unanswering_docker(docker, tmp_path, caplog):
    left = start(tmp_path / "work", ["sleep", "600"])
    wait_until(lambda: docker.running(), 10, "the container to start")
    docker.answer("rm", 1, "Error response from daemon: removal of container {id} is not permitted")
    with caplog.at_level(logging.INFO):
        assert runner.remove_leftover_containers(CONTAINER, tmp_path / "work") == ""
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "not permitted" in caplog.text, caplog.text
    left.signal(Signal.KILL)
    left.wait(Lines())


def test_command_pools_never_call_docker(docker, tmp_path, caplog):
    workload = start(tmp_path / "work", ["import time; time.sleep(600)"], pool=COMMAND)
    workload.signal(Signal.KILL)
    with caplog.at_level(logging.INFO):
        assert workload.wait(Lines())[0] == -signal.SIGKILL
        workload.remove()
        runner.remove_leftover_containers(COMMAND, tmp_path / "work")
    assert docker.calls() == [] and caplog.records == []
