#!/usr/bin/env bash
# Collective distillation on the manipulation suite, end to end, on a 2-core machine:
#   benchmarks/collective_pipeline.sh BUILD_DIR OUT_DIR [TASKS] [STUDENT_TASKS] [SEEDS]
# 1. a SAC worker per task (two at a time), each appending its labelled copies to
#    OUT_DIR/collective.hdf5; a task written TASK:STEPS trains its worker for STEPS env steps
#    (the example's default is 60K);
# 2. the collective Transformer distilled from them (FP32), evaluated on every task;
# 3. on each of STUDENT_TASKS (default window-open), the shaped student against plain SAC
#    (the same program with the shaping weight at 0), one run per seed (default 1-5), two at
#    a time, into OUT_DIR/student_<task>_<variant>_<seed>. SHAPINGS (default "update plain")
#    names the variants: update (student.shaping.at=update), store (at=store), plain.
# benchmarks/collective_table.py OUT_DIR prints the tables of benchmarks/RESULTS.md.
# PHASES (default "workers distill students") runs some of the three; "merge" (implied by
# workers) merges the workers' files again. WORKER_ARGS: more flags for every worker (e.g.
# configs/manipulation_task_cpu.yaml's settings as flags, n_step as
# --collective.replay.n_step). DISTILL_ARGS: more
# flags for the distillation (e.g. --train.steps=20000 for ten tasks).
set -euo pipefail
build=$1 out=$2 tasks=${3:-reach drawer-close window-open} students=${4:-window-open} seeds=${5:-1 2 3 4 5}
shapings=${SHAPINGS:-update plain}
bin=$build/examples/collective
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$out"
common=(--progress=off --run.update_threads=1)
phases=${PHASES:-workers distill students}
# Runs go two at a time: a new one starts as soon as either finishes (their lengths differ).
running=0
two_at_a_time() { if (( ++running == 2 )); then wait -n; running=1; fi; }
# Workers run into a file each (an append rewrites the file), merged in task order afterwards.
if [[ $phases == *workers* ]]; then
for ts in $tasks; do
  t=${ts%%:*} steps=()
  [[ $ts == *:* ]] && steps=(--train.steps=${ts#*:})
  $bin --experiment.mode=train_worker --env.tasks=$t ${WORKER_ARGS:-} "${steps[@]}" --experiment.dataset=$out/worker_$t.hdf5 \
       --run_dir=$out/worker_$t "${common[@]}" > $out/worker_$t.log 2>&1 &
  two_at_a_time
done
wait
running=0
fi
if [[ $phases == *workers* || $phases == *merge* ]]; then
rm -f $out/collective.hdf5
files=""
for ts in $tasks; do files="$files${files:+,}$out/worker_${ts%%:*}.hdf5"; done
$bin --experiment.mode=merge --experiment.dataset=$out/collective.hdf5 --experiment.merge=$files
fi
if [[ $phases == *distill* ]]; then
$bin --experiment.mode=distill_collective_transformer --experiment.dataset=$out/collective.hdf5 \
     --run_dir=$out/distill_fp32 "${common[@]}" ${DISTILL_ARGS:-} > $out/distill_fp32.log 2>&1
fi
[[ $phases == *students* ]] || exit 0
# A student run that finished (its summary.json is there) is not run again.
for t in $students; do
  for s in $seeds; do
    for w in $shapings; do
      [[ -f $out/student_${t}_${w}_$s/summary.json ]] && continue
      extra=(--student.shaping.collective=$out/distill_fp32/policy.bin)
      case $w in
        update|store) extra+=(--student.shaping.at=$w) ;;
        plain) extra+=(--student.shaping.weight=0) ;;
        *) echo "SHAPINGS: $w is not update, store or plain" >&2; exit 2 ;;
      esac
      $bin --experiment.mode=train_student --env.tasks=$t --seed=$s "${extra[@]}" \
           --run_dir=$out/student_${t}_${w}_$s "${common[@]}" > $out/student_${t}_${w}_$s.log 2>&1 &
      two_at_a_time
    done
  done
done
wait
