"""What to do about an interruption event: pure, like Karpenter's `action_for(message)`.

Three EventBridge events reach the interruption function:
- "EC2 Spot Instance Interruption Warning" (aws.ec2): the instance goes in two minutes;
- "EC2 Instance Rebalance Recommendation" (aws.ec2): elevated risk of that warning soon;
- "EC2 Instance-terminate Lifecycle Action" (aws.autoscaling): the group's terminate hook
  holds the instance in Terminating:Wait until someone completes the action.
Each becomes `DrainNode` (stop intake, hand work back, count it no longer as capacity, get
a replacement now) or `Ignore` with the reason. The EC2 events do not name the group; the
edge finds the pool from the instance when `DrainNode.pool` is None. An event with a field the
edge acts on (an instance id, a hook name, a token) not as AWS sends it is ignored, saying which:
acting on it would fail at AWS after the node was marked draining, and fail the invocation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.triggers import clip

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
TERMINATE_HOOK = "EC2 Instance-terminate Lifecycle Action"
SPOT_NOTICE_S = 120  # EC2 reclaims a spot instance two minutes after the warning
# What AWS sends, and its API takes back: an instance id is "i-" and 8 (older) or 17 hex digits (moto's,
# so the sandbox's, too; the API takes at most 19 characters); a hook name, its API's pattern and length;
# a lifecycle action token, a UUID: the API takes exactly 36 characters.
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
HOOK_NAME = re.compile(r"[A-Za-z0-9\-_/]{1,255}")
TOKEN_CHARS = 36


@dataclass(frozen=True, slots=True)
class LifecycleHold:
    """The terminate hook holds the instance. Whoever finishes with it completes the action:
    the agent after handing its items back (by its own instance id), or the interruption
    function at once when the node is idle or never reported."""

    hook: str
    token: str | None


@dataclass(frozen=True, slots=True)
class DrainNode:
    instance_id: str
    pool: str | None  # None: find it from the instance (EC2 events name no group)
    deadline: float | None  # epoch seconds the node is gone by, when known
    reason: str
    hold: LifecycleHold | None = None


@dataclass(frozen=True, slots=True)
class Ignore:
    reason: str


Action = DrainNode | Ignore


def _epoch(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def _shown(value: object) -> str:
    """A field's value for an ignore's reason: a string quoted and cut (`triggers.clip`), else its type."""
    if value is None or isinstance(value, str):
        return repr(clip(value) if value else value)
    return _a_type(value)


def _a_type(value: object) -> str:
    """The value's type with its article: "an int", "a dict"."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def pool_of_group(env: Environment, group: str) -> str | None:
    return {naming.group(env.name, p): p for p in env.pools}.get(group)


def action_for(event: object, env: Environment) -> Action:
    if not isinstance(event, dict) or not isinstance(event.get("detail"), dict):
        return Ignore("not an EventBridge event (no 'detail' object)")
    kind, detail = event.get("detail-type"), event["detail"]
    if kind in (SPOT_WARNING, REBALANCE):
        instance_id = detail.get("instance-id")
        if not isinstance(instance_id, str) or not INSTANCE_ID.fullmatch(instance_id):
            return Ignore(f"{kind}: detail.instance-id missing or not an instance id (got {_shown(instance_id)})")
        at = _epoch(event.get("time"))
        if kind == REBALANCE:
            return DrainNode(
                instance_id, None, None, "rebalance recommendation: spot interruption risk is high"
            )
        action = detail.get("instance-action") or "terminate"
        goes = (f"will {clip(action)} in {SPOT_NOTICE_S}s" if isinstance(action, str) else
                f"goes in {SPOT_NOTICE_S}s (its instance-action is {_a_type(action)}, not a string)")  # fmt: skip
        return DrainNode(
            instance_id,
            None,
            at + SPOT_NOTICE_S if at is not None else None,
            f"spot interruption warning: the instance {goes}",
        )
    if kind == TERMINATE_HOOK:
        instance_id, group = detail.get("EC2InstanceId"), detail.get("AutoScalingGroupName")
        if not isinstance(instance_id, str) or not isinstance(group, str):
            return Ignore(f"{kind}: detail.EC2InstanceId or detail.AutoScalingGroupName missing")
        if not INSTANCE_ID.fullmatch(instance_id):
            return Ignore(f"{kind}: detail.EC2InstanceId is not an instance id (got {_shown(instance_id)})")
        if detail.get("LifecycleTransition") != "autoscaling:EC2_INSTANCE_TERMINATING":
            return Ignore(f"{kind}: transition {_shown(detail.get('LifecycleTransition'))} is not a termination")
        pool = pool_of_group(env, group)
        if pool is None:
            return Ignore(f"{kind}: group {_shown(group)} is not a pool of environment {env.name!r}")
        hook, token = detail.get("LifecycleHookName"), detail.get("LifecycleActionToken")
        if hook and not (isinstance(hook, str) and HOOK_NAME.fullmatch(hook)):
            return Ignore(f"{kind}: detail.LifecycleHookName is not a hook name (got {_shown(hook)})")
        if token and not (isinstance(token, str) and len(token) == TOKEN_CHARS):
            return Ignore(f"{kind}: detail.LifecycleActionToken is not a lifecycle action token (got {_shown(token)})")
        hook = hook or naming.lifecycle_hook(env.name, pool)
        return DrainNode(
            instance_id,
            pool,
            None,
            f"group {group} is terminating the instance (hook {hook})",
            LifecycleHold(hook=hook, token=token or None),
        )
    return Ignore(f"event {_shown(kind)} from {_shown(event.get('source'))} is not an interruption this function handles")
