#!/usr/bin/env bash
# benchmarks/vs_rltools.sh [--build DIR] [--rltools DIR] [--repeat N] [--seeds N] [--only sac|sac2|ppo|compile|learn|ppo_learn]
# anvil against RLtools (rl-tools/rl-tools, the fastest published CPU RL library) on
# RLtools' own Pendulum benchmarks, configured alike, interleaved run by run, RLtools at its
# best (benchmarks/rltools.sh builds it with OpenBLAS):
#   sac        SAC, 10,000 steps, 1 env, batch 100, 64x64 ReLU actor and critics, lr 1e-3,
#              100 random steps, one update per step; one core each (taskset -c 0). RLtools'
#              BENCHMARK main evaluates nothing; anvil runs its 10 final evaluation episodes
#              (at least one is required), timed as its "eval" phase and reported
#              (eval_seconds): extra work on anvil's side only.
#   sac2       the same with anvil's default two update threads on two cores (RLtools: one)
#   ppo        PPO, 4 envs x 1,024 steps x 75 iterations, 2 epochs of 256-row minibatches,
#              64x64 ReLU, gamma 0.9, lr 1e-3, initial std 2, observations normalised, then
#              1,000 final evaluation episodes on both sides (RLtools' main runs them); one
#              core. RLtools: its PPO main with its BLAS backend (rltools_ppo), and as
#              upstream builds it, never calling BLAS (rltools_ppo_upstream, a labelled
#              second row against the same anvil runs).
#   compile    compiling examples/train_sac_pendulum.cpp without the precompiled header
#              (benchmarks/compile_time.py) against RLtools' SAC main (benchmarks/rltools.sh)
#   learn      SAC at the sac config, seeds 1 .. --seeds (default 10) on both sides, each final
#              actor evaluated over 100 episodes (deterministic actions, random start states):
#              anvil with train.eval_episodes=100, RLtools through benchmarks/rltools.sh's
#              sac_learn copy of its SAC main (seeded, with its own evaluation step); then
#              both sides' mean, spread and range
#   ppo_learn  PPO at the ppo config, seeds 0 .. --seeds - 1 on both sides: each final return
#              (1,000 episodes), then both sides' mean, spread and range.
# Prints one JSON line per run and side, then one per workload with the medians of the whole
# process and of the training alone, and their ratios anvil / RLtools, and the machine (CPU
# model, OpenBLAS kernel family). RLtools is not a dependency: benchmarks/rltools.sh says how
# to get it, and without it only anvil's side runs. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
# are unset for both sides. anvil's "seconds" is the whole process (as RLtools'), of which
# LibTorch's own start (loading libtorch and its libraries) is "start_seconds";
# "train_seconds" is the run's wall time from its summary.json, RLtools' the time its main
# prints at the end of training (before its final evaluation).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
rltools=$root/benchmarks/.rltools
repeat=3
seeds=10
only=
usage() { sed -n 2p "$0" | sed 's/^# //' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) [[ $# -ge 2 ]] || usage; build=$2; shift 2 ;;
    --rltools) [[ $# -ge 2 ]] || usage; rltools=$2; shift 2 ;;
    --repeat) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; repeat=$2; shift 2 ;;
    --seeds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; seeds=$2; shift 2 ;;
    --only) [[ ${2:-} =~ ^(sac|sac2|ppo|compile|learn|ppo_learn)$ ]] || usage; only=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
sac_bin=$build/benchmarks/timed_sac_pendulum  # the examples' Trainers and defaults, fast start and exit
ppo_bin=$build/benchmarks/timed_ppo_pendulum
for b in "$sac_bin" "$ppo_bin"; do
  [[ -x $b ]] || { echo "vs_rltools.sh: $b is missing: build the benchmarks first (cmake --build $build)" >&2; exit 2; }
done
have_rltools=1
[[ -f $rltools/src/rl/environments/pendulum/sac/cpu/training.cpp ]] || {
  have_rltools=0
  "$root/benchmarks/rltools.sh" --dir "$rltools" >&2 || true
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$work/lines.jsonl
touch "$out"

sac_args=(train.steps=10000 train.learning_starts=100 sac.batch_size=100 sac.actor.hidden=64,64
  sac.critic.hidden=64,64 sac.actor_lr=1e-3 sac.critic_lr=1e-3 sac.alpha_lr=1e-3 train.eval_interval=0
  train.eval_episodes=10 run.progress=off run.checkpoint_interval=0 run.tensorboard=false)
ppo_args=(env.num_envs=4 rollout.steps=1024 train.steps=307200 ppo.epochs=2 ppo.minibatch_size=256
  ppo.gamma=0.9 ppo.lr=1e-3 ppo.anneal_lr=false ppo.ent_coef=0 ppo.init_log_std=0.6931
  ppo.actor.activation=relu ppo.critic.activation=relu normalize.obs=true train.eval_interval=0
  train.eval_episodes=1000 run.progress=off run.checkpoint_interval=0 run.tensorboard=false)

# anvil NAME CORES ARGS...: one run of anvil's program on CORES; a JSON line with the process
# time, the training time and final return from the run's summary.json, and the peak RSS.
anvil() {
  local name=$1 cores=$2 bin=$3 t dir
  shift 3
  t=$work/time
  dir=$work/run-$RANDOM$RANDOM
  taskset -c "$cores" /usr/bin/time -f '%e %M' -o "$t" "$bin" "$@" run.run_dir="$dir" >/dev/null 2>&1 ||
    { echo "vs_rltools.sh: $name failed; rerun: $bin $* run.run_dir=$dir" >&2; exit 1; }
  python3 - "$name" "$t" "$dir/summary.json" "$start" "$*" <<'EOF' | tee -a "$out"
import json, re, sys
name, tfile, summary, start, args = sys.argv[1:]
secs, kb = open(tfile).read().split()
s = json.load(open(summary))
seed = re.search(r"run\.seed=(\d+)", args)
phases = s.get("phase_seconds", {})
print(json.dumps({"bench": "vs_rltools", "workload": name, "side": "anvil", "seed": int(seed.group(1)) if seed else 0,
                  "seconds": float(secs), "start_seconds": float(start),
                  "train_seconds": round(s.get("wall_seconds", 0.0), 3), "eval_seconds": phases.get("eval"),
                  "final_eval_return": s.get("final_eval_return"), "peak_rss_mib": round(int(kb) / 1024, 1)}))
EOF
  rm -rf "$dir"
}
# rl NAME ONLY [SEED]: one run of RLtools' side (benchmarks/rltools.sh), relabelled for this table.
rl() {
  [[ $have_rltools == 1 ]] || return 0
  "$root/benchmarks/rltools.sh" --dir "$rltools" --only "$2" --seed "${3:-0}" 2>/dev/null |
    python3 -c 'import json,sys
d=json.loads(sys.stdin.readline())
print(json.dumps({"bench":"vs_rltools","workload":sys.argv[1],"side":"rltools","seed":d["seed"],"seconds":d["seconds"],
                  "train_seconds":d["train_seconds"],"final_eval_return":d["final_return"],"peak_rss_mib":d["peak_rss_mib"]}))' "$1" |
    tee -a "$out"
}
# LibTorch's start on this machine: a program that only loads it (anvil's --help).
start=$( { /usr/bin/time -f '%e' taskset -c 0 "$sac_bin" --help >/dev/null; } 2>&1 | tail -n1)

for ((i = 0; i < repeat; i++)); do
  if [[ -z $only || $only == sac ]]; then anvil sac 0 "$sac_bin" "${sac_args[@]}" run.update_threads=1; rl sac sac; fi
  if [[ -z $only || $only == sac2 ]]; then anvil sac2 0,1 "$sac_bin" "${sac_args[@]}" run.update_threads=2; rl sac2 sac; fi
  if [[ -z $only || $only == ppo ]]; then
    anvil ppo 0 "$ppo_bin" "${ppo_args[@]}" run.update_threads=1
    rl ppo ppo
    rl ppo_upstream ppo_upstream
  fi
  if [[ -z $only || $only == compile ]]; then
    python3 "$root/benchmarks/compile_time.py" --build "$build" --root "$root" |
      python3 -c 'import json,sys
d={json.loads(l)["name"]: json.loads(l)["value"] for l in sys.stdin if l.strip()}
print(json.dumps({"bench":"vs_rltools","workload":"compile","side":"anvil","seconds":d["compile_seconds"],"peak_rss_mib":d["compile_peak_rss"]}))' |
      tee -a "$out"
    if [[ $have_rltools == 1 ]]; then
      "$root/benchmarks/rltools.sh" --dir "$rltools" --only compile 2>/dev/null |
        python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print(json.dumps({"bench":"vs_rltools","workload":"compile","side":"rltools","seconds":d["seconds"],"peak_rss_mib":d["peak_rss_mib"]}))' |
        tee -a "$out"
    fi
  fi
done
if [[ -z $only || $only == learn ]]; then
  for ((s = 1; s <= seeds; s++)); do
    anvil learn 0 "$sac_bin" "${sac_args[@]/#train.eval_episodes=*/train.eval_episodes=100}" run.update_threads=1 run.seed=$s
    rl learn sac_learn $s
  done
fi
if [[ -z $only || $only == ppo_learn ]]; then
  for ((s = 0; s < seeds; s++)); do
    anvil ppo_learn 0 "$ppo_bin" "${ppo_args[@]}" run.update_threads=1 run.seed=$s
    rl ppo_learn ppo $s
  done
fi
# The machine: CPU model and the OpenBLAS kernels both sides run (the runtime's own answer).
machine=$(python3 -c 'import ctypes, json
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
try:
    f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename; f.restype = ctypes.c_char_p; blas = f().decode()
except OSError:
    blas = "unknown"
print(json.dumps({"cpu": cpu, "blas_kernels": blas}))')
python3 - "$out" "$machine" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
machine = json.loads(sys.argv[2])
def spread(v):
    return {"n": len(v), "mean": round(statistics.mean(v), 1), "sd": round(statistics.stdev(v), 1) if len(v) > 1 else 0.0,
            "min": round(min(v), 1), "max": round(max(v), 1)}
for w in ("learn", "ppo_learn"):
    sides = {side: [r["final_eval_return"] for r in rows if r["workload"] == w and r["side"] == side
                    and r.get("final_eval_return") is not None] for side in ("anvil", "rltools")}
    if not sides["anvil"]:
        continue
    line = {"bench": "vs_rltools_summary", "workload": w, **machine,
            **{f"{side}_final_return": spread(v) for side, v in sides.items() if v}}
    if sides["rltools"]:
        lo, hi = min(sides["rltools"]), max(sides["rltools"])
        line["anvil_mean_inside_rltools_range"] = lo <= statistics.mean(sides["anvil"]) <= hi
        # returns are higher-is-better: a mean above RLtools' best seed learns at least as well
        line["anvil_mean_at_least_rltools_worst"] = statistics.mean(sides["anvil"]) >= lo
    print(json.dumps(line))
med = lambda v: statistics.median(v) if v else None
for w in dict.fromkeys(r["workload"] for r in rows if r["workload"] not in ("learn", "ppo_learn")):
    mine = "ppo" if w == "ppo_upstream" else w  # the upstream row is against the same anvil runs
    a = [r for r in rows if r["workload"] == mine and r["side"] == "anvil"]
    b = [r for r in rows if r["workload"] == w and r["side"] == "rltools"]
    line = {"bench": "vs_rltools_summary", "workload": w, **machine, "runs": [len(a), len(b)],
            "anvil_seconds": med([r["seconds"] for r in a]), "rltools_seconds": med([r["seconds"] for r in b]),
            "anvil_train_seconds": med([r["train_seconds"] for r in a if r.get("train_seconds") is not None]),
            "rltools_train_seconds": med([r["train_seconds"] for r in b if r.get("train_seconds") is not None])}
    if any(r.get("eval_seconds") is not None for r in a):
        line["anvil_eval_seconds"] = med([r["eval_seconds"] for r in a if r.get("eval_seconds") is not None])
    for k in ("", "train_"):
        x, y = line[f"anvil_{k}seconds"], line[f"rltools_{k}seconds"]
        if x and y:
            line[f"{k}ratio"] = round(x / y, 3)
    if line["anvil_train_seconds"] and line["rltools_seconds"]:
        line["anvil_train_over_rltools_process"] = round(line["anvil_train_seconds"] / line["rltools_seconds"], 3)
    print(json.dumps(line))
EOF
