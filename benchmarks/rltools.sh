#!/usr/bin/env bash
# benchmarks/rltools.sh [--dir DIR] [--repeat N] [--seed S] [--only sac|sac_learn|ppo|ppo_upstream|compile]
# Times RLtools' own Pendulum benchmark mains, built from an RLtools checkout in DIR
# (default benchmarks/.rltools, gitignored) with the flags of RLtools' CMake targets
# rl_environments_pendulum_{sac,ppo}_benchmark, OpenBLAS as the BLAS backend:
#   sac           src/rl/environments/pendulum/sac/cpu/training.cpp (10,000 steps, no
#                 evaluation in its BENCHMARK build)
#   sac_learn     the same SAC (its BENCHMARK configuration, the same networks and steps) in a
#                 copy that takes the seed as its first argument (upstream: seed 0 only) and
#                 evaluates the final actor with RLtools' own evaluation step: 100 episodes,
#                 deterministic actions, random start states ("Final return:"). For learning
#                 comparisons only: the evaluations make it no timing run.
#   ppo           src/rl/environments/pendulum/ppo/cpu/training.cpp at its best: a copy with
#                 the one include RLtools had until commit 30580624 restored
#                 (rl_tools/nn/operations_cpu_mux.h, right after the Adam instance include),
#                 so its layers call cblas_sgemm (checked with nm); 75 x 4 x 1024 steps, then
#                 a 1000-episode evaluation that is part of the time. The copy also takes the
#                 seed as its first argument (upstream: seed 0 only); seed 0 is upstream's run.
#   ppo_upstream  the same main as upstream builds it: its layers never call BLAS.
#   compile       one g++ invocation building the SAC main.
# Each run is pinned to CPU 0 with OPENBLAS_NUM_THREADS=1 and OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE unset. Stdout gets one JSON line per run: the whole process's seconds
# and peak RSS, the training seconds the main prints ("Time:"), and for PPO its final
# evaluation return ("Final return:"); the programs' output goes to stderr. Needs g++,
# taskset, nm, /usr/bin/time and the OpenBLAS runtime (libopenblas0-*).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
commit=9acdf5c83cf2e7f2871cc4c37d002d5e3666d723  # the RLtools commit this script was tested at
dir=$root/benchmarks/.rltools
repeat=1
seed=0
only=
usage() { sed -n 2p "$0" | sed 's/^# //' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) [[ $# -ge 2 ]] || usage; dir=$2; shift 2 ;;
    --repeat) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; repeat=$2; shift 2 ;;
    --seed) [[ ${2:-} =~ ^[0-9]+$ ]] || usage; seed=$2; shift 2 ;;
    --only) [[ ${2:-} =~ ^(sac|sac_learn|ppo|ppo_upstream|compile)$ ]] || usage; only=$2; shift 2 ;;
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
  local name=$1 t log
  shift
  t=$(mktemp)
  log=$(mktemp)
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
    taskset -c 0 /usr/bin/time -f '%e %M' -o "$t" "$@" > "$log" 2>&1
  cat "$log" >&2
  read -r s kb < "$t"
  # "Time: 0.41s" (the timing step, before any final evaluation), "Final return: -190.2"
  train=$(sed -n 's/.*Time: \([0-9.]*\)s.*/\1/p' "$log" | tail -n1)
  ret=$(sed -n 's/.*Final return: \([-0-9.e+]*\).*/\1/p' "$log" | tail -n1)
  rm -f "$t" "$log"
  awk -v n="$name" -v s="$s" -v kb="$kb" -v tr="${train:-null}" -v r="${ret:-null}" -v seed="$seed" \
    'BEGIN { printf "{\"bench\":\"%s\",\"side\":\"rltools\",\"seed\":%d,\"seconds\":%.2f,\"train_seconds\":%s,\"final_return\":%s,\"peak_rss_mib\":%.1f}\n", n, seed, s, tr, r, kb / 1024 }'
}
build_sac=("${cxx[@]}" -DRL_TOOLS_DISABLE_HDF5 "$dir/$sac_src" -o "$build/sac_pendulum" "${libs[@]}")
build_ppo_upstream=("${cxx[@]}" "$dir/$ppo_src" -o "$build/ppo_pendulum_upstream" "${libs[@]}")
# The PPO main at its best (see the head of this file): a copy beside the build, which finds
# the main's "config.h" through -I.
ppo_best=$build/ppo_training_blas.cpp
make_ppo_best() {
  local adam='#include <rl_tools/nn/optimizers/adam/instance/operations_generic.h>'
  grep -qF "$adam" "$dir/$ppo_src" || { echo "rltools.sh: $ppo_src no longer includes the Adam instance header; update this script" >&2; exit 1; }
  sed -e "s|^$adam\$|&\n#include <rl_tools/nn/operations_cpu_mux.h>  // restored by anvil's benchmarks/rltools.sh|" \
    -e 's|bool verbose = true;|bool verbose = true; const TI seed0 = argc > 1 ? static_cast<TI>(std::atoll(argv[1])) : 0;|' \
    -e 's|for (TI seed=0; seed < 1; seed++)|for (TI seed=seed0; seed < seed0 + 1; seed++)|' "$dir/$ppo_src" > "$ppo_best"
  grep -q 'operations_cpu_mux.h>  // restored' "$ppo_best" && grep -q 'seed < seed0 + 1' "$ppo_best" ||
    { echo "rltools.sh: could not patch $ppo_src (the include or the seed loop moved); update this script" >&2; exit 1; }
  "${cxx[@]}" -I"$dir/$(dirname "$ppo_src")" "$ppo_best" -o "$build/ppo_pendulum" "${libs[@]}"
  nm -C "$build/ppo_pendulum" | grep -q ' U cblas_sgemm' ||
    { echo "rltools.sh: $build/ppo_pendulum does not call cblas_sgemm: not RLtools' BLAS build" >&2; exit 1; }
}

# The SAC main for learning comparisons (see the head of this file): a copy of training.h
# whose BENCHMARK loop gains RLtools' evaluation step (100 episodes; the interval is the step
# limit, so its loop evaluates at step 0 and at the limit, printing "Step: ... Mean return:"),
# seeded from the command line, and a main that evaluates the final actor once more with that
# step's own call and on-demand generator: the "Final return:" the comparisons read (a second
# sample of 100 episodes beside the loop's own; this copy is for learning runs, never timed).
sac_learn=$build/sac_training_learn.h
make_sac_learn() {
  local h=$dir/$(dirname "$sac_src")/training.h
  local core='using LOOP_TIMING_CONFIG = rlt::rl::loop::steps::timing::Config<LOOP_CORE_CONFIG>;'
  grep -qF "$core" "$h" && grep -qF 'rlt::init(device, ts, 0);' "$h" ||
    { echo "rltools.sh: $h no longer has the BENCHMARK loop config or the seed-0 init; update this script" >&2; exit 1; }
  sed -e "s|^$core\$|struct LOOP_EVAL_PARAMETERS_LEARN: rlt::rl::loop::steps::evaluation::Parameters<TYPE_POLICY, TI, LOOP_CORE_CONFIG, 100, LOOP_CORE_PARAMETERS::STEP_LIMIT>{};  // anvil's benchmarks/rltools.sh\nusing LOOP_TIMING_CONFIG = rlt::rl::loop::steps::timing::Config<rlt::rl::loop::steps::evaluation::Config<LOOP_CORE_CONFIG, LOOP_EVAL_PARAMETERS_LEARN>>;|" \
    -e 's|rlt::init(device, ts, 0);|rlt::init(device, ts, seed);|' \
    -e 's|^    rlt::free(device, device.logger);$|    {  // anvil'"'"'s benchmarks/rltools.sh: the final actor, by the evaluation step'"'"'s own call\n        std::remove_reference_t<decltype(rlt::get(ts.evaluation_results, 0, 0))> result;\n        auto actor = rlt::get_actor(ts);\n        rlt::evaluate(device, ts.env_eval, ts.ui, actor, ts.actor_deterministic_evaluation_state, ts.actor_deterministic_evaluation_buffers, ts.evaluation_buffer, result, ts.rng_eval_on_demand, ts.evaluation_mode);\n        std::cout << "Final return: " << result.returns_mean << " (" << decltype(result)::SPEC::N_EPISODES << " episodes)" << std::endl;\n    }\n&|' \
    "$h" > "$sac_learn"
  grep -q 'LOOP_EVAL_PARAMETERS_LEARN' "$sac_learn" && grep -q 'rlt::init(device, ts, seed);' "$sac_learn" &&
    grep -q 'Final return: ' "$sac_learn" ||
    { echo "rltools.sh: could not patch $h (the loop config, the init or the end of run moved); update this script" >&2; exit 1; }
  printf '#include "sac_training_learn.h"\n#include <cstdlib>\nint main(int argc, char** argv){ run(argc > 1 ? static_cast<TI>(std::atoll(argv[1])) : 0); }\n' \
    > "$build/sac_learn.cpp"
  "${cxx[@]}" -DRL_TOOLS_DISABLE_HDF5 -I"$build" "$build/sac_learn.cpp" -o "$build/sac_pendulum_learn" "${libs[@]}"
}

# A binary built before is reused when it is newer than this script and than its main in
# the checkout (another RLtools commit rebuilds it).
fresh() { [[ -x $1 && $1 -nt $0 && $1 -nt $2 ]]; }

if [[ -z $only || $only == compile ]]; then
  for ((i = 0; i < repeat; i++)); do timed rltools_compile_sac "${build_sac[@]}"; done
elif [[ $only == sac ]]; then
  fresh "$build/sac_pendulum" "$dir/$sac_src" || "${build_sac[@]}"
fi
if [[ -z $only || $only == sac ]]; then
  for ((i = 0; i < repeat; i++)); do timed rltools_sac_pendulum "$build/sac_pendulum"; done
fi
if [[ $only == sac_learn ]]; then
  fresh "$build/sac_pendulum_learn" "$dir/$(dirname "$sac_src")/training.h" || make_sac_learn
  for ((i = 0; i < repeat; i++)); do timed rltools_sac_pendulum_learn "$build/sac_pendulum_learn" "$seed"; done
fi
if [[ -z $only || $only == ppo ]]; then
  fresh "$build/ppo_pendulum" "$dir/$ppo_src" || make_ppo_best
  for ((i = 0; i < repeat; i++)); do timed rltools_ppo_pendulum "$build/ppo_pendulum" "$seed"; done
fi
if [[ -z $only || $only == ppo_upstream ]]; then
  fresh "$build/ppo_pendulum_upstream" "$dir/$ppo_src" || "${build_ppo_upstream[@]}"
  for ((i = 0; i < repeat; i++)); do timed rltools_ppo_pendulum_upstream "$build/ppo_pendulum_upstream"; done
fi
