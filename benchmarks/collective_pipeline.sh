#!/usr/bin/env bash
# Collective distillation on the manipulation suite, end to end, on a 2-core machine:
#   benchmarks/collective_pipeline.sh BUILD_DIR OUT_DIR [TASKS] [STUDENT_TASK] [SEEDS]
# 1. a SAC worker per task (two at a time), each appending its labelled copies to
#    OUT_DIR/collective.hdf5;
# 2. the collective Transformer distilled from them (FP32), evaluated on every task;
# 3. on STUDENT_TASK, the shaped student against plain SAC (the same program with the
#    shaping weight at 0), one run per seed, two at a time.
# benchmarks/collective_table.py OUT_DIR prints the tables of benchmarks/RESULTS.md.
# PHASES (default "workers distill students") runs some of the three.
set -euo pipefail
build=$1 out=$2 tasks=${3:-reach drawer-close window-open} student=${4:-window-open} seeds=${5:-1 2 3}
bin=$build/examples/collective
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$out"
common=(--progress=off --run.update_threads=1)
phases=${PHASES:-workers distill students}
# Workers run two at a time, each into a file of its own (an append rewrites the file), merged
# in task order afterwards.
if [[ $phases == *workers* ]]; then
pids=()
for t in $tasks; do
  $bin --experiment.mode=train_worker --env.tasks=$t --experiment.dataset=$out/worker_$t.hdf5 \
       --run_dir=$out/worker_$t "${common[@]}" > $out/worker_$t.log 2>&1 &
  pids+=($!)
  if (( ${#pids[@]} == 2 )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait
rm -f $out/collective.hdf5
files=""
for t in $tasks; do files="$files${files:+,}$out/worker_$t.hdf5"; done
$bin --experiment.mode=merge --experiment.dataset=$out/collective.hdf5 --experiment.merge=$files
fi
if [[ $phases == *distill* ]]; then
$bin --experiment.mode=distill_collective_transformer --experiment.dataset=$out/collective.hdf5 \
     --run_dir=$out/distill_fp32 "${common[@]}" > $out/distill_fp32.log 2>&1
fi
[[ $phases == *students* ]] || exit 0
pids=()
for s in $seeds; do
  for w in shaped plain; do
    extra=(--student.shaping.collective=$out/distill_fp32/policy.bin)
    [[ $w == plain ]] && extra+=(--student.shaping.weight=0)
    $bin --experiment.mode=train_student --env.tasks=$student --seed=$s "${extra[@]}" \
         --run_dir=$out/student_${w}_$s "${common[@]}" > $out/student_${w}_$s.log 2>&1 &
    pids+=($!)
    if (( ${#pids[@]} == 2 )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  done
done
wait
