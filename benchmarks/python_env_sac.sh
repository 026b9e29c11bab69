#!/usr/bin/env bash
# SAC on Pendulum written in Python (tests/python/envs/pendulum.py, numpy, Gymnasium's
# published dynamics) through --env.id=python:pendulum:make, beside anvil's C++ Pendulum,
# for 3 seeds each, with the same settings (Pendulum-v1's block of
# examples/hyperparams/sac.yaml, 20,000 env steps). One JSON line per run; the Python env's
# final eval returns should lie inside the C++ env's range.
#
# Usage: benchmarks/python_env_sac.sh BUILD [SEEDS]
set -u
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
build=$(realpath "$1"); seeds=${2:-"0 1 2"}; here=$(dirname "$(realpath "$0")")
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
settings=(--train.steps=20000 --train.eval_interval=2000 --sac.actor_lr=0.001 --sac.critic_lr=0.001
  --sac.alpha_lr=0.001 --run.progress=off --run.tensorboard=false)
for seed in $seeds; do
  for env in Pendulum-v1 python:pendulum:make; do
    s=$(date +%s.%N)
    PYTHONPATH="$here/../tests/python/envs" "$build/examples/train_sac" --env.id=$env --seed=$seed \
      --run_dir="$out/$seed-${env//:/_}" "${settings[@]}" > "$out/log" 2>&1 || { cat "$out/log"; exit 1; }
    e=$(date +%s.%N)
    ret=$(grep -o 'eval return [-0-9.]*' "$out/log" | tail -1 | awk '{print $3}')
    echo "{\"name\": \"sac_pendulum_final_eval_return\", \"env\": \"$env\", \"seed\": $seed, \"value\": $ret, \"seconds\": $(echo "$e - $s" | bc)}"
  done
done
