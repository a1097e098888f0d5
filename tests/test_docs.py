"""The README and the documentation site say only what runs: every command they show is exercised here (a launcher
command as a dry run, a benchmark command by its script's own argument parser), the README stays short, its table is
the generated one, and the site builds in strict mode (a broken link or reference fails it)."""

from __future__ import annotations

import glob
import importlib
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from launcher.references import forget_references
from tests.helpers import ROOT, cli_in_process, shell_commands
from tests.user_code import OWN_RECIPE

README = os.path.join(ROOT, "README.md")
PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "pages", "**", "*.md"), recursive=True))
README_LINES = 250

# The user code the documentation names (a package of one's own, and a config directory of one's own).
MY_PKG = {
    "__init__.py": "",
    "nets.py": "from tests.user_code import two_layer_net\n\n\ndef make_net(in_features, out_features, width=64):\n"
               "    return two_layer_net(in_features, out_features, width)\n",
    "envs.py": "from tests.user_code import make_corridor\n\n\ndef make_maze(size=5):\n    return make_corridor(size)\n",
    "logs.py": "from components.logger import CSVLogger\nfrom tests.user_code import JsonLinesLogger  # noqa: F401\n\n\n"
               "class MyLogger(CSVLogger):\n    pass\n",
    "my_recipe.py": OWN_RECIPE,
}
MY_CONF = {
    "recipe/ppo_mine.yaml": "defaults: [base_ppo, _self_]\nnetwork: {_target_: my_pkg.nets.make_net, width: 128}\n",
    "env/maze.yaml": "defaults: [base_env, _self_]\n_target_: my_pkg.envs.make_maze\nkwargs: {size: 5}\n",
    "logger/jsonl.yaml": "_target_: my_pkg.logs.JsonLinesLogger\nlog_dir: .\nfilename: scalars.jsonl\n",
}


def _read(path) -> str:
    with open(path) as f:
        return f.read()


def _commands(path: str) -> list[list[str]]:
    """The shell commands of the ```bash, ```sh and ```console blocks of ``path`` (`tests.helpers.shell_commands`)."""
    return shell_commands(_read(path))


def _all_commands() -> list[tuple[str, list[str]]]:
    return [(os.path.relpath(path, ROOT), command) for path in [README, *PAGES] for command in _commands(path)]


def _launcher_args(words: list[str]) -> list[str] | None:
    """The arguments after ``-m launcher`` (also under torchrun), or ``None`` for another command."""
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "launcher":
            return words[i + 2:]
    return None


def _unique(found: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Each distinct command once, with every page that shows it."""
    pages: dict[tuple, list[str]] = {}
    for where, command in found:
        pages.setdefault(tuple(command), []).append(where)
    return [(", ".join(sorted(set(w))), list(c)) for c, w in pages.items()]


LAUNCHER = _unique([(where, c) for where, c in _all_commands() if _launcher_args(c) is not None])
BENCHMARKS = [(where, c) for where, c in _all_commands() if len(c) > 1 and c[0] == "python"
              and re.fullmatch(r"benchmarks/\w+\.py", c[1])]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """A working directory holding ``my_pkg`` (on ``sys.path``) and ``my_conf``, as the documentation assumes."""
    folder = tmp_path_factory.mktemp("user")
    for name, source in MY_PKG.items():
        (folder / "my_pkg").mkdir(exist_ok=True)
        (folder / "my_pkg" / name).write_text(source)
    for name, source in MY_CONF.items():
        (folder / "my_conf" / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
        (folder / "my_conf" / name).write_text(source)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        del sys.modules[name]
    forget_references()  # the +recipe=my_pkg...:RECIPE the commands registered: later tests list the recipe group


def test_the_documentation_shows_commands():
    assert len(LAUNCHER) >= 20 and BENCHMARKS, "no commands found: the extraction is broken"


@pytest.mark.slow
@pytest.mark.parametrize("where, command", LAUNCHER, ids=[f"{w}: {shlex.join(c)[:80]}" for w, c in LAUNCHER])
def test_every_launcher_command_in_the_docs_plans(where, command, user_dir, monkeypatch):
    _assert_dry_run_plans(where, command, user_dir, monkeypatch)


ON_SUBMITIT = [(where, c) for where, c in LAUNCHER if "components.collector.placement=submitit" in c]


@pytest.mark.parametrize("where, command", ON_SUBMITIT, ids=[f"{w}: {shlex.join(c)[:80]}" for w, c in ON_SUBMITIT])
def test_a_submitit_command_in_the_docs_plans_with_no_slurm_here(where, command, user_dir, monkeypatch):
    # a dry run may plan for a cluster this machine is not on: no sbatch on the PATH (whatever ran before put one there)
    import shutil

    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                                if d and not os.path.exists(os.path.join(d, "sbatch"))))
    assert shutil.which("sbatch") is None
    _assert_dry_run_plans(where, command, user_dir, monkeypatch)


def test_the_docs_show_submitit_commands():
    assert len(ON_SUBMITIT) >= 3, "no submitit command found: the extraction or the filter is broken"


def _assert_dry_run_plans(where: str, command: list[str], user_dir, monkeypatch) -> None:
    """The command's dry run: every job composed and checked (phase 1), then planned and printed (phase 2)."""
    import contextlib
    import io

    from launcher import cli
    from launcher.preflight import check_argv

    args = _launcher_args(command)
    if all("export RLSVC_KEY=" in _read(os.path.join(ROOT, page)) for page in where.split(", ")):
        monkeypatch.setenv("RLSVC_KEY", "the page's secret")  # each page showing it sets the run's secret first
    sweep = "--multirun" in args or "-m" in args
    with contextlib.chdir(user_dir):  # where the page's reader stands (--config-dir my_conf)
        configs = check_argv([*args, "launcher.dry_run=true"])  # phase 1: every job composed, checked
    for cfg in configs:  # then each job's plan and dry run, the phases Hydra's main would run for it
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            cli.dry_run(cli.plan(cfg))
        assert printed.getvalue().startswith("plan: recipe="), f"{where}: {shlex.join(command)}"
    if configs:
        return
    # a command line the preflight leaves to Hydra (--config-dir, ...): its dry run through the real entry point
    proc = cli_in_process(*args, "launcher.dry_run=true", *(["hydra.sweep.dir=sweep"] if sweep else []),
                          cwd=str(user_dir))
    assert proc.returncode == 0, f"{where}: {shlex.join(command)}\n{proc.stderr[-2000:]}"
    assert "plan: recipe=" in proc.stdout, f"{where}: {shlex.join(command)}\n{proc.stdout[-2000:]}"


def test_the_matrix_command_prints_the_table():
    import contextlib
    import io

    from components.compat import render_markdown
    from launcher import matrix

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        matrix.main()
    assert out.getvalue().strip() == render_markdown()


@pytest.mark.parametrize("where, command", BENCHMARKS, ids=[f"{w}: {shlex.join(c)}" for w, c in BENCHMARKS])
def test_every_benchmark_command_in_the_docs_parses(where, command):
    words = command
    script = os.path.splitext(os.path.basename(words[1]))[0]
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        module = importlib.import_module(script)
        module.arguments().parse_args(words[2:])  # exits 2 (SystemExit) on an option the script does not take
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))


def test_the_readme_is_short_and_its_table_is_the_generated_one():
    from components.compat import render_markdown
    from launcher.matrix import README_BEGIN, README_END

    text = _read(README)
    assert len(text.splitlines()) <= README_LINES
    assert text.split(README_BEGIN)[1].split(README_END)[0].strip() == render_markdown()
    assert "python -m launcher +recipe=ppo" in text and "python -m pytest" in text


def test_no_page_keeps_a_diary():
    # benchmark results live in benchmarks/results/*.json and the pages generated from them, not in prose
    diary = re.compile(r"\bat [0-9a-f]{7}\b|\b20\d\d-\d\d-\d\d\b|\bpassed, \d+ skipped\b|\b\d[\d,]* tests\b(?!/)")
    prose = {path: re.sub(r"```.*?```", "", _read(path), flags=re.S) for path in [README, *PAGES]}
    found = [f"{os.path.relpath(path, ROOT)}: {m.group(0)}" for path, text in prose.items()
             for m in diary.finditer(text)]
    assert found == []


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f",
                           os.path.join(ROOT, "docs", "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's notice about its successor
    assert proc.returncode == 0, textwrap.shorten(proc.stderr, 4000)
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "compatibility.html").read_text().count("<tr>") > 30
    assert (tmp_path / "site" / "reference" / "components.html").read_text().count('class="doc doc-object') > 100
    assert _misrendered(tmp_path / "site") == []


# What reST (or a Markdown slip) looks like once rendered: a Sphinx role left in a docstring, a name like `_target_`
# outside a code span read as emphasis, a doctest's >>> prompt read as three nested quotes.
MISRENDERED = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj):(?=<code>|`)|<em>target</em>"
                         r"|<blockquote>\s*<blockquote>\s*<blockquote>")


def _misrendered(site) -> list[str]:
    """``page: text`` for each leftover of `MISRENDERED` in the built ``site`` (an emphasised *target* that the page's
    own Markdown asks for aside)."""
    found = []
    for path in sorted(glob.glob(os.path.join(str(site), "**", "*.html"), recursive=True)):
        html, page = _read(path), os.path.relpath(path, str(site))
        source = os.path.join(ROOT, "docs", "pages", page[:-len(".html")] + ".md")
        asked = _read(source).count("*target*") if os.path.exists(source) else 0
        for m in MISRENDERED.finditer(html):
            if m.group(0) == "<em>target</em>" and asked > 0:
                asked -= 1
                continue
            text = re.sub(r"<[^>]+>|\s+", " ", html[max(0, m.start() - 120):m.end() + 80])
            found.append(f"{page}: {m.group(0)!r} in ...{text.strip()}...")
    return found
