#!/usr/bin/env bash
# Builds the benchmarks and runs them, appending their JSON lines to
# benchmarks/results/<date>-<host>.jsonl and printing them.
#   scripts/bench.sh                      all benchmarks with their defaults
#   scripts/bench.sh sac_update ARGS...   one benchmark, ARGS as its overrides
#                                         (e.g. bench.rounds=3; --help lists them) Run it on an otherwise idle machine: the figures are
# throughputs. benchmarks/RESULTS.md explains each figure and records the latest.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ANVIL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja >/dev/null
cmake --build "$build" --target bench_sac_update bench_vec_env bench_buffers bench_precision
mkdir -p benchmarks/results
out="benchmarks/results/$(date +%Y-%m-%d)-$(hostname).jsonl"
# The settings the test suite runs with (see cmake/anvil_programs.cmake): OpenMP workers
# sleep when idle. OPENBLAS_CORETYPE is left as the caller has it; each line names the
# kernels both sides used.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if [[ $# -gt 0 ]]; then
  which=$1
  shift
  [[ -x "$build/benchmarks/bench_$which" ]] || { echo "scripts/bench.sh: no benchmark 'bench_$which' (sac_update, vec_env, buffers, precision)" >&2; exit 2; }
  benches=("bench_$which")
else
  benches=(bench_vec_env bench_buffers bench_sac_update bench_precision)
fi
for b in "${benches[@]}"; do
  echo "== $b $*" >&2
  "$build/benchmarks/$b" "$@" | tee -a "$out"
done
echo "appended to $out" >&2
