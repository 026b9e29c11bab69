#!/usr/bin/env bash
# GPU figures on a machine that has PyTorch with CUDA but not anvil's Debian packages:
# builds the GPU benchmarks with g++ against the LibTorch inside that PyTorch (its headers
# and libraries under torch/), then runs them on CUDA and prints their JSON lines.
#
#   scripts/gpu-check.sh bench [overrides...]   bench_diffusion on CUDA (e.g. bench.seconds=2)
#   scripts/gpu-check.sh pusht [overrides...]   diffusion_pusht_direct: Diffusion Policy trained
#                                               on the expert's demonstrations, scored on the test seeds
#   scripts/gpu-check.sh sac                    bench_precision on CUDA (SAC updates/s per precision),
#                                               then the main job (examples/train_sac_pendulum,
#                                               header-only) on CUDA and on this machine's CPU, on
#                                               CUDA without phase syncs, and on CUDA with 16 envs
#                                               and batch 2048: one JSON line per run (summary.json)
#   scripts/gpu-check.sh graph                  updates as CUDA graphs: the CUDA tests (SAC's and
#                                               Diffusion Policy's graphs against op by op), then
#                                               what GRAPH_RUNS names (default "precision main
#                                               diffusion"): bench_precision at 256x256 (op by op
#                                               against each precision as a run has it), the main
#                                               job with its update as a graph (the default) and op
#                                               by op (sac.cuda_graph=false), bench_diffusion, and
#                                               pusht (diffusion_pusht_direct, PUSHT_ARGS)
#   scripts/gpu-check.sh baseline               the op-by-op figures the captured updates of issue 53
#                                               are measured against, each with the GPU's utilisation
#                                               (nvidia-smi, every 100 ms) over its run: the CUDA tests,
#                                               PPO (bench_ppo, 8 and 64 envs), COMA at its users'
#                                               schedule (bench_coma: batch 128 x 5 minibatches x 5
#                                               passes, FP32 and BF16), the U-Net at batch 256
#                                               (bench_diffusion) and the main job graphed
#   scripts/gpu-check.sh crash [doctest args]   the CUDA tests and bench_ppo on CUDA under cuda-gdb
#                                               (GPU_CXXFLAGS=-g1 for line numbers): backtraces
#   scripts/gpu-check.sh all                    builds every program above at once (one g++ each, in
#                                               parallel), then runs sac and pusht (PUSHT_ARGS: its
#                                               overrides)
#
# The header-only dependencies the programs use (Boost.PFR, nlohmann-json, range-v3,
# yaml-cpp and its static library) come from DEPS (default .deps: include/ and lib/), filled
# on a Debian machine with:  mkdir -p .deps/include/boost .deps/lib &&
#   cp -r /usr/include/boost/pfr /usr/include/boost/pfr.hpp .deps/include/boost/ &&
#   cp -r /usr/include/nlohmann /usr/include/yaml-cpp .deps/include/ &&
#   cp -r /usr/include/range /usr/include/meta /usr/include/concepts /usr/include/std .deps/include/ &&
#   cp /usr/lib/x86_64-linux-gnu/libyaml-cpp.a .deps/lib/ &&
#   cp -r /usr/include/chipmunk .deps/include/ && cp /usr/lib/x86_64-linux-gnu/libchipmunk.a .deps/lib/ &&
#   cp -r /usr/include/doctest .deps/include/
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
deps=${DEPS:-.deps}
out=${GPU_BUILD_DIR:-build-gpu}
torch_dir=$($py -c 'import os, torch; print(os.path.dirname(torch.__file__))')
abi=$($py -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
# CUDA's runtime headers (LibTorch's CUDA headers include them): the toolkit's, or the
# nvidia-cuda-runtime wheel's that PyTorch installs.
cuda_inc=
for d in "${CUDA_HOME:-/usr/local/cuda}/include" "$(dirname "$(command -v nvcc || echo /none/bin/nvcc)")/../include"; do
  [[ -f $d/cuda_runtime.h ]] && { cuda_inc=$d; break; }
done
if [[ -z $cuda_inc ]]; then
  h=$(find "$(dirname "$torch_dir")/nvidia" -name cuda_runtime.h 2>/dev/null | head -n 1)
  [[ -n $h ]] && cuda_inc=$(dirname "$h")
fi
echo "gpu-check: torch $($py -c 'import torch; print(torch.__version__, torch.version.cuda)') at $torch_dir, g++ $(g++ -dumpfullversion), CUDA headers ${cuda_inc:-not found}"
mkdir -p "$out"
# PyTorch's wheels are built with c10d and Gloo, and its c10d headers declare their classes
# only under these macros (CMake's Torch package adds them; a plain g++ line must).
# ANVIL_WITH_CUDA: anvil's CUDA-only code (CMake defines it when LibTorch has CUDA).
# GPU_CXXFLAGS: more flags (e.g. -g1, for the backtraces of `crash`)
# shellcheck disable=SC2206
flags=(${GPU_CXXFLAGS:-} -std=c++20 -O2 -DNDEBUG "-D_GLIBCXX_USE_CXX11_ABI=$abi" -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -DANVIL_WITH_CUDA=1 -Iinclude "-I$deps/include"
       -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include" ${cuda_inc:+-isystem "$cuda_inc"})
# CUDA's runtime library (c10's CUDA headers call it inline): the one PyTorch loads.
cudart=$(find "$(dirname "$torch_dir")/nvidia" "$torch_dir/lib" -name 'libcudart.so*' 2>/dev/null | head -n 1)
[[ -n $cudart ]] || cudart=$(find "${CUDA_HOME:-/usr/local/cuda}/" -name 'libcudart.so*' 2>/dev/null | head -n 1)
# libstdc++ first: PyTorch's wheels carry and export their own copy of std::filesystem
# (built for an older libstdc++), and the first library that defines a symbol wins. Bound to
# that copy, std::filesystem::remove_all called address 0 on an H200 (cuda-gdb, `crash`),
# killing the CUDA tests and bench_ppo/bench_coma in their clean-up.
libs=("$deps/lib/libyaml-cpp.a" "-L$torch_dir/lib" "-Wl,-rpath,$torch_dir/lib" -Wl,--no-as-needed -lstdc++
      -ltorch -ltorch_cuda -ltorch_cpu -lc10_cuda -lc10 ${cudart:+"$cudart" "-Wl,-rpath,$(dirname "$cudart")"}
      -Wl,--as-needed -lpthread -ldl)
what=${1:-bench}
shift || true
# build PROG SOURCE [EXTRA...]: one program, its compiler output in $out/PROG.build.log
build() {
  local prog=$1 src=$2
  shift 2
  if g++ "${flags[@]}" "$src" "$@" "${libs[@]}" -o "$out/$prog" >"$out/$prog.build.log" 2>&1; then
    echo "gpu-check: built $prog"
  else
    echo "gpu-check: $prog did not build:" >&2
    tail -n 30 "$out/$prog.build.log" >&2
    return 1
  fi
}
build_sac() {
  build bench_precision benchmarks/bench_precision.cpp & local a=$!
  build train_sac_pendulum examples/train_sac_pendulum.cpp & local b=$!
  local rc=0
  wait $a || rc=1
  wait $b || rc=1
  return $rc
}
# summary NAME DIR: one JSON line from the run's summary.json
summary() {
  $py - "$1" "$2/summary.json" <<'PYEOF'
import json, sys
name, path = sys.argv[1:]
s = json.load(open(path))
keys = ("env_steps", "updates", "wall_seconds", "env_steps_per_s", "updates_per_s", "final_eval_return",
        "best_eval_return", "timer_overhead", "bottleneck")
line = {"bench": "gpu_main_job", "run": name, "device": s["config"]["run.device"]}
line.update({k: s.get(k) for k in keys})
line["phase_share"] = {k: round(v, 3) for k, v in s.get("phase_share", {}).items() if v >= 0.005}
line["config"] = {k: v for k, v in s["config"].items() if k.startswith(("env.num_envs", "sac.batch_size", "train.", "run.update_threads"))}
print(json.dumps(line))
PYEOF
}
# run_mains NAME ARGS [NAME ARGS ...]: the main job (examples/train_sac_pendulum) once per
# pair, each run in $out/run-NAME, one JSON line each from its summary.json
run_mains() {
  local common=(run.progress=off run.tensorboard=false run.checkpoint_interval=0) rc=0
  while (( $# >= 2 )); do
    local name=$1 a=$2 dir=$out/run-$1
    shift 2
    rm -rf "$dir"
    echo "== train_sac_pendulum $a"
    # shellcheck disable=SC2086
    if "$out/train_sac_pendulum" "${common[@]}" $a run.run_dir="$dir" >"$dir.log" 2>&1; then
      summary "$name" "$dir"
    else
      echo "gpu-check: train_sac_pendulum $a failed:" >&2
      tail -n 20 "$dir.log" >&2
      rc=1
    fi
  done
  return $rc
}
run_sac() {
  if [[ -x $out/bench_precision ]]; then
    echo "== bench_precision"
    "$out/bench_precision" bench.device=cuda bench.seconds=1 bench.rounds=2 || echo "gpu-check: bench_precision failed" >&2
  fi
  [[ -x $out/train_sac_pendulum ]] || return 0
  # the main job as it ships (256x256, batch 256, one env, one update per step), then the
  # same on this machine's CPU (fewer steps: its rate is what is compared), on CUDA without
  # a device synchronisation per timed phase, and a GPU-sized setup: 16 envs, batch 2048,
  # one update per vector step (16 env steps), learning rates scaled by sqrt
  run_mains main_cuda "run.device=cuda" main_cpu "run.device=cpu train.steps=5000" \
    nosync_cuda "run.device=cuda train.steps=6000 run.sync_timings=false" \
    wide_cuda "run.device=cuda env.num_envs=16 sac.batch_size=2048 train.lr_scaling=sqrt train.update_interval=16 train.steps=32000 train.eval_interval=16000" || true
}
# util NAME CMD...: CMD run while nvidia-smi reads the GPU's utilisation every 100 ms; one
# JSON line (gpu_utilisation: mean and median percent, the samples, the most memory used)
util() {
  local name=$1 f=$out/util-$1.csv s rc=0
  shift
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 100 >"$f" 2>/dev/null &
  s=$!
  "$@" || rc=$?
  kill "$s" 2>/dev/null || true
  wait "$s" 2>/dev/null || true
  $py - "$name" "$f" "$rc" <<'PYEOF'
import json, statistics, sys
name, path, rc = sys.argv[1:]
rows = [l.split(",") for l in open(path) if l[:1].isdigit()]
u = [float(r[0]) for r in rows]
m = [float(r[1]) for r in rows]
print(json.dumps({"name": "gpu_utilisation", "run": name, "exit": int(rc), "samples": len(u),
                  "mean_percent": round(statistics.mean(u), 1) if u else None,
                  "median_percent": statistics.median(u) if u else None,
                  "max_memory_mib": max(m) if m else None}))
PYEOF
  return $rc
}
run_baseline() {
  if [[ -x $out/anvil_cuda_tests ]]; then
    echo "== anvil_cuda_tests"
    "$out/anvil_cuda_tests" || echo "gpu-check: anvil_cuda_tests failed" >&2
  fi
  if [[ -x $out/bench_ppo ]]; then
    echo "== bench_ppo (CUDA)"
    util ppo_cuda "$out/bench_ppo" bench.device=cuda 'bench.num_envs=[8,64]' 'bench.modes=[sync]' bench.steps=32768 ||
      echo "gpu-check: bench_ppo failed" >&2
  fi
  if [[ -x $out/bench_coma ]]; then
    echo "== bench_coma (CUDA, 128 x 5 x 5)"
    util coma_cuda "$out/bench_coma" bench.device=cuda 'bench.num_envs=[8]' bench.steps=${COMA_STEPS:-6000} bench.rounds=1 ||
      echo "gpu-check: bench_coma failed" >&2
  fi
  if [[ -x $out/bench_diffusion ]]; then
    echo "== bench_diffusion (CUDA)"
    util unet_cuda "$out/bench_diffusion" bench.device=cuda bench.seconds=2 bench.rounds=1 || echo "gpu-check: bench_diffusion failed" >&2
  fi
  if [[ -x $out/train_sac_pendulum ]]; then
    util main_graph_cuda run_mains graph_cuda "run.device=cuda" || true
  fi
}
run_graph() {
  local rc=0 runs=" ${GRAPH_RUNS:-precision main diffusion} "
  if [[ -x $out/anvil_cuda_tests ]]; then
    echo "== anvil_cuda_tests"
    "$out/anvil_cuda_tests" || { echo "gpu-check: anvil_cuda_tests failed" >&2; rc=1; }
  fi
  if [[ $runs == *" precision "* && -x $out/bench_precision ]]; then
    echo "== bench_precision (256x256)"
    "$out/bench_precision" bench.device=cuda bench.seconds=1 bench.rounds=3 'bench.hidden=[256]' 'bench.batch=[256,2048]' ||
      echo "gpu-check: bench_precision failed" >&2
  fi
  if [[ $runs == *" diffusion "* && -x $out/bench_diffusion ]]; then
    echo "== bench_diffusion"
    "$out/bench_diffusion" bench.device=cuda bench.seconds=1 bench.rounds=3 || echo "gpu-check: bench_diffusion failed" >&2
  fi
  if [[ $runs == *" main "* && -x $out/train_sac_pendulum ]]; then
    run_mains graph_cuda "run.device=cuda" eager_cuda "run.device=cuda sac.cuda_graph=false train.steps=6000" \
      graph_nosync_cuda "run.device=cuda run.sync_timings=false" || rc=1
  fi
  if [[ $runs == *" pusht "* && -x $out/diffusion_pusht_direct ]]; then
    echo "== diffusion_pusht_direct ${PUSHT_ARGS:-}"
    # shellcheck disable=SC2086
    "$out/diffusion_pusht_direct" bench.device=cuda ${PUSHT_ARGS:-} || { echo "gpu-check: diffusion_pusht_direct failed" >&2; rc=1; }
  fi
  return $rc
}
case "$what" in
  graph)
    build anvil_cuda_tests tests/doctest_main.cpp tests/cuda/cuda_graph_test.cpp & t=$!
    build bench_diffusion benchmarks/bench_diffusion.cpp & d=$!
    p=
    if [[ " ${GRAPH_RUNS:-} " == *" pusht "* ]]; then
      build diffusion_pusht_direct benchmarks/diffusion_pusht_direct.cpp "$deps/lib/libchipmunk.a" & p=$!
    fi
    build_sac || true
    wait $t || true
    wait $d || true
    [[ -z $p ]] || wait $p || true
    run_graph ;;
  bench) build bench_diffusion benchmarks/bench_diffusion.cpp; echo "== bench_diffusion"; "$out/bench_diffusion" bench.device=cuda "$@" ;;
  pusht)
    build diffusion_pusht_direct benchmarks/diffusion_pusht_direct.cpp "$deps/lib/libchipmunk.a"
    echo "== diffusion_pusht_direct"
    "$out/diffusion_pusht_direct" bench.device=cuda "$@" ;;
  sac) build_sac || true; run_sac ;;
  crash)
    # the CUDA tests and bench_ppo on CUDA under cuda-gdb: each thread's backtrace where one crashes
    build anvil_cuda_tests tests/doctest_main.cpp tests/cuda/cuda_graph_test.cpp & t=$!
    build bench_ppo benchmarks/bench_ppo.cpp '-DANVIL_BENCH_PPO_REFERENCE=""' & p=$!
    wait $t || true
    wait $p || true
    # a jump to address 0 leaves no frame to unwind: the words on the stack name the caller
    gdb=(cuda-gdb -q -batch -ex 'set pagination off' -ex 'set print thread-events off' -ex 'set cuda api_failures ignore'
         -ex run -ex 'bt 40' -ex 'x/16a $sp' -ex 'info threads' --args)
    command -v cuda-gdb >/dev/null || gdb=()
    echo "== anvil_cuda_tests, the restore case alone"
    "${gdb[@]}" "$out/anvil_cuda_tests" -tc='*restore*' "$@" || true
    echo "== anvil_cuda_tests, the others"
    "$out/anvil_cuda_tests" -tce='*restore*' "$@" || echo "gpu-check: anvil_cuda_tests failed"
    echo "== bench_ppo (CUDA)"
    "${gdb[@]}" "$out/bench_ppo" bench.device=cuda 'bench.num_envs=[8]' 'bench.modes=[sync]' bench.steps=2048 || true ;;
  baseline)
    build anvil_cuda_tests tests/doctest_main.cpp tests/cuda/cuda_graph_test.cpp & t=$!
    build bench_diffusion benchmarks/bench_diffusion.cpp & d=$!
    build bench_ppo benchmarks/bench_ppo.cpp '-DANVIL_BENCH_PPO_REFERENCE=""' & p=$!
    build bench_coma benchmarks/bench_coma.cpp & c=$!
    build train_sac_pendulum examples/train_sac_pendulum.cpp & m=$!
    for j in $t $d $p $c $m; do wait "$j" || true; done
    run_baseline ;;
  all)
    build diffusion_pusht_direct benchmarks/diffusion_pusht_direct.cpp "$deps/lib/libchipmunk.a" & pusht=$!
    build_sac || true
    wait $pusht || true
    run_sac
    if [[ -x $out/diffusion_pusht_direct ]]; then
      echo "== diffusion_pusht_direct ${PUSHT_ARGS:-}"
      # shellcheck disable=SC2086
      "$out/diffusion_pusht_direct" bench.device=cuda ${PUSHT_ARGS:-}
    fi ;;
  *) echo "scripts/gpu-check.sh: bench, pusht, sac, graph, baseline, crash or all, not '$what'" >&2; exit 2 ;;
esac
