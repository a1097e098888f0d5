"""The tutorial (``docs/pages/tutorial/``) shows only what runs and what runs prints.

- Its steps are listed by its index and the site's navigation in order, each links to the next, and each stays
  short.
- Every command of its ```bash blocks is exercised: a launcher command is one that ``tests/test_docs.py`` plans (its
  collected ``LAUNCHER`` commands), a benchmark command one it parses; any other command is either run here, where
  that is cheap and safe (its arguments parsed by the tool's own parser, its extras read from ``pyproject.toml``),
  or matched by a table naming the test that runs it. A command in none of these fails.
- The output it shows is what the code prints now: each plan as the dry run of its command prints it, each summary
  line as `launcher.report.summary_line` writes it, a device refusal as the check raises it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pathlib
import re
import shlex

import pytest
import yaml

from tests import test_docs
from tests.helpers import ROOT, shell_commands

TUTORIAL = os.path.join(ROOT, "docs", "pages", "tutorial")
STEPS = ["1-cartpole.md", "2-processes.md", "3-atari.md", "4-appo.md", "5-ray.md", "6-slurm.md",
         "7-several-machines.md", "8-gpu.md"]
PAGES = ["index.md", *STEPS]
PROSE_WORDS = 800  # a step's words outside its code blocks and comments
MARKER = re.compile(r"<!-- output of: (.*?) -->\n```text\n(.*?)```", re.S)
SUMMARY = re.compile(r"(?P<recipe>\S+) (?P<env>\S+) (?P<state>solved|finished): (?P<frames>[\d,]+) frames in "
                     r"(?P<seconds>[\d.]+) s \((?P<fps>[\d,]+) frames/s\), final mean return (?P<final>-?[\d.]+); "
                     r"results in (?P<run_dir>\S+)")

# Commands run elsewhere: a pattern over the command's words joined by spaces, and the test that runs it (a test
# function in a file of tests/). A command that matches none of these and is not exercised here fails.
ELSEWHERE = {
    r"\.ci/hosts\.sh (up|down) \d+":
        "tests/hosts/test_torchrun.py::test_ppo_solves_cartpole_with_its_collectors_on_another_host_and_binds_only_"
        "where_asked",
    r"export RLSVC_KEY=\$\(openssl rand -hex 32\)":
        "tests/launcher/test_torchrun.py::test_env_ranks_without_the_shared_key_are_refused",
    r"eval \$\(\.ci/local_slurm\.sh start\)": "tests/launcher/test_slurm.py::test_a_sweep_runs_as_slurm_jobs",
    r"\.ci/local_slurm\.sh stop": "tests/launcher/test_slurm.py::test_a_sweep_runs_as_slurm_jobs",
    r"squeue --states=all --format=%i\|%T\|%N":
        "tests/hosts/test_slurm.py::test_collector_jobs_run_on_node_b_and_reach_the_driver_on_host_a",
    r"bash benchmarks/gpu_check\.sh \S+":
        "tests/test_gpu_check.py::test_the_gpu_check_without_cuda_says_so_runs_what_it_can_and_exits_0",
}
# What a run under a launcher command needs besides the plan: the test that runs the launcher that way.
UNDER = {
    "torchrun": "tests/launcher/test_torchrun.py::test_ranks_torchrun_started_collect_for_the_driver",
    "ip netns exec": "tests/hosts/test_torchrun.py::test_appo_on_minatar_learns_with_its_collectors_on_another_host",
}


# ---------------------------------------------------------------------------------------------- reading the pages
def _read(page: str) -> str:
    return pathlib.Path(TUTORIAL, page).read_text()


def _fences(text: str) -> list[tuple[str, str]]:
    """Each fenced block of ``text`` as (language, body)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def _commands(text: str) -> list[list[str]]:
    """The commands of the ```bash blocks of ``text`` as words, by the rules of ``tests/test_docs.py``."""
    return shell_commands(text, ("bash",))


COMMANDS = [(page, command) for page in PAGES for command in _commands(_read(page))]
OUTPUTS = [(page, shown, body) for page in PAGES for shown, body in MARKER.findall(_read(page))]


def _ids(items) -> list[str]:
    return [f"{item[0]}: {' '.join(item[1])[:70]}" for item in items]


def _test_exists(where: str) -> bool:
    path, _, name = where.partition("::")
    full = os.path.join(ROOT, path)
    return os.path.exists(full) and re.search(rf"^def {re.escape(name)}\(", pathlib.Path(full).read_text(),
                                              re.M) is not None


# ---------------------------------------------------------------------------------------------- the path
def test_the_index_and_the_navigation_list_every_step_in_order():
    linked = re.findall(r"\]\((\d-[\w-]+\.md)\)", _read("index.md"))
    assert list(dict.fromkeys(linked)) == STEPS
    assert sorted(os.listdir(TUTORIAL)) == sorted([*PAGES, *(f for f in os.listdir(TUTORIAL)
                                                             if not f.endswith(".md"))])
    nav = yaml.safe_load(pathlib.Path(ROOT, "docs", "mkdocs.yml").read_text())["nav"]
    tutorial = next(entry["Tutorial"] for entry in nav if isinstance(entry, dict) and "Tutorial" in entry)
    pages = [entry if isinstance(entry, str) else next(iter(entry.values())) for entry in tutorial]
    assert pages == [f"tutorial/{page}" for page in PAGES]


@pytest.mark.parametrize("step", STEPS)
def test_each_step_is_short_shows_commands_and_links_to_the_next(step):
    text = _read(step)
    prose = re.sub(r"<!--.*?-->", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), flags=re.S)
    assert len(prose.split()) <= PROSE_WORDS, f"{step}: {len(prose.split())} words of prose"
    assert _commands(text), f"{step} shows no command"
    following = STEPS[STEPS.index(step) + 1:]
    if following:
        assert f"]({following[0]})" in text.split("Next:")[-1], f"{step} does not end by linking to {following[0]}"
    # every block is commands (bash) or output (text): a command in a block of another kind would go untested
    assert {language for language, _ in _fences(text)} <= {"bash", "text"}, step


# ---------------------------------------------------------------------------------------------- every command
def _kind(words: list[str]) -> str:
    """How a command is exercised (see the module docstring); fails on a command nothing exercises."""
    line = " ".join(words)
    if words[:3] == ["ip", "netns", "exec"]:
        assert re.fullmatch(r"rlsvc\d+-[abc]", words[3]), f"{line}: not a host .ci/hosts.sh makes"
        return f"under ip netns exec: {_kind(words[4:])}"
    if _launcher(words) is not None:
        return "launcher"
    if words[0] == "python" and len(words) > 1 and re.fullmatch(r"benchmarks/\w+\.py", words[1]):
        return "benchmark"
    if words[0] in HERE:
        return "here"
    matches = [pattern for pattern in ELSEWHERE if re.fullmatch(pattern, line)]
    assert len(matches) == 1, f"nothing exercises {line!r}: run it in HERE, or name the test that runs it in ELSEWHERE"
    return f"elsewhere: {ELSEWHERE[matches[0]]}"


def _launcher(words: list[str]) -> list[str] | None:
    """The arguments after ``-m launcher`` (also under torchrun), or ``None`` for another command."""
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "launcher":
            return words[i + 2:]
    return None


def _pip(words: list[str]) -> None:
    """``pip install`` of torch at the pin the package takes, or of this package with extras it declares."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads(pathlib.Path(ROOT, "pyproject.toml").read_text())["project"]
    assert words[1] == "install" and len(words) == 3, words
    target = words[2]
    if target.startswith("torch=="):
        torch = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch")
        assert torch.specifier.contains(target.removeprefix("torch==")), (target, str(torch))
        assert target in pathlib.Path(ROOT, "docs", "pages", "getting-started.md").read_text()  # the same pin
        return
    match = re.fullmatch(r"\.(?:\[([\w,]+)\])?", target)
    assert match, f"{target!r}: not this package"
    for extra in (match.group(1) or "").split(","):
        assert not extra or extra in project["optional-dependencies"], f"no extra {extra!r} in pyproject.toml"


def _tensorboard(words: list[str]) -> None:
    import warnings

    with warnings.catch_warnings():  # what TensorBoard imports warns about itself (html5lib's sanitizer)
        warnings.simplefilter("ignore")
        from tensorboard import program

        program.TensorBoard().configure(argv=[None, *words[1:]])  # its own flags, checked (exits 2 on a wrong one)


def _ray(words: list[str]) -> None:
    import warnings

    with warnings.catch_warnings():  # what Ray's command line imports warns about itself (pydantic, Ray Serve)
        warnings.simplefilter("ignore")
        from ray.scripts import scripts

    command = {"start": scripts.start, "stop": scripts.stop}[words[1]]
    command.make_context(words[1], list(words[2:]))  # Ray's own parser: an option it lacks raises


def _torchrun(words: list[str]) -> None:
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(words[1:])  # torchrun's own parser (exits 2 on a wrong option)
    assert args.module and args.training_script == "launcher", words


HERE = {"pip": _pip, "tensorboard": _tensorboard, "ray": _ray, "torchrun": _torchrun}


@pytest.mark.parametrize("page, words", COMMANDS, ids=_ids(COMMANDS))
def test_every_command_of_the_tutorial_is_exercised(page, words):
    kind = _kind(words)
    inner = words[4:] if kind.startswith("under ip netns exec") else words
    if kind.endswith("launcher"):
        planned = {tuple(command) for _, command in test_docs.LAUNCHER}
        assert tuple(words) in planned, f"tests/test_docs.py does not plan {' '.join(words)!r}"
        assert _test_exists("tests/test_docs.py::test_every_launcher_command_in_the_docs_plans")
        if inner[0] == "torchrun":
            _torchrun(inner)
        for under, where in UNDER.items():
            if " ".join(words).startswith(under) or inner[0] == under:
                assert _test_exists(where), where
    elif kind.endswith("benchmark"):
        assert tuple(words) in {tuple(command) for _, command in test_docs.BENCHMARKS}
        assert _test_exists("tests/test_docs.py::test_every_benchmark_command_in_the_docs_parses")
    elif kind.endswith("here"):
        HERE[inner[0]](inner)
    else:
        where = kind.rpartition("elsewhere: ")[2]
        assert _test_exists(where), f"{' '.join(words)}: {where} does not exist"


def test_the_tutorial_shows_each_kind_of_command():
    kinds = {_kind(words).rpartition(": ")[2].split("::")[0] for _, words in COMMANDS}
    assert {"launcher", "here"} <= kinds and len(COMMANDS) >= 30, kinds  # the extraction found them


def test_a_command_nothing_exercises_fails():
    with pytest.raises(AssertionError, match="nothing exercises 'rm -rf outputs'"):
        _kind(["rm", "-rf", "outputs"])
    with pytest.raises(SystemExit):
        _torchrun(["torchrun", "--no-such-option", "-m", "launcher"])
    with pytest.raises(AssertionError, match="no extra 'nothing'"):
        _pip(["pip", "install", ".[atari,nothing]"])


# ---------------------------------------------------------------------------------------------- what it shows
@functools.lru_cache(maxsize=None)
def _dry_run(shown: str) -> tuple[list[str], list]:
    """The lines the dry run of the launcher command ``shown`` prints (with a sweep's Slurm line first, as its
    launcher prints it), and its plans."""
    from launcher import cli
    from launcher.preflight import check_argv
    from launcher.slurm import JobResources, job_resources

    args = _launcher(shlex.split(shown))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLSVC_KEY", "the page's secret")  # each page whose commands need it exports it first
        configs = check_argv([*args, "launcher.dry_run=true"])
        plans, printed = [], io.StringIO()
        with contextlib.redirect_stdout(printed):
            for cfg in configs:
                plans.append(cli.plan(cfg))
                cli.dry_run(plans[-1])
    lines = printed.getvalue().splitlines()
    if len(plans) > 1:
        largest = JobResources.largest(job_resources(plan) for plan in plans)
        lines.insert(0, largest.line(f"from the plan, the largest of {len(plans)} jobs"))
    return lines, plans


def _plan_part(body: str) -> list[str]:
    """The lines of an output block that the plan prints: from its start to the first progress, log, error, blank
    or summary line."""
    lines = []
    for line in body.splitlines():
        if not line.strip() or line.startswith(("[", "configuration error")) or SUMMARY.fullmatch(line):
            break
        lines.append(line.rstrip())
    return lines


@pytest.mark.parametrize("page, shown, body", OUTPUTS, ids=[f"{p}: {s[:70]}" for p, s, _ in OUTPUTS])
def test_the_output_shown_is_what_the_command_prints(page, shown, body):
    assert shlex.split(shown) in _commands(_read(page)), f"{page}: the output of a command the page does not show"
    for line in body.splitlines():  # a summary line, as the launcher writes it
        match = SUMMARY.fullmatch(line)
        if match:
            from launcher.report import summary_line

            result = {"solved": match["state"] == "solved", "frames": int(match["frames"].replace(",", "")),
                      "wall_seconds": float(match["seconds"]),
                      "fps": int(match["fps"].replace(",", "")), "final_mean_return": float(match["final"])}
            assert summary_line(match["recipe"], match["env"], result, match["run_dir"]) == line
            seconds = (result["wall_seconds"] - 0.05, result["wall_seconds"] + 0.05)  # as rounded to 0.1 s
            assert result["frames"] / seconds[1] - 1 <= result["fps"] <= result["frames"] / seconds[0] + 1, line
    if _launcher(shlex.split(shown)) is None:
        return
    shown_plan = _plan_part(body)
    if shown_plan:  # the plan's lines, in the order the dry run prints them
        printed, _ = _dry_run(shown)
        rest = iter(printed)
        missing = [line for line in shown_plan if not any(line == other.rstrip() for other in rest)]
        assert missing == [], f"{page}: shown but not printed (in this order) by the dry run: {missing}"
    if body.startswith("configuration error: ") and "recipe.device" in body:
        import torch

        from launcher.checks import check_devices_here
        from transports.kernel.errors import ConfigurationError

        if torch.cuda.is_available():
            pytest.skip("the refusal shown is of a machine without CUDA")
        _, plans = _dry_run(shown)
        with pytest.raises(ConfigurationError) as refused:
            check_devices_here(plans[0])
        assert f"configuration error: {refused.value}" == body.strip()


def test_the_tutorial_shows_plans_and_summaries_it_checks():
    assert sum(bool(_plan_part(body)) for _, _, body in OUTPUTS) >= 6
    assert sum(bool(SUMMARY.search(body)) for _, _, body in OUTPUTS) >= 5
    unmarked = [(page, body[:60]) for page in PAGES for language, body in _fences(_read(page))
                if language == "text" and ("plan: recipe=" in body or SUMMARY.search(body))
                and f"```text\n{body}```" not in {f"```text\n{b}```" for p, _, b in OUTPUTS if p == page}]
    assert unmarked == [], f"output without <!-- output of: ... --> naming its command: {unmarked}"
