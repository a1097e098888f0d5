"""Plugins: a package installed beside the project names a module under the entry-point group
``rl_services.plugins``; every interpreter of a run imports it, so what it registers (here an env family) works from
the command line and in each owner's own process. A plugin that cannot be imported is named and left out."""

from __future__ import annotations

import json

import pytest

from tests.components.test_env_families import TOY_FAMILY, TOY_YAML
from tests.helpers import run_cli

pytestmark = pytest.mark.slow  # each test runs python -m launcher


@pytest.fixture(autouse=True)
def _fresh_scan(monkeypatch):
    # a command line run in this process (an in-process test) hands the list it found down in RLSVC_PLUGINS; the one
    # under test must read the entry points itself, with the temporary package on its path
    monkeypatch.delenv("RLSVC_PLUGINS", raising=False)


def _install(site, module: str, source: str) -> None:
    """A distribution in ``site`` as pip leaves one: the module and its ``.dist-info`` with the entry point."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rl_services.plugins]\n{module} = {module}\n")


def test_an_installed_plugins_env_family_trains_from_the_command_line_in_every_process(tmp_path):
    site, conf = tmp_path / "site", tmp_path / "conf" / "env"
    site.mkdir()
    conf.mkdir(parents=True)
    _install(site, "toy_plugin", TOY_FAMILY)
    (conf / "toy.yaml").write_text(TOY_YAML)
    done = run_cli(f"--config-dir={tmp_path / 'conf'}", "+recipe=ppo", "env=toy", "env.toy.scale=3", "service=process", "recipe.num_envs=2",
                   "recipe.total_frames=256", "recipe.target_return=null", "launcher.plot=false",
                   "hydra.run.dir=run", cwd=str(tmp_path), timeout=180,
                   env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    [collector] = [c for c in plan["components"] if c["name"] == "collector"]
    assert collector["placement"] == "process"  # the family's envs were made in a child process
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["frames"] >= 256
    rewards = [float(r.split(",")[2]) for r in (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1:]
               if r.startswith("train/mean_return,")]
    assert rewards and set(rewards) == {15.0}  # every episode capped at 5 steps, each reward scaled by 3


def test_a_plugin_that_cannot_be_imported_is_named_and_the_run_goes_on(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "broken_plugin", "raise RuntimeError('this plugin is broken')\n")
    done = run_cli("+recipe=ppo", "launcher.dry_run=true", cwd=str(tmp_path), timeout=120,
                   env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert "plugin 'broken_plugin' (broken_plugin, entry-point group 'rl_services.plugins') could not be imported" \
        in done.stderr and "RuntimeError: this plugin is broken" in done.stderr
