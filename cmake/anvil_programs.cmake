# How anvil's own tests, examples and benchmarks are built: a shared precompiled header for
# torch that examples and tools opt into (see anvil_program), the same warnings everywhere,
# and a tuned environment for running them.

# GCC 12 reports false positives inside yaml-cpp and libstdc++ headers (dangling-pointer,
# restrict); they are not ours and not real.
set(ANVIL_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-dangling-pointer -Wno-restrict)

# The precompiled header lives in a tiny object library; every heavy program reuses it.
# anvil::compiled is position-independent (the Python module, python/, holds it), and GCC
# refuses a header precompiled with other -fPIC/-fPIE settings, so it has a twin built PIC.
function(anvil_pch_library name)
  add_library(${name} OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
  target_link_libraries(${name} PUBLIC anvil::anvil)
  target_compile_options(${name} PRIVATE ${ANVIL_WARNINGS})
  target_precompile_headers(${name} PRIVATE
    <torch/torch.h> <yaml-cpp/yaml.h> <boost/pfr.hpp>
    <algorithm> <chrono> <cstdint> <functional> <map> <memory> <optional> <span> <string>
    <string_view> <thread> <vector>)
endfunction()
anvil_pch_library(anvil_pch)
if(ANVIL_BUILD_COMPILED)
  anvil_pch_library(anvil_pch_pic)
  set_target_properties(anvil_pch_pic PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()

# Test programs are optimised less than users' programs: at -O1 a Trainer translation unit
# compiles in about half the time of -O3 (GCC 12 here: mujoco_train_test.cpp 49 s against
# ~90 s), and the learning tests, whose time is mostly LibTorch's and MuJoCo's, run ~25%
# longer. Examples and benchmarks keep the build type's flags: they are what users run and
# what the figures in benchmarks/RESULTS.md are measured on. Empty: the build type's flags.
set(ANVIL_TEST_OPTIMIZE "-O1" CACHE STRING
    "Optimisation flag for anvil's test programs in optimised builds (empty: the build type's)")
function(anvil_test_optimize target)
  if(ANVIL_TEST_OPTIMIZE)
    target_compile_options(${target} PRIVATE $<$<CONFIG:Release,RelWithDebInfo,MinSizeRel>:${ANVIL_TEST_OPTIMIZE}>)
  endif()
endfunction()

# anvil_program(<name> <sources>... [LIGHT] [TEST] [PCH]): an executable linked with anvil.
# LIGHT ones include no torch. TEST ones are optimised with ANVIL_TEST_OPTIMIZE. PCH ones
# (the examples and tools) reuse the torch precompiled header. The others go without it, so
# that the header a test file includes first (the one it tests; some benchmarks include
# first a header they use) is checked there for compiling on its own, as a user's program
# includes it: the precompiled header would put all of torch and the common standard
# headers before it (tests/CMakeLists.txt). Test files that include the torch headers they
# use compile faster without it than they did with it (docs/benchmarks/build.md).
function(anvil_program name)
  cmake_parse_arguments(ARG "LIGHT;TEST;PCH" "" "" ${ARGN})
  if(ARG_LIGHT AND ARG_PCH)
    message(FATAL_ERROR "anvil_program(${name}): LIGHT includes no torch, so it takes no torch precompiled header (PCH)")
  endif()
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE anvil::anvil)
  anvil_target_provenance(${name})
  target_compile_options(${name} PRIVATE ${ANVIL_WARNINGS})
  if(ARG_TEST)
    anvil_test_optimize(${name})
  endif()
  if(ARG_PCH)
    target_precompile_headers(${name} REUSE_FROM anvil_pch)
  endif()
endfunction()

# Environment for running anvil programs from ctest: BLAS and OpenMP settings that are
# measured to be faster here (see README, "Performance settings"). Applied to tests only;
# users choose their own.
set(ANVIL_RUN_ENV "OMP_WAIT_POLICY=PASSIVE")
if(EXISTS /proc/cpuinfo)
  file(STRINGS /proc/cpuinfo _anvil_flags REGEX "^flags" LIMIT_COUNT 1)
  if(_anvil_flags MATCHES " avx512f " AND _anvil_flags MATCHES " avx512bw ")
    # Pin OpenBLAS's AVX-512 kernels so test timings do not depend on an inherited
    # OPENBLAS_CORETYPE (some shells force AVX2 ones).
    list(APPEND ANVIL_RUN_ENV "OPENBLAS_CORETYPE=SkylakeX")
  endif()
endif()
