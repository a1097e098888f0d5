"""The pages a user reads summarise: no page narrates benchmark runs one by one ("run 12 showed...", "runs 5 and 6"),
the JSON in `benchmarks/results/` keeps that history and the pages' generated blocks show it, and no page grows past
a stated number of words. Fast and in-process: these read the Markdown sources of `docs/pages/` and `README.md`."""

from __future__ import annotations

import glob
import os
import re

import pytest

from tests.helpers import ROOT

README = os.path.join(ROOT, "README.md")
PAGES_DIR = os.path.join(ROOT, "docs", "pages")
PAGES = sorted(glob.glob(os.path.join(PAGES_DIR, "**", "*.md"), recursive=True))

BENCHMARK_PAGE_WORDS = 1500
"""The most words a page under `docs/pages/benchmarks/` may hold, counted by `words`: prose, hand-written tables and
headings, but not fenced code blocks (the commands) nor what a `<!-- generated: ... -->` marker renders from the
results JSON at build time. A benchmark page says what is measured against what, the command, the newest results
and what they mean for a user; that fits in about 1,200 words."""

PAGE_WORDS = 3000
"""The most words any other page (and the README) may hold, counted the same way: about a quarter of an hour's
reading. A guide that needs more is split into pages."""

LOOKUP_PAGE_WORDS = {"troubleshooting.md": 4500}
"""Pages a reader searches for one message rather than reads through (each section a message, its cause and what to
do), with their own limit."""

DIARY = re.compile(
    r"\bruns? #?\d+\b"                # "run 12", "Run 5 of ...", "runs 13", "run #3"
    r"|\bruns \d+\s*(?:-|–|to|and|,)\s*\d+\b"  # "runs 13-15", "runs 5 and 6", "runs 13 to 18"
    r"|\bwhat runs? (?:\d|\w+ show)",  # "What run 15 shows", "What runs 9 to 11 show"
    re.I)
"""Run-by-run diary prose: a benchmark run named by its number in a results file."""

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)


def _name(path: str) -> str:
    return os.path.relpath(path, ROOT)


def words(markdown: str) -> int:
    """The words of a Markdown page as a reader meets them in its source: fenced code blocks and HTML comments (the
    generated markers) left out, a word being a run of non-space characters holding a letter or a digit (so table
    rules and lone punctuation do not count)."""
    text = COMMENT.sub(" ", FENCE.sub(" ", markdown))
    return sum(1 for token in text.split() if re.search(r"[^\W_]", token))


def diary(markdown: str) -> list[str]:
    """The diary phrases of a page (see `DIARY`), generated markers left out (what they render comes from the JSON)."""
    return [m.group(0) for m in DIARY.finditer(COMMENT.sub(" ", markdown))]


def limit(path: str) -> int:
    """The word limit of the page at `path`: `BENCHMARK_PAGE_WORDS` under `docs/pages/benchmarks/`, a lookup page's
    own (`LOOKUP_PAGE_WORDS`), else `PAGE_WORDS`."""
    benchmarks = os.path.join(PAGES_DIR, "benchmarks") + os.sep
    if path.startswith(benchmarks):
        return BENCHMARK_PAGE_WORDS
    return LOOKUP_PAGE_WORDS.get(os.path.relpath(path, PAGES_DIR), PAGE_WORDS)


def test_the_checks_see_what_they_look_for():
    # each check fails on the prose it is for, and passes what a summary says instead
    for prose in ["What run 15 shows", "Run 5 of `benchmarks/results/x.json`", "as in run 12, APPO",
                  "runs 13-15", "in runs 5 and 6", "runs 13 to 18", "What runs 9 to 11 show", "run #3"]:
        assert diary(prose), prose
    for prose in ["the newest run", "every recorded run, newest first", "a run takes 3 minutes", "run it twice",
                  "three runs of 5 seeds", "<!-- generated: history run_12 -->", "dry runs"]:
        assert diary(prose) == [], prose
    page = "# Title\n\nOne two three.\n\n```bash\npython a.py --seeds 0 1 2\n```\n\n<!-- generated: benchmark x -->\n" \
           "| a | b |\n|---|---|\n| 1.5 | x |\n"
    assert words(page) == 8  # Title, One, two, three., a, b, 1.5, x
    assert limit(os.path.join(PAGES_DIR, "benchmarks", "atari.md")) == BENCHMARK_PAGE_WORDS
    assert limit(os.path.join(PAGES_DIR, "recipes.md")) == limit(README) == PAGE_WORDS


def test_the_pages_are_there():
    assert len(PAGES) > 40 and any("/benchmarks/" in p for p in PAGES) and os.path.exists(README)


@pytest.mark.parametrize("path", [*PAGES, README], ids=_name)
def test_no_page_narrates_runs(path):
    # a page states the newest result, its command, machine and commit; benchmarks/results/*.json keeps the history
    found = diary(open(path).read())
    assert found == [], f"{_name(path)} names runs by number: {found}"


@pytest.mark.parametrize("path", [*PAGES, README], ids=_name)
def test_no_page_is_longer_than_its_limit(path):
    count = words(open(path).read())
    assert count <= limit(path), f"{_name(path)}: {count:,} words, more than {limit(path):,}"


RESULTS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.json")))


@pytest.mark.parametrize("path", RESULTS, ids=_name)
def test_what_a_page_renders_from_the_newest_run_names_no_run_by_number(path, monkeypatch):
    # the generated block is part of the page a reader sees: its labels and notes name a run by date and commit
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import _results

    name = os.path.basename(path)[:-5]
    runs = _results.load(path)
    found = diary(_results.page(name, runs[-1:]))
    assert found == [], f"the newest run of {_name(path)} renders {found}"


def test_the_pages_say_no_gpu_run_was_made_only_while_none_is_recorded():
    recorded = os.path.exists(os.path.join(ROOT, "benchmarks", "results", "gpu.json"))
    for page in ("benchmarks/gpu.md", "benchmarks/index.md"):
        says_none = "no gpu run has been made yet" in open(os.path.join(PAGES_DIR, page)).read().lower()
        assert says_none is not recorded, f"{page}: {'says' if says_none else 'does not say'} no GPU run was made, " \
                                          f"and benchmarks/results/gpu.json {'exists' if recorded else 'does not'}"
