"""Cold import of the function handlers, against a bare `import boto3` in the same run.

Each sample is a fresh interpreter (what a Lambda cold start pays), timed from inside the
child so interpreter start-up is left out. The scaler's handler loads its settings (pydantic)
and the tick (policy) on its first trigger, not on import: the line "+ first trigger's loads"
shows that part too, so the whole cold start stays in view. Also lists the heaviest modules on the scaler's
path (python -X importtime) and checks that no heavy library we ship elsewhere is imported.

    python benchmarks/bench_cold_import.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import shape_args

ROOT = Path(__file__).resolve().parents[1]
# label -> the statements timed in a fresh interpreter
TARGETS = {
    "baseline: import boto3": "import boto3",
    "lambdas.scaler.handler": "import lambdas.scaler.handler",
    "  + first trigger's loads": (
        "import lambdas.scaler.handler, tidefleet.control; tidefleet.config.load_environment('dev')"
    ),
    "lambdas.interruption.handler": "import lambdas.interruption.handler",
}
MUST_NOT_LOAD = ("jinja2", "click", "cdktn", "constructs", "rich", "moto", "tidefleet.cli")
TIMER = (
    "import time, sys; t = time.perf_counter(); exec({code!r}); "
    "print(time.perf_counter() - t); print(','.join(sorted(m for m in {heavy!r} if m in sys.modules)))"
)


def sample(code: str) -> tuple[float, str]:
    out = subprocess.run(
        [sys.executable, "-c", TIMER.format(code=code, heavy=MUST_NOT_LOAD)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return float(out[0]), out[1] if len(out) > 1 else ""


def heaviest(module: str, top: int = 8) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) from python -X importtime, largest first."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=shape_args.positive, default=15, help="fresh interpreters per target")
    args = parser.parse_args()
    # Interleaved, so a busy machine slows every target alike; the minimum is the least
    # disturbed sample and the fairest comparison on a shared machine.
    samples: dict[str, list[tuple[float, str]]] = {label: [] for label in TARGETS}
    for _ in range(args.runs):
        for label, code in TARGETS.items():
            samples[label].append(sample(code))
    best, medians = {}, {}
    for label, got in samples.items():
        times = sorted(t for t, _ in got)
        best[label], medians[label] = times[0], statistics.median(times)
        heavy = {h for _, h in got if h}
        print(
            f"{label:32s} min {best[label] * 1000:7.1f} ms  median {medians[label] * 1000:7.1f}  "
            f"max {times[-1] * 1000:7.1f}  heavy modules loaded: {', '.join(heavy) or 'none'}"
        )
    base = "baseline: import boto3"
    for label in list(TARGETS)[1:]:
        print(
            f"{label} / boto3: min {best[label] / best[base]:.2f}x (+{(best[label] - best[base]) * 1000:.0f} ms), "
            f"median {medians[label] / medians[base]:.2f}x"
        )
    print("\nheaviest imports on the scaler's path (cumulative ms, python -X importtime):")
    for micros, name in heaviest("lambdas.scaler.handler"):
        print(f"  {micros / 1000:7.1f}  {name}")


if __name__ == "__main__":
    main()
