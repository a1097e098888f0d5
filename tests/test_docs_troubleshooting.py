"""The troubleshooting page quotes the messages a user meets as the code prints them, so it cannot go stale.

A message is quoted in a code span: those of the paragraph right after a `###` heading when that paragraph starts
with one, and the leading code span of a list item. Its `{...}` placeholders stand for what varies (a value, a path,
a nested message); the text between them must be a piece of a string literal in the source tree (an f-string's text
between two of its values, a module's string constant put in where the f-string names it). Each example of the page
(a `text` block whose first line is `$ python -m launcher ...`) is run in this process, and what it prints is what
the page shows, its first line one of its section's quoted messages.
"""

from __future__ import annotations

import ast
import functools
import glob
import os
import re
import shlex

import pytest

from tests.helpers import ROOT, cli_in_process

PAGE = os.path.join(ROOT, "docs", "pages", "troubleshooting.md")
SOURCES = ("launcher", "components", "transports", "recipes", "hydra_plugins")
PLACEHOLDER = re.compile(r"\{[^{}]*\}")
HOLE = "\x00"  # where an f-string puts a value: no quoted text may span it
SPAN = re.compile(r"`([^`]+)`")
PROMPT = "$ python -m launcher "


def _sections(text: str) -> list[dict]:
    """Each section of ``text``: its heading, its quoted messages, and its examples as ``(argv, printed lines)``."""
    sections: list[dict] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            sections.append({"heading": line.lstrip("# "), "level": len(line) - len(line.lstrip("#")),
                             "messages": [], "examples": []})
            i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            paragraph = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "```")):
                paragraph.append(lines[i].strip())
                i += 1
            if sections[-1]["level"] == 3 and paragraph and paragraph[0].startswith("`"):
                sections[-1]["messages"] += SPAN.findall(" ".join(paragraph))
            continue
        if line.startswith("- `") and sections and sections[-1]["level"] == 3:
            item = [line[2:]]  # a list item's leading code span, which may wrap onto the next lines
            while i + 1 < len(lines) and lines[i + 1].startswith("  ") and item[0].count("`") < 2:
                i += 1
                item[0] += " " + lines[i].strip()
            sections[-1]["messages"].append(SPAN.match(item[0]).group(1))
        if line in ("```text", "```{.text .wrap}") and i + 1 < len(lines) and lines[i + 1].startswith(PROMPT):
            end = lines.index("```", i + 1)
            argv = shlex.split(lines[i + 1][len(PROMPT):])
            sections[-1]["examples"].append((argv, lines[i + 2:end]))
            i = end
        i += 1
    return sections


SECTIONS = _sections(open(PAGE).read())
MESSAGES = [m for s in SECTIONS for m in s["messages"]]
EXAMPLES = [(s["heading"], argv, printed, s["messages"]) for s in SECTIONS for argv, printed in s["examples"]]


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module-level constants of ``tree`` (strings and numbers) as the text an f-string would give."""
    found = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        value = getattr(getattr(node, "value", None), "value", None)
        if isinstance(getattr(node, "value", None), ast.Constant) and isinstance(value, (str, int, float)):
            found.update({t.id: str(value) for t in targets if isinstance(t, ast.Name)})
    return found


def _module_name(path: str) -> str:
    return os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")


def _imported(tree: ast.Module, module: str, constants: dict[str, dict[str, str]]) -> dict[str, str]:
    """The constants ``tree`` (the module named ``module``) imports by name from modules of the tree."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            package = module.split(".")[:len(module.split(".")) - node.level] if node.level else []
            source = constants.get(".".join([*package, *([node.module] if node.module else [])]), {})
            found.update({(a.asname or a.name): source[a.name] for a in node.names if a.name in source})
    return found


@functools.cache
def _literal_text() -> str:
    """Every string literal of the source tree, joined by `HOLE`, docstrings left out; in an f-string, each value
    is `HOLE`, but a constant's text where it names a module-level constant of its module or one it imports."""
    paths = [p for d in SOURCES for p in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)]
    trees = {_module_name(path): ast.parse(open(path).read()) for path in paths}
    constants = {module: _constants(tree) for module, tree in trees.items()}

    def value(v: ast.expr, known: dict[str, str]) -> str:
        if isinstance(v, ast.Constant):
            return str(v.value)
        name = v.value.id if isinstance(v.value, ast.Name) else None
        return HOLE if v.format_spec is not None or name is None else known.get(name, HOLE)

    pieces: list[str] = []
    for module, tree in trees.items():
        known = {**_imported(tree, module, constants), **constants[module]}
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                pieces.append("".join(value(v, known) for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                pieces.append(re.sub(r"%[sdr]", HOLE, node.value))
    return HOLE.join(pieces)


def test_the_page_quotes_messages_and_shows_examples():
    # the extraction finds what the page holds: a broken one would let every check below pass on nothing
    assert len(MESSAGES) >= 60, MESSAGES
    assert len(EXAMPLES) >= 8, EXAMPLES


def test_every_quoted_message_is_text_the_code_prints():
    source = _literal_text()
    missing = {m: [f for f in PLACEHOLDER.split(m) if f.strip() and f not in source] for m in MESSAGES}
    assert {m: f for m, f in missing.items() if f} == {}, "text of a quoted message that no string literal holds"
    # each message holds a stretch of the code's own words, not just placeholders and punctuation
    assert [m for m in MESSAGES if len(PLACEHOLDER.sub("", m).strip()) < 10] == []


def test_a_reworded_message_is_caught():
    # the check tells the code's words from others: each message with a word of its longest stretch changed fails it
    source = _literal_text()
    for message in MESSAGES:
        longest = max(PLACEHOLDER.split(message), key=len)
        words = longest.split(" ")
        i = max(range(len(words)), key=lambda k: len(words[k]))
        reworded = " ".join([*words[:i], words[i] + "s", *words[i + 1:]])
        assert reworded not in source, (message, reworded)
    assert "the same secret in the environment of every node's processes (e.g. export RLSVC_KEY=" in source


def _as_pattern(message: str) -> str:
    return r"(?:configuration error: |error: )?" + ".+?".join(map(re.escape, PLACEHOLDER.split(message)))


@pytest.mark.parametrize("heading, argv, printed, messages", EXAMPLES, ids=[shlex.join(e[1]) for e in EXAMPLES])
def test_each_example_prints_what_the_page_shows(heading, argv, printed, messages, tmp_path, monkeypatch):
    for variable in ("RLSVC_KEY", "WORLD_SIZE", "RANK", "HYDRA_FULL_ERROR"):
        monkeypatch.delenv(variable, raising=False)
    proc = cli_in_process(*argv, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.rstrip("\n").splitlines() == printed
    assert os.listdir(tmp_path) == [], "a refused run leaves no run directory"
    if messages:  # the example shows one of the messages its section quotes
        assert any(re.fullmatch(_as_pattern(m), printed[0]) for m in messages), (heading, printed[0])
