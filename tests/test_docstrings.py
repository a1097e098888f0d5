"""Every public class and function of components/, transports/ and recipes/ says what it is for.

Read from the source with ``ast`` so the check stays fast and needs no optional dependency. A public name is one
without a leading underscore, in a module whose own name and folders do not start with one (a package's
``__init__.py`` counts). A method may go without a docstring when it overrides a documented method of the same name:
in a base class found in the project (resolved by name through the module's imports) or in a well-known protocol of
the standard library or torch (``KNOWN_PROTOCOLS``). Properties count as methods; a property's setter and a
``typing.overload`` stub need none of their own."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ("components", "transports", "recipes")

# Methods that external bases already document; an override keeps their meaning.
_TORCH_MODULE = {"forward", "extra_repr", "reset_parameters", "train", "eval", "state_dict", "load_state_dict"}
KNOWN_PROTOCOLS = {
    "Module": _TORCH_MODULE,
    "Sequential": _TORCH_MODULE,
    "ModuleList": _TORCH_MODULE,
    "ModuleDict": _TORCH_MODULE,
    "Thread": {"run"},
    "Process": {"run"},
    "JSONEncoder": {"default"},
    "Formatter": {"format"},
    "Handler": {"emit", "flush", "close"},
    "Mapping": {"keys", "items", "values", "get"},
    "MutableMapping": {"keys", "items", "values", "get"},
    "Exception": {"add_note", "with_traceback"},
}


class _Module:
    """One parsed module: its classes by name and where each imported name comes from."""

    def __init__(self, name, path, tree):
        self.name, self.path, self.tree = name, path, tree
        self.classes = {node.name: node for node in _top_level(tree) if isinstance(node, ast.ClassDef)}
        self.imported = {}  # local name -> (module, name or None for a module)
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in _top_level(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imported[alias.asname] = (alias.name, None)


def _top_level(tree):
    """The statements of a module body, including those under module-level ``if`` and ``try``."""
    for node in tree.body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, getattr(node, "handlers", []), getattr(node, "finalbody", [])):
                for child in block:
                    if isinstance(child, ast.ExceptHandler):
                        yield from child.body
                    else:
                        yield child


def _modules(root, packages):
    """Every module of ``packages`` under ``root``, by dotted name (private ones too: they may hold base classes)."""
    found = {}
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(files):
                if not file.endswith(".py"):
                    continue
                path = os.path.join(folder, file)
                rel = os.path.relpath(path, root)
                parts = rel[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                with open(path) as handle:
                    found[".".join(parts)] = _Module(".".join(parts), rel, ast.parse(handle.read(), rel))
    return found


def _is_public_module(path):
    parts = path[:-3].split(os.sep)
    return not any(part.startswith("_") for part in parts if part != "__init__")


def _resolve(modules, module, name, seen=()):
    """The class ``name`` means inside ``module``, as (module, ClassDef), or None when it lies outside the project."""
    if (module.name, name) in seen:
        return None
    seen = (*seen, (module.name, name))
    if name in module.classes:
        return module, module.classes[name]
    if name in module.imported:
        source, attr = module.imported[name]
        if attr is None:
            return None
        target = modules.get(source)
        if target is not None:
            return _resolve(modules, target, attr, seen)
    return None


def _base_expr(modules, module, expr):
    """Resolve a base-class expression: ``Name``, ``package.Name`` or ``Generic[...]``-style subscripts."""
    if isinstance(expr, ast.Subscript):
        return _base_expr(modules, module, expr.value)
    if isinstance(expr, ast.Name):
        return _resolve(modules, module, expr.id)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        source = module.imported.get(expr.value.id)
        dotted = None
        if source is not None:
            dotted = source[0] if source[1] is None else f"{source[0]}.{source[1]}"
        elif expr.value.id in modules:
            dotted = expr.value.id
        if dotted in modules:
            return _resolve(modules, modules[dotted], expr.attr)
    return None


def _base_name(expr):
    if isinstance(expr, ast.Subscript):
        return _base_name(expr.value)
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _functions(cls):
    """The methods defined in a class body (a property's getter and setter are two)."""
    return [node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _documented_in_bases(modules, module, cls, method, depth=0):
    """Whether a base of ``cls`` (or a base of a base) documents ``method``."""
    if depth > 20:
        return False
    for expr in cls.bases:
        if method in KNOWN_PROTOCOLS.get(_base_name(expr), ()):
            return True
        found = _base_expr(modules, module, expr)
        if found is None:
            continue
        base_module, base = found
        if any(f.name == method and ast.get_docstring(f) for f in _functions(base)):
            return True
        if _documented_in_bases(modules, base_module, base, method, depth + 1):
            return True
    return False


def _is_accessor_or_overload(node):
    """A property's setter or deleter (the getter carries the docstring) or a ``typing.overload`` stub."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Attribute) and decorator.attr in ("setter", "deleter"):
            return True
        if _base_name(decorator) == "overload":
            return True
    return False


def missing_docstrings(root=ROOT, packages=CHECKED):
    """``path:line name`` for each public class, function or method without a docstring."""
    modules = _modules(root, packages)
    missing = []
    for module in modules.values():
        if not _is_public_module(module.path):
            continue
        for node in _top_level(module.tree):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_"):
                continue
            if not ast.get_docstring(node) and not _is_accessor_or_overload(node):
                missing.append((module.path, node.lineno, node.name))
            if not isinstance(node, ast.ClassDef):
                continue
            for method in _functions(node):
                if method.name.startswith("_") or ast.get_docstring(method) or _is_accessor_or_overload(method):
                    continue
                if _documented_in_bases(modules, module, node, method.name):
                    continue
                missing.append((module.path, method.lineno, f"{node.name}.{method.name}"))
    return [f"{path}:{line} {name}" for path, line, name in sorted(set(missing))]


def test_every_public_class_and_function_has_a_docstring():
    missing = missing_docstrings()
    assert not missing, f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)


def test_the_check_flags_what_lacks_a_docstring_and_spares_documented_overrides(tmp_path):
    files = {
        "pkg/__init__.py": "def exported():\n    pass\n",
        "pkg/_private.py": "def hidden():\n    pass\n\n\nclass Base:\n    def run(self):\n        \"\"\"Run.\"\"\"\n",
        "pkg/_skipped/mod.py": "def inside_a_private_folder():\n    pass\n",
        "pkg/mod.py": (
            "from torch import nn\n"
            "from ._private import Base as Renamed\n\n\n"
            "class Child(Renamed):\n"
            "    \"\"\"A child.\"\"\"\n\n"
            "    def run(self):\n        pass\n\n"
            "    def extra(self):\n        pass\n\n"
            "    @property\n    def size(self):\n        pass\n\n"
            "    @size.setter\n    def size(self, value):\n        pass\n\n"
            "    def _own(self):\n        pass\n\n\n"
            "class Net(nn.Module):\n"
            "    \"\"\"A net.\"\"\"\n\n"
            "    def forward(self, x):\n        return x\n\n\n"
            "class Bare:\n    pass\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = [entry.split(" ")[1] for entry in missing_docstrings(str(tmp_path), ("pkg",))]
    assert found == ["exported", "Child.extra", "Child.size", "Bare"]
