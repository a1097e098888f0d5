#!/usr/bin/env bash
# Download, here, the wheels that benchmarks/gpu_check.sh installs on a GPU machine that cannot fetch anything: the
# project's dependencies (and the GPU check's) that such a machine lacks, as cp312 manylinux x86_64 or pure-Python
# wheels, into .whl/ at the repository root (kept out of git through .git/info/exclude).
#
# The machine it is written for: Python 3.12, PyTorch 2.11 (CUDA 13), numpy, PyYAML, cloudpickle, typing-extensions,
# packaging, tqdm, matplotlib, opencv-python-headless, pytest with pytest-timeout, pytest-xdist and hypothesis already
# installed. Carried: tensordict (and pyvers), hydra-core, omegaconf, antlr4-python3-runtime (built here from its
# source archive: PyPI has no wheel of 4.9.3), gymnasium (and Farama-Notifications), ale-py (its ROMs inside), and
# pytest at the version the project's tests are written for.
#
#     benchmarks/gpu_wheels.sh            # then: device run with carry [".whl"], command: bash benchmarks/gpu_check.sh
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=.whl
mkdir -p .git/info
grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude

# one version of each (two of one package stop the whole install there)
BINARY=(
  tensordict==0.15.3
  pyvers==0.2.3
  hydra-core==1.3.8
  omegaconf==2.3.1
  gymnasium==1.4.0
  farama-notifications==0.0.6
  ale-py==0.12.1
  pytest==9.2.0
)
SOURCE=(antlr4-python3-runtime==4.9.3)

rm -rf "$WHEELS"
mkdir -p "$WHEELS"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$WHEELS" "${BINARY[@]}"
# pure Python, published as a source archive only: built into a py3-none-any wheel here
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "${SOURCE[@]}" 2>/dev/null \
  || "$PYTHON" -m pip wheel -q --no-deps -w "$WHEELS" "${SOURCE[@]}"
rm -f "$WHEELS"/*.tar.gz

for wheel in "$WHEELS"/*.whl; do
  case "$wheel" in
    *cp312*manylinux*x86_64*.whl | *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
    *) echo "gpu_wheels.sh: $wheel is neither cp312 manylinux x86_64 nor pure Python" >&2; exit 1 ;;
  esac
done
ls -1 "$WHEELS"
echo "$(ls "$WHEELS" | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS/ (with the repository, a device run carries" \
     "at most 64 MiB)"
