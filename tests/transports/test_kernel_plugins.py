"""transports.kernel.plugins: the list of plugins the launcher found is handed down in RLSVC_PLUGINS, and
a process that finds it there imports those modules without reading the installed packages again."""

from __future__ import annotations

import os
import sys

import pytest

from transports.kernel import plugins


@pytest.fixture
def handed_down(tmp_path, monkeypatch):
    """A plugin module in ``tmp_path`` named in RLSVC_PLUGINS, as a process of a run inherits it."""
    name = f"handed_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.VARIABLE, f"mine={name},broken={name}:missing")
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setattr(plugins, "_found_here", None)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda **_: pytest.fail("read the installed packages"))
    yield name
    sys.modules.pop(name, None)


def test_a_handed_down_plugin_is_imported_without_reading_the_installed_packages(handed_down):
    with pytest.warns(plugins.PluginWarning, match=r"plugin 'broken' .* AttributeError"):
        loaded = plugins.load_plugins()
    assert loaded["mine"] is None and sys.modules[handed_down].IMPORTED
    assert loaded["broken"].startswith("AttributeError")
    assert plugins.load_plugins() == loaded  # once per interpreter: nothing is imported or warned again


def test_the_launcher_hands_down_what_it_found_and_a_process_outside_a_run_sets_nothing(tmp_path, monkeypatch):
    # set, then deleted: monkeypatch then restores the variable's absence at the end (a delenv of a variable that is
    # not set records nothing, and the value hand_down writes below would stay in this worker's environment, handed
    # to every process its later tests start)
    monkeypatch.setenv(plugins.VARIABLE, "")
    monkeypatch.delenv(plugins.VARIABLE)
    monkeypatch.setattr(plugins, "_found_here", None)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda **_: [])
    plugins.load_plugins()  # what importing components does: reads, imports, hands nothing down
    assert plugins.VARIABLE not in os.environ
    monkeypatch.setattr(plugins, "_found_here", [("mine", "my_pkg.mine")])
    plugins.hand_down()  # what the launcher's command line does before its run starts processes
    assert os.environ[plugins.VARIABLE] == "mine=my_pkg.mine"
