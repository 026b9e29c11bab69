#!/usr/bin/env bash
# A refactoring's before and after, interleaved on one machine (issue 43, "nothing else
# changes"): compile time of a user main, the metrics.csv of the main job and of short PPO,
# COMA and MT-SAC runs (identical apart from their time columns), SAC at RLtools' config
# timed whole on one core, and the prioritized buffer.
#
# Usage: benchmarks/before_after.sh OLD_BUILD NEW_BUILD [OUT_DIR]
#   each BUILD a build directory of a checkout (its parent the source tree), Release.
set -u
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
old=$(realpath "$1"); new=$(realpath "$2"); out=${3:-/tmp/before_after}; rm -rf "$out"; mkdir -p "$out"
here=$(dirname "$(realpath "$0")")
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $($new/tools/anvil-doctor 2>/dev/null | grep -o 'BLAS: [^(]*' | head -1)"
# 4. compile time of a user main
python3 $here/compile_time.py --root $old/.. --build $old --source examples/train_sac_pendulum.cpp | sed 's/^/old /'
python3 $here/compile_time.py --root $new/.. --build $new --source examples/train_sac_pendulum.cpp | sed 's/^/new /'
python3 $here/compile_time.py --root $old/.. --build $old --source examples/custom_trainer_main.cpp | sed 's/^/old /'
python3 $here/compile_time.py --root $new/.. --build $new --source examples/custom_trainer_main.cpp | sed 's/^/new /'
# 1. the main job's metrics.csv, before and after
for side in old new; do
  b=$([[ $side == old ]] && echo $old || echo $new)
  $b/examples/train_sac_pendulum --progress=off --run_dir=$out/main_$side > $out/main_$side.log 2>&1
  tail -1 $out/main_$side.log | head -c 0; grep "^done" $out/main_$side.log
done
python3 - $out <<'PY'
import csv, sys
out = sys.argv[1]
def rows(side):
    r = list(csv.DictReader(open(f"{out}/main_{side}/metrics.csv")))
    return [{k: v for k, v in x.items() if k not in ("wall_s", "env_steps_per_s")} for x in r]
a, b = rows("old"), rows("new")
print("metrics.csv rows", len(a), len(b), "identical apart from wall_s and env_steps_per_s:", a == b)
PY
# 1b. PPO, COMA, MT-SAC and the offline diffusion run: metrics.csv of a short run before and after
for ex in "train_ppo --train.steps=8192" "ppo_cartpole --smoke" "coma --smoke" "mt_sac --smoke"; do
  name=${ex%% *}
  for side in old new; do
    b=$([[ $side == old ]] && echo $old || echo $new)
    rm -rf $out/${name}_$side
    $b/examples/$ex --progress=off --run_dir=$out/${name}_$side > $out/${name}_$side.log 2>&1 || echo "$name $side failed: $(tail -2 $out/${name}_$side.log)"
  done
  python3 - $out $name <<'PY'
import csv, sys
out, name = sys.argv[1], sys.argv[2]
def rows(side):
    r = list(csv.DictReader(open(f"{out}/{name}_{side}/metrics.csv")))
    return [{k: v for k, v in x.items() if k not in ("wall_s", "env_steps_per_s")} for x in r]
a, b = rows("old"), rows("new")
print(name, "metrics.csv rows", len(a), len(b), "identical apart from wall_s and env_steps_per_s:", a == b)
PY
done
# 2. SAC at RLtools' config, whole process, one core, interleaved
sac_args=(train.steps=10000 train.learning_starts=100 sac.batch_size=100 sac.actor.hidden=64,64
  sac.critic.hidden=64,64 sac.actor_lr=1e-3 sac.critic_lr=1e-3 sac.alpha_lr=1e-3 train.eval_interval=0
  train.eval_episodes=10 run.progress=off run.checkpoint_interval=0 run.tensorboard=false run.update_threads=1)
for round in 1 2 3 4 5; do
  for side in old new; do
    bin=$([[ $side == old ]] && echo $old/examples/train_sac_pendulum || echo $new/benchmarks/timed_sac_pendulum)
    rm -rf $out/sac_$side
    s=$(date +%s.%N); taskset -c 0 $bin --run_dir=$out/sac_$side "${sac_args[@]}" > $out/sac_$side.log 2>&1; e=$(date +%s.%N)
    echo "{\"name\": \"sac_rltools_config_seconds\", \"side\": \"$side\", \"round\": $round, \"value\": $(echo "$e - $s" | bc), \"unit\": \"s\", \"eval\": \"$(grep -o 'eval return [^ ]*' $out/sac_$side.log)\"}"
  done
done
# 3. the prioritized buffer, interleaved
for round in 1 2; do
  for side in old new; do
    b=$([[ $side == old ]] && echo $old || echo $new)
    $b/benchmarks/bench_buffers --bench.rounds=1 --bench.python= 2>/dev/null | grep -E '"name": "(buffer_sample_update_batches|buffer_sample)"' | sed "s/^/$side $round /"
  done
done
