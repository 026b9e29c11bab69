#!/usr/bin/env bash
# benchmarks/mt_sac_vs_sac.sh [BUILD_DIR] [OUT_DIR] [STEPS_PER_TASK]
# One multi-task SAC against one SAC per task at equal total env steps, on TASKS of the
# MuJoCo manipulation suite (default six: reach, push, drawer-open, drawer-close,
# button-press-topdown, window-open; TASKS=mt10 for MT10's ten), seed SEED (default 1), and
# PARTS=single or PARTS=multi for one side only; EXTRA_ARGS (space-separated --KEY=VALUE
# flags) go to every run, replacing the settings below where they name the same key. Each single-task run gets STEPS_PER_TASK env
# steps on 2 envs; the multi-task run gets N x STEPS_PER_TASK on 2N envs (2 per task) with
# task-balanced batches and a temperature per task. Same networks, learning rates and
# update-to-data ratio everywhere. Runs longer than a sitting: add --run.checkpoint_interval=N
# --run.checkpoint_buffer=true --run.resume=auto to EXTRA_ARGS and give the same command again
# after a stop; each run goes on from its last checkpoint, replay buffer included.
# The single-task runs go as one sweep (--multirun, two at a time). benchmarks/mt_sac_table.py
# then prints a markdown table of each task's final success rate and return and the first
# evaluation at 80% success, and writes it to OUT_DIR/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-runs/mt_sac_vs_sac}
steps=${3:-100000}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
tasks=${TASKS:-reach,push,drawer-open,drawer-close,button-press-topdown,window-open}
if [ "$tasks" = mt10 ]; then
  tasks=reach,push,pick-place,door-open,drawer-open,drawer-close,button-press-topdown,peg-insert-side,window-open,window-close
fi
n=$(echo "$tasks" | tr ',' '\n' | wc -l)
parts=${PARTS:-single,multi}
common=(--train.learning_starts=2000 --train.update_interval=2 --train.eval_interval=10000
        --train.eval_episodes=10 --mtsac.actor_lr=0.001 --mtsac.critic_lr=0.001 --mtsac.alpha_lr=0.001
        --mtsac.gamma=0.95 --mtsac.init_alpha=0.1 "--mtsac.actor.hidden=[128,128]"
        "--mtsac.critic.hidden=[128,128]" --run.progress=lines --run.checkpoint_interval=0 --seed="${SEED:-1}")
read -ra extra <<< "${EXTRA_ARGS:-}"  # further flags for every run, e.g. EXTRA_ARGS=--env.max_episode_steps=150
for flag in "${extra[@]}"; do         # one of the settings above given again replaces it
  kept=()
  for c in "${common[@]}"; do [[ $c == "${flag%%=*}="* ]] || kept+=("$c"); done
  common=("${kept[@]}" "$flag")
done
mkdir -p "$out"
# How this output was made, for the tables' JSON lines (benchmarks/mt10_seeds.py).
printf 'TASKS=%s SEED=%s PARTS=%s EXTRA_ARGS=%q benchmarks/mt_sac_vs_sac.sh %s %s %s\n' \
  "${TASKS:-}" "${SEED:-1}" "$parts" "${EXTRA_ARGS:-}" "$build" "$out" "$steps" > "$out/command"
if [[ $parts == *single* && $n == 1 ]]; then  # one task: one run (a sweep needs two values or more)
  mkdir -p "$out/single"
  "$build/examples/mt_sac" --env.tasks="$tasks" --run_dir="$out/single/0_env.tasks=$tasks" \
    --env.num_envs=2 --train.steps="$steps" "${common[@]}" > "$out/single/0_env.tasks=$tasks.log" 2>&1
elif [[ $parts == *single* ]]; then
  "$build/examples/mt_sac" --multirun "env.tasks=$tasks" --jobs 2 --run_dir="$out/single" \
    --env.num_envs=2 --train.steps="$steps" "${common[@]}"
fi
if [[ $parts == *multi* ]]; then
  "$build/examples/mt_sac" --env.tasks="$tasks" --env.num_envs=$((2 * n)) --train.steps=$((n * steps)) \
    --run_dir="$out/multi" "${common[@]}" >> "$out/multi.log" 2>&1  # appended: a resumed run adds to it
fi
if [[ $parts == *single* && $parts == *multi* ]]; then python3 benchmarks/mt_sac_table.py "$out" "$tasks" "$steps"; fi
