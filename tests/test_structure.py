"""The shape the architecture promises, checked on the source: imports run one way, components use only the
public transport API, placement is decided only by the hosts and the table, no module passes 600 lines."""

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


MAX_LINES = 600
"""Past this a module is rarely one concern; below it, a module is split by concern, never to fit a number."""


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_passes_its_size(package):
    long = [(path, source.count("\n")) for path, source in _modules(package) if source.count("\n") > MAX_LINES]
    assert long == []


def _kind_comparisons(source):
    """Comparisons of a transport kind (a name or attribute with ``transport`` or ``kind`` in it) with the name of a
    registered transport."""
    from transports import registry

    kinds = {d.kind for d in registry.descriptors()}

    def names_a_kind(side):
        if isinstance(side, ast.Constant):
            return side.value in kinds
        return isinstance(side, (ast.Tuple, ast.Set, ast.List)) and any(names_a_kind(e) for e in side.elts)

    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [s for s in sides if isinstance(s, (ast.Name, ast.Attribute))
                 and any(word in (s.id if isinstance(s, ast.Name) else s.attr) for word in ("transport", "kind"))]
        if named and any(names_a_kind(s) for s in sides):
            yield node.lineno


def test_components_and_the_launcher_never_branch_on_a_transport_kind():
    # what a transport is comes from its descriptor, and how a component uses it from its declared bindings
    found = [f"{path}:{line}" for package in ("components", "launcher") for path, source in _modules(package)
             if not path.endswith("declaration.py") for line in _kind_comparisons(source)]
    assert found == []


def _local_imports(path, source, package):
    """The modules of ``package`` that ``path`` imports, at module level or inside functions."""
    here = os.path.splitext(os.path.relpath(path, package))[0].replace(os.sep, ".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [node.module] if node.module else [alias.name for alias in node.names]
            elif node.level == 0 and node.module and node.module.split(".")[0] == package:
                rest = node.module.split(".")[1:]
                names = [rest[0]] if rest else [alias.name for alias in node.names]
            else:
                continue
            yield from (name.split(".")[0] for name in names if name.split(".")[0] != here)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package and len(parts) > 1 and parts[1] != here:
                    yield parts[1]


def test_the_launcher_imports_itself_without_a_cycle():
    graph = {}
    for path, source in _modules("launcher"):
        name = os.path.splitext(os.path.basename(path))[0]
        graph[name] = {m for m in _local_imports(os.path.relpath(path, "launcher"), source, "launcher") if m != name}
    cycles = []

    def visit(node, trail):
        for nxt in sorted(graph.get(node, ())):
            if nxt in trail:
                cycles.append(" -> ".join([*trail[trail.index(nxt):], nxt]))
            elif nxt in graph:
                visit(nxt, [*trail, nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []
