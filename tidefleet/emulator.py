"""The embedded AWS: a moto server on 127.0.0.1, as a child process.

Used by the sandbox and the integration tests. boto3 code is the product's own; only the
endpoint differs (`AWS_ENDPOINT_URL`, honoured natively by boto3).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tidefleet import lifeline

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


# moto's server, less werkzeug's line per request: its log keeps what went wrong (a failed request's
# traceback, a crash), not every call the agents make.
_MOTO = "import sys; from tidefleet.emulator import serve; serve(sys.argv[1:])"


def serve(argv: list[str]) -> None:
    """The moto server's process: `patch_moto`, then moto's own main. A moto whose internals no
    longer match the patch runs unpatched, saying so in one line of its log: every transaction
    then keeps memory, which only a big job notices (the sandbox names the log if the server dies)."""
    import logging

    lifeline.watch(lifeline.end_tree)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    try:
        patch_moto()
    except RuntimeError as err:
        print(f"{err}; running unpatched: its memory grows with every DynamoDB transaction", file=sys.stderr, flush=True)
    try:
        patch_one_call_at_a_time()
    except RuntimeError as err:
        print(f"{err}; running unpatched: two calls at once may fail with HTTP 500", file=sys.stderr, flush=True)
    try:
        patch_weighted_terminate()
    except RuntimeError as err:
        print(f"{err}; running unpatched: terminating a weighted node may replace it or stop another",
              file=sys.stderr, flush=True)  # fmt: skip
    from moto.server import main

    main(argv)


def patch_moto() -> None:
    """Keep the moto server's memory and time bounded under DynamoDB transactions (moto 5.2.5, the
    newest on PyPI when written). Run in the server's process, before it starts; real AWS is unaffected.

    moto's `DynamoDBBackend.transact_write_items` deep-copies the whole table once per action, for a
    rollback, and every copied `Item` is kept for ever: `BaseModel.__new__` appends each instance to
    `Item.instances_tracked` (only moto's /moto-api/data.json dashboard reads it). A one-item cancel
    on a 3,000-item table kept ~6 MB and took ~0.1 s; an agent's 51-action result batch ~160 MB and 2 s.
    Queries and updates leak the same way (each deep-copies the items it returns or changes).

    Two changes: Items are no longer tracked (they are freed like any object), and a transaction
    copies only the items it touches, restoring them if it fails, while moto's own whole-table copy
    becomes the table itself (its rollback then puts back the same object). Table streams are not
    rolled back (tidefleet's table has none). Raises RuntimeError, one line, if moto's code is no
    longer the one this was written against."""
    import copy
    import inspect
    import re
    import types
    from importlib.metadata import version

    try:
        from moto.core.common_models import BaseModel
        from moto.dynamodb import models
        from moto.dynamodb.models.dynamo_type import Item
        from moto.dynamodb.models.table import Table

        backend = models.DynamoDBBackend
        original = backend.transact_write_items
        if getattr(original, "tidefleet_patched", False):
            return
        body = re.sub(r"\s+", "", inspect.getsource(original))
        applies = (
            Item.__new__ is BaseModel.__new__
            and isinstance(getattr(Item, "instances_tracked", None), list)
            and "original_table_state[table_name]=copy.deepcopy(self.tables[table_name])" in body
            and "self.tables[table_name]=original_table_state[table_name]" in body
            and set(re.findall(r"\bcopy\.(\w+)", inspect.getsource(models))) == {"deepcopy"}
            and callable(getattr(backend, "get_keys_value", None))
        )
    except (ImportError, AttributeError, OSError):
        applies = False
    if not applies:
        raise RuntimeError(f"tidefleet.emulator.patch_moto: moto {version('moto')}'s DynamoDB internals changed; "
                           "the patch for its per-transaction table copy no longer applies: update or remove it")  # fmt: skip

    Item.__new__ = staticmethod(lambda cls, *args, **kwargs: object.__new__(cls))
    Item.instances_tracked = []
    # models/__init__ deep-copies in two places only: the whole table here, and one item in update_item.
    models.copy = types.SimpleNamespace(
        deepcopy=lambda x, memo=None: x if isinstance(x, Table) else copy.deepcopy(x, memo)
    )

    def touched(self, op: dict) -> tuple | None:
        """(table, hash key, range key) of one action; None where moto's own call will refuse it."""
        try:
            table = self.get_table(op["TableName"])
            key = op.get("Key") or {a: op["Item"][a] for a in table.table_key_attrs}
            return (table, *self.get_keys_value(table, key))
        except Exception:  # noqa: BLE001 - any reason: then nothing of it is written
            return None

    def transact_write_items(self, transact_items: list[dict]) -> None:
        before: dict[tuple, object] = {}  # (table, hash, range) -> a copy of its item, or None
        for at in filter(None, (touched(self, op) for action in transact_items for op in action.values())):
            if at not in before:
                before[at] = copy.deepcopy(at[0].get_item(at[1], at[2]))
        try:
            original(self, transact_items)
        except Exception:
            for (table, hash_key, range_key), item in before.items():
                rows, slot = (table.items[hash_key], range_key) if range_key else (table.items, hash_key)
                if item is None:
                    rows.pop(slot, None)
                else:
                    rows[slot] = item
            raise

    transact_write_items.tidefleet_patched = True
    backend.transact_write_items = transact_write_items


def patch_one_call_at_a_time() -> None:
    """Serve one AWS call at a time, all but SQS's ReceiveMessage. moto's server runs each request
    in a thread of its own and its backends take no locks: a DynamoDB Query copying an item while an
    UpdateItem added an attribute to it raised "dictionary changed size during iteration", an HTTP
    500 page that ended a sandbox run (and a CI run) under load. The GIL runs one call at a time
    anyway, so this costs little. A ReceiveMessage long poll sleeps inside moto's backend for up to
    20 s, so it keeps running beside the others (moto's SQS iterates lists, whose growth does not raise).
    S3 is not served through call_action (moto dispatches it on a path of its own), so is not covered.
    Raises RuntimeError, one line, if moto's code is no longer the one this was written against."""
    import threading
    from importlib.metadata import version

    try:
        from moto.core.responses import BaseResponse

        original = BaseResponse.call_action
        applies = callable(original) and callable(getattr(BaseResponse, "_get_action", None))
    except (ImportError, AttributeError):
        applies = False
    if not applies:
        raise RuntimeError(f"tidefleet.emulator.patch_one_call_at_a_time: moto {version('moto')}'s request "
                           "handling changed; the patch that serves one call at a time no longer applies: update or remove it")  # fmt: skip
    if getattr(original, "tidefleet_patched", False):
        return
    lock = threading.Lock()

    def call_action(self):
        if self.service_name == "sqs" and self._get_action() == "ReceiveMessage":
            return original(self)
        with lock:
            return original(self)

    call_action.tidefleet_patched = True
    BaseResponse.call_action = call_action


def patch_weighted_terminate() -> None:
    """Terminating a group's instance with a decrement lowers its desired capacity by the
    instance's weight, as AWS does (desired counts weighted units), not by one (moto 5.2.5).

    Unpatched, moto then finds the group short and launches a replacement, and the scaler's next
    set_desired stops the surplus: the first instances not protected from scale-in, an idle node the
    scaler chose to keep or one that just took work. The sandbox's gang runs (4-unit GPU nodes)
    lost nodes so. Raises RuntimeError, one line, if moto's code is no longer the one this was written
    against."""
    import inspect
    from importlib.metadata import version

    try:
        from moto.autoscaling.models import AutoScalingBackend

        original = AutoScalingBackend.detach_instances
        if getattr(original, "tidefleet_patched", False):
            return
        applies = (list(inspect.signature(original).parameters) == ["self", "group_name", "instance_ids", "should_decrement"]
                   and "group.desired_capacity=original_size-len(instance_ids)" in "".join(inspect.getsource(original).split()))  # fmt: skip
    except (ImportError, AttributeError, OSError):
        applies = False
    if not applies:
        raise RuntimeError(f"tidefleet.emulator.patch_weighted_terminate: moto {version('moto')}'s Auto Scaling "
                           "internals changed; the patch for weighted terminations no longer applies: update or remove it")  # fmt: skip

    def detach_instances(self, group_name: str, instance_ids: list[str], should_decrement: bool) -> list:
        group = self.autoscaling_groups[group_name]
        if should_decrement:
            overrides = (group.mixed_instances_policy or {}).get("LaunchTemplate", {}).get("Overrides", [])
            weights = {o["InstanceType"]: int(o.get("WeightedCapacity") or 1) for o in overrides if "InstanceType" in o}
            units = sum(weights.get(s.instance.instance_type, 1) for s in group.instance_states if s.instance.id in instance_ids)
            group.desired_capacity = max(0, (group.desired_capacity or 0) - units)
        return original(self, group_name, instance_ids, False)  # which sets the group to its (lowered) desired

    detach_instances.tidefleet_patched = True
    AutoScalingBackend.detach_instances = detach_instances


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MotoServer:
    url: str
    process: subprocess.Popen
    log: Path | None = None  # its stdout and stderr; None: discarded

    def exited(self) -> str | None:
        """None while it runs; else how it ended, in words ("was killed by SIGKILL")."""
        code = self.process.poll()
        if code is None:
            return None
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            return f"was killed by {name}" + (" (out of memory? see dmesg)" if code == -signal.SIGKILL else "")
        return f"exited with code {code}"

    def env(self, region: str = "us-east-1") -> dict[str, str]:
        """Variables that point boto3 (in this or a child process) at this server."""
        return {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": self.url, "AWS_DEFAULT_REGION": region}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _exited_at_start(code: int, log: Path | None) -> str:
    """Why moto ended as it started, from the last line of its log (the error it died of: a port in
    use, a module missing), not a guess."""
    try:
        last = next((line for line in reversed(log.read_text(errors="replace").splitlines()) if line.strip()), "")
    except (OSError, AttributeError):  # no log kept
        last = ""
    said = f": {last.strip()[:300]}" if last else "; is moto[server] installed?"
    return f"moto server exited at start (code {code}){said}" + (f"; see {log}" if log is not None else "")


class PortTaken(RuntimeError):
    """moto could not bind its port: another program took it after `free_port` chose it."""


PORT_TRIES = 3  # ports tried when the one chosen is taken before moto binds it


def start_moto(port: int | None = None, timeout_s: float = 30.0, log: Path | None = None) -> MotoServer:
    """log: a file for the server's output (appended), where its errors and its end are kept. A
    port of its own choosing that another program takes first is chosen again."""
    for tries_left in range(PORT_TRIES - 1, -1, -1) if port is None else (0,):
        try:
            return _start_moto(port or free_port(), timeout_s, log)
        except PortTaken:
            if not tries_left:
                raise
    raise AssertionError("unreachable")


def _start_moto(port: int, timeout_s: float, log: Path | None) -> MotoServer:
    url = f"http://127.0.0.1:{port}"
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the child keeps its copy
    tie, fds = lifeline.for_child()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _MOTO, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
            # Not the user's AWS settings: a profile this machine lacks ended moto at start (ProfileNotFound).
            env={**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **FAKE_CREDENTIALS, **tie},
            pass_fds=fds,  # the server ends with this process, even a SIGKILLed one (`lifeline`)
        )
    finally:
        if log is not None:
            out.close()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                why = _exited_at_start(process.returncode, log)
                raise (PortTaken if "in use" in why else RuntimeError)(why)
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                return MotoServer(url=url, process=process, log=log)
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto server did not answer on {url} within {timeout_s:.0f}s")
    except BaseException:  # no answer in time, a SIGTERM's SystemExit, a Ctrl-C: the caller has no handle on it
        process.kill()
        process.wait()  # reaped: no zombie left behind
        raise
