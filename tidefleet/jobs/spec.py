"""What one job asks of its queue's pool: an image (or tag), a command, env, slots per item, a
timeout, a retry budget — each bounded by what the queue allows.

A queue runs its pool's command or container unless it opts in: `accept_images` and
`accept_commands` list glob patterns (`"*"` = any) a job's image or command must match; a tag
of the pool's own image is always accepted. Slots, timeout and retries may only go down from
the queue's values: the policy sizes the fleet for the queue's slots, and the queue's
visibility and redrive are set for its timeout and retries. The spec is checked at submit
(`problems`), recorded on the job, and resolved by the agent (`resolve`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase

from tidefleet.config import ENV_VAR, IMAGE_REFERENCE, Pool, Queue


@dataclass(frozen=True)
class JobSpec:
    image: str | None = None  # a full image reference, or ":tag" for a tag of the pool's image
    command: str | None = None  # shell words; the item's args are appended
    env: dict[str, str] = field(default_factory=dict)
    slots: int | None = None
    timeout_s: int | None = None
    max_retries: int | None = None

    def record(self) -> dict:
        """The spec as the job record keeps it: only what was asked."""
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}

    @classmethod
    def from_record(cls, record: dict | None) -> JobSpec:
        return cls(**{k: v for k, v in (record or {}).items() if k in cls.__dataclass_fields__})

    def retries_on(self, queue: Queue) -> int:
        """Failed attempts retried before the dead-letter queue: the job's own, else its queue's."""
        return queue.max_retries if self.max_retries is None else self.max_retries


@dataclass(frozen=True)
class Resolved:
    """What the agent runs an item of the job with."""

    container: str | None
    command: str | None
    env: dict[str, str]
    slots: int
    timeout_s: int
    max_retries: int


def not_text(text: str) -> int | None:
    """Where `text` has a character UTF-8 cannot encode (a lone surrogate: JSON's "\\udcff", or a
    command-line argument that was not UTF-8), or None: no queue or store can carry one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None


def _image(spec: JobSpec, pool: Pool) -> str | None:
    if spec.image is None or not spec.image.startswith(":"):
        return spec.image
    repository = re.sub(r"(@.*|:[\w][\w.-]*)$", "", pool.container or "")
    return f"{repository}{spec.image}"


# The job's env rides on its record (DynamoDB: 400 KB an item) and into every attempt's process
# environment: a few settings, not data. 64 KiB in all (names and values, UTF-8) leaves the
# record room and stays under Linux's 128 KiB per variable.
MAX_ENV_BYTES = 64 << 10
FIELDS = {"image": "spec.image", "command": "spec.command", "env": "spec.env.", "slots": "spec.slots",
          "timeout_s": "spec.timeout_s", "max_retries": "spec.max_retries"}
FLAGS = {"image": "--image", "command": "--command", "env": "--item-env ", "slots": "--slots",
         "timeout_s": "--timeout", "max_retries": "--max-retries"}


def problems(spec: JobSpec, queue_name: str, queue: Queue, pool: Pool, *, flags: bool = False) -> list[str]:
    """One line per problem: field (or, with `flags`, the CLI option), value, what to do."""
    out = []
    q = f"queues.{queue_name}"
    at = FLAGS if flags else FIELDS
    # Types first: a JobSpec built in code is not checked as it is made.
    if spec.image is not None and not isinstance(spec.image, str):
        out.append(f"{at['image']}: must be a string (got {spec.image!r}); e.g. 'ghcr.io/acme/train:v2' or ':v2'")
    elif spec.image is not None:
        image = _image(spec, pool)
        if pool.container is None:
            out.append(f"{at['image']}: queue {queue_name!r} runs a command, not a container (got {spec.image!r}); "
                       "drop --image or use a queue of a container pool")  # fmt: skip
        elif not re.fullmatch(IMAGE_REFERENCE, image):
            out.append(f"{at['image']}: not an image reference (got {spec.image!r}); e.g. 'ghcr.io/acme/train:v2' or ':v2'")
        elif not _same_repository(image, pool.container) and not _accepted(image, queue.accept_images):
            out.append(f"{at['image']}: queue {queue_name!r} does not accept this image (got {image!r}); "
                       f"add a pattern to {q}.accept_images or use a tag of {pool.container!r}")  # fmt: skip
    if spec.command is not None and not isinstance(spec.command, str):
        out.append(f"{at['command']}: must be a string of shell words (got {spec.command!r}); e.g. 'python train.py --fast' "
                   "(the item's args are appended)")  # fmt: skip
    elif spec.command is not None:
        try:
            words = shlex.split(spec.command)
        except ValueError as err:
            words = None
            out.append(f"{at['command']}: not shell words ({err}) (got {spec.command!r}); close the quote or escape it")
        if (bad := not_text(spec.command)) is not None:
            words = None
            out.append(f"{at['command']}: not valid text (a lone surrogate {spec.command[bad]!r} at character "
                       f"{bad + 1}); give the command as UTF-8 text")  # fmt: skip
        if words == []:
            out.append(f"{at['command']}: empty (got ''); give a command or leave it out")
        elif words and not _accepted(spec.command, queue.accept_commands):
            out.append(f"{at['command']}: queue {queue_name!r} does not accept this command (got {spec.command!r}); "
                       f"add a pattern to {q}.accept_commands")  # fmt: skip
    env = spec.env if isinstance(spec.env, dict) else {}
    if env is not spec.env:
        out.append(f"{at['env'].strip(' .')}: must be a dict of variable names to values (got {spec.env!r}); "
                   "e.g. {'SEED': '1'}")  # fmt: skip
    for key, value in env.items():
        if not isinstance(key, str) or not re.fullmatch(ENV_VAR, key) or key.startswith("TIDEFLEET_"):
            out.append(f"{at['env']}{key}: not a usable variable name (got {key!r}); letters, digits, '_'; TIDEFLEET_* is reserved")
        elif not isinstance(value, str) or "\0" in value or not_text(value) is not None:
            out.append(f"{at['env']}{key}: a value must be UTF-8 text without NUL (got {value!r})")
    sizes = [len(str(k).encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) for k, v in env.items() if isinstance(v, str)]
    if sum(sizes) > MAX_ENV_BYTES:
        out.append(f"{at['env'].strip(' .')}: {len(sizes)} variable(s) of {sum(sizes)} bytes in all, over the "
                   f"{MAX_ENV_BYTES // 1024} KiB a job's environment may hold; pass large data by URI, not inline")  # fmt: skip
    for name, value, most in (("slots", spec.slots, queue.slots_per_item), ("timeout_s", spec.timeout_s, queue.item_timeout_s),
                              ("max_retries", spec.max_retries, queue.max_retries)):  # fmt: skip
        least = 0 if name == "max_retries" else 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most):
            config = {"slots": "slots_per_item", "timeout_s": "item_timeout_s"}.get(name, name)
            fix = (f"ask for less, or raise {q}.{config}" if isinstance(value, int) and not isinstance(value, bool)
                   and value > most else f"give {least} to {most}, or leave it out for the queue's {most}")  # fmt: skip
            out.append(f"{at[name]}: must be a whole number from {least} to {most}, the queue's {config} "
                       f"(got {value!r}); {fix}")  # fmt: skip
    return out


def _same_repository(image: str, pool_image: str) -> bool:
    strip = lambda ref: re.sub(r"(@.*|:[\w][\w.-]*)$", "", ref)
    return strip(image) == strip(pool_image)


def _accepted(value: str, patterns: list[str]) -> bool:
    return any(fnmatchcase(value, p) for p in patterns)


def resolve(spec: JobSpec, queue: Queue, pool: Pool) -> Resolved:
    """The job's values where it set them, the queue's and pool's elsewhere."""
    return Resolved(
        container=_image(spec, pool) or pool.container,
        command=(spec.command or pool.command) if pool.container is None else spec.command,
        env={**pool.env, **spec.env},
        slots=spec.slots or queue.slots_per_item,
        timeout_s=spec.timeout_s or queue.item_timeout_s,
        max_retries=spec.retries_on(queue),
    )
