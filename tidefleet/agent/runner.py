"""The I/O of one attempt's workload: its folder, environment, process, signals, output and usage.
No decisions here: what to signal and when is `tidefleet.agent.attempt`."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tidefleet import naming
from tidefleet.agent.attempt import Signal
from tidefleet.agent.gpus import docker_gpu_args, visible_env

if TYPE_CHECKING:
    from tidefleet.config import Pool
    from tidefleet.jobs.sdk import ItemMessage
    from tidefleet.jobs.spec import Resolved
    from tidefleet.ports import LogStream

log = logging.getLogger("tidefleet.agent")

# A container runs under dockerd, out of reach of the signals that end its `docker run` client:
# the client writes the container's id beside the attempt's folder (`Workload.cid_file`: out of
# reach of the workload, which owns its folder and could point the agent's `docker rm -f` at
# another container), and the label (that folder) lets a later agent find what one that died
# left running.
CID_FILE = "container.id"
LABEL = "tidefleet.workdir"
DOCKER_S = 30  # at most, per docker command: a hung dockerd must not hold an attempt for ever
GONE = ("No such container", "is already in progress")  # docker: its --rm removed it, or is removing it
# docker run's own failure (exit 125) ends with a hint under the line that explains it; the
# explaining line is the one an item's reason keeps. "Run ... for more information": docker 25+.
DOCKER_HINT = re.compile(r"(See|Run) 'docker [a-z -]*--help'.*")
# How docker run says its daemon does not answer: the node's fault, not the item's.
DAEMON_DOWN = "docker: Cannot connect to the Docker daemon"
DAEMON_DOWN_EXIT = 125  # docker run's exit code for its own errors


class NodeFault(Exception):
    """This node cannot run any item (its docker daemon does not answer, its item user is
    missing): failing the items it takes would dead-letter them all within a second."""


def workload_command(what: Pool | Resolved, args: list[str], env_names: list[str], mounts: list[Path],
                     user: pwd.struct_passwd | None = None, gpu_indices: list[int] = (),
                     workdir: Path | None = None) -> list[str]:  # fmt: skip
    """The argv for one item: the command with the args appended, or docker run of the container
    (with the job's command, if it set one, before the args) on the item's own GPUs; `workdir`, the
    attempt's folder, is its `LABEL`, and the container's id goes beside it (`cid_path`)."""
    if what.container is None:
        return [*shlex.split(what.command), *args]
    passthrough = [a for name in env_names for a in ("-e", name)]  # values come from our env
    volumes = [a for m in mounts for a in ("-v", f"{m}:{m}")]  # stop file and local checkpoints
    as_user = ["--user", f"{user.pw_uid}:{user.pw_gid}"] if user else []
    command = shlex.split(what.command) if what.command else []
    folder = workdir.absolute() if workdir else None  # absolute: the client runs in that folder
    found_by = ["--cidfile", str(cid_path(folder)), "--label", f"{LABEL}={folder}"] if folder else []
    return ["docker", "run", "--rm", *found_by, *as_user, *docker_gpu_args(list(gpu_indices)), *passthrough,
            *volumes, what.container, *command, *args]  # fmt: skip


def cid_path(workdir: Path) -> Path:
    """Where `docker run` writes the id of an attempt's container: beside its folder, in its
    item's folder, which is the agent's."""
    return workdir.with_name(f"{workdir.name}.{CID_FILE}")


def _docker(*args: str) -> tuple[str, str]:
    """One docker command: (its output, "") or ("", why it failed). A container already gone is
    no failure; it never raises."""
    try:
        done = subprocess.run(["docker", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=DOCKER_S, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:  # no docker on this node; a hung dockerd
        return "", str(err)
    why = [line for line in done.stderr.splitlines() if line.strip() and not any(g in line for g in GONE)]
    if done.returncode != 0 and (why or not done.stderr.strip()):
        return "", f"docker {args[0]} exited {done.returncode}: {why[0][:300] if why else 'without a word'}"
    return done.stdout, ""


def remove_leftover_containers(pool: Pool, work_dir: Path) -> str:
    """At the agent's start: remove the containers of attempts under `work_dir` that an agent before
    it on this node left running (killed -9, restarted), which hold the GPUs and memory its items
    need. Another agent sharing this docker (the sandbox's nodes) has another work_dir.
    Returns why docker does not answer (its `docker ps` failed: no docker, dockerd down or hung),
    "" when it does: every `docker run` of the pool's items would fail the same way."""
    if pool.container is None:
        return ""
    each = '{{.ID}} {{.Label "' + LABEL + '"}}'  # a container's id and its attempt's folder
    listed, unanswered = _docker("ps", "-a", "--filter", f"label={LABEL}", "--format", each)
    if unanswered:
        return unanswered
    ids = [cid for cid, _, folder in (line.partition(" ") for line in listed.splitlines())
           if folder and Path(folder).is_relative_to(work_dir.absolute())]  # fmt: skip
    why = _docker("rm", "-f", *ids)[1] if ids else ""
    if why:
        log.warning("could not remove the containers a previous agent on this node left: %s", why)
    elif ids:
        log.info("removed %d container(s) a previous agent on this node left running: %s",
                 len(ids), " ".join(ids))  # fmt: skip
    return ""


def item_user(name: str | None) -> pwd.struct_passwd | None:
    """The account workloads run as; None: the agent's own. A named user that does not exist is
    the node's fault (it would otherwise run items as root without saying so)."""
    if not name:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise NodeFault(
            f"the item user {name!r} does not exist on this node: its user-data creates it "
            "(or set run_as_root = true on the pool)"
        ) from None


def checkpoint_uri(base: str, root: Path | None, queue: str, msg: ItemMessage) -> str:
    """Per item, the same on every attempt; under its queue's prefix, where the node role may write.
    `root`: local checkpoints (the sandbox), whose folder is made here."""
    key = f"{naming.checkpoint_prefix(queue)}{msg.job}/{msg.item}/"
    if root is not None:
        (root / key).mkdir(parents=True, exist_ok=True)
    return f"{base}/{key}"


def free_port() -> int:
    """A TCP port free on this node now, for a gang's rendezvous (MASTER_PORT): the lead's
    workload binds it moments later, so another process taking it first is unlikely, not impossible."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# After the workload's process group has exited: how long to keep reading what is already in its
# pipe (a daemon left holding the pipe must not hold the attempt), and how often to look for its
# exit. What a workload that ends on its own leaves running in its group (a forked child, a
# wrapper script's background job) is stopped as systemd stops a unit's: SIGTERM, SIGKILL after
# LEFTOVER_KILL_S; but only after LEFTOVER_TERM_S, for a daemon it started may not have left the
# group yet (`setsid cmd &` and exit at once).
DRAIN_S = 1.5
POLL_S = 0.25
LEFTOVER_TERM_S = 1.5
LEFTOVER_KILL_S = 5.0
KILLED_WAIT_S = 10.0  # what SIGKILL has not ended by then, it will not
# Of one line of output: more than the 16,000 characters an item log keeps of it (logstream).
MAX_LINE_BYTES = 65_536
LINE_END = re.compile(rb"(\r\n|\r|\n)")


class OutputLines:
    """A workload's output cut into lines as it comes. A carriage return ends a line as a newline
    does: a progress bar (tqdm, pip) redraws its line with one, so each update is a line and the
    log shows the latest, not one line that grows for ever. A line keeps its first
    `MAX_LINE_BYTES`: whatever the output, memory stays bounded and time linear."""

    def __init__(self):
        self.pending = bytearray()  # the line not ended yet
        self.after_cr = False  # the last chunk ended with \r: a \n that starts the next is its \r\n

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines that `chunk` ends."""
        if self.after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self.after_cr = chunk.endswith(b"\r")
        parts = LINE_END.split(chunk)  # text, end, text, end, ..., the text of a line not ended yet
        self.pending += parts[0][: MAX_LINE_BYTES - len(self.pending)]
        if len(parts) == 1:
            return []
        texts = [bytes(self.pending), *(text[:MAX_LINE_BYTES] for text in parts[2:-1:2])]
        self.pending = bytearray(parts[-1][:MAX_LINE_BYTES])
        # A bare \r ending nothing (the one a progress bar starts each redraw with) is no line.
        return [text for text, end in zip(texts, parts[1::2], strict=True) if text or end != b"\r"]


def _live(pgid: int, tag: bytes | None) -> Iterator[tuple[int, bool]]:
    """(pid, whether in the group) of each process, zombies aside, in process group `pgid` or,
    given a tag, whose environment holds it (`Workload.tag`: its attempt's stop file): a process
    that left the group for a session of its own (torchrun starts each worker so, `setsid cmd &`)
    still carries the environment it was started with. A zombie is one that only waits to be
    reaped: the workload's own process, which `Workload.wait` reaps last so that the group's id
    cannot go to another process meanwhile, or an orphan whose reaper is slow. Where there is no
    /proc (not Linux: a sandbox on a laptop), there are none."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # state, ppid and pgrp follow the command's name, which may hold ") "
            state, _, pgrp = stat.read_text().rsplit(") ", 1)[1].split(maxsplit=3)[:3]
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if state in "ZX":
            continue
        if pgrp == str(pgid):
            yield int(stat.parent.name), True
            continue
        try:
            tagged = tag is not None and tag in (stat.parent / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or another user's (an agent that is not root)
            continue
        if tagged:
            yield int(stat.parent.name), False


def group_alive(pgid: int, tag: bytes | None = None) -> bool:
    """Whether a process of the workload is left: in its group, or tagged (`_live`)."""
    return next(_live(pgid, tag), None) is not None


class CannotStart(Exception):
    """The workload's program could not be started."""


class Workload:
    """One attempt's process group and its folder (stop file, done file; a container's id beside it)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.stopped = False  # asked to stop: what it leaves in its group has the agent's grace
        self.leftover: list[tuple[float, int]] | None = None  # ended on its own: (when, signal) to come
        self.exited_at: float | None = None  # when its own process was seen to have exited (monotonic)
        self.killed_at: float | None = None  # when its group was first sent SIGKILL (monotonic)
        self.in_container = False  # its process is the `docker run` client of a container
        # Its processes out of its group carry this in their environment (`_live`); None for a
        # container, whose processes docker stops and removes.
        self.tag: bytes | None = None

    @property
    def stop_file(self) -> Path:
        return self.workdir / "STOP"

    @property
    def done_file(self) -> Path:
        return self.workdir / "DONE"

    @property
    def cid_file(self) -> Path:
        return cid_path(self.workdir)

    def completed(self) -> bool:
        return self.done_file.exists()

    def start(self, what: Resolved, msg: ItemMessage, attempt: int, checkpoint: str, *, checkpoint_root: Path | None,
              user_name: str | None, gpu_indices: list[int] = (), extra_env: dict | None = None,
              grace_s: float | None = None) -> None:  # fmt: skip
        """Start the workload in its own process group (so a signal reaches its children too).
        `what`: the job's command or container and env over the pool's (`jobs.spec.resolve`);
        `gpu_indices`: the item's own GPUs, the only ones it sees; `extra_env`: a gang's rank and
        rendezvous (`agent.gang.workload_env`); `grace_s`: the agent's grace after a stop, which
        torchrun is told too (it SIGKILLs its workers 30 s after a SIGTERM by default, a save cut
        short under a longer grace), unless the job's or pool's env sets it.
        Raises CannotStart when the program cannot be started, NodeFault for a missing item user;
        anything else it raises (a command that does not parse) is as much the item's failure."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.in_container = what.container is not None
        if self.in_container:  # docker run refuses an old id file (an agent died in this folder)
            self.cid_file.unlink(missing_ok=True)
        item_env = {
            **({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(math.ceil(grace_s))} if grace_s is not None else {}),
            **what.env,
            **(visible_env(list(gpu_indices)) if gpu_indices else {}),
            "TIDEFLEET_JOB_ID": msg.job,
            "TIDEFLEET_ITEM_ID": msg.item,
            "TIDEFLEET_ATTEMPT": str(attempt),
            "TIDEFLEET_CHECKPOINT_URI": checkpoint,
            "TIDEFLEET_STOP_FILE": str(self.stop_file),
            "TIDEFLEET_DONE_FILE": str(self.done_file),
            # The Python that has tidefleet (its checkpoint module): a node's python3 is the image's.
            **({} if self.in_container else {"TIDEFLEET_PYTHON": sys.executable}),
            **(extra_env or {}),
        }
        self.tag = None if self.in_container else f"TIDEFLEET_STOP_FILE={self.stop_file}".encode()
        mounts = [self.workdir] + ([checkpoint_root.resolve()] if checkpoint_root else [])
        user = item_user(user_name)
        as_user: dict = {}
        if user is not None:  # its done file, and its own files, go in its folder
            os.chown(self.workdir, user.pw_uid, user.pw_gid)
        if user is not None and what.container is None:  # a container gets --user instead
            as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            item_env |= {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}
        argv = workload_command(what, msg.args, list(item_env), mounts, user, gpu_indices, self.workdir)
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env={**os.environ, **item_env}, cwd=self.workdir, start_new_session=True, **as_user,
            )  # fmt: skip
        except (OSError, ValueError) as err:  # no such program; a NUL byte in an argument
            raise CannotStart(f"could not start {argv[0]!r}: {err}") from err

    def wait(self, stream: LogStream) -> tuple[int, dict, str]:
        """Copy its output to `stream`, line by line (`OutputLines`), until its process group has
        exited: (exit code of its own process, usage, last line of output, not docker's hint
        under its own error: `DOCKER_HINT`). A wrapper script the
        spot notice's SIGTERM ended at once is not the end: its child may still be saving its
        checkpoint, and an item handed back before that is saved resumes from an older one. What
        is left in the group of a workload asked to stop has the grace the agent gives it (the
        agent's SIGKILL ends it); what a workload that ended on its own left there is stopped
        (`LEFTOVER_TERM_S`), for it would hold the slot's GPUs and memory under the next item.
        Once the group has exited, its output is read for up to `DRAIN_S` more, not to EOF: a
        daemon it left in another session (`setsid cmd &`), out of reach of the group's signals,
        may hold the pipe open for ever. Such a daemon gets EPIPE/SIGPIPE on its next write. A
        container's `docker run` client is the process here; its container, which runs on under
        dockerd without it once it is killed, is removed by `remove`."""
        assert self.proc is not None, "started"
        fd = self.proc.stdout.fileno()
        os.set_blocking(fd, False)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        output, last_line = OutputLines(), ""
        reading, drain_until, look_at = True, None, 0.0
        try:
            while True:
                now = time.monotonic()
                if drain_until is None and now >= look_at:  # at most every POLL_S: it reads /proc
                    look_at = now + POLL_S
                    if self._group_ended(now):
                        drain_until = now + DRAIN_S
                if drain_until is not None and (not reading or now >= drain_until):
                    break
                wait_s = max(0.0, (look_at if drain_until is None else drain_until) - now)
                if not reading:  # EOF before its group ended: it is exiting, or it closed its output
                    if self._exited():
                        time.sleep(wait_s)
                    else:  # until its own process exits, then look at its group at once
                        os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
                        look_at = 0.0
                    continue
                if poller.poll(wait_s * 1000):
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if chunk == b"":  # EOF: every holder of the pipe has closed it; it is exiting
                        reading, look_at = False, 0.0
                    for raw in output.feed(chunk):
                        last_line = self._logged(raw, stream, last_line)
            if output.pending:  # a last line with no newline
                last_line = self._logged(bytes(output.pending), stream, last_line)
        finally:
            self.proc.stdout.close()
            if drain_until is None:  # reading failed: leave nothing running
                self._signal_group(signal.SIGKILL)
            # wait4 gives this child's own CPU time and peak memory, even with siblings running.
            _, status, rusage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
        usage = {
            "cpu_s": round(rusage.ru_utime + rusage.ru_stime, 3),
            "peak_rss_mb": round(rusage.ru_maxrss / 1024, 1),
        }
        return self.proc.returncode, usage, last_line

    def _logged(self, raw: bytes, stream: LogStream, last_line: str) -> str:
        """Write one line of its output; the last line so far, which docker's hint is not."""
        line = raw.decode(errors="replace")
        stream.write(line, cut_before=len(raw) >= MAX_LINE_BYTES)  # OutputLines kept its first bytes only
        return last_line if self.in_container and DOCKER_HINT.fullmatch(line) else line

    def daemon_unreachable(self, code: int, last_line: str) -> bool:
        """Whether its `docker run` failed because dockerd does not answer: docker's own error
        (125) saying so, before any container was created (no id in its cid file; a workload
        that prints those words ran in one). A bad image name, an image that does not exist:
        the same exit code, the item's failure."""
        return (self.in_container and code == DAEMON_DOWN_EXIT and last_line.startswith(DAEMON_DOWN)
                and not self._container_id())  # fmt: skip

    def _group_ended(self, now: float) -> bool:
        """Whether its process and all its group have exited; stops what a workload that ended
        on its own left running in its group."""
        if not self._exited():
            return False
        self.exited_at = self.exited_at or now
        if not group_alive(self.proc.pid, self.tag):
            return True
        if self.killed_at is not None and now >= self.killed_at + KILLED_WAIT_S:
            # A process SIGKILL does not end (stuck in the kernel: a hung driver or mount) must not
            # hold the slot, and the item, for ever.
            log.warning("%s: processes of the workload's group outlived SIGKILL by %.0f s (stuck in the kernel?); "
                        "ending the attempt without them", self.workdir, KILLED_WAIT_S)  # fmt: skip
            return True
        if self.leftover is None and self.stopped:  # the agent's grace, then its SIGKILL
            return False
        if self.leftover is None:
            term_at = now + LEFTOVER_TERM_S
            self.leftover = [(term_at, signal.SIGTERM), (term_at + LEFTOVER_KILL_S, signal.SIGKILL)]
        while self.leftover and now >= self.leftover[0][0]:
            self._signal_group(self.leftover.pop(0)[1])
        return False

    def signal(self, what: Signal) -> None:
        """STOP: the stop file and SIGTERM, which docker run passes on to its container (its
        --sig-proxy, on by default). KILL: SIGKILL, and `docker kill` for the container."""
        if what is Signal.STOP:
            self.stopped = True
            try:  # not following a link: the folder is the workload's, the agent is root
                os.close(os.open(self.stop_file, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o644))
            except OSError:  # its folder is gone (it has ended), or STOP is a link it made
                pass
        # The whole process group, also once its own process has exited: shells and their children
        self._signal_group(signal.SIGTERM if what is Signal.STOP else signal.SIGKILL)
        if what is Signal.KILL and (cid := self._container_id()):
            # In the background: signals are sent under the agent's lock, which a hung dockerd must
            # not hold. The rm -f of `remove` is the one whose failure is told.
            threading.Thread(target=_docker, args=("kill", cid), daemon=True).start()

    def _signal_group(self, signum: int) -> None:
        """Its group and its processes out of the group (`_live`), until `wait` has reaped its
        process, whose zombie keeps the group's id from going to another process; by then none is
        left."""
        if self.proc is not None and self.proc.returncode is None:
            if signum == signal.SIGKILL and self.killed_at is None:
                self.killed_at = time.monotonic()
            try:
                os.killpg(self.proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
            for pid, in_group in _live(self.proc.pid, self.tag) if self.tag else ():
                if not in_group:
                    try:
                        os.kill(pid, signum)
                    except (ProcessLookupError, PermissionError):
                        pass

    def has_exited(self) -> bool:
        """Whether it has ended, its process and all its process group, without reaping it
        (`wait` does)."""
        if self.proc is None:
            return False
        return self.proc.returncode is not None or (self._exited() and not group_alive(self.proc.pid, self.tag))

    def _exited(self) -> bool:
        """Whether its own process has ended, without reaping it."""
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # already reaped: its runner is settling it
            return True

    def remove(self) -> None:
        """Its container, then its folder: called once the attempt's outcome is recorded, since a
        hung dockerd holds this up to `DOCKER_S`; and before its slot is free, since a container
        left running holds the slot's GPUs and memory."""
        self._remove_container()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _container_id(self) -> str:
        try:
            return self.cid_file.read_text().strip()
        except OSError:  # not a container, or not created yet, or already removed
            return ""

    def _remove_container(self) -> None:
        """docker rm -f, once. After --rm, the usual answer is that it is gone; any other is one line."""
        if cid := self._container_id():
            _, why = _docker("rm", "-f", cid)
            if why:
                log.warning("could not remove container %s: %s", cid[:12], why)
        with contextlib.suppress(OSError):  # an empty one too: docker run died before writing the id
            self.cid_file.unlink(missing_ok=True)
