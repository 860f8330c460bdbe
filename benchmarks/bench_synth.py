"""Wall time of `invoke synth --env prod` against the floor: a bare import of the provider
package (which starts the jsii Node kernel). Both run as fresh processes, alternately, in
this one run; prints each time and the ratio of the medians."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import stacks  # noqa: F401  (sets JSII_NODE to the bundled Node; children inherit it)

ROOT = Path(__file__).resolve().parents[1]
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
COMMANDS = {
    "bare import cdktn_provider_aws": [sys.executable, "-c", "import cdktn_provider_aws"],
    "invoke synth --env prod": [sys.executable, "-m", "invoke", "synth", "--env", "prod"],
}


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(RUNS):
        for name, cmd in COMMANDS.items():
            times[name].append(wall(cmd))
    for name, values in times.items():
        print(f"{name:34s} median {statistics.median(values):6.2f} s  runs {' '.join(f'{v:.2f}' for v in values)}")
    floor, synth = (statistics.median(v) for v in times.values())
    print(f"synth / floor = {synth / floor:.2f}x  (synth beyond the import: {synth - floor:.2f} s)")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + f" Runs each {RUNS} times (BENCH_RUNS).").parse_args()
    main()
