"""The pure scaling policy: `decide(env, fleet, now)` -> one `PoolDecision` per pool."""

from tidefleet.policy.apply import apply
from tidefleet.policy.scaling import decide

__all__ = ["apply", "decide"]
