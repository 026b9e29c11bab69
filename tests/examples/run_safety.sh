#!/usr/bin/env bash
# run_safety.sh CASE PROGRAM DIR
# Process tests of a run's safety (issue 19), on a training program as a user runs it:
#   sigterm      the first SIGTERM finishes the step, checkpoints, writes summary.json and
#                exits 143; --resume=auto continues from that checkpoint
#   sigint       the same for Ctrl-C (SIGINT), exit 130
#   second       a second SIGTERM while the first is being handled exits at once (143),
#                leaving the previous checkpoint as it was
#   sigusr1      SIGUSR1 writes a checkpoint and the run goes on to the end (exit 0)
#   lock         a second run in a run directory in use is refused, naming it and the pid
#   nonempty     a run directory that holds a run is refused without --resume
#   seed         --resume=auto with another seed is refused, naming run.seed, and the
#                refused resume changes no file of the run directory
#   takes        a resume given only the run directory takes the run's own settings from its
#                config.yaml (networks, envs, schedule); a setting given that the checkpoint
#                cannot take is still refused, naming it; --print-config shows what will run
#   rows         metrics.csv has one row per logged step, also after a finished run is resumed,
#                and that resumed run prints no timing verdict (it trained nothing); also after a
#                resume from a mid-run checkpoint past train.steps (the evaluation it makes as it
#                ends goes into the row already there)
#   diskfull     a run whose disk fills after its first checkpoint (a small tmpfs in a mount
#                namespace of the test's own) stops with an error naming the file and keeps that
#                checkpoint; with space freed, --resume=auto --train.steps below it finishes
#                and metrics.csv has one row per logged step (skipped, exit 77, where no mount
#                namespace can be made)
#   config       --config naming a directory, batch_size > capacity and learning_starts >=
#                steps are refused (exit 2) naming the fields
#   memory       a buffer that cannot fit is refused before it is allocated, naming
#                buffer.capacity and both sizes
#   sweep        --multirun runs the cross product (two at a time with --jobs 2) into its own
#                directories with a table in sweep.csv; a bad value is refused before any run
#   names        default run directories include the seed and do not collide
#   provenance   config.yaml and summary.json record env, policy types, versions, command,
#                host and git commit; summary.json's values are typed; the config is in TensorBoard;
#                --config config.yaml --print-config prints the same settings and the same hash
set -uo pipefail
case_=$1
prog=$2
dir=$3
rm -rf "$dir" "$dir".*
mkdir -p "$(dirname "$dir")"
small=(--progress=off sac.actor.hidden=[16,16] sac.critic.hidden=[16,16] train.eval_episodes=1)
fail() { echo "FAIL: $*"; [[ -f $dir.log ]] && { echo "--- log:"; cat "$dir.log"; }; exit 1; }

# Waits (up to 60 s) until FILE matches PATTERN.
wait_for() {
  for _ in $(seq 1 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    grep -q "^error:" "$dir.log" 2>/dev/null && fail "the run failed"
    sleep 0.1
  done
  fail "timed out waiting for '$2' in $1"
}

stop_with() {  # SIGNAL EXPECTED_STATUS
  "$prog" --run_dir="$dir" train.steps=400000 train.learning_starts=500 --log_interval=500 "${small[@]}" \
    train.eval_interval=0 >"$dir.log" 2>&1 &
  local pid=$!
  wait_for "$dir/metrics.csv" "^1500,"
  kill -"$1" "$pid"
  wait "$pid"
  local rc=$?
  [[ $rc == "$2" ]] || fail "exit status $rc after SIG$1, expected $2"
  grep -q "stopping on SIG$1 at env step" "$dir.log" || fail "no 'stopping on SIG$1' line"
  grep -q "stopped: by SIG$1 at env step [0-9]*; checkpoint written" "$dir.log" || fail "no 'stopped:' line"
  local step
  step=$(sed -n "s/.*stopped: by SIG$1 at env step \([0-9]*\);.*/\1/p" "$dir.log")
  [[ -f $(printf "%s/checkpoint-%012d.ckpt" "$dir" "$step") ]] || fail "no checkpoint at the step it stopped ($step)"
  grep -q "\"status\": \"stopped by SIG$1\"" "$dir/summary.json" || fail "summary.json does not say it stopped"
  grep -q "\"env_steps\": $step," "$dir/summary.json" || fail "summary.json is not at step $step"
  "$prog" --run_dir="$dir" --resume=auto train.steps=$((step + 300)) train.learning_starts=500 --log_interval=500 \
    "${small[@]}" train.eval_interval=0 >"$dir.resumed.log" 2>&1 || fail "the resumed run failed: $(cat "$dir.resumed.log")"
  grep -q "resumed from .* at env step $step" "$dir.resumed.log" || fail "did not resume at step $step: $(cat "$dir.resumed.log")"
  grep -q "done: $((step + 300)) env steps" "$dir.resumed.log" || fail "the resumed run did not finish"
}

case $case_ in
  sigterm) stop_with TERM 143 ;;
  sigint) stop_with INT 130 ;;
  second)
    # The first SIGTERM comes during a long evaluation (it is handled after it); the second,
    # 0.7 s later, ends the process at once.
    "$prog" --run_dir="$dir" train.steps=5000 train.learning_starts=200 --log_interval=500 --progress=off \
      sac.actor.hidden=[64,64] sac.critic.hidden=[16,16] train.eval_interval=1000 train.eval_episodes=300000 \
      --checkpoint_interval=500 >"$dir.log" 2>&1 &
    pid=$!
    wait_for "$dir/metrics.csv" "^500,"
    sleep 3  # in the evaluation at step 1000 (300,000 episodes in one batch: about 20 s)
    grep -q "^1000," "$dir/metrics.csv" && fail "the evaluation at step 1000 ended too soon for this test"
    before=$(ls "$dir"/checkpoint-*.ckpt | tail -1)
    sum=$(md5sum <"$before")
    kill -TERM "$pid"
    sleep 0.7
    kill -TERM "$pid"
    wait "$pid"
    rc=$?
    [[ $rc == 143 ]] || fail "exit status $rc after two SIGTERMs, expected 143"
    grep -q "a second signal; exiting at once" "$dir.log" || fail "no message for the second signal"
    [[ $(md5sum <"$before") == "$sum" ]] || fail "the previous checkpoint changed"
    ;;
  sigusr1)
    "$prog" --run_dir="$dir" train.steps=6000 train.learning_starts=500 --log_interval=500 "${small[@]}" \
      train.eval_interval=0 --checkpoint_interval=0 >"$dir.log" 2>&1 &
    pid=$!
    wait_for "$dir/metrics.csv" "^1500,"
    kill -USR1 "$pid"
    wait "$pid"
    rc=$?
    [[ $rc == 0 ]] || fail "exit status $rc after SIGUSR1, expected 0 (the run goes on)"
    n=$(ls "$dir"/checkpoint-*.ckpt | wc -l)
    [[ $n == 2 ]] || fail "$n checkpoints, expected 2 (SIGUSR1's and the last)"
    ;;
  lock)
    "$prog" --run_dir="$dir" train.steps=400000 "${small[@]}" >"$dir.log" 2>&1 &
    pid=$!
    wait_for "$dir/.lock" "$pid"
    out=$("$prog" --run_dir="$dir" --resume=auto train.steps=2000 "${small[@]}" 2>&1)
    rc=$?
    kill -TERM "$pid"
    wait "$pid"
    [[ $rc == 1 ]] || fail "the second run exited $rc, expected 1: $out"
    grep -q "run.run_dir: '$dir' is in use by another run (pid $pid)" <<<"$out" || fail "message: $out"
    ;;
  nonempty)
    "$prog" --run_dir="$dir" train.steps=600 train.learning_starts=200 "${small[@]}" >"$dir.log" 2>&1 || fail "first run failed"
    out=$("$prog" --run_dir="$dir" train.steps=600 train.learning_starts=200 "${small[@]}" 2>&1)
    rc=$?
    [[ $rc == 2 ]] || fail "a second run in a used directory exited $rc, expected 2: $out"
    grep -q "already holds a run; use --resume=auto" <<<"$out" || fail "message: $out"
    ;;
  seed)
    "$prog" --run_dir="$dir" train.steps=600 train.learning_starts=200 --seed=1 "${small[@]}" >"$dir.log" 2>&1 ||
      fail "first run failed"
    snapshot() { (cd "$dir" && find . -type f ! -name .lock -exec md5sum {} + | sort; ls -A | sort); }
    before=$(snapshot)
    out=$("$prog" --run_dir="$dir" --resume=auto train.steps=1200 train.learning_starts=200 --seed=2 "${small[@]}" 2>&1)
    rc=$?
    [[ $rc == 1 ]] || fail "resume with another seed exited $rc, expected 1: $out"
    grep -q "run.seed = 1; this run has run.seed = 2" <<<"$out" || fail "message: $out"
    [[ $(snapshot) == "$before" ]] || fail "the refused resume changed the run directory"
    ;;
  takes)
    "$prog" --run_dir="$dir" train.steps=600 train.learning_starts=200 "${small[@]}" >"$dir.log" 2>&1 || fail "first run failed"
    out=$("$prog" --run_dir="$dir" --resume=auto --print-config 2>&1) || fail "--print-config of a resume failed: $out"
    grep -q "resume: the run's settings from $dir/config.yaml" <<<"$out" || fail "no line naming the run's config: $out"
    grep -q "^    hidden: \[16, 16\]" <<<"$out" || fail "--print-config of the resume does not show the run's networks: $out"
    out=$("$prog" --run_dir="$dir" --resume=auto train.steps=900 2>&1) || fail "a resume given only the run directory failed: $out"
    grep -q "resumed from .*checkpoint-000000000600.ckpt at env step 600" <<<"$out" || fail "did not resume: $out"
    grep -q "done: 900 env steps" <<<"$out" || fail "the resumed run did not finish: $out"
    out=$("$prog" --run_dir="$dir" --resume=auto train.steps=1200 sac.critic.hidden=[32,32] 2>&1)
    rc=$?
    [[ $rc == 1 ]] || fail "a resume with other networks exited $rc, expected 1: $out"
    grep -q "sac.critic.hidden = \[16, 16\]; this run has sac.critic.hidden = \[32, 32\]" <<<"$out" || fail "message: $out"
    ;;
  rows)
    # 1,100 steps, rows every 500 and an evaluation only at the end: rows 500, 1000, 1100.
    "$prog" --run_dir="$dir" train.steps=1100 train.learning_starts=200 --log_interval=500 "${small[@]}" \
      train.eval_interval=0 >"$dir.log" 2>&1 || fail "run failed"
    "$prog" --run_dir="$dir" --resume=auto train.steps=1100 train.learning_starts=200 --log_interval=500 "${small[@]}" \
      train.eval_interval=0 >"$dir.resumed.log" 2>&1 || fail "resumed run failed: $(cat "$dir.resumed.log")"
    # A finished run resumed trains nothing: no time split or verdict about its evaluation.
    grep -Eq "bound:|^time:" "$dir.resumed.log" && fail "a resumed finished run printed a verdict: $(cat "$dir.resumed.log")"
    steps=$(tail -n +2 "$dir/metrics.csv" | cut -d, -f1 | tr '\n' ' ')
    [[ $steps == "500 1000 1100 " ]] || fail "metrics.csv rows at steps '$steps', expected '500 1000 1100 '"
    last=$(tail -1 "$dir/metrics.csv")
    col=$(head -1 "$dir/metrics.csv" | tr ',' '\n' | grep -n '^eval_return$' | cut -d: -f1)
    [[ -n $(cut -d, -f"$col" <<<"$last") ]] || fail "the last row has no eval_return: $last"
    [[ -n $(cut -d, -f"$(head -1 "$dir/metrics.csv" | tr ',' '\n' | grep -n '^critic_loss$' | cut -d: -f1)" <<<"$last") ]] ||
      fail "the last row has no critic_loss: $last"
    # Resumed from a mid-run checkpoint (no evaluation at its step) with train.steps below it:
    # the run ends at once, its evaluation goes into the row of that step, not a second row.
    rm -rf "$dir"
    "$prog" --run_dir="$dir" train.steps=1200 train.learning_starts=200 --log_interval=300 --checkpoint_interval=900 \
      "${small[@]}" train.eval_interval=0 >"$dir.log" 2>&1 || fail "run failed"
    "$prog" --run_dir="$dir" --resume="$dir/checkpoint-000000000900.ckpt" train.steps=600 train.learning_starts=200 \
      --log_interval=300 "${small[@]}" train.eval_interval=0 >"$dir.resumed.log" 2>&1 ||
      fail "resumed run failed: $(cat "$dir.resumed.log")"
    steps=$(tail -n +2 "$dir/metrics.csv" | cut -d, -f1 | tr '\n' ' ')
    [[ $steps == "300 600 900 " ]] || fail "metrics.csv rows at steps '$steps' after a resume past train.steps, expected '300 600 900 '"
    [[ -n $(tail -1 "$dir/metrics.csv" | cut -d, -f"$col") ]] || fail "the row of step 900 has no eval_return: $(tail -1 "$dir/metrics.csv")"
    ;;
  diskfull)
    # Everything runs in a mount namespace of its own, where a 32 MiB tmpfs is the disk.
    if [[ ${ANVIL_DISKFULL_NS:-} != 1 ]]; then
      for how in -rm -m; do
        if unshare $how sh -c "mkdir -p '$dir.fs' && mount -t tmpfs -o size=1m tmpfs '$dir.fs'" 2>/dev/null; then
          ANVIL_DISKFULL_NS=1 exec unshare $how bash "$0" "$@"
        fi
      done
      echo "SKIPPED: no mount namespace can be made here (unshare -rm or -m), so no small filesystem to fill"
      rm -rf "$dir.fs"
      exit 77
    fi
    mkdir -p "$dir.fs" && mount -t tmpfs -o size=32m tmpfs "$dir.fs" || fail "cannot mount a tmpfs in the namespace"
    run=$dir.fs/run
    # The run is stopped (SIGSTOP) as soon as its first checkpoint and policy.bin are there,
    # the disk is filled, and the run goes on: its next write fails.
    "$prog" --run_dir="$run" train.steps=400000 train.learning_starts=200 --log_interval=300 --checkpoint_interval=1800 \
      --tensorboard=false --progress=off sac.actor.hidden=[64,64] sac.critic.hidden=[64,64] train.eval_episodes=1 \
      train.eval_interval=0 >"$dir.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 6000); do
      [[ -f $run/checkpoint-000000001800.ckpt && -f $run/policy.bin ]] && break
      kill -0 "$pid" 2>/dev/null || fail "the run ended before its first checkpoint"
      sleep 0.01
    done
    kill -STOP "$pid"
    [[ -f $run/checkpoint-000000001800.ckpt ]] || fail "no checkpoint at step 1800"
    [[ ! -f $run/checkpoint-000000003600.ckpt ]] || fail "the run passed its second checkpoint before it could be stopped"
    sum=$(md5sum <"$run/checkpoint-000000001800.ckpt")
    dd if=/dev/zero of="$dir.fs/filler" bs=64k 2>/dev/null  # until the disk is full
    kill -CONT "$pid"
    wait "$pid"
    rc=$?
    [[ $rc == 1 ]] || fail "the run on a full disk exited $rc, expected 1"
    grep -Eq "^error: .*(writing '$run/[^']+' failed \(disk full\?\)|No space left)" "$dir.log" ||
      fail "no error naming the file it could not write: $(tail -3 "$dir.log")"
    [[ $(md5sum <"$run/checkpoint-000000001800.ckpt") == "$sum" ]] || fail "the checkpoint at step 1800 changed"
    compgen -G "$run/*.tmp" >/dev/null && fail "the failed write left a partial file: $(ls "$run")"
    rm -f "$dir.fs/filler"
    "$prog" --run_dir="$run" --resume=auto train.steps=1500 >"$dir.resumed.log" 2>&1 ||
      fail "the resumed run failed: $(cat "$dir.resumed.log")"
    grep -q "resumed from .*checkpoint-000000001800.ckpt at env step 1800" "$dir.resumed.log" ||
      fail "did not resume at step 1800: $(cat "$dir.resumed.log")"
    steps=$(tail -n +2 "$run/metrics.csv" | cut -d, -f1 | tr '\n' ' ')
    [[ $steps == "300 600 900 1200 1500 1800 " ]] ||
      fail "metrics.csv rows at steps '$steps', expected '300 600 900 1200 1500 1800 '"
    umount "$dir.fs"
    ;;
  config)
    mkdir -p "$dir.d"
    out=$("$prog" --config "$dir.d" 2>&1)
    [[ $? == 2 ]] && grep -q "is a directory" <<<"$out" || fail "--config DIR: $out"
    out=$("$prog" --run_dir="$dir" sac.batch_size=512 buffer.capacity=256 "${small[@]}" 2>&1)
    [[ $? == 2 ]] && grep -q "sac.batch_size (512) is larger than buffer.capacity (256)" <<<"$out" ||
      fail "batch_size > capacity: $out"
    out=$("$prog" --run_dir="$dir.2" train.steps=1000 train.learning_starts=1000 "${small[@]}" 2>&1)
    [[ $? == 2 ]] && grep -q "train.learning_starts (1000) is not below train.steps (1000)" <<<"$out" ||
      fail "learning_starts >= steps: $out"
    ;;
  memory)
    out=$("$prog" --run_dir="$dir" buffer.capacity=1500000000 "${small[@]}" 2>&1)
    rc=$?
    [[ $rc == 2 ]] || fail "a buffer that cannot fit exited $rc, expected 2: $out"
    grep -Eq "buffer.capacity=1500000000: UniformBuffer's storage needs [0-9.]+ GiB, but [0-9.]+ [GM]iB is available" <<<"$out" ||
      fail "message: $out"
    ;;
  sweep)
    # 2 seeds x 2 batch sizes, two at a time: four runs in their own directories, a table.
    out=$("$prog" --multirun seed=1,2 sac.batch_size=64,128 --jobs 2 --run_dir="$dir" train.steps=400 \
      train.learning_starts=200 "${small[@]}" 2>&1)
    rc=$?
    echo "$out"
    [[ $rc == 0 ]] || fail "the sweep exited $rc"
    grep -q "sweep: 4 of 4 runs succeeded" <<<"$out" || fail "no summary line"
    [[ $(wc -l <"$dir/sweep.csv") == 5 ]] || fail "sweep.csv: $(cat "$dir/sweep.csv")"
    head -1 "$dir/sweep.csv" | grep -q "^run,seed,sac.batch_size,exit_status,final_eval_return,best_eval_return" ||
      fail "sweep.csv header: $(head -1 "$dir/sweep.csv")"
    grep -q "^3,2,128,0,-[0-9]" "$dir/sweep.csv" || fail "sweep.csv rows: $(cat "$dir/sweep.csv")"
    for run in 0_seed=1_sac.batch_size=64 1_seed=1_sac.batch_size=128 2_seed=2_sac.batch_size=64 3_seed=2_sac.batch_size=128; do
      [[ -f $dir/$run/summary.json ]] || fail "no run directory $run"
    done
    grep -q '"sac.batch_size": 128' "$dir/3_seed=2_sac.batch_size=128/summary.json" || fail "run 3 did not get batch 128"
    grep -q '"run.seed": 2' "$dir/3_seed=2_sac.batch_size=128/summary.json" || fail "run 3 did not get seed 2"
    # A value no run can take is refused before any run starts.
    out=$("$prog" --multirun seed=1,2 sac.batch_size=64,0 --run_dir="$dir.bad" "${small[@]}" 2>&1)
    [[ $? == 2 ]] && grep -q "the run with seed=1 sac.batch_size=0: .*sac.batch_size = 0 is out of range" <<<"$out" ||
      fail "a bad sweep value: $out"
    [[ ! -e $dir.bad ]] || fail "a refused sweep created its directory"
    ;;
  names)
    # Default run directories name the seed and never collide, even started together.
    mkdir -p "$dir" && cd "$dir" || fail "no scratch directory"
    "$prog" --seed=7 train.steps=300 train.learning_starts=200 "${small[@]}" >a.log 2>&1 &
    a=$!
    "$prog" --seed=7 train.steps=300 train.learning_starts=200 "${small[@]}" >b.log 2>&1 &
    b=$!
    wait $a || fail "first run failed: $(cat a.log)"
    wait $b || fail "second run failed: $(cat b.log)"
    n=$(ls -d runs/sac-Pendulum-v1-seed7-* | wc -l)
    [[ $n == 2 ]] || fail "$n run directories: $(ls runs)"
    cd - >/dev/null
    ;;
  provenance)
    "$prog" --run_dir="$dir" train.steps=300 train.learning_starts=200 "${small[@]}" >"$dir.log" 2>&1 || fail "run failed"
    for line in "# env: Pendulum-v1" "# algorithm: anvil::BasicSAC<>" "# buffer: anvil::UniformBuffer" \
                "# parallelism: anvil::SingleDevice" "# precision: anvil::FP32" "# anvil: 0.1.0" "# libtorch: " \
                "# command: $prog --run_dir=$dir" "# host: $(hostname)" "# git_commit: "; do
      grep -qF -- "$line" "$dir/config.yaml" || fail "config.yaml lacks '$line': $(head -20 "$dir/config.yaml")"
    done
    grep -Eq "^# git_commit: ([0-9a-f]{40}(-dirty)?|unknown)$" "$dir/config.yaml" || fail "git_commit line"
    python3 - "$dir/summary.json" <<'PY' || fail "summary.json: $(cat "$dir/summary.json")"
import json, sys
j = json.load(open(sys.argv[1]))
c, p = j["config"], j["provenance"]
assert c["sac.batch_size"] == 256 and c["train.steps"] == 300, c
assert c["sac.tau"] == 0.005 and c["sac.auto_alpha"] is True and c["sac.actor.hidden"] == [16, 16], c
assert c["run.device"] == "auto" and isinstance(j["env_steps"], int), c
assert p["env"] == "Pendulum-v1" and p["algorithm"] == "anvil::BasicSAC<>" and p["precision"] == "anvil::FP32", p
assert j["status"] == "finished", j["status"]
PY
    # The config is in TensorBoard's Text tab too.
    grep -aq "run/config" "$dir"/events.out.tfevents.* || fail "no run/config text summary in the events file"
    # --config reads the written config.yaml back (its provenance lines are comments), to the
    # same config and the same hash: one config, one hash, wherever it is computed.
    printed=$("$prog" --config "$dir/config.yaml" --print-config 2>&1) || fail "config.yaml does not read back: $printed"
    run_hash=$(sed -n '1s/.*config hash \([0-9a-f]\{16\}\).*/\1/p' "$dir/config.yaml")
    printed_hash=$(sed -n '1s/.* hash \([0-9a-f]\{16\}\)$/\1/p' <<<"$printed")
    [[ -n $run_hash && $run_hash == "$printed_hash" ]] ||
      fail "config.yaml says hash '$run_hash', --config of it --print-config says '$printed_hash'"
    grep -q "\"config_hash\": \"$run_hash\"" "$dir/summary.json" || fail "summary.json's hash is not $run_hash"
    diff <(grep -v '^#' "$dir/config.yaml") <(grep -v '^#' <<<"$printed") >/dev/null ||
      fail "the settings printed differ from config.yaml's: $(diff <(grep -v '^#' "$dir/config.yaml") <(grep -v '^#' <<<"$printed"))"
    ;;
  *) echo "unknown case $case_"; exit 2 ;;
esac
rm -rf "$dir" "$dir".* 2>/dev/null
echo "ok: $case_"
