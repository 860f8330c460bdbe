"""The sandbox's emulated NVIDIA driver: answers the two `nvidia-smi` queries the agent makes
(`tidefleet.agent.gpus`) for FAKE_GPUS devices (default 4), so GPU pools run on a laptop. The
sandbox puts an `nvidia-smi` that runs this on its nodes' PATH under `--train`; nothing else uses it.

    python -m tidefleet.sandbox.fake_nvidia_smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits
"""

from __future__ import annotations

import os
import sys

ANSWERS = {
    "--query-gpu=index,uuid,memory.total": lambda i: f"{i}, GPU-sandbox-{i}, 24576",
    "--query-gpu=index,utilization.gpu,memory.used": lambda i: f"{i}, 0, 0",
}


def main(argv: list[str]) -> int:
    answer = ANSWERS.get(argv[0] if argv else "")
    if answer is None:
        print(f"sandbox nvidia-smi: unknown query {argv[:1]}", file=sys.stderr)
        return 2
    for i in range(int(os.environ.get("FAKE_GPUS", "4"))):
        print(answer(i))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
