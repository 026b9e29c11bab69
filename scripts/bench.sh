#!/usr/bin/env bash
# Builds the benchmarks and runs them, appending their JSON lines to
# benchmarks/results-<host>.jsonl (each line carries its date) and printing them.
#   scripts/bench.sh                      all benchmarks with their defaults
#   scripts/bench.sh sac_update ARGS...   one benchmark, ARGS as its overrides
#                                         (e.g. bench.rounds=3; --help lists them) Run it on an otherwise idle machine: the figures are
# throughputs. benchmarks/RESULTS.md explains each figure and records the latest.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ANVIL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja >/dev/null
targets=(bench_sac_update bench_vec_env bench_buffers bench_precision bench_ddp bench_ppo bench_async bench_coma bench_diffusion bench_image_encoders bench_pixel_sac)
# The MuJoCo suite's benchmark, when CMake found MuJoCo; image demonstrations', with HDF5
# and Chipmunk2D.
mujoco=()
if grep -Eq "^build benchmarks/bench_mujoco[ :]" "$build/build.ninja"; then mujoco=(bench_mujoco); fi
if grep -Eq "^build benchmarks/bench_image_demos[ :]" "$build/build.ninja"; then mujoco+=(bench_image_demos); fi
cmake --build "$build" --target "${targets[@]}" "${mujoco[@]}"
out="benchmarks/results-$(hostname).jsonl"
# The settings the test suite runs with (see cmake/anvil_programs.cmake): OpenMP workers
# sleep when idle. OPENBLAS_CORETYPE is left as the caller has it; each line names the
# kernels both sides used.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if [[ $# -gt 0 ]]; then
  which=$1
  shift
  [[ -x "$build/benchmarks/bench_$which" ]] || { echo "scripts/bench.sh: no benchmark 'bench_$which' (sac_update, vec_env, buffers, precision, ddp, ppo, async, coma, diffusion, image_encoders, pixel_sac, image_demos, mujoco)" >&2; exit 2; }
  benches=("bench_$which")
else
  benches=(bench_vec_env bench_buffers bench_sac_update bench_precision bench_ddp bench_ppo bench_async bench_coma bench_diffusion bench_image_encoders bench_pixel_sac "${mujoco[@]}")
fi
for b in "${benches[@]}"; do
  runs=("")
  # DDP: the same run with 1 and 2 ranks (unless the caller chose), for the ratio.
  if [[ $b == bench_ddp && " $* " != *" bench.ranks="* ]]; then runs=("bench.ranks=1" "bench.ranks=2"); fi
  for extra in "${runs[@]}"; do
    echo "== $b $extra $*" >&2
    # Only the JSON lines go to the results (a trainer's own messages are dropped).
    "$build/benchmarks/$b" $extra "$@" | { grep --line-buffered '^{' || true; } | tee -a "$out"
  done
done
echo "appended to $out" >&2
