#!/usr/bin/env bash
# Envs in Python stepped in this process (env.workers=0) by two builds of the bridge, side
# by side in interleaved rounds: BUILD_A and BUILD_B are build folders (e.g. one configured
# with -DANVIL_PYTHON_STATIC=ON, one with OFF). Each round runs each build's
# bench_python_envs (1 and 16 envs, no workers), which measures its own bridge beside the
# bare Python loop under python3 and under the interpreter its bridge embeds. Prints the
# JSON lines, each with "bridge" (the build's interpreter: PIC archive or shared library)
# and "round" added to its config, then one summary line per build and env count: the
# median over rounds of anvil / bare loop under python3 (issue 44's figure, target 0.85).
#
# Usage: benchmarks/python_bridge_ab.sh BUILD_A BUILD_B [ROUNDS] [SECONDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { sed -n 2,11p "$0"; exit 2; }
a=$1 b=$2 rounds=${3:-3} seconds=${4:-1}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE ANVIL_PYTHON_ENVS  # each bench loads its own build's bridge
for build in "$a" "$b"; do
  [ -x "$build/benchmarks/bench_python_envs" ] || { echo "python_bridge_ab: $build/benchmarks/bench_python_envs is not built (ninja -C $build benchmarks/bench_python_envs)" >&2; exit 1; }
done
out=$(mktemp); trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for build in "$a" "$b"; do
    PYTHONPATH="$here/../tests/python/envs" "$build/benchmarks/bench_python_envs" --bench.seconds="$seconds" \
      "--bench.workers=[]" "--bench.num_envs=[1,16]" |
      /usr/bin/python3 -c '
import json, sys
rows = [json.loads(line) for line in sys.stdin]
# the interpreter the build embeds, as its bench names it: "libpython (embedded: PIC archive)"
bridge = next(r["config"]["interpreter"] for r in rows if "interpreter" in r["config"])
for j in rows:
    j["config"]["bridge"] = bridge.split(": ")[-1].rstrip(")")
    j["config"]["round"] = int(sys.argv[1])
    print(json.dumps(j))' "$r" | tee -a "$out"
  done
done
/usr/bin/python3 - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["config"]["bridge"], r["config"]["num_envs"]) for r in rows})
for bridge, n in keys:
    v = [r["value"] for r in rows if r["name"] == "python_env_vs_bare_loop" and "interpreter" not in r["config"]
         and r["config"]["bridge"] == bridge and r["config"]["num_envs"] == n]
    print(json.dumps({"name": "python_env_vs_bare_loop_median", "bridge": bridge, "num_envs": n,
                      "rounds": v, "median": statistics.median(v), "target": 0.85}))
EOF
