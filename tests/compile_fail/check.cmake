# cmake -DBUILD_DIR=... -DTARGET=... -DSRC=... [-DNINJA=... -DOBJECT=...] [-DEXPECT_OK=1] -P check.cmake
# Passes when compiling TARGET's source fails, its first error carries the sentence on SRC's
# `// expect:` line, and exactly one static_assert fired (EXPECT_OK: when it compiles).
#
# With Ninja (NINJA and OBJECT given) the compiler runs directly, with the command the build
# would run (`ninja -t commands`, which only reads the build files), and with -fsyntax-only,
# so that no two ninja processes write the build tree's logs at once: these checks run in
# parallel with each other and with every other test. Otherwise the target is built.
if(NOT EXPECT_OK)
  file(READ "${SRC}" text)
  string(REGEX MATCH "// expect: [^\n]*" expect_line "${text}")
  string(REGEX REPLACE "^// expect: " "" expect "${expect_line}")
  if(expect STREQUAL "")
    message(FATAL_ERROR "${SRC} has no '// expect: <sentence>' line")
  endif()
endif()
if(NINJA AND OBJECT)
  file(RELATIVE_PATH object "${BUILD_DIR}" "${OBJECT}")  # as build.ninja names it
  execute_process(COMMAND "${NINJA}" -C "${BUILD_DIR}" -t commands "${object}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE commands ERROR_VARIABLE err)
  string(STRIP "${commands}" commands)
  string(REGEX REPLACE "^.*\n" "" command "${commands}")  # the last: the object's own compile
  string(FIND "${command}" "${SRC}" at)
  if(NOT rc EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "ninja gave no compile command for ${OBJECT} (${rc}): ${err}\n${commands}")
  endif()
  execute_process(COMMAND sh -c "${command} -fsyntax-only" WORKING_DIRECTORY "${BUILD_DIR}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
else()
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
endif()
if(EXPECT_OK)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TARGET} must compile, but:\n${out}")
  endif()
  message(STATUS "compiled as intended: ${SRC}")
  return()
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but this combination must be rejected")
endif()
string(REGEX MATCH "error: [^\n]*" first_error "${out}")
string(FIND "${first_error}" "${expect}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "first error is not the expected sentence.\nexpected: ${expect}\nfirst error: ${first_error}\n\nfull output:\n${out}")
endif()
string(REGEX MATCHALL "static assertion failed" asserts "${out}")
list(LENGTH asserts n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected exactly one static_assert to fire, got ${n}:\n${out}")
endif()
message(STATUS "rejected as intended: ${expect}")
