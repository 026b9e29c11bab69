#!/usr/bin/env bash
# scripts/sanitize.sh [BUILD_DIR]
# Builds the test suite with AddressSanitizer and UndefinedBehaviorSanitizer (in BUILD_DIR,
# default build-sanitize) and runs its non-learning tests: every doctest case and process
# test but the learning runs, the DDP launches and the package builds. Any report fails it.
# About 25 minutes on 2 cores, so CI does not run it; run it before a release and after
# changes to buffers, envs, binary files or threads.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-sanitize}
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANVIL_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
targets="anvil_light_tests anvil_tests train_sac_pendulum"
# The MuJoCo suite's tests, when MuJoCo was found.
if grep -Eq "^build tests/anvil_mujoco_tests[ :]" "$build/build.ninja"; then targets="$targets anvil_mujoco_tests"; fi
cmake --build "$build" --target $targets
# LibTorch is not instrumented: its allocations are not ours to check for leaks, and its
# operator new/delete pairs confuse the mismatch check.
export ASAN_OPTIONS=detect_leaks=0:alloc_dealloc_mismatch=0:detect_odr_violation=0:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Learning runs take minutes under the sanitizers and test nothing more about memory.
learning='learns|reaches|to the FP32 bar|also learns|PPO: .*(CartPole|Pendulum)'
ctest --test-dir "$build" -j2 --output-on-failure -LE 'example|tools|package|ddp|compile_fail|single_include|layering' \
  -E "$learning"
echo "sanitize.sh: the non-learning tests ran clean under ASan and UBSan"
