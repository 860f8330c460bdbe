"""Publish what nodes install at boot, under `agent/` in the environment's artifacts bucket
(see templates/user-data.sh.j2): a wheelhouse (`wheels/`: the agent and every runtime
dependency, for every node platform), `requirements.txt` pinning each to its version and
sha256, and the environment file. A node installs with `pip install --require-hashes
--no-deps --no-index`: boot resolves nothing and fetches nothing from an index, so what runs
as root is exactly what was published."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from collections import defaultdict
from importlib.metadata import distributions
from pathlib import Path

from stacks.package import environment_file
from tidefleet.cloud import for_env
from tidefleet.config import Environment

ROOT = Path(__file__).resolve().parents[1]


# Where the agent runs (templates/user-data.sh.j2): Amazon Linux 2023's python3.11 on EC2,
# Debian 12 (3.11) or Ubuntu 24.04 (3.12) on GCE; x86_64 or arm64 (Graviton, Axion).
NODE_PYTHONS = {"aws": ("3.11",), "gcp": ("3.11", "3.12")}
NODE_ARCHS = ("x86_64", "aarch64")


def manylinux(arch: str) -> list[str]:
    """Platform tags a node takes: glibc up to 2.34 (AL2023's, the oldest of the node images).
    pip takes them listed: it does not widen manylinux_2_34 to the older ones itself."""
    return [f"manylinux_2_{minor}_{arch}" for minor in range(34, 16, -1)] + [f"manylinux2014_{arch}"]
# On GCE the agent also needs its Google clients: the wheel's gcp-node extra.
NODE_EXTRAS = {"aws": "", "gcp": "[gcp-node]"}
REQUIREMENTS = "requirements.txt"


def build_agent_wheel(out: Path) -> Path:
    """The tidefleet wheel alone (its dependencies go into the wheelhouse beside it)."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(ROOT)],
        check=True,
    )
    wheels = sorted(out.glob("tidefleet-*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1]


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed_pins() -> str:
    """`name==version` of every distribution installed here, as pip constraints: the node gets
    the versions the agent was tested with, not whatever is newest on publish day."""
    pins = {_canonical(d.metadata["Name"]): d.version for d in distributions() if d.metadata["Name"]}
    pins.pop("tidefleet", None)
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def build_wheelhouse(env: Environment, wheel: Path, out: Path, *, archs: tuple[str, ...] = NODE_ARCHS) -> Path:
    """`out/wheels/`: the agent wheel and its dependency closure for every node platform, and
    `out/requirements.txt`: each pinned to one version with the sha256 of every file of it."""
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    constraints = out / "constraints.txt"
    constraints.write_text(installed_pins())
    for python in NODE_PYTHONS[env.cloud]:
        for arch in archs:
            platforms = [arg for tag in manylinux(arch) for arg in ("--platform", tag)]
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *platforms,
                 "--python-version", python, "--implementation", "cp", "--dest", str(wheels),
                 "--constraint", str(constraints), f"{wheel}{NODE_EXTRAS[env.cloud]}"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if result.returncode:
                raise RuntimeError(
                    f"pip download of the agent's dependencies for Python {python} on {arch} failed:\n"
                    f"{result.stderr.strip()[-2000:]}"
                )
    (out / REQUIREMENTS).write_text(hashed_requirements(sorted(wheels.glob("*.whl"))))
    return out


def hashed_requirements(wheels: list[Path]) -> str:
    """One `name==version --hash=sha256:...` line per distribution, a hash per file."""
    versions: dict[str, set[str]] = defaultdict(set)
    hashes: dict[str, list[str]] = defaultdict(list)
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]  # a wheel's name and version never contain "-"
        versions[_canonical(name)].add(version)
        hashes[_canonical(name)].append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    lines = []
    for name in sorted(versions):
        if len(versions[name]) > 1:
            raise RuntimeError(
                f"{name}: node platforms resolved different versions ({', '.join(sorted(versions[name]))}); "
                f"install {name} in the environment you publish from, so its version is pinned"
            )
        (version,) = versions[name]
        lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(hashes[name])))
    return "\n".join(lines) + "\n"


def publish_agent(env: Environment, wheelhouse: Path | None = None) -> list[str]:
    """Upload the wheelhouse (built from this checkout unless given), its requirements and
    the environment's file (`stacks.package.environment_file`: the one it was loaded from, as
    the function archive holds it); returns the URIs written. Wheels go first, so a node booting
    meanwhile never sees requirements naming a wheel not there yet."""
    cloud = for_env(env)
    cloud.artifacts_location()  # no bucket, no credentials: said now, not after minutes of building
    # The file `env` was loaded from (--env path/to/x.toml too), checked unchanged since: not a same-named one.
    environment = environment_file(env).source
    with tempfile.TemporaryDirectory() as tmp:
        if wheelhouse is None:
            wheelhouse = build_wheelhouse(env, build_agent_wheel(Path(tmp) / "dist"), Path(tmp) / "house")
        uploads = {f"agent/wheels/{w.name}": w for w in sorted((wheelhouse / "wheels").glob("*.whl"))}
        uploads[f"agent/{REQUIREMENTS}"] = wheelhouse / REQUIREMENTS
        uploads[f"agent/environments/{env.name}.toml"] = environment
        return [cloud.upload(key, path) for key, path in uploads.items()]
