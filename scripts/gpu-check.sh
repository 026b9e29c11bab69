#!/usr/bin/env bash
# GPU figures on a machine that has PyTorch with CUDA but not anvil's Debian packages:
# builds the GPU benchmarks with g++ against the LibTorch inside that PyTorch (its headers
# and libraries under torch/), then runs them on CUDA and prints their JSON lines.
#
#   scripts/gpu-check.sh bench [overrides...]   bench_diffusion on CUDA (e.g. bench.seconds=2)
#   scripts/gpu-check.sh pusht [overrides...]   diffusion_pusht_direct: Diffusion Policy trained
#                                               on the expert's demonstrations, scored on the test seeds
#
# The header-only dependencies the benchmarks use (Boost.PFR, nlohmann-json, yaml-cpp and
# its static library) come from DEPS (default .deps: include/ and lib/), filled on a Debian
# machine with:  mkdir -p .deps/include/boost .deps/lib &&
#   cp -r /usr/include/boost/pfr /usr/include/boost/pfr.hpp .deps/include/boost/ &&
#   cp -r /usr/include/nlohmann /usr/include/yaml-cpp .deps/include/ &&
#   cp /usr/lib/x86_64-linux-gnu/libyaml-cpp.a .deps/lib/ &&
#   cp -r /usr/include/chipmunk .deps/include/ && cp /usr/lib/x86_64-linux-gnu/libchipmunk.a .deps/lib/
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
deps=${DEPS:-.deps}
out=${GPU_BUILD_DIR:-build-gpu}
torch_dir=$($py -c 'import os, torch; print(os.path.dirname(torch.__file__))')
abi=$($py -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
echo "gpu-check: torch $($py -c 'import torch; print(torch.__version__, torch.version.cuda)') at $torch_dir, g++ $(g++ -dumpfullversion)"
mkdir -p "$out"
flags=(-std=c++20 -O2 -DNDEBUG "-D_GLIBCXX_USE_CXX11_ABI=$abi" -Iinclude "-I$deps/include"
       -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include")
libs=("$deps/lib/libyaml-cpp.a" "-L$torch_dir/lib" "-Wl,-rpath,$torch_dir/lib" -Wl,--no-as-needed
      -ltorch -ltorch_cuda -ltorch_cpu -lc10_cuda -lc10 -Wl,--as-needed -lpthread -ldl)
what=${1:-bench}
shift || true
case "$what" in
  bench) prog=bench_diffusion; extra=() ;;
  pusht) prog=diffusion_pusht_direct; extra=("$deps/lib/libchipmunk.a") ;;
  *) echo "scripts/gpu-check.sh: bench or pusht, not '$what'" >&2; exit 2 ;;
esac
g++ "${flags[@]}" "benchmarks/$prog.cpp" "${extra[@]}" "${libs[@]}" -o "$out/$prog"
echo "== $prog"
"$out/$prog" bench.device=cuda "$@"
