# cmake -DPROGRAM= -DARGS=a;b -DEXPECT_RC=n -DEXPECT=text [-DREGEX=1] [-DCLEAN_DIR=dir] -P run_expect.cmake
# Runs PROGRAM with ARGS; passes when it exits with EXPECT_RC (a crash never does) and its
# output contains EXPECT (a regular expression when REGEX is set). CLEAN_DIR (a run
# directory the program writes) is removed first, so the test can run again.
if(CLEAN_DIR)
  file(REMOVE_RECURSE "${CLEAN_DIR}")
endif()
execute_process(COMMAND "${PROGRAM}" ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}\nstdout:\n${out}\nstderr:\n${err}")
endif()
set(all "${out}${err}")
if(REGEX)
  if(NOT all MATCHES "${EXPECT}")
    message(FATAL_ERROR "output does not match '${EXPECT}':\n${all}")
  endif()
else()
  string(FIND "${all}" "${EXPECT}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "output does not contain '${EXPECT}':\n${all}")
  endif()
endif()
