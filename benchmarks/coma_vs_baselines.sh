#!/usr/bin/env bash
# COMA, central-V and independent actor-critic on a multi-agent task, several seeds each,
# beside the mapping mission's reference flights (random, lawnmower), one line per run.
#   benchmarks/coma_vs_baselines.sh BUILD_DIR OUT_DIR CONFIG STEPS "SEEDS" ["CRITICS"]
# e.g. benchmarks/coma_vs_baselines.sh build runs/coma_mapping configs/coma_mapping.yaml 150000 "1 2 3"
# Each run's summary.json is in OUT_DIR/<critic>_seed<k>/; the table is printed at the end.
set -euo pipefail
build=${1:?build dir}; out=${2:?out dir}; config=${3:?config}; steps=${4:?env steps}; seeds=${5:-"1 2 3"}
critics=${6:-"counterfactual central_v independent"}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$out"
for critic in $critics; do
  for seed in $seeds; do
    dir="$out/${critic}_seed${seed}"
    [ -f "$dir/summary.json" ] && continue
    rm -rf "$dir"
    "$build/examples/coma" --config "$config" --coma.critic="$critic" --seed="$seed" --train.steps="$steps" \
      --run_dir="$dir" --progress=off > "$out/${critic}_seed${seed}.log" 2>&1
  done
done
if grep -q "id: Mapping" "$config"; then
  "$build/benchmarks/bench_coma" --bench.mode=reference --bench.seeds="[$(echo $seeds | tr ' ' ',')]" > "$out/reference.jsonl"
fi
python3 - "$out" "$critics" "$seeds" <<'PY'
import json, sys, os, statistics
out, critics, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print("| policy | final eval return per seed | mean | best eval (mean) | env steps/s |")
print("|---|---|---|---|---|")
for c in critics:
    finals, bests, speeds = [], [], []
    for s in seeds:
        j = json.load(open(os.path.join(out, f"{c}_seed{s}", "summary.json")))
        finals.append(j["final_eval_return"]); bests.append(j["best_eval_return"]); speeds.append(j["env_steps_per_s"])
    print(f"| {c} | {', '.join(f'{x:.3f}' for x in finals)} | {statistics.mean(finals):.3f} | {statistics.mean(bests):.3f} | {statistics.mean(speeds):.0f} |")
ref = os.path.join(out, "reference.jsonl")
if os.path.exists(ref):
    by = {}
    for line in open(ref):
        j = json.loads(line)
        if j["name"] == "mapping_entropy_removed":
            by.setdefault(j["config"]["policy"], []).append(j["value"])
    for p, v in by.items():
        print(f"| {p} (reference) | {', '.join(f'{x:.3f}' for x in v)} | {statistics.mean(v):.3f} | | |")
PY
