#!/bin/sh
# Recurrent PPO against feed-forward PPO on CartPole with its velocities hidden
# (CartPoleNoVel-v1), the same budget and settings on both sides (each program's
# examples/hyperparams entry for the env: 8 envs x 32 steps, 20 epochs, minibatches of
# 256, epochs stopped at a KL of 0.02, 100k env steps), 3 seeds each, final evaluation over 20 episodes. Appends one JSON
# line per run to benchmarks/results-vm.jsonl (name recurrent_ppo_learning).
# Usage: benchmarks/recurrent_vs_ff.sh [BUILD_DIR] [SEEDS...]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
seeds=${*:-0 1 2}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
cpu=$(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //')
out=$(mktemp -d)
for seed in $seeds; do
  for program in train_ppo_recurrent train_ppo; do
    dir="$out/$program-$seed"
    start=$(date +%s.%N)
    "$build/examples/$program" --env.id=CartPoleNoVel-v1 --seed="$seed" --train.eval_episodes=20 \
      --run_dir="$dir" > "$dir.log" 2>&1
    end=$(date +%s.%N)
    python3 - "$dir/summary.json" "$program" "$seed" "$start" "$end" "$cpu" <<'PY' >> benchmarks/results-vm.jsonl
import datetime, json, sys
path, program, seed, start, end, cpu = sys.argv[1:]
import os, re
s = json.load(open(path))
# the BLAS kernel family the run reported in its header ("cpu: OpenBLAS (Cooperlake kernels), ...")
header = open(os.path.join(os.path.dirname(path), "training.log")).read()
m = re.search(r"cpu: (\w+) \((\w+) kernels\)", header)
blas = f"{m.group(1)} {m.group(2)}" if m else "unknown"
print(json.dumps({"name": "recurrent_ppo_learning", "value": round(s["final_eval_return"], 1),
                  "unit": "final evaluation return, mean of 20 episodes",
                  "config": {"env": "CartPoleNoVel-v1", "program": program,
                             "policy": "GRU actor and value" if program == "train_ppo_recurrent" else "feed-forward MLPs",
                             "seed": int(seed), "env_steps": s["env_steps"], "best_eval": round(s["best_eval_return"], 1),
                             "train_s": round(s["wall_seconds"], 1), "process_s": round(float(end) - float(start), 2),
                             "command": f"build/examples/{program} --env.id=CartPoleNoVel-v1 --seed={seed} --train.eval_episodes=20"},
                  "cpu": cpu, "blas": blas, "date": datetime.date.today().isoformat()}))
PY
    tail -n 1 benchmarks/results-vm.jsonl
  done
done
rm -rf "$out"
