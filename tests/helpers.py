"""Plain helpers the tests share (fixtures live in ``conftest.py``): bounded waits, processes, the CLI, Ray.

Import them as ``from tests.helpers import ...``. The test tree is a package (``tests/__init__.py``) imported with
``--import-mode=importlib``, and ``conftest.py`` puts the repository root first on ``sys.path`` and ``PYTHONPATH``,
so ``tests`` is this folder in the test process and in every child (multiprocessing, Ray workers, ``python -m
launcher``), even where some installed distribution ships a top-level ``tests`` package of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Callable, TypeVar

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 30.0, interval: float = 0.01, what: str = "") -> T:
    """Poll ``condition`` until it returns something truthy (returned), failing the test after ``timeout`` s.

    Never a fixed sleep: returns as soon as the condition holds; the interval grows to at most 0.1 s.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.1)


def default_sigint() -> None:
    # A runner started in the background (``cmd &`` in a script, nohup, some CI agents) ignores SIGINT, and a
    # child inherits that; Python then installs no KeyboardInterrupt handler. Ctrl-C tests need the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_cli(*args: str, cwd: str, **kwargs) -> subprocess.Popen:
    """Start ``python -m launcher`` as a user would, with the default SIGINT disposition, in a session of its own
    (so a test can signal its whole process group)."""
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=cwd, preexec_fn=default_sigint,
                            start_new_session=True, text=True, **kwargs)


def run_cli(*args: str, cwd: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m launcher`` in a subprocess (bounded in time) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        preexec_fn=default_sigint,
    )


def proc_state(pid: int) -> str:
    """The state letter of process ``pid`` (``Z`` for a zombie), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def process_gone(pid: int) -> bool:
    return proc_state(pid) in ("gone", "Z")


def pgroup_members(pgid: int) -> list[int]:
    """Processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def our_live_actors() -> list[str]:
    """Class names of the actors still alive in the connected cluster (the registry directory excepted)."""
    from ray._private import state

    return sorted(a.get("ActorClassName", "?") for a in state.actors().values()
                  if a.get("State") == "ALIVE" and a.get("ActorClassName") != "_Directory")


PLACEMENT_FIXTURES = {"ray": "ray_cluster", "submitit": "submitit_local"}
"""The fixture a placement's hosts need around them (request it with ``request.getfixturevalue``)."""

SLOW_PLACEMENTS = frozenset({"ray", "submitit", "distributed", "rpc", "monarch"})
"""Placements whose hosts start seconds-long workers (a Ray actor, a submitit job, a worker rank, an rpc world, a
Monarch proc: each a fresh interpreter importing torch), so their cases are marked ``slow`` (tests/startup.py)."""


@contextlib.contextmanager
def tmpfs(where, size_kb: int):
    """A tmpfs of ``size_kb`` KiB mounted at ``where`` (made if missing), unmounted afterwards. Skips the test where it
    cannot be mounted (not root)."""
    os.makedirs(where, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        import pytest

        pytest.skip(f"a small tmpfs cannot be mounted here ({mounted.stderr.strip() or 'mount failed'}): the test "
                    "needs root")
    try:
        yield str(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@contextlib.contextmanager
def segment_dir_of(where, size_kb: int, monkeypatch):
    """A tmpfs of ``size_kb`` KiB at ``where`` made the segment directory (``RLSVC_SHM_DIR``) for the test: a small
    ``/dev/shm`` of its own (:func:`tmpfs`)."""
    with tmpfs(where, size_kb):
        monkeypatch.setenv("RLSVC_SHM_DIR", str(where))
        try:
            yield str(where)
        finally:
            monkeypatch.delenv("RLSVC_SHM_DIR", raising=False)


def cli_in_process(*args: str, cwd: str) -> subprocess.CompletedProcess:
    """Run ``python -m launcher`` 's entry point (:func:`launcher.cli.main`) in this process, in directory ``cwd``,
    and capture what it prints and its exit status: the same phases a subprocess runs (preflight, then Hydra), for
    checks that need no process of their own (a configuration mistake, a dry run). Hydra's global state is cleared
    afterwards."""
    import contextlib
    import io

    from hydra.core.global_hydra import GlobalHydra

    from launcher.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    argv, here = sys.argv, os.getcwd()
    try:
        os.chdir(cwd)
        sys.argv = ["launcher", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
        os.chdir(here)
        GlobalHydra.instance().clear()
    return subprocess.CompletedProcess(["launcher", *args], code, out.getvalue(), err.getvalue())


MONARCH_ATEXIT = "atexit.register(lambda: shutdown_context("
"""The line of Monarch's own exit handler in every process that was a Monarch client: under load its 1 s flush of the
actor system times out and Python prints the handler's ``TimeoutError`` while the process exits anyway."""


def tracebacks(stderr: str) -> list[str]:
    """The Python tracebacks in ``stderr``, each as its text, without those of Monarch's exit handler timing out in a
    child process that is ending (:data:`MONARCH_ATEXIT`): a run's own errors, not its dependencies' teardown noise."""
    lines, found = stderr.splitlines(), []
    for i, line in enumerate(lines):
        if line.strip() != "Traceback (most recent call last):":
            continue
        end = i + 1
        while end < len(lines) and (lines[end].startswith(" ") or not lines[end].strip()):
            end += 1  # the frames, indented; the exception's line is the first one that is not
        block = "\n".join(lines[i:end + 1])
        if not (MONARCH_ATEXIT in block and "TimeoutError" in (lines[end] if end < len(lines) else "")):
            found.append(block)
    return found


def decoded_video(path: str) -> tuple[int, tuple[int, int]]:
    """``(frames, (width, height))`` of a video file, decoded by its reader (ffmpeg for MP4, Pillow for GIF)."""
    if path.endswith(".mp4"):
        import imageio_ffmpeg

        reader = imageio_ffmpeg.read_frames(path)
        meta = next(reader)
        return sum(1 for _ in reader), tuple(meta["size"])
    from PIL import Image

    with Image.open(path) as gif:
        return gif.n_frames, gif.size


def shell_commands(text: str, languages: tuple[str, ...] = ("bash", "sh", "console")) -> list[list[str]]:
    """The shell commands of the fenced blocks of Markdown `text` in `languages`, as words, one list per command:
    continuations joined, a `$ ` prompt and comments dropped, `a && b`, `a; b`, `a || b`, `a | b` and `a &` split."""
    import re
    import shlex

    commands = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if language not in languages:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split, lexer.commenters = True, "#"
            command: list[str] = []
            for word in lexer:
                if word in ("&&", ";", "||", "|", "&"):
                    commands.append(command)
                    command = []
                else:
                    command.append(word)
            commands.append(command)
    return [c for c in commands if c]
