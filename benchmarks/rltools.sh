#!/usr/bin/env bash
# benchmarks/rltools.sh [--dir DIR] [--repeat N] [--only sac|ppo|compile]
# Times RLtools' own Pendulum benchmark mains, built from an RLtools checkout in DIR
# (default benchmarks/.rltools, gitignored) with the flags of RLtools' CMake targets
# rl_environments_pendulum_{sac,ppo}_benchmark, OpenBLAS as the BLAS backend:
#   SAC: src/rl/environments/pendulum/sac/cpu/training.cpp (10,000 steps)
#   PPO: src/rl/environments/pendulum/ppo/cpu/training.cpp (75 x 4 x 1024 steps, then a
#        1000-episode evaluation that is part of the time; this main never calls BLAS)
#   compile: one g++ invocation building the SAC main.
# Each run is pinned to CPU 0 with OPENBLAS_NUM_THREADS=1 and OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE unset. Stdout gets one JSON line per run; the programs' output goes to
# stderr. Needs g++, taskset, /usr/bin/time and the OpenBLAS runtime (libopenblas0-*).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
commit=9acdf5c83cf2e7f2871cc4c37d002d5e3666d723  # the RLtools commit this script was tested at
dir=$root/benchmarks/.rltools
repeat=1
only=
usage() { sed -n 2p "$0" | sed 's/^# //' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) [[ $# -ge 2 ]] || usage; dir=$2; shift 2 ;;
    --repeat) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; repeat=$2; shift 2 ;;
    --only) [[ ${2:-} =~ ^(sac|ppo|compile)$ ]] || usage; only=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done

sac_src=src/rl/environments/pendulum/sac/cpu/training.cpp
ppo_src=src/rl/environments/pendulum/ppo/cpu/training.cpp
if [[ ! -f $dir/$sac_src || ! -f $dir/$ppo_src || ! -d $dir/include/rl_tools ]]; then
  echo "rltools.sh: no RLtools checkout in $dir; get the tested one with" >&2
  echo "  git clone https://github.com/rl-tools/rl-tools $dir && git -C $dir checkout $commit" >&2
  printf '{"bench":"rltools","skipped":"RLtools not found in %s"}\n' "$dir"
  exit 0
fi
have=$(git -C "$dir" rev-parse HEAD 2>/dev/null || echo unknown)
[[ $have == "$commit" ]] || echo "rltools.sh: note: $dir is at $have, not $commit" >&2

build=$dir/build
mkdir -p "$build"
# Release flags of the CMake benchmark targets (-O3 -DNDEBUG, then -O3 -ffast-math
# -march=native from RLtools::RLtools, then -Ofast -march=native), OpenBLAS backend.
# RLtools declares cblas_sgemm itself, so the runtime library is enough to link.
cxx=(g++ -std=gnu++17 -Ofast -march=native -DNDEBUG -I"$dir/include"
  -DRL_TOOLS_BACKEND_ENABLE_OPENBLAS -DRL_TOOLS_BACKEND_ENABLE_BLAS
  -DRL_TOOLS_DISABLE_TENSORBOARD -DBENCHMARK)
libs=(-pthread -l:libopenblas.so.0)
timed() {  # timed NAME CMD... : runs CMD on CPU 0, prints NAME's JSON line
  local name=$1 t
  shift
  t=$(mktemp)
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
    taskset -c 0 /usr/bin/time -f '%e %M' -o "$t" "$@" >&2
  read -r s kb < "$t"
  rm -f "$t"
  awk -v n="$name" -v s="$s" -v kb="$kb" \
    'BEGIN { printf "{\"bench\":\"%s\",\"side\":\"rltools\",\"seconds\":%.2f,\"peak_rss_mib\":%.1f}\n", n, s, kb / 1024 }'
}
build_sac=("${cxx[@]}" -DRL_TOOLS_DISABLE_HDF5 "$dir/$sac_src" -o "$build/sac_pendulum" "${libs[@]}")
build_ppo=("${cxx[@]}" "$dir/$ppo_src" -o "$build/ppo_pendulum" "${libs[@]}")

if [[ -z $only || $only == compile ]]; then
  for ((i = 0; i < repeat; i++)); do timed rltools_compile_sac "${build_sac[@]}"; done
elif [[ $only == sac ]]; then
  "${build_sac[@]}"
fi
if [[ -z $only || $only == sac ]]; then
  for ((i = 0; i < repeat; i++)); do timed rltools_sac_pendulum "$build/sac_pendulum"; done
fi
if [[ -z $only || $only == ppo ]]; then
  "${build_ppo[@]}"
  for ((i = 0; i < repeat; i++)); do timed rltools_ppo_pendulum "$build/ppo_pendulum"; done
fi
