#!/usr/bin/env bash
# GPU figures on a machine that has PyTorch with CUDA but not anvil's Debian packages:
# builds the GPU programs with CMake's `cuda` preset against the LibTorch inside that
# PyTorch, then runs them on CUDA and prints their JSON lines.
#
#   scripts/gpu-check.sh bench [overrides...]   bench_diffusion on CUDA (e.g. bench.seconds=2)
#   scripts/gpu-check.sh pusht [overrides...]   diffusion_pusht_direct: Diffusion Policy trained
#                                               on the expert's demonstrations, scored on the test seeds
#   scripts/gpu-check.sh sac                    bench_precision on CUDA (SAC updates/s per precision),
#                                               then the main job (examples/train_sac_pendulum,
#                                               header-only) on CUDA and on this machine's CPU, on
#                                               CUDA without phase syncs, and on CUDA with 16 envs
#                                               and batch 2048: one JSON line per run (summary.json)
#   scripts/gpu-check.sh graph                  updates as CUDA graphs: the CUDA tests (every captured
#                                               update against op by op: SAC, MT-SAC, FP16's scaler,
#                                               PPO, COMA, Diffusion Policy, distillation, one DDP
#                                               rank with NCCL), then
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
#                                               passes, FP32 and BF16), PPO's and COMA's updates each
#                                               graphed and op by op, the U-Net at batch 256
#                                               (bench_diffusion) and the main job graphed
#   scripts/gpu-check.sh crash [doctest args]   the CUDA tests and bench_ppo on CUDA under cuda-gdb
#                                               (GPU_CXXFLAGS=-g1 for line numbers): backtraces
#   scripts/gpu-check.sh figures                issue 53's figures in its order, each with the GPU's
#                                               utilisation: MT-SAC at batch 2048 (the one-GPU MT10
#                                               config) graphed and op by op, SAC per precision, COMA
#                                               128x5x5, acting (16 envs), PPO, the U-Net at batch 256
#   scripts/gpu-check.sh tests [ctest args]     every CUDA test as ctest runs it (ctest -L gpu)
#   scripts/gpu-check.sh curated                builds what a GPU machine builds (the build preset
#                                               cuda-curated: the target anvil_gpu_programs), then
#                                               runs the CUDA tests
#   scripts/gpu-check.sh all                    builds sac's and pusht's programs at once, then runs
#                                               sac and pusht (PUSHT_ARGS: its overrides)
#
# Builds with CMake's `cuda` preset (CMakePresets.json: LibTorch from PYTHON's PyTorch,
# ANVIL_TORCH_PYTHON), in GPU_BUILD_DIR (default build-gpu), the dependencies without a
# package on this machine found by their files under DEPS (default .deps), which
# scripts/gpu-deps.sh fills on a Debian machine: Boost.PFR, nlohmann-json, range-v3, doctest
# and yaml-cpp's static library, Chipmunk2D's (Push-T), MuJoCo's shared libraries (mt_sac,
# mt_sac_ddp; the programs run with DEPS/lib on LD_LIBRARY_PATH). Each mode builds its
# targets in one `cmake --build` (all of them: `cmake --build --preset cuda-curated`).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
deps=$(realpath -m "${DEPS:-.deps}")
out=${GPU_BUILD_DIR:-build-gpu}
bin=$out/bin
export LD_LIBRARY_PATH=$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "gpu-check: torch $($py -c 'import torch; print(torch.__version__, torch.version.cuda)'), g++ $(g++ -dumpfullversion), cmake $(cmake --version | head -n 1 | cut -d' ' -f3)"
mkdir -p "$bin"
what=${1:-bench}
shift || true
case "$what" in
  bench|pusht|sac|graph|baseline|figures|tests|curated|crash|all) ;;
  *) echo "scripts/gpu-check.sh: bench, pusht, sac, graph, baseline, figures, tests, curated, crash or all, not '$what'" >&2; exit 2 ;;
esac
# GPU_CXXFLAGS: more flags (e.g. -g1, for the backtraces of `crash`)
configure() {
  local gen=()
  command -v ninja >/dev/null || gen=(-G "Unix Makefiles")
  if cmake --preset cuda -B "$out" "${gen[@]}" "-DANVIL_TORCH_PYTHON=$(command -v "$py")" "-DCMAKE_PREFIX_PATH=$deps" \
       -DANVIL_BUILD_PYTHON_MODULE=OFF "-DCMAKE_CXX_FLAGS=${GPU_CXXFLAGS:-}" >"$out/configure.log" 2>&1; then
    grep '^-- anvil' "$out/configure.log" | sed 's/^-- /gpu-check: /'
  else
    echo "gpu-check: cmake --preset cuda failed:" >&2
    tail -n 30 "$out/configure.log" >&2
    return 1
  fi
}
configure
# build TARGET...: the targets in one build (the others go on where one fails), each program
# built linked as $bin/TARGET
build() {
  local keep=(-k 0)
  [[ -f $out/build.ninja ]] || keep=(-k)
  cmake --build "$out" --target "$@" -- "${keep[@]}" >"$out/build-$1.log" 2>&1 ||
    { echo "gpu-check: not every one of $* built:" >&2; grep -E 'error|FAILED' "$out/build-$1.log" | head -n 30 >&2; }
  local t f
  for t in "$@"; do
    f=$(find "$out" -path "$bin" -prune -o -type f -name "$t" -perm -u+x -print | head -n 1)
    if [[ -n $f ]]; then
      ln -sf "$(realpath "$f")" "$bin/$t"
      echo "gpu-check: built $t"
    else
      rm -f "$bin/$t"
    fi
  done
}
build_sac() { build bench_precision train_sac_pendulum; }
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
    if "$bin/train_sac_pendulum" "${common[@]}" $a run.run_dir="$dir" >"$dir.log" 2>&1; then
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
  if [[ -x $bin/bench_precision ]]; then
    echo "== bench_precision"
    "$bin/bench_precision" bench.device=cuda bench.seconds=1 bench.rounds=2 || echo "gpu-check: bench_precision failed" >&2
  fi
  [[ -x $bin/train_sac_pendulum ]] || return 0
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
# PPO (bench_ppo, 8 and 64 envs), COMA at its users' schedule (bench_coma: batch 128 x 5
# minibatches x 5 passes), the U-Net at batch 256 (bench_diffusion): each under util
run_ppo() {
  if [[ -x $bin/bench_ppo ]]; then
    echo "== bench_ppo (CUDA)"
    util ppo_cuda "$bin/bench_ppo" bench.device=cuda 'bench.num_envs=[8,64]' 'bench.modes=[sync]' bench.steps=32768 \
      "bench.cuda_graph=[${PPO_GRAPHS:-on,off}]" ||
      echo "gpu-check: bench_ppo failed" >&2
  fi
}
run_coma() {
  if [[ -x $bin/bench_coma ]]; then
    echo "== bench_coma (CUDA, 128 x 5 x 5)"
    util coma_cuda "$bin/bench_coma" bench.device=cuda 'bench.num_envs=[8]' bench.steps=${COMA_STEPS:-6000} bench.rounds=1 \
      "bench.cuda_graph=[${COMA_GRAPHS:-on,off}]" ||
      echo "gpu-check: bench_coma failed" >&2
  fi
}
run_unet() {
  if [[ -x $bin/bench_diffusion ]]; then
    echo "== bench_diffusion (CUDA)"
    util unet_cuda "$bin/bench_diffusion" bench.device=cuda bench.seconds=2 bench.rounds=1 || echo "gpu-check: bench_diffusion failed" >&2
  fi
}
run_baseline() {
  if [[ -x $bin/anvil_cuda_tests ]]; then
    echo "== anvil_cuda_tests"
    "$bin/anvil_cuda_tests" || echo "gpu-check: anvil_cuda_tests failed" >&2
  fi
  run_ppo
  run_coma
  run_unet
  if [[ -x $bin/train_sac_pendulum ]]; then
    util main_graph_cuda run_mains graph_cuda "run.device=cuda" || true
  fi
}
run_graph() {
  local rc=0 runs=" ${GRAPH_RUNS:-precision main diffusion} "
  if [[ -x $bin/anvil_cuda_tests ]]; then
    echo "== anvil_cuda_tests"
    "$bin/anvil_cuda_tests" || { echo "gpu-check: anvil_cuda_tests failed" >&2; rc=1; }
  fi
  if [[ $runs == *" precision "* && -x $bin/bench_precision ]]; then
    echo "== bench_precision (256x256)"
    "$bin/bench_precision" bench.device=cuda bench.seconds=1 bench.rounds=3 'bench.hidden=[256]' 'bench.batch=[256,2048]' ||
      echo "gpu-check: bench_precision failed" >&2
  fi
  if [[ $runs == *" diffusion "* && -x $bin/bench_diffusion ]]; then
    echo "== bench_diffusion"
    "$bin/bench_diffusion" bench.device=cuda bench.seconds=1 bench.rounds=3 || echo "gpu-check: bench_diffusion failed" >&2
  fi
  if [[ $runs == *" main "* && -x $bin/train_sac_pendulum ]]; then
    run_mains graph_cuda "run.device=cuda" eager_cuda "run.device=cuda sac.cuda_graph=false train.steps=6000" \
      graph_nosync_cuda "run.device=cuda run.sync_timings=false" || rc=1
  fi
  if [[ $runs == *" pusht "* && -x $bin/diffusion_pusht_direct ]]; then
    echo "== diffusion_pusht_direct ${PUSHT_ARGS:-}"
    # shellcheck disable=SC2086
    "$bin/diffusion_pusht_direct" bench.device=cuda ${PUSHT_ARGS:-} || { echo "gpu-check: diffusion_pusht_direct failed" >&2; rc=1; }
  fi
  return $rc
}
# The figures of issue 53, in its order, each with the GPU's utilisation over its run:
# MT-SAC at batch 2048 (the one-GPU MT10 config, examples/mt_sac_ddp: env steps/s and
# updates/s) graphed and op by op, SAC per precision (bench_precision: FP16 graphed with its
# loss scaler on the device), COMA at 128 x 5 x 5, acting (the main job with 16 envs, graphed and
# op by op: its act phase), PPO, the U-Net at batch 256. MT10_STEPS: the MT10 runs' env steps.
run_figures() {
  local steps=${MT10_STEPS:-30000} g dir
  if [[ -x $bin/mt_sac_ddp ]]; then
    for g in true false; do
      dir=$out/run-mt10_graph_$g
      rm -rf "$dir"
      echo "== mt_sac_ddp --config configs/mt10_server_1gpu.yaml mtsac.cuda_graph=$g train.steps=$steps"
      if util "mt10_1gpu_graph_$g" "$bin/mt_sac_ddp" --config configs/mt10_server_1gpu.yaml "mtsac.cuda_graph=$g" \
           "train.steps=$steps" train.eval_interval=1000000 run.checkpoint_interval=0 run.progress=off \
           run.tensorboard=false "run.run_dir=$dir" >"$dir.log" 2>&1; then
        grep -E '"name": "gpu_utilisation"' "$dir.log" || true
        summary "mt10_1gpu_graph_$g" "$dir"
      else
        echo "gpu-check: mt_sac_ddp failed:" >&2
        tail -n 20 "$dir.log" >&2
      fi
    done
  else
    echo "gpu-check: mt_sac_ddp not built (MuJoCo's files under DEPS: scripts/gpu-deps.sh)" >&2
  fi
  if [[ -x $bin/bench_precision ]]; then
    echo "== bench_precision (256x256, batch 256 and 2048)"
    util precision "$bin/bench_precision" bench.device=cuda bench.seconds=1 bench.rounds=2 'bench.hidden=[256]' \
      'bench.batch=[256,2048]' || echo "gpu-check: bench_precision failed" >&2
  fi
  run_coma
  if [[ -x $bin/train_sac_pendulum ]]; then
    local wide="run.device=cuda env.num_envs=16 train.update_interval=16 train.steps=32000 train.eval_interval=16000"
    util acting run_mains act16_graph "$wide" act16_eager "$wide sac.cuda_graph=false" || true
  fi
  run_ppo
  run_unet
}
case "$what" in
  figures)
    build anvil_cuda_tests mt_sac_ddp bench_precision bench_coma train_sac_pendulum bench_ppo bench_diffusion
    [[ ! -x $bin/anvil_cuda_tests ]] || "$bin/anvil_cuda_tests" || echo "gpu-check: anvil_cuda_tests failed" >&2
    run_figures ;;
  graph)
    targets=(anvil_cuda_tests bench_diffusion bench_precision train_sac_pendulum)
    [[ " ${GRAPH_RUNS:-} " != *" pusht "* ]] || targets+=(diffusion_pusht_direct)
    build "${targets[@]}"
    run_graph ;;
  bench) build bench_diffusion; echo "== bench_diffusion"; "$bin/bench_diffusion" bench.device=cuda "$@" ;;
  pusht)
    build diffusion_pusht_direct
    echo "== diffusion_pusht_direct"
    "$bin/diffusion_pusht_direct" bench.device=cuda "$@" ;;
  sac) build_sac; run_sac ;;
  tests)
    # every CUDA test as ctest runs it (the preset `gpu`: the label gpu)
    build anvil_cuda_tests anvil_tests
    ctest --test-dir "$out" -L gpu --output-on-failure "$@" ;;
  curated)
    # what a GPU machine builds (the build preset cuda-curated), then the CUDA tests
    build anvil_gpu_programs
    build anvil_cuda_tests bench_precision bench_sac_update bench_ppo bench_coma bench_diffusion bench_ddp \
      train_sac_pendulum train_sac mt_sac mt_sac_ddp diffusion_pusht_direct
    [[ ! -x $bin/anvil_cuda_tests ]] || "$bin/anvil_cuda_tests" ;;
  crash)
    # the CUDA tests and bench_ppo on CUDA under cuda-gdb: each thread's backtrace where one crashes
    build anvil_cuda_tests bench_ppo
    # a jump to address 0 leaves no frame to unwind: the words on the stack name the caller
    gdb=(cuda-gdb -q -batch -ex 'set pagination off' -ex 'set print thread-events off' -ex 'set cuda api_failures ignore'
         -ex run -ex 'bt 40' -ex 'x/16a $sp' -ex 'info threads' --args)
    command -v cuda-gdb >/dev/null || gdb=()
    echo "== anvil_cuda_tests, the restore case alone"
    "${gdb[@]}" "$bin/anvil_cuda_tests" -tc='*restore*' "$@" || true
    echo "== anvil_cuda_tests, the others"
    "$bin/anvil_cuda_tests" -tce='*restore*' "$@" || echo "gpu-check: anvil_cuda_tests failed"
    echo "== bench_ppo (CUDA)"
    "${gdb[@]}" "$bin/bench_ppo" bench.device=cuda 'bench.num_envs=[8]' 'bench.modes=[sync]' bench.steps=2048 || true ;;
  baseline)
    build anvil_cuda_tests bench_diffusion bench_ppo bench_coma train_sac_pendulum
    run_baseline ;;
  all)
    build bench_precision train_sac_pendulum diffusion_pusht_direct
    run_sac
    if [[ -x $bin/diffusion_pusht_direct ]]; then
      echo "== diffusion_pusht_direct ${PUSHT_ARGS:-}"
      # shellcheck disable=SC2086
      "$bin/diffusion_pusht_direct" bench.device=cuda ${PUSHT_ARGS:-}
    fi ;;
  *) echo "scripts/gpu-check.sh: bench, pusht, sac, graph, baseline, tests, curated, crash or all, not '$what'" >&2; exit 2 ;;
esac
