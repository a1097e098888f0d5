"""Tables that cannot go stale: the configuration page's groups and recipe x env tables are generated from ``conf/``
(`launcher.reference`), and no page offers a ``group=option`` that ``conf/`` lacks.

In-process and fast: the pages are read as text, ``conf/`` as YAML; nothing is built or started."""

from __future__ import annotations

import glob
import os
import re

import pytest

from launcher import reference
from tests.helpers import ROOT
from tests.test_docs import MY_CONF, PAGES, README

CONF = os.path.join(ROOT, "conf")

# Options the documentation's reader writes in a config directory of their own (tests/test_docs.py makes it and plans
# the pages' commands with it): `+recipe=ppo_mine`, `env=maze`, `logger=jsonl`.
READERS_OWN = {(os.path.dirname(path), os.path.splitext(os.path.basename(path))[0]) for path in MY_CONF}

# A page may name an option that is not one of conf/ where it says so: each entry is one the page still names (a
# stale entry fails too), with what the page says of it.
NOT_OFFERED = {
    "docs/pages/placements/distributed.md": {"service=distributed"},  # "so there is no `service=distributed`"
    "docs/pages/placements/rpc.md": {"service=rpc"},  # "`service=rpc` ... is refused with the alternatives"
    "docs/pages/architecture.md": {"env=my_family", "service=my_placement"},  # names a plugin of the reader's registers
    "docs/pages/your-own-code.md": {"env=my_family", "recipe_env=appo_minatar_mine"},  # the reader's own files
}

FENCE = re.compile(r"^(```+|~~~+)[ \t]*([\w+-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
NOT_OVERRIDES = {"python", "py", "toml", "yaml", "yml", "json", "ini", "cfg"}  # keyword arguments, mappings: not CLI


def _code(text: str) -> list[str]:
    """The code of a Markdown page: each fenced block's lines (but blocks of a language whose ``x=y`` is not an
    override, and the plan's header line ``plan: recipe=... env=<env id>`` that a dry run prints), and each code span
    outside the blocks."""
    found: list[str] = []

    def block(m: re.Match) -> str:
        if m.group(2).lower() not in NOT_OVERRIDES:
            found.extend(line for line in m.group(3).splitlines() if not line.lstrip().startswith("plan:"))
        return "\n"

    prose = FENCE.sub(block, text)
    found.extend(m.group(2) for m in SPAN.finditer(prose))
    return found


def offered(text: str, groups: dict[str, set[str]]) -> list[str]:
    """Every ``group=option`` (also ``+group=``, ``++group=``, a sweep's ``group=a,b`` or ``choice(a,b)``) in the code
    of ``text`` whose group is one of ``groups`` and whose option is not: placeholders (``<kind>``, ``X``, ``...``,
    ``${...}``), Python literals, recipe references (``module:RECIPE``) and an option whose refusal the page shows
    (the launcher's ``group has no option 'option'``) aside."""
    names = "|".join(re.escape(g) for g in sorted(groups, key=len, reverse=True))
    token = re.compile(rf"(?<![\w.\-/$@\]])(?:\+\+?|~)?({names})=([^\s`'\"]*)")
    bad = []
    for code in _code(text):
        for m in token.finditer(code):
            group, value = m.group(1), m.group(2)
            call = re.fullmatch(r"\w+\((.*)\)[),.;:]*", value)  # choice(a,b) and the like
            value = call.group(1) if call else value
            for option in value.split(","):
                option = option.strip().rstrip(").;:]").strip()
                if (not option or re.search(r"[<>{}$*]|\.\.\.", option) or re.fullmatch(r"[A-Z][A-Z_]*", option)
                        or option in ("None", "True", "False") or (group == "recipe" and ":" in option)):
                    continue
                if (option not in groups[group] and (group, option) not in READERS_OWN
                        and f"{group} has no option '{option}'" not in text):
                    bad.append(f"{m.group(1)}={option}")
    return bad + _table_options(text, groups)


def _table_options(text: str, groups: dict[str, set[str]]) -> list[str]:
    """``group=option`` for each option a hand-written table lists that its group lacks: a table with an ``options``
    column, in a row whose first cell is a group (`` `service` ``), each code span of that column."""
    bad, column = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = next((i for i, c in enumerate(cells) if c.lower() in ("options", "option")), -1)
            continue
        group = cells[0].strip("`+")
        if column > 0 and len(cells) > column and group in groups and cells[0].startswith("`"):
            for option in re.findall(r"`([^`]+)`", cells[column]):
                if option not in groups[group] and not re.search(r"[<>{}$*]|\.\.\.", option):
                    bad.append(f"{group}={option}")
    return bad


def _pages() -> list[str]:
    return [README, *PAGES]


def test_no_page_offers_an_option_conf_lacks():
    groups = reference.group_options()
    assert {"service", "env", "recipe", "recipe_env", "hydra/launcher", "hydra/sweeper"} <= set(groups)
    found, allowed_seen = [], set()
    for path in _pages():
        where = os.path.relpath(path, ROOT)
        allowed = NOT_OFFERED.get(where, set())
        for token in dict.fromkeys(offered(open(path).read(), groups)):
            if token in allowed:
                allowed_seen.add((where, token))
            else:
                found.append(f"{where}: {token}")
    assert found == [], "options that conf/ lacks (" + ", ".join(f"{g}: {sorted(o)}" for g, o in groups.items()) + ")"
    stale = [f"{where}: {token}" for where, tokens in NOT_OFFERED.items() for token in tokens
             if (where, token) not in allowed_seen]
    assert stale == [], "NOT_OFFERED names tokens its page no longer shows"


def test_the_options_a_shown_refusal_lists_are_those_of_conf():
    groups = reference.group_options()
    found = []
    for path in _pages():
        text = open(path).read()
        for m in re.finditer(r"([\w/]+) has no option '[^']*'[^\n]*\n\s+supported: ([^\n]*)", text):
            if m.group(1) in groups and set(m.group(2).split(", ")) != groups[m.group(1)]:
                found.append(f"{os.path.relpath(path, ROOT)}: {m.group(1)}: {m.group(2)}")
    assert found == []


def test_the_check_finds_what_conf_lacks_in_code_only():
    groups = reference.group_options()
    page = """Prose may say service=distributed; code may not:

```bash
python -m launcher +recipe=bar service=distributed env=atari,foo hydra/launcher=submitit_slurm \\
    components.collector.placement=submitit hydra/sweeper=optuna 'env=choice(cartpole,nope)' logger=<backend>
```

```python
Owner(config, transport="shared_memory", service=None)
```

| group | options | what it sets |
|---|---|---|
| `service` | `direct` (default), `distributed` | the default placement |

Spans: `recipe_env=x`, `++transport=wire`, `transport=X`, `+recipe=my_pkg.my_recipe:RECIPE`, `env=maze`,
`logger=gone`, shown refused: `logger has no option 'gone'`.
"""
    assert offered(page, groups) == ["recipe=bar", "service=distributed", "env=foo", "env=nope", "recipe_env=x",
                                     "transport=wire", "service=distributed"]


def test_every_conf_option_has_a_one_line_description():
    missing = []
    for group, options in reference.config_groups().items():
        for option in (o for o in options if o.provider == "conf"):
            path = os.path.join(CONF, group, f"{option.name}.yaml")
            first = next((line for line in open(path) if not line.startswith("# @package")), "")
            if not (option.description.endswith(".") and first.startswith("#") and len(first.rstrip("\n")) <= 120
                    and option.description[:-1].lower() in first.lower()):
                missing.append(f"conf/{group}/{option.name}.yaml: {first.strip()!r}")
    assert missing == [], "the first comment line of each option is a sentence of its own"


def test_the_tables_list_every_file_of_conf():
    files = sorted(os.path.relpath(p, CONF)[:-len(".yaml")] for p in glob.glob(os.path.join(CONF, "**", "*.yaml"),
                                                                               recursive=True))
    options = [f for f in files if "/" in f]
    assert len(options) >= 40 and "hydra/launcher/slurm" in options
    sections = dict(re.findall(r"^### `([\w/]+)`\n(.*?)(?=^### |\Z)", reference.groups(), re.M | re.S))
    assert set(sections) == {name.rsplit("/", 1)[0] for name in options}
    for name in (n for n in options if not n.startswith("recipe_env/")):  # those: the recipe x env table, below
        group, option = name.rsplit("/", 1)
        assert f"| `{option}` |" in sections[group], name
    assert "| `submitit_slurm` | A Hydra plugin's option, which `slurm` extends." in sections["hydra/launcher"]
    table = reference.groups()
    assert "| `service` | `direct` |" in table  # conf/config.yaml's default
    rows = [line for line in reference.recipe_envs().splitlines() if line.startswith("| `")]
    pairs = [f"recipe_env/{r.split('|')[1].strip(' `')}_{r.split('|')[2].strip(' `')}" for r in rows]
    assert pairs == [f for f in files if f.startswith("recipe_env/")]


def test_a_recipe_env_table_row_is_what_composing_the_pair_gives():
    """Each row's settings are what ``+recipe=R env=E`` composes to, and the bracketed value what the recipe gives
    without the file (``~recipe_env``)."""
    from hydra import compose, initialize_config_module

    from launcher import schema

    schema.register()
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in reference.recipe_envs().splitlines()
            if line.startswith("| `")]
    with initialize_config_module("conf", version_base=None):
        recipes = {r.strip("`"): compose("config", overrides=[f"recipe={r.strip('`')}", "~recipe_env"]).recipe
               for r in {row[0] for row in rows}}
        for recipe, env, _, settings in rows:
            recipe, env = recipe.strip("`"), env.strip("`")
            paired, alone = compose("config", overrides=[f"recipe={recipe}", f"env={env}"]).recipe, recipes[recipe]
            for key, value, own in re.findall(r"`(\w+)=([^`]*)`(?: \(([^)]*)\))?", settings):
                assert reference._value(paired[key]) == value, f"{recipe} x {env}: {key}"
                assert reference._value(alone[key]) == own, f"{recipe} x {env}: {key} without the file"


@pytest.mark.parametrize("generate", ["configuration", "groups", "recipe_envs"])
def test_generated_tables_show_names_with_underscores_as_code(generate):
    text = getattr(reference, generate)()
    prose = re.sub(r"`[^`\n]*`", "", text)
    emphasis = re.findall(r"(?<![\w`\\])_\w*_(?![\w`])|(?<![\w`\\])_\w+|<run dir>", prose)
    assert emphasis == [], f"{generate}(): names Markdown reads as emphasis (or tags)"
    assert "`_target_`" in reference.configuration()


def test_no_docstring_or_comment_holds_a_sphinx_role():
    # Docstrings are Markdown (docs/mkdocs.yml): `name`, not :class:`name`. The site build catches a role on the API
    # reference pages; this catches one in any module, rendered or not, without a build.
    role = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj):`")
    found = [f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()[:80]}"
             for folder in ("components", "transports", "launcher", "recipes", "benchmarks")
             for path in sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True))
             for n, line in enumerate(open(path, encoding="utf-8"), 1) if role.search(line)]
    assert found == []
