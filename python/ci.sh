#!/usr/bin/env bash
# CI step of the Python package: a fresh virtual environment with PyTorch (pinned), numpy and
# pytest from PyPI, the package built and installed with `pip install ./python` (maturin, the
# Rust extension in the dev profile the Rust tests already built), then its tests (pytest).
# Fails when a test fails or when no test ran (pytest's exit code 5).
#
# Measured on this project's 2-core machine (Debian 12, Python 3.11, December 2026, with three
# other builds sharing the cores): torch 2.15.0 with its nvidia-* wheels installs in 1.5 to
# 3 minutes and takes 5.5 GB of disk (the Linux wheels on PyPI are CUDA builds, and
# `import torch` fails without the nvidia-* wheels, so PyPI offers no lighter way); the dev
# build of the extension took 7.4 CPU-minutes for the whole step (about 4 minutes of wall time
# on two free cores once the Rust tests have built the dependencies); the tests take about
# 40 seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MIXERS_PY_VENV:-target/python-ci/venv}"
python="${PYTHON:-python3}"
t0=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -m venv "$venv" 2>/dev/null; then
    # Debian's own Python keeps venv and pip in separate packages.
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq python3-venv python3-pip
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "torch==2.15.0" "numpy>=1.21" "pytest>=7"
t1=$(date +%s)
echo "python deps installed in $((t1 - t0)) s; the environment takes $(du -sm "$venv" | cut -f1) MiB"

# The dev profile shares the Rust tests' build; a user's `pip install ./python` builds release.
MATURIN_PEP517_ARGS="--profile dev" "${pip[@]}" install --force-reinstall --no-deps ./python
t2=$(date +%s)
echo "package built and installed in $((t2 - t1)) s"

set +e
"$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
rc=$?
set -e
echo "pytest finished in $(($(date +%s) - t2)) s"
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing"
  exit 1
fi
exit "$rc"
