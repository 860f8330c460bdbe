"""The pure scaling policy: `decide(env, fleet, now)` -> one `PoolDecision` per pool."""

from tidefleet.policy.scaling import decide

__all__ = ["decide"]
