"""The segment directory (``RLSVC_SHM_DIR``) and what happens where it has no room: a segment lives and is found
again where it was made; one that does not fit is refused as it is made, naming the directory and the room left;
a process killed by SIGBUS (a page of shared memory that could not be backed) is said to have run out of it.

The small shared memory is real: a tmpfs mounted for the test (root only; elsewhere the tests say why they skip).
"""

from __future__ import annotations

import errno
import functools
import mmap
import os
import pickle

import pytest

from components.hosts.process import ProcessHost
from transports.kernel.errors import PeerFailureError, SharedMemoryFull
from transports.segments import Segment
from tests.helpers import segment_dir_of


def test_a_segment_lives_in_the_segment_directory_and_is_found_there_from_anywhere(tmp_path, monkeypatch):
    with segment_dir_of(tmp_path / "shm", 1024, monkeypatch) as directory:
        segment = Segment(4096)
        try:
            assert os.listdir(directory) == [segment.name] and not os.path.exists(f"/dev/shm/{segment.name}")
            segment.buf[:5] = b"hello"
            monkeypatch.delenv("RLSVC_SHM_DIR")  # a process that was never told: the segment says where it is
            attached = pickle.loads(pickle.dumps(segment))
            assert bytes(attached.buf[:5]) == b"hello"
            attached.close()
        finally:
            segment.close()
        assert os.listdir(directory) == []


def test_a_segment_that_does_not_fit_is_refused_as_it_is_made(tmp_path, monkeypatch):
    with segment_dir_of(tmp_path / "shm", 1024, monkeypatch) as directory:
        with pytest.raises(SharedMemoryFull) as full:
            Segment(4 << 20)  # 4 MiB in 1 MiB: sparse, it would have been made, and a first write past 1 MiB killed
        assert full.value.errno == errno.ENOSPC
        assert str(full.value).startswith(f"ran out of shared memory in {directory} (1.0 MiB free of 1.0 MiB): a "
                                          "segment of 4.0 MiB does not fit; give ")
        assert "docker run --shm-size=1g" in str(full.value) and "RLSVC_SHM_DIR" in str(full.value)
        assert os.listdir(directory) == []  # nothing of it is left
        assert pickle.loads(pickle.dumps(full.value)).strerror == full.value.strerror  # it travels as it is


def _touch_more_than_fits(directory: str, size: int) -> None:
    """Map a sparse file of ``size`` bytes in ``directory`` and write every page: past the room left, the kernel has
    no page to give and the process gets SIGBUS (what an unreserved segment did)."""
    fd = os.open(os.path.join(directory, f"rlsvc_{os.getpid()}_0_sparse"), os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    pages = mmap.mmap(fd, size)
    for offset in range(0, size, mmap.PAGESIZE):
        pages[offset] = 1


def test_a_process_killed_by_sigbus_is_said_to_have_run_out_of_shared_memory(tmp_path, monkeypatch):
    with segment_dir_of(tmp_path / "shm", 1024, monkeypatch) as directory:
        host = ProcessHost("writer", functools.partial(_touch_more_than_fits, directory, 4 << 20))
        try:
            with pytest.raises(PeerFailureError) as died:
                host.start()
        finally:
            host.shutdown()
        said = str(died.value)
        assert "killed by SIGBUS: it ran out of shared memory in " + directory + " (" in said, said
        assert " free of 1.0 MiB)" in said, said
        assert os.listdir(directory) == []  # its host unlinked what the dead writer left there
