"""The quick loop's guard (tests/startup.py): a test not marked ``slow`` that starts something costing seconds fails,
naming it; a ``slow`` one may."""

import subprocess
import sys

import pytest


def test_a_quick_test_that_starts_a_subprocess_of_ours_fails_naming_it():
    with pytest.raises(pytest.fail.Exception, match="starts a subprocess launcher but is not marked slow"):
        subprocess.run([sys.executable, "-m", "launcher", "--help"], capture_output=True)
    with pytest.raises(pytest.fail.Exception, match="starts a Python subprocess"):
        subprocess.run([sys.executable, "-c", "pass"])
    assert subprocess.run(["true"]).returncode == 0  # other programs are cheap: allowed


def test_a_quick_test_that_starts_ray_or_monarch_fails_naming_it():
    from components.hosts import host_class
    from components.hosts.ray import RayClusterConfig, ray_cluster

    with pytest.raises(pytest.fail.Exception, match="starts a Ray cluster"):
        with ray_cluster(RayClusterConfig()):
            pass
    with pytest.raises(pytest.fail.Exception, match="starts a Monarch proc"):
        host_class("monarch")("probe", dict).start()


@pytest.mark.slow
def test_a_slow_test_may_start_them():
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout == "42\n"
