"""transports.kernel.plugins: the list of plugins a run's first interpreter found is handed down in RLSVC_PLUGINS, and
a process that finds it there imports those modules without reading the installed packages again."""

from __future__ import annotations

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
    monkeypatch.setattr("importlib.metadata.entry_points", lambda **_: pytest.fail("read the installed packages"))
    yield name
    sys.modules.pop(name, None)


def test_a_handed_down_plugin_is_imported_without_reading_the_installed_packages(handed_down):
    with pytest.warns(plugins.PluginWarning, match=r"plugin 'broken' .* AttributeError"):
        loaded = plugins.load_plugins()
    assert loaded["mine"] is None and sys.modules[handed_down].IMPORTED
    assert loaded["broken"].startswith("AttributeError")
    assert plugins.load_plugins() == loaded  # once per interpreter: nothing is imported or warned again
