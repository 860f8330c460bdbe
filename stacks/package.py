"""The function archives, one per cloud, each a deterministic zip (same inputs -> same sha256).

- AWS Lambda (`build/functions.zip`): `lambdas/` (the AWS handlers), `tidefleet/`,
  `environments/`, and the third-party runtime dependencies as wheels for Lambda's python3.12
  on x86_64, fetched once with `pip download` into build/wheels/ and unpacked into the zip;
  boto3 is left out because the Lambda runtime provides it. Nothing is vendored into git.
- GCP Cloud Function (`build/gcp-scaler.zip`): `main.py` at the root (the Python buildpack's
  default source; the Functions Framework puts its directory on sys.path, so `tidefleet/` beside
  it imports), `tidefleet/`, `environments/`, and `requirements.txt`, which the buildpack
  installs for the function's own runtime. No wheels: Lambda's binaries would shadow them.

Neither holds `tidefleet/sim/` or `tidefleet/sandbox/` (LEFT_OUT): no function imports the
simulator or the sandbox (tests/test_function_archives.py runs the archives without them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVES = {"aws": "functions.zip", "gcp": "gcp-scaler.zip"}  # under build/, by the environment's cloud
LIBRARY = ("tidefleet", "environments")  # in both archives
AWS_SOURCES = ("lambdas", *LIBRARY)
GCP_MAIN = "lambdas/gcp_scaler"  # its main.py is the GCP archive's main.py; the AWS archive leaves it out
LEFT_OUT = ("tidefleet/sim", "tidefleet/sandbox")  # in neither archive: no function imports them
# What the AWS functions import beyond the standard library and boto3 (pydantic brings
# pydantic_core, annotated_types, typing_extensions, typing_inspection).
LAMBDA_REQUIREMENTS = ("pydantic>=2.7,<3",)
PLATFORM = ("--platform", "manylinux2014_x86_64", "--python-version", "3.12", "--implementation", "cp")
# Keyed by what is asked for, so changing a requirement never reuses old wheels.
WHEEL_CACHE = ROOT / "build" / "wheels" / hashlib.sha256(repr((LAMBDA_REQUIREMENTS, PLATFORM)).encode()).hexdigest()[:12]
# What the GCP scaler function imports; the buildpack installs them from requirements.txt.
GCP_FUNCTION_REQUIREMENTS = (
    "functions-framework>=3.5,<4",  # the entry point's host; Google asks for it to be listed
    "google-cloud-compute>=1.19,<2",  # the managed instance groups
    "google-cloud-firestore>=2.16,<3",  # node heartbeats (Cloud Monitoring is read over REST via google-auth)
    "pydantic>=2.7,<3",
)
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say
FILE_MODE = 0o644 << 16
SKIP_PARTS = {"__pycache__", ".pytest_cache"}


def runtime_wheels(cache: Path = WHEEL_CACHE) -> list[Path]:
    """Binary wheels of LAMBDA_REQUIREMENTS for the Lambda platform, downloaded once."""
    wheels = sorted(cache.glob("*.whl"))
    if wheels:
        return wheels
    # Per process (parallel test workers download at once), and never mistaken for a cache if interrupted.
    partial = cache.with_name(f"{cache.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *PLATFORM,
         "--dest", str(partial), *LAMBDA_REQUIREMENTS],
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
    archive; wheels and requirements.txt aside."""
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


def aws_entries(root: Path, wheels: list[Path]) -> dict[str, bytes]:
    entries: dict[str, bytes] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if not name.endswith("/") and not SKIP_PARTS & set(name.split("/")):
                    entries[name] = archive.read(name)
    return entries | sources(root, "aws")


def gcp_entries(root: Path) -> dict[str, bytes]:
    entries = sources(root, "gcp")
    entries["main.py"] = entries.pop(f"{GCP_MAIN}/main.py")
    entries["requirements.txt"] = "".join(f"{r}\n" for r in GCP_FUNCTION_REQUIREMENTS).encode()
    return entries


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


def build_aws_archive(out: Path, *, root: Path = ROOT, wheels: list[Path] | None = None) -> tuple[Path, str]:
    """Write the Lambda zip to `out`; return its path and sha256 hex digest."""
    return write_zip(out, aws_entries(root, runtime_wheels() if wheels is None else wheels))


def build_gcp_archive(out: Path, *, root: Path = ROOT) -> tuple[Path, str]:
    """Write the Cloud Function zip to `out`; return its path and sha256 hex digest."""
    return write_zip(out, gcp_entries(root))


def build_archive(cloud: str, out_dir: Path = ROOT / "build") -> tuple[Path, str]:
    """The archive of `cloud` ("aws" or "gcp") under `out_dir`, by its name in ARCHIVES."""
    builder = {"aws": build_aws_archive, "gcp": build_gcp_archive}[cloud]
    return builder(Path(out_dir) / ARCHIVES[cloud])
