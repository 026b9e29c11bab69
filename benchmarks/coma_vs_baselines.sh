#!/usr/bin/env bash
# COMA, central-V and independent actor-critic on a multi-agent task, several seeds each;
# on the mapping mission also the random and lawnmower flights, and every trained policy
# flown on the same 200 missions as they are (bench_coma's policy and reference modes).
#   benchmarks/coma_vs_baselines.sh BUILD_DIR OUT_DIR CONFIG STEPS "SEEDS" ["CRITICS"]
# e.g. benchmarks/coma_vs_baselines.sh build runs/coma_mapping configs/coma_mapping.yaml 200000 "1 2 3"
# Each run's directory is OUT_DIR/<critic>_seed<k>/ (summary.json, metrics.csv, checkpoints);
# a finished run is not trained again. The table is printed at the end.
set -euo pipefail
build=${1:?build dir}; out=${2:?out dir}; config=${3:?config}; steps=${4:?env steps}; seeds=${5:-"1 2 3"}
critics=${6:-"counterfactual central_v independent"}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$out"
runs=()
for critic in $critics; do
  for seed in $seeds; do
    dir="$out/${critic}_seed${seed}"
    runs+=("$dir")
    [ -f "$dir/summary.json" ] && continue
    rm -rf "$dir"
    "$build/examples/coma" --config "$config" --coma.critic="$critic" --seed="$seed" --train.steps="$steps" \
      --run_dir="$dir" --progress=off > "$out/${critic}_seed${seed}.log" 2>&1
  done
done
mapping=0
grep -q "id: Mapping" "$config" && mapping=1
if [ $mapping = 1 ]; then
  "$build/benchmarks/bench_coma" --bench.mode=reference --bench.seeds="[7]" > "$out/reference.jsonl"
  list=$(printf '%s,' "${runs[@]}"); list="[${list%,}]"
  "$build/benchmarks/bench_coma" --bench.mode=policy --bench.seeds="[7]" --bench.runs="$list" > "$out/policies.jsonl"
fi
python3 - "$out" "$critics" "$seeds" "$mapping" <<'PY'
import json, sys, os, statistics
out, critics, seeds, mapping = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4] == "1"
def fmt(v): return f"{statistics.mean(v):.3f}" + (f" ± {statistics.stdev(v):.3f}" if len(v) > 1 else "")
print("Training runs (evaluation episodes of each run's own evaluations):")
print("| critic | final eval return per seed | mean | best eval (mean) | env steps/s |")
print("|---|---|---|---|---|")
for c in critics:
    finals, bests, speeds = [], [], []
    for s in seeds:
        j = json.load(open(os.path.join(out, f"{c}_seed{s}", "summary.json")))
        finals.append(j["final_eval_return"]); bests.append(j["best_eval_return"]); speeds.append(j["env_steps_per_s"])
    print(f"| {c} | {', '.join(f'{x:.3f}' for x in finals)} | {statistics.mean(finals):.3f} | {statistics.mean(bests):.3f} | {statistics.mean(speeds):.0f} |")
if mapping:
    rows = {}
    for f in ("reference.jsonl", "policies.jsonl"):
        for line in open(os.path.join(out, f)):
            j = json.loads(line)
            p = j["config"]["policy"]
            rows.setdefault(p, {}).setdefault(j["name"], []).append(j["value"])
    print()
    print("The same 200 missions for every policy (mean over the runs' seeds, ± their std):")
    print("| policy | return (weighted entropy removed) | weighted entropy left | entropy left | map error |")
    print("|---|---|---|---|---|")
    for p, m in rows.items():
        print(f"| {p} | {fmt(m['mapping_return'])} | {fmt(m['mapping_weighted_entropy_left'])} | {fmt(m['mapping_entropy_left'])} | {fmt(m['mapping_map_error'])} |")
PY
