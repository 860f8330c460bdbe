"""The function archives, one per environment, each a deterministic zip (same inputs -> same sha256).

- AWS Lambda (`build/functions-<env>.zip`): `lambdas/` (the AWS handlers), `tidefleet/`, the
  environment's file, and the third-party runtime dependencies as wheels for Lambda's python3.12
  on x86_64, at the versions installed here (`pinned`), fetched once with `pip download` into
  build/wheels/ and unpacked into the zip;
  boto3 is left out because the Lambda runtime provides it. Nothing is vendored into git.
- GCP Cloud Function (`build/gcp-scaler-<env>.zip`): `main.py` at the root (the Python buildpack's
  default source; the Functions Framework puts its directory on sys.path, so `tidefleet/` beside
  it imports), `tidefleet/`, the environment's file, and `requirements.txt`, which the buildpack
  installs for the function's own runtime: every library pinned to the version installed here
  (`pinned`), so a redeploy months later installs what was tested. No wheels: Lambda's
  binaries would shadow them.

The environment's file is the one it was loaded from (the repository's environments/, the
folder $TIDEFLEET_ENVIRONMENTS names, or a path given to --env), its bytes checked to load as the
very environment being deployed, and packaged as `environments/<name>.toml`: the name the stacks
set TIDEFLEET_ENV to, and the file the function loads (`tidefleet.triggers.function_environment`).
No other environment's file is packaged: an edit of prod.toml leaves dev's archive, and so dev's
functions, byte for byte as they were.

Neither holds `tidefleet/sim/` or `tidefleet/sandbox/` (LEFT_OUT): no function imports the
simulator or the sandbox (tests/test_function_archives.py runs the archives without them).

Both are built from the working tree, uncommitted edits included, and say so: BUILD_INFO inside
each names the newest commit that changed a file it packages and the packaged files that differ
from that commit (`build_info`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidefleet.config import Environment

ROOT = Path(__file__).resolve().parents[1]
# Under build/, one per environment (`archive_name`): by the environment's cloud, with its name.
ARCHIVES = {"aws": "functions-{env}.zip", "gcp": "gcp-scaler-{env}.zip"}
LIBRARY = ("tidefleet",)  # in both archives
ENVIRONMENTS = "environments"  # where the function loads environments/<TIDEFLEET_ENV>.toml from (one file)
AWS_SOURCES = ("lambdas", *LIBRARY)
GCP_MAIN = "lambdas/gcp_scaler"  # its main.py is the GCP archive's main.py; the AWS archive leaves it out
LEFT_OUT = ("tidefleet/sim", "tidefleet/sandbox")  # in neither archive: no function imports them
BUILD_INFO = "tidefleet/build_info.json"  # in both archives: what they were built from (build_info)
# What the AWS functions import beyond the standard library and boto3 (pydantic brings
# pydantic_core, annotated_types, typing_extensions, typing_inspection). Declared ranges: what
# is packaged is pinned to the versions installed here (`pinned`), for both clouds.
LAMBDA_REQUIREMENTS = ("pydantic>=2.7,<3",)
PLATFORM = ("--platform", "manylinux2014_x86_64", "--python-version", "3.12", "--implementation", "cp")
# Both runtimes (Lambda's python3.12 on x86_64, the Cloud Function's python312), for the
# environment markers of the dependencies (`pinned`).
RUNTIME_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
                   "os_name": "posix", "platform_machine": "x86_64"}  # fmt: skip
# What the GCP scaler function imports; the buildpack installs them, pinned, from requirements.txt.
GCP_FUNCTION_REQUIREMENTS = (
    # The entry point's host; Google asks for it to be listed. Not installed here (its namespace
    # .pth imports `google` at every interpreter start), so pinned by hand to the version the
    # archive tests serve it with; its own dependencies are resolved where it is installed.
    "functions-framework==3.10.2",
    "google-cloud-compute>=1.19,<2",  # the managed instance groups
    "google-cloud-firestore>=2.16,<3",  # node heartbeats (Cloud Monitoring is read over REST via google-auth)
    "pydantic>=2.7,<3",
)
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say
FILE_MODE = 0o644 << 16
SKIP_PARTS = {"__pycache__", ".pytest_cache"}


def pinned(requirements: Iterable[str]) -> tuple[list[str], list[str]]:
    """`requirements` and everything they depend on in the functions' runtime (RUNTIME_MARKERS),
    each as `name==version` at the version installed here, where the tests ran: sorted pins, and
    the requirements that are not installed here, as given (nothing to pin them to; their own
    dependencies are then resolved by pip where they are installed). A version installed outside
    its requirement's range is an error: the archive would hold what the range excludes."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    missing, done, todo = [], set(), [(r, Requirement(r)) for r in requirements]
    while todo:
        text, requirement = todo.pop(0)
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in done:
            continue
        done.add((name, frozenset(requirement.extras)))
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing += [text] if name not in {canonicalize_name(Requirement(m).name) for m in missing} else []
            continue
        if not requirement.specifier.contains(dist.version, prereleases=True):
            raise RuntimeError(f"{name} {dist.version} is installed here, outside {requirement} that the functions "
                               "need: install a version in that range (pip install -e '.[dev,gcp]'), then build again")
        pins[name] = dist.version
        for line in dist.requires or []:
            needed = Requirement(line)
            extras = ("", *requirement.extras)
            if needed.marker is None or any(needed.marker.evaluate({**RUNTIME_MARKERS, "extra": e}) for e in extras):
                todo.append((line, needed))
    return [f"{name}=={version}" for name, version in sorted(pins.items())], missing


def wheel_cache(requirements: Iterable[str]) -> Path:
    """Keyed by what is asked for, so a new pin or platform never reuses old wheels."""
    key = hashlib.sha256(repr((tuple(requirements), PLATFORM)).encode()).hexdigest()[:12]
    return ROOT / "build" / "wheels" / key


def runtime_wheels(cache: Path | None = None) -> list[Path]:
    """Binary wheels of LAMBDA_REQUIREMENTS, pinned, for the Lambda platform, downloaded once."""
    pins, missing = pinned(LAMBDA_REQUIREMENTS)
    requirements = [*pins, *missing]
    cache = cache or wheel_cache(requirements)
    wheels = sorted(cache.glob("*.whl"))
    if wheels:
        return wheels
    # Per process (parallel test workers download at once), and never mistaken for a cache if interrupted.
    partial = cache.with_name(f"{cache.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *PLATFORM,
         "--dest", str(partial), *requirements],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode:
        raise RuntimeError(f"pip download of the functions' dependencies failed:\n{result.stderr.strip()[-2000:]}")
    try:
        partial.rename(cache)
    except OSError:  # another process got there first with the same wheels
        shutil.rmtree(partial, ignore_errors=True)
    return sorted(cache.glob("*.whl"))


def packaged(cloud: str, name: str) -> bool:
    """Whether the repository file `name` (a path from the root, with '/') goes into `cloud`'s
    archive; wheels, requirements.txt and the environment's file aside."""
    parts = name.split("/")
    if SKIP_PARTS & set(parts) or name.endswith(".pyc") or name.startswith(tuple(f"{p}/" for p in LEFT_OUT)):
        return False
    if cloud == "gcp":
        return parts[0] in LIBRARY or name == f"{GCP_MAIN}/main.py"
    return parts[0] in AWS_SOURCES and not name.startswith(f"{GCP_MAIN}/")


def sources(root: Path, cloud: str) -> dict[str, bytes]:
    """The repository files `cloud`'s archive packages, by their path from `root`."""
    tops = AWS_SOURCES if cloud == "aws" else (*LIBRARY, GCP_MAIN)
    files = (p for top in tops for p in (root / top).rglob("*") if p.is_file())
    return {name: path.read_bytes() for path in files if packaged(cloud, name := path.relative_to(root).as_posix())}


def archive_name(env: Environment) -> str:
    """The file name of `env`'s archive: its cloud's, with the environment's name."""
    return ARCHIVES[env.cloud].format(env=env.name)


@dataclass(frozen=True)
class EnvironmentFile:
    """An environment's file as an archive packages it: `name` in the archive
    (environments/<environment's name>.toml), its bytes, and the file they were read from."""

    name: str
    data: bytes
    source: Path


def environment_file(env: Environment, source: Path | None = None) -> EnvironmentFile:
    """The file `env` was loaded from (`source`, else the path given to --env, else
    <environments folder>/<name>.toml as `load_environment` found it), read once. Its bytes are
    checked to load as `env` itself: the archive never holds another file of the same name, nor
    one edited since `env` was validated (then: RuntimeError, run again)."""
    from tidefleet.config import ConfigError, environment_path, parse_environment

    path = Path(source) if source is not None else environment_path(env._path or env.name)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise RuntimeError(f"cannot read {path}, the file of environment {env.name!r} ({err.strerror or err})") from None
    try:
        again = parse_environment(tomllib.loads(data.decode("utf-8-sig")), name=path.stem, source=str(path))
    except (ConfigError, ValueError) as err:  # ValueError: not UTF-8, not TOML
        again = str(err).splitlines()[0]
    if isinstance(again, str) or again.model_dump() != env.model_dump():
        said = f" ({again})" if isinstance(again, str) else ""
        raise RuntimeError(f"{path} no longer holds environment {env.name!r} as it was validated{said}; it was edited "
                           "meanwhile: run the command again")  # fmt: skip
    return EnvironmentFile(f"{ENVIRONMENTS}/{env.name}.toml", data, path)


def _git(root: Path, *args: str) -> str | None:
    """git's output in `root`, or None where git is missing or fails (no checkout, no commit yet)."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _in_checkout(root: Path, path: Path) -> str | None:
    """`path` from `root`, with '/', if it lies under `root`; else None."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except (OSError, ValueError):
        return None


def build_info(root: Path, cloud: str, files: dict[str, bytes], environment: EnvironmentFile | None = None) -> dict:
    """What `cloud`'s archive of `files` (sources()) and `environment` is built from: `commit`, the
    newest commit that changed a packaged file, and `changed`, the packaged files whose bytes
    differ from HEAD's (edited, staged, untracked, deleted), by their paths in the checkout;
    `dirty` is whether there are any. Not HEAD itself: a commit that changes nothing packaged (the
    docs, another environment's file) must leave the archive's bytes, and so the deployed
    functions, as they were. An environment file from outside the checkout is no commit's: it is
    named, by its name in the archive, in `outside_checkout`. Outside a git checkout, or without
    git: no commit, and a note."""
    head = (_git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}") or "").strip()
    tops = AWS_SOURCES if cloud == "aws" else (*LIBRARY, GCP_MAIN)
    own, outside = dict(files), []  # by path from root
    if environment is not None:
        where = _in_checkout(root, environment.source)
        if where is None:
            outside.append(environment.name)
        else:
            own[where] = environment.data
    environments = sorted(own.keys() - files.keys())
    listing = _git(root, "ls-tree", "-r", "-z", "HEAD", "--", *tops, *environments) if head else None
    if listing is None:
        return {"commit": None, "dirty": None, "changed": [], "note": "not a git checkout"}
    committed = {}
    for record in filter(None, listing.split("\0")):
        meta, name = record.split("\t", 1)
        _, kind, blob = meta.split()
        if kind == "blob" and (packaged(cloud, name) or name in environments):
            committed[name] = blob
    algorithm = "sha1" if len(head) == 40 else "sha256"  # git's object format

    def blob_of(data: bytes) -> str:
        return hashlib.new(algorithm, b"blob %d\0" % len(data) + data).hexdigest()

    changed = {name for name, data in own.items() if committed.get(name) != blob_of(data)}
    changed |= committed.keys() - own.keys()
    leave_out = [*LEFT_OUT, GCP_MAIN] if cloud == "aws" else LEFT_OUT
    paths = [*(AWS_SOURCES if cloud == "aws" else (*LIBRARY, f"{GCP_MAIN}/main.py")), *environments,
             *(f":(exclude){p}" for p in leave_out)]  # fmt: skip
    commit = (_git(root, "log", "-1", "--format=%H", "HEAD", "--", *paths) or "").strip() or head
    return {"commit": commit, "dirty": bool(changed), "changed": sorted(changed)} | (
        {"outside_checkout": outside} if outside else {}
    )


def _packaged(root: Path, cloud: str, entries: dict[str, bytes], env: Environment | None,
              env_file: Path | None) -> dict[str, bytes]:  # fmt: skip
    """`entries` with `cloud`'s sources from `root`, `env`'s file (`environment_file`) and BUILD_INFO."""
    files = sources(root, cloud)
    environment = environment_file(env, env_file) if env is not None else None
    entries |= files | ({environment.name: environment.data} if environment else {})
    entries[BUILD_INFO] = (json.dumps(build_info(root, cloud, files, environment), indent=2) + "\n").encode()
    return entries


def aws_entries(root: Path, wheels: list[Path], env: Environment | None = None,
                env_file: Path | None = None) -> dict[str, bytes]:  # fmt: skip
    entries: dict[str, bytes] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if not name.endswith("/") and not SKIP_PARTS & set(name.split("/")):
                    entries[name] = archive.read(name)
    return _packaged(root, "aws", entries, env, env_file)


def gcp_entries(root: Path, env: Environment | None = None, env_file: Path | None = None) -> dict[str, bytes]:
    entries = _packaged(root, "gcp", {}, env, env_file)
    entries["main.py"] = entries.pop(f"{GCP_MAIN}/main.py")
    entries["requirements.txt"] = gcp_requirements().encode()
    return entries


def gcp_requirements() -> str:
    """The Cloud Function's requirements.txt: GCP_FUNCTION_REQUIREMENTS and their dependencies,
    pinned (`pinned`); one not installed here stays as declared (a range, or a version pinned by
    hand, as functions-framework's), and says which."""
    from packaging.requirements import Requirement

    def by_hand(requirement: str) -> bool:  # one exact version, as declared
        specs = list(Requirement(requirement).specifier)
        return len(specs) == 1 and specs[0].operator in ("==", "===") and not specs[0].version.endswith("*")

    pins, missing = pinned(GCP_FUNCTION_REQUIREMENTS)
    lines = ["# The versions installed where this archive was built (stacks/package.py)", *pins]
    lines += [f"{r}  # pinned by hand, not installed here: its own dependencies resolve where it is installed"
              if by_hand(r) else f"{r}  # not installed where this archive was built, so not pinned"
              for r in missing]  # fmt: skip
    return "".join(f"{line}\n" for line in lines)


def write_zip(out: Path, entries: dict[str, bytes]) -> tuple[Path, str]:
    """Sorted names, one fixed time and mode: the bytes depend on the contents alone."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.external_attr = FILE_MODE
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, entries[name], compresslevel=9)
    return out, hashlib.sha256(out.read_bytes()).hexdigest()


def build_aws_archive(out: Path, *, root: Path = ROOT, wheels: list[Path] | None = None, env: Environment | None = None,
                      env_file: Path | None = None) -> tuple[Path, str]:  # fmt: skip
    """Write the Lambda zip of `env` (its file: `environment_file`) to `out`; return its path and
    sha256 hex digest. Without `env`, no environment's file: an archive no function can run."""
    return write_zip(out, aws_entries(root, runtime_wheels() if wheels is None else wheels, env, env_file))


def build_gcp_archive(out: Path, *, root: Path = ROOT, env: Environment | None = None,
                      env_file: Path | None = None) -> tuple[Path, str]:  # fmt: skip
    """Write the Cloud Function zip of `env` to `out`; return its path and sha256 hex digest.
    Without `env`, no environment's file: an archive no function can run."""
    return write_zip(out, gcp_entries(root, env, env_file))


def build_archive(env: Environment, out_dir: Path = ROOT / "build", *, root: Path | None = None,
                  env_file: Path | None = None) -> tuple[Path, str, dict]:  # fmt: skip
    """`env`'s archive under `out_dir`, by `archive_name` (where stacks/app.py points the stack):
    its path, sha256 hex digest, and the BUILD_INFO it records."""
    builder = {"aws": build_aws_archive, "gcp": build_gcp_archive}[env.cloud]
    path, digest = builder(Path(out_dir) / archive_name(env), root=root or ROOT, env=env, env_file=env_file)
    with zipfile.ZipFile(path) as archive:
        return path, digest, json.loads(archive.read(BUILD_INFO))
