#!/usr/bin/env bash
# Installs every Debian package anvil's build, tests, examples and benchmarks need, and
# only those that are missing, so it is safe to run again. Then checks that Torch's matrix
# products go through a real BLAS: with Debian's reference BLAS they are ~10x slower
# (1000 Adam steps of a 3-256-256-1 MLP at batch 256: 16 s instead of 1.6 s).
#
# Usage: scripts/install-deps.sh        (as root, or with sudo available)
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build python3 git
  # LibTorch 1.13 (CPU) and the Gloo headers its c10d needs
  libtorch-dev libgloo-dev
  # a fast BLAS for Torch's CPU matrix products (switches the libblas.so.3 alternative)
  libopenblas0-openmp
  # Boost.PFR (config reflection), YAML configs, range-v3, tests
  libboost1.81-dev libyaml-cpp-dev librange-v3-dev doctest-dev
  # typed JSON (summary.json, sweep tables)
  nlohmann-json3-dev
  # optional components, detected by CMake: the MuJoCo manipulation suite (envs/mujoco/)
  libmujoco-dev
  # Push-T's physics (envs/chipmunk/) and demonstrations and datasets on disk (data/hdf5.hpp)
  libchipmunk-dev libhdf5-dev
  # zlib: anvil inflates gzip-compressed image chunks of HDF5 files in its own threads
  zlib1g-dev
  # Python's HDF5 binding, with which a test opens the demonstration files anvil writes
  python3-h5py
  # envs written in Python (envs/python_env.hpp): the bridge embeds Debian's Python, with numpy
  pybind11-dev python3-dev python3-numpy python3-pytest
  # `pip install build/python` (import anvil), tested in a virtual environment
  python3-pip python3-venv python3-setuptools
  # side-by-side Python reference implementations in benchmarks/
  python3-torch
  # the API reference from the headers (target api_docs, docs/Doxyfile.in)
  doxygen
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all ${#packages[@]} packages present"
fi

# The BLAS Torch links (libblas.so.3) must be OpenBLAS, not the reference implementation.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
blas=$(readlink -f "/usr/lib/$arch/libblas.so.3" || true)
case "$blas" in
  *openblas*) echo "install-deps: BLAS is $blas" ;;
  *)
    echo "install-deps: libblas.so.3 points at '$blas' (slow reference BLAS); switching to OpenBLAS"
    alt=$(update-alternatives --list "libblas.so.3-$arch" 2>/dev/null | grep openblas | head -n1 || true)
    if [ -z "$alt" ]; then
      echo "install-deps: ERROR: no OpenBLAS alternative for libblas.so.3 found" >&2
      exit 1
    fi
    $sudo update-alternatives --set "libblas.so.3-$arch" "$alt"
    blas=$(readlink -f "/usr/lib/$arch/libblas.so.3")
    case "$blas" in
      *openblas*) echo "install-deps: BLAS is now $blas" ;;
      *) echo "install-deps: ERROR: BLAS is still '$blas'" >&2; exit 1 ;;
    esac
    ;;
esac
