#!/usr/bin/env bash
# kill_mid_save.sh PROGRAM DIR
# A run killed with SIGKILL while it writes a checkpoint (its buffer file or the checkpoint
# itself, caught by the temporary file the write goes to) leaves the previous checkpoint
# intact: --resume=auto then continues from the latest complete one and finishes.
set -uo pipefail
prog=$1
dir=$2
rm -rf "$dir"
args=(--progress=off train.eval_interval=0 train.eval_episodes=1 train.learning_starts=200
      --checkpoint_interval=100 --checkpoint_buffer=true --keep_last=2
      sac.actor.hidden=[16,16] sac.critic.hidden=[16,16])
"$prog" --run_dir="$dir" train.steps=200000 "${args[@]}" >"$dir.log" 2>&1 &
pid=$!
caught=0
for _ in $(seq 1 20000); do
  if compgen -G "$dir/checkpoint-*.ckpt" >/dev/null && compgen -G "$dir/*.tmp" >/dev/null; then
    kill -9 "$pid"
    caught=1
    break
  fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.001
done
[[ $caught == 1 ]] || { kill -9 "$pid" 2>/dev/null; echo "never caught a checkpoint being written"; cat "$dir.log"; exit 1; }
wait "$pid"
rc=$?
[[ $rc == 137 ]] || { echo "the run was not killed by SIGKILL (exit status $rc)"; exit 1; }
echo "killed while writing: $(cd "$dir" && ls *.tmp)"
latest=$(cd "$dir" && ls checkpoint-*.ckpt | sort | tail -1)
step=$((10#$(echo "$latest" | sed 's/checkpoint-\([0-9]*\)\.ckpt/\1/')))
out=$("$prog" --run_dir="$dir" --resume=auto train.steps=$((step + 200)) "${args[@]}" 2>&1)
rc=$?
echo "$out"
[[ $rc == 0 ]] || { echo "the resumed run failed (exit status $rc)"; exit 1; }
grep -q "resumed from .*$latest at env step $step" <<<"$out" || { echo "did not resume from $latest"; exit 1; }
grep -q "done: $((step + 200)) env steps" <<<"$out" || { echo "the resumed run did not finish"; exit 1; }
rm -rf "$dir" "$dir.log"
