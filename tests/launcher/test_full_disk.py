"""A disk that fills up mid-run: one line naming what could not be written and where, exit status 4, the services
stopped in order, and what was written before (the last checkpoint, a whole summary or none) kept.

The full disk is real: a small tmpfs mounted for the test (root only; elsewhere the test says why it skips).
"""

from __future__ import annotations

import contextlib
import json
import subprocess

import pytest

from components.logger import CSVLogger, Logger, LoggerConfig
from launcher.conventions import EXIT_NO_SPACE
from launcher.failures import no_space
from tests.helpers import tmpfs
from transports.kernel.errors import RemoteError


@contextlib.contextmanager
def small_disk(where, free_kb: int):
    """A tmpfs at ``where`` with about ``free_kb`` KiB left (a file fills the rest), unmounted afterwards."""
    with tmpfs(where, free_kb + 512):
        with open(where / "filler", "wb") as f:
            f.write(b"\0" * 512 * 1024)
        yield where


def test_a_full_disk_is_found_in_every_shape_it_arrives_in():
    full = OSError(28, "No space left on device", "/runs/a/metrics.csv")
    assert no_space(full) == "No space left on device: /runs/a/metrics.csv"
    try:  # raised while another error was being handled, and raised from it
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("the recipe stopped") from exc
    except RuntimeError as wrapped:
        assert no_space(wrapped) == "No space left on device: /runs/a/metrics.csv"
    remote = RemoteError("OSError", "[Errno 28] No space left on device: '/runs/a'")  # from a logger's process
    assert no_space(remote) == "No space left on device: /runs/a"
    assert no_space(RemoteError("OSError", "[Errno 122] Disk quota exceeded")) == "Disk quota exceeded"
    assert no_space(OSError(13, "Permission denied", "/x")) is None
    assert no_space(RemoteError("OSError", "[Errno 5] Input/output error")) is None
    assert no_space(ValueError("no")) is None


def test_a_logger_on_a_full_disk_names_its_directory_and_fails_alike_after(tmp_path):
    with small_disk(tmp_path / "disk", free_kb=16) as disk:
        logger = Logger(LoggerConfig(placement="direct"),
                        backend=CSVLogger(str(disk / "run"), flush_every=1, tensorboard=False)).start()
        try:
            with pytest.raises(OSError) as full:
                for step in range(100_000):
                    logger.log_metrics({"train/loss": 0.5, "train/return": 1.0}, step=step)
            assert full.value.errno == 28 and full.value.filename == str(disk / "run")
            with pytest.raises(OSError, match="No space left on device"):  # at once, without another write
                logger.log_scalar("train/loss", 0.1, step=0)
        finally:
            logger.shutdown()  # what it cannot flush is lost, said in its log; closing does not raise
        rows = (disk / "run" / "metrics.csv").read_text().splitlines()
        assert rows[0] == "tag,step,value,wall_time" and len(rows) > 10


def _run_until_full(tmp_path, *overrides: str) -> tuple[subprocess.CompletedProcess, object]:
    from tests.helpers import run_cli

    disk = tmp_path / "disk"
    with small_disk(disk, free_kb=160):
        run_dir = disk / "run"
        proc = run_cli("+recipe=ppo", "recipe.target_return=null", "recipe.total_frames=10000000",
                       f"hydra.run.dir={run_dir}", *overrides, cwd=str(tmp_path), timeout=240)
        files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    return proc, files


@pytest.mark.slow  # a run that fills its disk, twice: seconds each
@pytest.mark.parametrize("service, overrides, full_at", [
    ("direct", ("launcher.checkpoint_every=20000",), "checkpoint.pt"),
    ("process", ("logger.flush_every=1",), ""),  # the logger's own process runs out of room first
])
def test_a_run_whose_disk_fills_up_ends_in_one_line_with_exit_4(tmp_path, service, overrides, full_at):
    proc, files = _run_until_full(tmp_path, f"service={service}", *overrides)
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines()
             if line.strip() and not line.startswith("[progress]")]
    assert proc.returncode == EXIT_NO_SPACE == 4, proc.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "Logging error" not in proc.stderr, proc.stderr
    run_dir = tmp_path / "disk" / "run"
    assert lines[0].startswith(f"error: the run stopped: No space left on device: {run_dir}"), lines[0]
    assert lines[0].split(";")[0].endswith(full_at) and "every service was shut down" in lines[0]
    if "summary.json" in files:  # whole, or not there at all
        summary = json.loads(files["summary.json"])
        assert summary["failed"].startswith("No space left on device") and summary["frames"] > 0
    if "checkpoint.pt" in files:  # the last one written, whole (the one that did not fit left nothing behind)
        import io

        import torch

        assert torch.load(io.BytesIO(files["checkpoint.pt"]), weights_only=True)["frames"] >= 20000
        assert "the last checkpoint written (checkpoint.pt)" in lines[0]
    assert not [name for name in files if name.endswith(".tmp")]
