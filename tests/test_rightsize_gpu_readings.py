"""Right-sizing GPU items whose attempts lack a GPU reading: the agent records a reading the driver
does not have (utilisation on a MIG-enabled GPU) as unknown, not 0 (tests/test_gpus.py), and
`tidefleet rightsize` averages only the readings there are and prints n/a where there is none,
never 0 % (an idle GPU) nor 0 MiB."""

from __future__ import annotations

import pytest

from tests.test_costs import ENV, measured, priced
from tidefleet import rightsize
from tidefleet.jobs.cost_cli import _advice_lines


def attempt(**gpu) -> dict:
    return measured(cpu_s=50.0, rss=4000, itype="g5.12xlarge", node_slots=4, **gpu)


@pytest.mark.parametrize(("attempts", "shown"), [
    ([attempt(gpu_util_pct=None, gpu_mem_peak_mb=18_000)] * 2, "GPU: n/a mean utilisation, 18,000 MiB peak memory"),
    ([attempt(gpu_util_pct=None, gpu_mem_peak_mb=18_000), attempt(gpu_util_pct=30, gpu_mem_peak_mb=9_000)],
     "GPU: 30% mean utilisation, 18,000 MiB peak memory"),
    ([attempt(gpu_util_pct=30, gpu_mem_peak_mb=None)], "GPU: 30% mean utilisation, n/a peak memory"),
    ([attempt()], "GPU: n/a mean utilisation, n/a peak memory"),
], ids=["MIG: no utilisation", "one attempt of two measured", "no memory reading", "no reading at all"])  # fmt: skip
def test_a_gpu_reading_no_attempt_had_is_shown_as_n_a_and_the_others_are_averaged_alone(attempts, shown):
    advice = rightsize.advise(ENV, "queue train", "gpu", priced(*attempts, queue="train"))
    assert advice.need.gpus == 1 and f"  {shown}" in _advice_lines(advice)
