"""The synthesized IAM policies, evaluated request by request with tests/iam_eval.py (our own
evaluator over the synthesized JSON: moto has no policy simulation). The scaler may do what
changing a group's on-demand base needs and no more; a node role reaches only its own pool's
and queues' records, checkpoints and log streams, and cannot replace what boot installs."""

from __future__ import annotations

import pytest
from conftest import SHIPPED_ENVS
from iam_eval import ACCOUNT, Request, Resolver, allowed

from tidefleet import naming
from tidefleet.config import load_environment

pytestmark = pytest.mark.synth


@pytest.fixture(params=SHIPPED_ENVS)
def shipped(request, synthesized):
    """(environment, its policy documents with references resolved) per shipped environment."""
    env = load_environment(request.param)
    stack = synthesized[request.param][1]
    resolve = Resolver(stack, env.region)
    docs = {name: resolve(doc["statement"]) for name, doc in stack["data"]["aws_iam_policy_document"].items()}
    return env, docs


def arn(env, service: str, resource: str, account: str = ACCOUNT) -> str:
    return f"arn:aws:{service}:{env.region}:{account}:{resource}"


def template_arn(env, pool: str) -> str:
    return arn(env, "ec2", f"launch-template/lt-pool-{pool}_launch-template")


def node_role_arn(env, pool: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:role/{naming.node_role(env.name, pool)}"


def update_group_requests(env, pool: str) -> list[Request]:
    """What AWS authorizes for UpdateAutoScalingGroup with a launch template (Amazon EC2 Auto
    Scaling user guide, "API permissions": as for CreateAutoScalingGroup, the caller must be
    allowed ec2:RunInstances with the template, ec2:CreateTags for its tag specifications and
    iam:PassRole for its instance profile), plus ssm:GetParameters when the image is an SSM
    parameter resolved at launch."""
    template = {"ec2:LaunchTemplate": template_arn(env, pool)}
    group = arn(env, "autoscaling", f"autoScalingGroup:0f1e-uuid:autoScalingGroupName/{naming.group(env.name, pool)}")
    requests = [
        Request("autoscaling:UpdateAutoScalingGroup", group),
        Request("ec2:RunInstances", template_arn(env, pool), template),
        *(Request("ec2:RunInstances", arn(env, "ec2", r), template)
          for r in ("instance/i-0abc", "volume/vol-0abc", "network-interface/eni-0abc", "subnet/subnet-0abc",
                    "security-group/sg-0abc", "spot-instances-request/sir-0abc")),
        Request("ec2:RunInstances", arn(env, "ec2", "image/ami-0abc", account=""), template),
        Request("ec2:CreateTags", arn(env, "ec2", "volume/vol-0abc"), {"ec2:CreateAction": "RunInstances"}),
        Request("ec2:CreateTags", arn(env, "ec2", "instance/i-0abc"), {"ec2:CreateAction": "RunInstances"}),
        Request("iam:PassRole", node_role_arn(env, pool), {"iam:PassedToService": "ec2.amazonaws.com"}),
    ]  # fmt: skip
    image = env.pools[pool].image
    if image.startswith("ssm:"):
        requests.append(Request("ssm:GetParameters", f"arn:aws:ssm:{env.region}::parameter{image.removeprefix('ssm:')}"))
    return requests


# -- the evaluator itself -------------------------------------------------------------------

STATEMENTS = [
    {"effect": "Allow", "actions": ["s3:Get*"], "resources": ["arn:aws:s3:::b/agent/*"]},
    {"effect": "Allow", "actions": ["iam:PassRole"], "resources": ["arn:aws:iam::1:role/node"],
     "condition": [{"test": "StringEquals", "variable": "iam:PassedToService", "values": ["ec2.amazonaws.com"]}]},
    {"effect": "Allow", "actions": ["dynamodb:GetItem"], "resources": ["arn:aws:dynamodb:r:1:table/t"],
     "condition": [{"test": "ForAllValues:StringLike", "variable": "dynamodb:LeadingKeys", "values": ["JOB#*"]}]},
    {"effect": "Deny", "actions": ["s3:GetObject"], "resources": ["arn:aws:s3:::b/agent/secret"]},
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_", "verdict"),
    [
        (Request("s3:GetObject", "arn:aws:s3:::b/agent/x.whl"), True),
        (Request("S3:getobject", "arn:aws:s3:::b/agent/x.whl"), True),  # actions are case-insensitive
        (Request("s3:PutObject", "arn:aws:s3:::b/agent/x.whl"), False),  # action not granted
        (Request("s3:GetObject", "arn:aws:s3:::b/checkpoints/x"), False),  # resource outside the glob
        (Request("s3:GetObject", "arn:aws:s3:::b/agent/secret"), False),  # explicit deny wins
        (Request("iam:PassRole", "arn:aws:iam::1:role/node", {"iam:PassedToService": "ec2.amazonaws.com"}), True),
        (Request("iam:PassRole", "arn:aws:iam::1:role/node", {"iam:PassedToService": "lambda.amazonaws.com"}), False),
        (Request("iam:PassRole", "arn:aws:iam::1:role/node"), False),  # missing key fails the condition
        (Request("dynamodb:GetItem", "arn:aws:dynamodb:r:1:table/t", {"dynamodb:LeadingKeys": ["JOB#1"]}), True),
        (Request("dynamodb:GetItem", "arn:aws:dynamodb:r:1:table/t", {"dynamodb:LeadingKeys": ["POOL#a"]}), False),
        (Request("dynamodb:GetItem", "arn:aws:dynamodb:r:1:table/t"), True),  # ForAllValues over nothing: IAM's pitfall
    ],
)
def test_the_evaluator_decides_as_iam_documents(request_, verdict):
    assert allowed(STATEMENTS, request_) is verdict


def test_the_evaluator_refuses_an_operator_it_does_not_model():
    statement = {"actions": ["s3:GetObject"], "resources": ["*"],
                 "condition": [{"test": "NumericLessThan", "variable": "s3:max-keys", "values": ["10"]}]}  # fmt: skip
    with pytest.raises(NotImplementedError, match="NumericLessThan"):
        allowed([statement], Request("s3:GetObject", "arn:aws:s3:::b/k", {"s3:max-keys": "5"}))


def test_without_its_passrole_statement_the_scaler_could_not_change_the_on_demand_base(shipped):
    env, docs = shipped
    pool = min(env.pools)
    crippled = [s for s in docs["control_scaler-role_policy"] if s["sid"] != "PassNodeRoles"]
    denied = [r.action for r in update_group_requests(env, pool) if not allowed(crippled, r)]
    assert denied == ["iam:PassRole"]


# -- the scaler -------------------------------------------------------------------------------


def test_the_scaler_may_change_each_groups_on_demand_base_and_desired_capacity(shipped):
    env, docs = shipped
    scaler = docs["control_scaler-role_policy"]
    for pool in env.pools:
        group = arn(env, "autoscaling", f"autoScalingGroup:0f1e-uuid:autoScalingGroupName/{naming.group(env.name, pool)}")
        requests = [*update_group_requests(env, pool), Request("autoscaling:SetDesiredCapacity", group),
                    Request("autoscaling:TerminateInstanceInAutoScalingGroup", group),
                    Request("dynamodb:BatchGetItem", arn(env, "dynamodb", f"table/{naming.table(env.name)}"))]  # fmt: skip
        assert [r for r in requests if not allowed(scaler, r)] == [], pool


@pytest.mark.parametrize(
    ("what", "request_of"),
    [
        ("launch from another template",
         lambda env, pool: Request("ec2:RunInstances", arn(env, "ec2", "instance/i-0abc"),
                                   {"ec2:LaunchTemplate": arn(env, "ec2", "launch-template/lt-someone-elses")})),
        ("launch without a template", lambda env, pool: Request("ec2:RunInstances", arn(env, "ec2", "instance/i-0abc"))),
        ("use another template", lambda env, pool: Request("ec2:RunInstances", arn(env, "ec2", "launch-template/lt-x"),
                                                           {"ec2:LaunchTemplate": arn(env, "ec2", "launch-template/lt-x")})),
        ("tag outside a launch", lambda env, pool: Request("ec2:CreateTags", arn(env, "ec2", "instance/i-0abc"))),
        ("pass a node role to Lambda",
         lambda env, pool: Request("iam:PassRole", node_role_arn(env, pool), {"iam:PassedToService": "lambda.amazonaws.com"})),
        ("pass its own role",
         lambda env, pool: Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/{naming.function(env.name, 'scaler')}",
                                   {"iam:PassedToService": "ec2.amazonaws.com"})),
        ("pass an admin role",
         lambda env, pool: Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/Admin", {"iam:PassedToService": "ec2.amazonaws.com"})),
        ("update another environment's group",
         lambda env, pool: Request("autoscaling:UpdateAutoScalingGroup",
                                   arn(env, "autoscaling", "autoScalingGroup:u:autoScalingGroupName/tidefleet-other-cpu"))),
    ],
)  # fmt: skip
def test_the_scaler_may_not(shipped, what, request_of):
    env, docs = shipped
    for pool in env.pools:
        assert not allowed(docs["control_scaler-role_policy"], request_of(env, pool)), what


def test_the_interruption_function_gets_no_launch_rights(shipped):
    env, docs = shipped
    for pool in env.pools:
        granted = [r.action for r in update_group_requests(env, pool) if allowed(docs["control_interruption-role_policy"], r)]
        assert granted == []


# -- node roles -------------------------------------------------------------------------------


def node_requests(env, pool: str, queue: str, other_pool: str, other_queue: str) -> list[tuple[Request, bool]]:
    table = arn(env, "dynamodb", f"table/{naming.table(env.name)}")
    bucket = f"arn:aws:s3:::{naming.artifacts_bucket(env.name, ACCOUNT)}"
    streams = arn(env, "logs", f"log-group:{naming.item_log_group(env.name)}")
    keys = lambda *k: {"dynamodb:LeadingKeys": list(k)}
    own_checkpoint = f"{bucket}/{naming.checkpoint_prefix(queue)}job-1/item-1/state.pt"
    return [
        (Request("dynamodb:GetItem", table, keys("JOB#job-1")), True),
        (Request("dynamodb:UpdateItem", table, keys("JOB#job-1")), True),
        (Request("dynamodb:UpdateItem", table, keys(f"POOL#{pool}")), True),
        (Request("dynamodb:UpdateItem", table, keys(f"QUEUE#{queue}")), True),
        (Request("dynamodb:BatchGetItem", table, keys(f"QUEUE#{queue}")), True),  # record_item_seconds reads the mean
        (Request("dynamodb:BatchGetItem", table, keys(f"QUEUE#{other_queue}")), False),
        (Request("dynamodb:UpdateItem", table, keys(f"POOL#{other_pool}")), False),
        (Request("dynamodb:UpdateItem", table, keys(f"QUEUE#{other_queue}")), False),
        (Request("dynamodb:PutItem", table, keys("JOB#job-1")), False),  # jobs are recorded by the SDK
        (Request("dynamodb:DeleteItem", table, keys(f"POOL#{pool}")), False),
        (Request("s3:PutObject", own_checkpoint), True),
        (Request("s3:GetObject", own_checkpoint), True),
        (Request("s3:PutObject", f"{bucket}/{naming.checkpoint_prefix(other_queue)}job-1/item-1/state.pt"), False),
        (Request("s3:GetObject", f"{bucket}/agent/requirements.txt"), True),
        (Request("s3:PutObject", f"{bucket}/agent/requirements.txt"), False),  # boot installs it as root
        (Request("s3:PutObject", f"{bucket}/agent/wheels/tidefleet-0.1.0-py3-none-any.whl"), False),
        (Request("s3:ListBucket", bucket, {"s3:prefix": "agent/"}), True),
        (Request("s3:ListBucket", bucket, {"s3:prefix": f"{naming.checkpoint_prefix(queue)}job-1/"}), True),
        (Request("s3:ListBucket", bucket, {"s3:prefix": ""}), False),
        (Request("logs:CreateLogStream", streams), True),
        (Request("logs:PutLogEvents", f"{streams}:log-stream:{naming.item_log_stream_prefix(queue)}job-1/item-1/1"), True),
        (Request("logs:PutLogEvents", f"{streams}:log-stream:{naming.item_log_stream_prefix(other_queue)}job-1/item-1/1"), False),
    ]


def test_each_node_role_reaches_only_its_own_pools_and_queues_records_checkpoints_and_logs(shipped):
    env, docs = shipped
    for pool in env.pools:
        others = sorted(set(env.pools) - {pool}) or ["elsewhere"]
        other_queues = sorted(set(env.queues) - set(env.queues_of(pool))) or ["elsewhere"]
        for queue in env.queues_of(pool):
            wrong = [(r, verdict) for r, verdict in node_requests(env, pool, queue, others[0], other_queues[0])
                     if allowed(docs[f"pool-{pool}_node-role_policy"], r) is not verdict]  # fmt: skip
            assert wrong == [], (pool, queue)


# -- the functions' reads (outside audit: each was denied on AWS, where moto allows everything) --


def test_the_functions_may_do_what_their_code_calls(shipped):
    """The scaler and the interruption function list the queues' URLs (SqsQueues._list_urls:
    ListQueues, no resource-level permission) before reading their depth; the schedule function's
    submit reads a queue's visibility timeout (lease_s); EventBridge Scheduler decrypts each
    schedule's input, encrypted with the environment's key, as its invoke role."""
    env, docs = shipped
    queues = [arn(env, "sqs", naming.queue(env.name, q)) for q in env.queues]
    for role in ("control_scaler-role_policy", "control_interruption-role_policy"):
        requests = [Request("sqs:ListQueues", "*"), *(Request("sqs:GetQueueAttributes", q) for q in queues)]
        assert [r for r in requests if not allowed(docs[role], r)] == [], role
    submit = [Request(a, q) for q in queues for a in ("sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes")]
    assert [r for r in submit if not allowed(docs["schedules_role_policy"], r)] == []
    (key,) = {r for s in docs["schedules_role_policy"] if s["sid"] == "ReadSettings" for r in s["resources"]}
    assert allowed(docs["schedules_scheduler-role_policy"], Request("kms:Decrypt", key))
    assert not allowed(docs["schedules_scheduler-role_policy"], Request("kms:Decrypt", arn(env, "kms", "key/other")))
