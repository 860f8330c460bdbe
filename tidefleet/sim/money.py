"""Dollar amounts in the simulator's tables and plot legend."""

from __future__ import annotations

import math


def usd(x: float) -> str:
    """Cents from $1 up (`1,146.86`); under $1, 4 significant digits (`0.09740`), so that a printed
    ratio can be checked against the printed costs of a small trace."""
    rounded = float(f"{x:.3e}")  # to 4 significant digits: 0.99996 is $1.00, 0.099999 is 0.1000
    if not 0 < abs(rounded) < 1:  # 0, $1 and more (nan and inf too)
        return f"{x:,.2f}"
    return f"{rounded:.{3 - math.floor(math.log10(abs(rounded)))}f}"
