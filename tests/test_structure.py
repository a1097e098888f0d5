"""The shape the architecture promises, checked on the source: imports run one way, components use only the
public transport API, placement is decided only by the hosts and the table, no module passes 400 lines."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("launcher", "components", "transports", "recipes")


def _modules(package):
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), open(path).read()


def _imports(source):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


FORBIDDEN = {
    "transports": ("components", "launcher", "recipes"),
    "components": ("launcher",),
    "recipes": ("launcher", "transports"),
}


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_run_one_way(package):
    wrong = [(path, name) for path, source in _modules(package) for name in _imports(source)
             if name.split(".")[0] in FORBIDDEN.get(package, ())]
    assert wrong == []


def test_components_use_only_the_public_transport_api():
    private = [(path, name) for path, source in _modules("components") for name in _imports(source)
               if name.startswith("transports.") and any(part.startswith("_") for part in name.split(".")[1:])]
    assert private == []


def test_placement_is_decided_only_by_the_hosts_and_the_table():
    branch = re.compile(r"placement\s*(==|!=|in\s*\()")
    found = [f"{path}:{i + 1}" for package in PACKAGES for path, source in _modules(package)
             if not path.startswith(os.path.join("components", "hosts"))
             for i, line in enumerate(source.splitlines()) if branch.search(line)]
    assert found == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_passes_400_lines(package):
    long = [(path, source.count("\n")) for path, source in _modules(package) if source.count("\n") > 400]
    assert long == []
