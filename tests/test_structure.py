"""The shape the architecture promises, checked on the source: imports run one way, components use only the
public transport API, placement is decided only by the hosts and the table, no package imports itself in a cycle and
no private name crosses modules."""

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


def _module_name(path):
    parts = os.path.splitext(path)[0].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name):
    path = os.path.join(ROOT, *name.split("."))
    return os.path.exists(path + ".py") or os.path.exists(os.path.join(path, "__init__.py"))


def _project_imports(path, source):
    """``(line, module, name)`` for each import of a project module by ``path``, at module level or inside functions:
    ``module`` is the dotted module imported from, ``name`` the name taken from it (``None`` for ``import module``)."""
    here = _module_name(path)
    package = here if path.endswith("__init__.py") else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            base = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            if base.split(".")[0] in PACKAGES:
                yield from ((node.lineno, base, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, None) for alias in node.names
                        if alias.name.split(".")[0] in PACKAGES)


def _import_graph():
    """Every project module -> the project modules it imports (a package import is an edge to its ``__init__``)."""
    graph = {}
    for package in PACKAGES:
        for path, source in _modules(package):
            here = _module_name(path)
            targets = set()
            for _, module, name in _project_imports(path, source):
                whole = f"{module}.{name}" if name else module
                targets.add(whole if name and _is_module(whole) else module)
            graph[here] = targets - {here}
    return graph


def _cycles(graph):
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_package_imports_itself_in_a_cycle():
    # a cycle makes import order matter and the modules one concern in two files; every package, at any depth
    assert _cycles(_import_graph()) == []


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_crosses_modules():
    # a leading underscore means "this module's own": another module that needs it needs a public name. A private
    # module (``_gloo``) belongs to its package: modules beside it may import it, nothing outside
    wrong = []
    for package in PACKAGES:
        for path, source in _modules(package):
            here = _module_name(path)
            folder = here if path.endswith("__init__.py") else here.rpartition(".")[0]
            for line, module, name in _project_imports(path, source):
                parts = [*module.split("."), *([name] if name else [])]
                for depth, part in enumerate(parts):
                    if not _private(part):
                        continue
                    owner = ".".join(parts[:depth])
                    is_module = _is_module(".".join(parts[:depth + 1]))
                    if not is_module or not (folder == owner or folder.startswith(owner + ".")):
                        wrong.append(f"{path}:{line} {'.'.join(parts)}")
    assert wrong == []


def test_the_kernel_imports_nothing_else_of_the_project():
    # transports/kernel is below every package (errors, option checks, the placement vocabulary): components and
    # transports both build on it, so it may import only itself, the standard library and third-party packages
    wrong = [f"{path}:{line} {module}" for path, source in _modules(os.path.join("transports", "kernel"))
             for line, module, _ in _project_imports(path, source)
             if module != "transports.kernel" and not module.startswith("transports.kernel.")]
    assert wrong == []
