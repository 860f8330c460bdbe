"""What the commands' click options share."""

from __future__ import annotations

import math

import click


def finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A FloatRange option's callback that refuses nan (and inf, where the range allows it):
    FloatRange lets nan through, since no comparison holds for it, and a nan interval waits for
    nothing (`Event.wait(nan)` returns at once) while a nan deadline never comes."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds; give one{_range(param.type)}")
    return value


def _range(kind: click.ParamType) -> str:
    low, high = getattr(kind, "min", None), getattr(kind, "max", None)
    if low is not None and high is not None:
        return f" from {low:g} to {high:g}"
    if low is not None:
        return f" of {low:g} or more"
    return f" up to {high:g}" if high is not None else ""
