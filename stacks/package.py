"""The functions archive: `lambdas/`, `tidefleet/`, `environments/` and the third-party
runtime dependencies, as one deterministic zip (same inputs -> same sha256).

Dependencies are wheels for Lambda's python3.12 on x86_64, fetched once with
`pip download` into build/wheels/ and unpacked into the zip; boto3 is left out because
the Lambda runtime provides it. Nothing is vendored into git.

The same archive is the GCP scaler's Cloud Function source: its Python buildpack installs
the root `requirements.txt` (Lambda ignores the file), so that file is always written.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("lambdas", "tidefleet", "environments")
# What the functions import beyond the standard library and boto3 (pydantic brings
# pydantic_core, annotated_types, typing_extensions, typing_inspection).
RUNTIME_REQUIREMENTS = ("pydantic>=2.7,<3",)
PLATFORM = ("--platform", "manylinux2014_x86_64", "--python-version", "3.12", "--implementation", "cp")
# Keyed by what is asked for, so changing a requirement never reuses old wheels.
WHEEL_CACHE = ROOT / "build" / "wheels" / hashlib.sha256(repr((RUNTIME_REQUIREMENTS, PLATFORM)).encode()).hexdigest()[:12]
# What the GCP scaler function imports; the buildpack installs them from requirements.txt.
GCP_FUNCTION_REQUIREMENTS = (
    "functions-framework>=3.5,<4",  # the entry point's host; Google asks for it to be listed
    "google-cloud-compute>=1.19,<2",  # the managed instance groups
    "google-cloud-firestore>=2.16,<3",  # node heartbeats (Cloud Monitoring is read over REST via google-auth)
    "pydantic>=2.7,<3",
    "boto3>=1.34,<2",  # imported, never called, by the shared handler's parse and the store module
)
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say
FILE_MODE = 0o644 << 16
SKIP_PARTS = {"__pycache__", ".pytest_cache"}


def runtime_wheels(cache: Path = WHEEL_CACHE) -> list[Path]:
    """Binary wheels of RUNTIME_REQUIREMENTS for the Lambda platform, downloaded once."""
    wheels = sorted(cache.glob("*.whl"))
    if wheels:
        return wheels
    partial = cache.with_name(cache.name + ".partial")  # an interrupted download is never mistaken for a cache
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *PLATFORM,
         "--dest", str(partial), *RUNTIME_REQUIREMENTS],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode:
        raise RuntimeError(f"pip download of the functions' dependencies failed:\n{result.stderr.strip()[-2000:]}")
    partial.rename(cache)
    return sorted(cache.glob("*.whl"))


def _entries(root: Path, wheels: list[Path]) -> dict[str, bytes]:
    entries: dict[str, bytes] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if not name.endswith("/") and not SKIP_PARTS & set(name.split("/")):
                    entries[name] = archive.read(name)
    for top in SOURCES:
        for path in (root / top).rglob("*"):
            if path.is_file() and not SKIP_PARTS & set(path.parts) and path.suffix != ".pyc":
                entries[path.relative_to(root).as_posix()] = path.read_bytes()
    entries["requirements.txt"] = "".join(f"{r}\n" for r in GCP_FUNCTION_REQUIREMENTS).encode()
    return entries


def build_archive(out: Path, *, root: Path = ROOT, wheels: list[Path] | None = None) -> tuple[Path, str]:
    """Write the zip to `out`; return its path and sha256 hex digest."""
    entries = _entries(root, runtime_wheels() if wheels is None else wheels)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.external_attr = FILE_MODE
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, entries[name], compresslevel=9)
    return out, hashlib.sha256(out.read_bytes()).hexdigest()
