#!/usr/bin/env bash
# DDP as users meet it: real processes, real Gloo over loopback, real signals.
#   ddp_faults.sh CASE DDP_SAC ONE_PER_NODE WORK_DIR [DDP_PPO]
# CASE:
#   launcher-kill   a rank of a launched run is killed: the launcher names it, stops the
#                   other, exits non-zero in bounded time, and leaves no process behind
#   joined-kill     ranks started by hand (RANK, WORLD_SIZE, ... as torchrun sets them):
#                   kill rank 1, then (another run) rank 0; the survivor names the dead rank
#   hang            a rank stops answering (SIGSTOP): the other fails after parallel.timeout_s
#   rendezvous      a rank that cannot reach MASTER_ADDR:MASTER_PORT names the address
#   multi-node      two launchers (NNODES=2, NODE_RANK=0/1, one rank each) train together
#   learns          DDP<2> learns Pendulum (fixed seed) and its ranks end bitwise identical
#   resume          a DDP run resumes from its checkpoint: rank 0 reads it, the others
#                   take its state, and the ranks stay in sync
#   signal          SIGTERM to the launcher: every rank stops at the same step, rank 0
#                   checkpoints, exit 143; --resume=auto continues with the ranks in sync
#   ppo             Trainer<PPO, RolloutBuffer, DDP<2>> with normalised observations
#                   solves CartPole (fixed seed) and its ranks end bitwise identical
#   slurm           two tasks as srun starts them (SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_ID,
#                   SLURM_NTASKS, SLURM_STEP_NODELIST, SLURM_JOB_ID; no RANK, no MASTER_*):
#                   they find each other at the step's first node on the port derived from
#                   the job id, train together and end in sync
set -u
case_name=$1 ddp=$2 one=$3 work=$4 ppo=${5:-}
rm -rf "$work" && mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1
fail() { echo "FAIL ($case_name): $*"; for f in "$work"/*.log; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
elapsed() { python3 -c "print(round($(now) - $1, 2))"; }
# The pid of the process of ours (its run directory in its arguments) with RANK=$2.
rank_pid() {
  for p in $(pgrep -f -- "--run_dir=$1"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
  done
}
# Waits until the run in $1 has updated (its rank 0 printed a log line with updates).
wait_training() {
  for _ in $(seq 1 600); do
    grep -Eq ' [1-9][0-9]* updates' "$1" 2>/dev/null && return 0
    grep -q 'error:' "$1" 2>/dev/null && fail "the run failed before training"
    sleep 0.1
  done
  fail "the run did not start training within 60 s"
}
# Waits for pid $1 to end, at most $2 seconds; prints the seconds it took.
wait_gone() {
  local t0; t0=$(now)
  for _ in $(seq 1 $(( $2 * 10 ))); do kill -0 "$1" 2>/dev/null || { elapsed "$t0"; return 0; }; sleep 0.1; done
  fail "pid $1 still runs after $2 s"
}
# Waits for the two processes in $pid0 and $pid1; fails unless both exit 0.
both_succeed() {
  wait "$pid0"; local rc0=$?
  wait "$pid1"; local rc1=$?
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || fail "exit statuses $rc0 and $rc1"
}
long=(--train.steps=10000000 --progress=lines --log_interval=100)

case $case_name in
launcher-kill)
  "$ddp" "${long[@]}" --parallel.timeout_s=20 --run_dir="$work/run" > "$work/launcher.log" 2>&1 &
  launcher=$!
  wait_training "$work/launcher.log"
  victim=$(rank_pid "$work/run" 1)
  [ -n "$victim" ] || fail "no rank 1 found"
  kill -9 "$victim"
  took=$(wait_gone "$launcher" 30)
  wait "$launcher"; rc=$?
  [ "$rc" -ne 0 ] || fail "the launcher exited 0 after a rank was killed"
  grep -q "launcher: rank 1 (pid $victim) was killed by signal 9 (SIGKILL)" "$work/launcher.log" ||
    fail "the launcher did not name rank 1"
  sleep 0.5
  left=$(pgrep -f -- "--run_dir=$work/run" || true)
  [ -z "$left" ] || fail "processes left behind: $left"
  echo "ok: launcher exited $rc ${took}s after rank 1 was killed, naming it; no process left"
  ;;
joined-kill)
  for victim_rank in 1 0; do
    port=$(free_port)
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$ddp" "${long[@]}" --parallel.timeout_s=20 --run_dir="$work/run$victim_rank" > "$work/kill$victim_rank.rank$r.log" 2>&1 &
      eval "pid$r=$!"
    done
    wait_training "$work/kill$victim_rank.rank0.log"
    survivor_rank=$((1 - victim_rank))
    victim=$(eval echo "\$pid$victim_rank") survivor=$(eval echo "\$pid$survivor_rank")
    kill -9 "$victim"
    took=$(wait_gone "$survivor" 30)
    wait "$survivor"; rc=$?
    wait "$victim" 2>/dev/null
    log="$work/kill$victim_rank.rank$survivor_rank.log"
    [ "$rc" -eq 3 ] || fail "rank $survivor_rank exited $rc, not 3"
    if [ "$victim_rank" = 1 ]; then
      grep -q "error: rank 0: .* failed: rank 1 (pid $victim) has died" "$log" || fail "rank 0 did not name rank 1"
    else
      grep -q "error: rank 1: .* failed: rank 0, which serves the rendezvous store at 127.0.0.1:$port, is unreachable: it has died" "$log" ||
        fail "rank 1 did not name rank 0"
    fi
    echo "ok: rank $victim_rank killed; rank $survivor_rank exited $rc after ${took}s naming it"
  done
  ;;
hang)
  port=$(free_port)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$ddp" "${long[@]}" --parallel.timeout_s=4 --run_dir="$work/run" > "$work/rank$r.log" 2>&1 &
    eval "pid$r=$!"
  done
  wait_training "$work/rank0.log"
  kill -STOP "$pid1"
  took=$(wait_gone "$pid0" 30)
  wait "$pid0"; rc=$?
  kill -9 "$pid1"; wait "$pid1" 2>/dev/null
  [ "$rc" -eq 3 ] || fail "rank 0 exited $rc, not 3"
  grep -q "did not answer within parallel.timeout_s (4 s)" "$work/rank0.log" || fail "no timeout message"
  echo "ok: rank 1 stopped answering; rank 0 exited $rc after ${took}s (parallel.timeout_s=4)"
  ;;
rendezvous)
  port=$(free_port)  # nobody listens there
  t0=$(now)
  RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$ddp" --smoke --parallel.timeout_s=3 --run_dir="$work/run" > "$work/rank1.log" 2>&1
  rc=$?
  [ "$rc" -eq 3 ] || fail "exited $rc, not 3"
  grep -q "error: rank 1: cannot reach the rendezvous at 127.0.0.1:$port within 3 s" "$work/rank1.log" ||
    fail "the address tried is not in the message"
  echo "ok: exited $rc after $(elapsed "$t0")s naming 127.0.0.1:$port"
  ;;
multi-node)
  port=$(free_port)
  for n in 0 1; do
    NNODES=2 NODE_RANK=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$one" --smoke --progress=lines --run_dir="$work/node$n" > "$work/node$n.log" 2>&1 &
    eval "pid$n=$!"
  done
  both_succeed
  grep -q "launcher: starting 1 rank(s) on node 1 of 2 (world of 2)" "$work/node1.log" || fail "node 1 did not launch"
  grep -q "world: 2 rank(s) on 2 nodes, gloo" "$work/node0.log" || fail "rank 0 is not in a world of 2 nodes"
  grep -q "ranks in sync: all 2 ranks hold bitwise-identical" "$work/node0.log" || fail "no in-sync check"
  [ -f "$work/node0/summary.json" ] && [ ! -e "$work/node1/summary.json" ] || fail "only rank 0 writes the run files"
  echo "ok: two nodes on loopback trained together"
  ;;
learns)
  "$ddp" --seed=1 --train.steps=10000 --train.eval_interval=2000 --progress=lines --log_interval=2000 \
    --run_dir="$work/run" > "$work/learns.log" 2>&1 || fail "exit status $?"
  grep -q "ranks in sync: all 2 ranks hold bitwise-identical parameters and optimizer state" "$work/learns.log" ||
    fail "no in-sync line"
  final=$(python3 -c "import json; print(json.load(open('$work/run/summary.json'))['final_eval_return'])")
  python3 -c "import sys; sys.exit(0 if $final >= -300 else 1)" || fail "final eval return $final < -300"
  echo "ok: DDP<2> reached eval return $final in 10,000 env steps; ranks bitwise identical"
  ;;
resume)
  "$ddp" --seed=2 --train.steps=1600 --train.learning_starts=400 --checkpoint_interval=800 --progress=lines \
    --run_dir="$work/run" > "$work/first.log" 2>&1 || fail "first run: exit status $?"
  [ -f "$work/run/checkpoint-000000000800.ckpt" ] || fail "no checkpoint at step 800"
  rm "$work/run/checkpoint-000000001600.ckpt"
  "$ddp" --seed=2 --train.steps=2400 --train.learning_starts=400 --checkpoint_interval=800 --progress=lines \
    --run_dir="$work/run" --resume=auto > "$work/resumed.log" 2>&1 || fail "resumed run: exit status $?"
  grep -q "resumed from .*checkpoint-000000000800.ckpt at env step 800" "$work/resumed.log" || fail "did not resume at 800"
  grep -q "ranks in sync: all 2 ranks hold bitwise-identical .* env step 2400" "$work/resumed.log" || fail "not in sync"
  grep -q "done: 2400 env steps" "$work/resumed.log" || fail "did not finish at 2400"
  echo "ok: resumed at step 800 with 2 ranks, in sync at 2400"
  ;;
signal)
  # SIGTERM to the launcher (a cluster's preemption): it reaches each rank once, they stop
  # at the same step, rank 0 checkpoints, everyone exits 143; --resume=auto continues in sync.
  "$ddp" "${long[@]}" --train.learning_starts=400 --run_dir="$work/run" > "$work/launcher.log" 2>&1 &
  launcher=$!
  wait_training "$work/launcher.log"
  kill -TERM "$launcher"
  wait_gone "$launcher" 60 >/dev/null
  wait "$launcher"; rc=$?
  [ "$rc" -eq 143 ] || fail "the launcher exited $rc after SIGTERM, expected 143"
  grep -q "stopping on SIGTERM at env step" "$work/launcher.log" || fail "rank 0 did not say it was stopping"
  step=$(sed -n 's/.*stopped: by SIGTERM at env step \([0-9]*\);.*/\1/p' "$work/launcher.log" | head -1)
  [ -n "$step" ] || fail "no 'stopped:' line"
  [ "$(grep -c "stopped: by SIGTERM at env step $step;" "$work/launcher.log")" -eq 2 ] || fail "the ranks did not stop at the same step"
  ckpt=$(printf "%s/run/checkpoint-%012d.ckpt" "$work" "$step")
  [ -f "$ckpt" ] || fail "no checkpoint at step $step"
  grep -q "launcher: rank" "$work/launcher.log" && fail "the launcher treated the stop as a failure"
  "$ddp" --train.steps=$((step + 400)) --train.learning_starts=400 --progress=lines --run_dir="$work/run" \
    --resume=auto > "$work/resumed.log" 2>&1 || fail "resumed run: exit status $?"
  grep -q "resumed from .*at env step $step" "$work/resumed.log" || fail "did not resume at $step"
  grep -q "ranks in sync: all 2 ranks hold bitwise-identical" "$work/resumed.log" || fail "not in sync after resuming"
  echo "ok: SIGTERM stopped both ranks at step $step with a checkpoint; resumed in sync"
  ;;
ppo)
  "$ppo" --seed=1 --progress=lines --log_interval=10000 --run_dir="$work/run" > "$work/ppo.log" 2>&1 ||
    fail "exit status $?"
  grep -q "ranks in sync: all 2 ranks hold bitwise-identical parameters and optimizer state" "$work/ppo.log" ||
    fail "no in-sync line"
  final=$(python3 -c "import json; print(json.load(open('$work/run/summary.json'))['final_eval_return'])")
  python3 -c "import sys; sys.exit(0 if $final >= 475 else 1)" || fail "final eval return $final < 475"
  echo "ok: PPO with DDP<2> reached eval return $final in 100,000 env steps; ranks bitwise identical"
  ;;
slurm)
  # A job id whose derived port (10000 + 20 x (id mod 1000) + step) is free here.
  job=$(python3 -c '
import random, socket
for _ in range(200):
    j = random.randrange(1, 10**6)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 10000 + 20 * (j % 1000))); print(j); break
    except OSError:
        pass
    finally:
        s.close()')
  [ -n "$job" ] || fail "no free port in 10000-29999"
  port=$((10000 + 20 * (job % 1000)))
  for r in 0 1; do
    env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u MASTER_ADDR -u MASTER_PORT \
      SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 \
      SLURM_STEP_NUM_NODES=1 SLURM_STEP_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=2 SLURM_JOB_ID=$job \
      "$ddp" --smoke --progress=lines --run_dir="$work/run" > "$work/task$r.log" 2>&1 &
    eval "pid$r=$!"
  done
  both_succeed
  grep -q "world: 2 rank(s), gloo, joined via SLURM step $job.0, rendezvous localhost:$port" "$work/task0.log" ||
    fail "task 0 did not join a world of 2 through SLURM's variables at localhost:$port"
  grep -q "ranks in sync: all 2 ranks hold bitwise-identical" "$work/task0.log" || fail "no in-sync check"
  grep -q "launcher:" "$work/task0.log" && fail "a task launched ranks of its own"
  echo "ok: two srun-style tasks trained together (rendezvous localhost:$port from SLURM_JOB_ID=$job)"
  ;;
*) echo "unknown case $case_name"; exit 2 ;;
esac
