"""The README's sandbox option table says what `tidefleet sandbox --help` says: every option, its
default and its bounds; and every invoke task's option with a default names it in its help."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from invoke import Collection

from tidefleet.sandbox.cli import sandbox

ROOT = Path(__file__).resolve().parents[1]


def sandbox_rows() -> dict[str, str]:
    """option -> its meaning, from the table under '## The sandbox'."""
    section = (ROOT / "README.md").read_text().split("\n## The sandbox\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| option | meaning |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    rows = (line.split(" | ", 1) for line in table.splitlines())
    return {re.match(r"\| `(--[\w-]+)", name).group(1): meaning.replace("`", "") for name, meaning in rows}


def test_the_readme_sandbox_table_has_every_option_its_default_and_bounds():
    rows = sandbox_rows()
    options = [p for p in sandbox.params if isinstance(p, click.Option)]
    assert sorted(rows) == sorted(p.opts[0] for p in options)
    for option in options:
        meaning = rows[option.opts[0]]
        if option.show_default and not option.is_flag:
            assert f"default {option.default}" in meaning, (option.opts[0], meaning)
        if isinstance(option.type, (click.IntRange, click.FloatRange)):
            if option.type.max is not None:
                assert f"at most {option.type.max}" in meaning, (option.opts[0], meaning)
            if option.type.min:
                assert f"at least {option.type.min}" in meaning, (option.opts[0], meaning)


def fresh_tasks():
    """tasks.py loaded anew: invoke hands each option's help over once (get_arguments pops it), so
    the module other tests in this process used may have none left."""
    spec = importlib.util.spec_from_file_location("fresh_tasks", ROOT / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_task_option_with_a_default_names_it_in_its_help():
    collection = Collection.from_module(fresh_tasks())
    missing = [f"{name} --{arg.name.replace('_', '-')}: {arg.help!r}"
               for name in collection.task_names for arg in collection[name].get_arguments()
               if arg.default not in (None, False, "", [])
               and f"default {arg.default}" not in (arg.help or "")]  # fmt: skip
    assert not missing, missing


def test_invoke_sandbox_takes_every_option_tidefleet_sandbox_has():
    collection = Collection.from_module(fresh_tasks())
    taken = {f"--{arg.name.replace('_', '-')}" for arg in collection["sandbox"].get_arguments()}
    assert taken == {p.opts[0] for p in sandbox.params if isinstance(p, click.Option)}


@pytest.mark.parametrize("value", ["nan", "inf", "3601"])
@pytest.mark.parametrize("option", ["--tick", "--boot-delay"])
def test_a_seconds_option_refuses_what_no_sandbox_could_run_on(option, value):
    # nan passes click's FloatRange (no comparison holds for it): a sandbox that never ticked.
    result = CliRunner().invoke(sandbox, [option, value])
    assert result.exit_code == 2 and option in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("given", [["--items", "5"], ["--chaos"], ["--items", "200", "--chaos"]])
def test_train_refuses_the_demo_jobs_options_rather_than_ignoring_them(given):
    """--train runs its own scenario: --items and --chaos shaped nothing and were dropped without a word."""
    result = CliRunner().invoke(sandbox, ["--train", *given])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    named = [g for g in given if g.startswith("--")]
    assert f"--train runs its own scenario instead of the demo job, which {' and '.join(named)}" in result.output
