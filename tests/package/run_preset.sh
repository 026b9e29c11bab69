#!/usr/bin/env bash
# tests/package/run_preset.sh SOURCE_DIR WORK_DIR
# The `cuda` preset (CMakePresets.json) as a GPU machine without anvil's packages uses it
# (scripts/gpu-check.sh), checked against this machine's PyTorch (Debian's python3-torch, the
# CPU LibTorch): the dependencies as files only (scripts/gpu-deps.sh into WORK_DIR/deps, the
# system's packages and prefixes hidden from CMake), LibTorch from the PyTorch of python3
# (ANVIL_TORCH_PYTHON); one benchmark built with it runs and prints its figures.
set -euo pipefail
src=$1 work=$2
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "ANVIL-SKIPPED: no PyTorch for /usr/bin/python3 (Debian: python3-torch), so no LibTorch of a PyTorch installation to check the preset against"
  exit 0
fi
rm -rf "$work"
mkdir -p "$work"
"$src/scripts/gpu-deps.sh" "$work/deps"
hide=()
for p in yaml-cpp Boost range-v3 nlohmann_json doctest mujoco pybind11; do hide+=("-DCMAKE_DISABLE_FIND_PACKAGE_$p=ON"); done
cd "$src"
# The preset's own build directory is the checkout's build-cuda; -B puts it in WORK_DIR.
cmake --preset cuda -B "$work/build" "-DCMAKE_PREFIX_PATH=$work/deps" "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/" "${hide[@]}" \
  -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON -DANVIL_BUILD_PYTHON_MODULE=OFF >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
grep '^-- anvil' "$work/configure.log"
expect() {
  grep -q -- "$1" "$work/configure.log" || { echo "the configure log does not say: $1"; exit 1; }
}
expect "anvil: LibTorch .* from .*python3's PyTorch at "
for dep in yaml-cpp Boost range-v3 nlohmann_json doctest; do expect "anvil: $dep from its files: $work/deps/include"; done
expect "anvil: MuJoCo from its files: $work/deps/lib/libmujoco.so"
expect "anvil: Push-T on Chipmunk2D (envs/chipmunk/) ON"
cmake --build "$work/build" --target bench_precision >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
out=$("$work/build/benchmarks/bench_precision" 'bench.hidden=[16]' 'bench.batch=[32]' bench.seconds=0.02 bench.rounds=1 bench.device=cpu)
echo "$out"
grep -q '"name": "sac_update_precision_vs_fp32"' <<<"$out" || { echo "bench_precision printed no figures"; exit 1; }
rm -rf "$work"
