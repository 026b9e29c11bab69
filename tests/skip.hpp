// ANVIL_SKIP(why): ends a test case that cannot run on this machine (no CUDA device, no
// h5py, ...) so that ctest reports it as skipped, never as passed: the line it prints is what
// every doctest test's SKIP_REGULAR_EXPRESSION (tests/CMakeLists.txt) looks for. It goes
// before the case's assertions: ctest then reports the whole case as skipped.
#pragma once

#include <doctest/doctest.h>

#define ANVIL_SKIP(why)                          \
  do {                                           \
    MESSAGE("ANVIL-SKIPPED: " << why);           \
    return;                                      \
  } while (0)
