# cmake -DTEST_EXECUTABLE=... -DTEST_WORKING_DIR=... -DCTEST_FILE=... [-DTEST_SKIP_REGEX=...]
#       [-DTEST_ENVIRONMENT=A=1|B=2] -P doctest_discover.cmake
# Writes CTEST_FILE: one ctest entry per doctest case of TEST_EXECUTABLE, each labelled with
# its test suite (the suite `gpu` marks the cases that need CUDA), with the skip expression
# and the environment given (every entry of it: TEST_ENVIRONMENT separates them with '|').
#
# doctest's own doctest_discover_tests(ADD_LABELS) asks the program for each case's suite
# in a run of its own, one start of LibTorch per case (about 0.3 s each: minutes of every
# build for a few hundred cases); this asks once for the cases and once per suite.
function(list_of out)
  execute_process(COMMAND "${TEST_EXECUTABLE}" ${ARGN} OUTPUT_VARIABLE text RESULT_VARIABLE rc
                  WORKING_DIRECTORY "${TEST_WORKING_DIR}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TEST_EXECUTABLE} ${ARGN} exited ${rc}:\n${text}")
  endif()
  string(REPLACE ";" "\\;" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(names "")
  foreach(line IN LISTS lines)
    if(line STREQUAL "" OR line MATCHES "^=+$" OR line MATCHES "^\\[doctest\\] ")
      continue()
    endif()
    list(APPEND names "${line}")
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

# An argument of the generated script, quoted as a bracket argument when it needs it.
function(quoted out value)
  if(value MATCHES "[^-./:a-zA-Z0-9_]")
    set(${out} "[==[${value}]==]" PARENT_SCOPE)
  else()
    set(${out} "${value}" PARENT_SCOPE)
  endif()
endfunction()

list_of(cases --list-test-cases)
list_of(suites --list-test-suites)
foreach(suite IN LISTS suites)
  list_of(in_suite --list-test-cases "--test-suite=${suite}")
  foreach(name IN LISTS in_suite)
    string(MD5 key "${name}")
    list(APPEND "labels_${key}" "${suite}")
  endforeach()
endforeach()

string(REPLACE "|" ";" environment "${TEST_ENVIRONMENT}")
quoted(exe "${TEST_EXECUTABLE}")
quoted(dir "${TEST_WORKING_DIR}")
set(script "")
foreach(name IN LISTS cases)
  string(REPLACE "," "\\," filter "${name}")  # doctest splits a filter at commas
  quoted(test "${name}")
  quoted(arg "--test-case=${filter}")
  string(APPEND script "add_test(${test} ${exe} ${arg})\n")
  set(props "WORKING_DIRECTORY ${dir}")
  if(TEST_SKIP_REGEX)
    quoted(skip "${TEST_SKIP_REGEX}")
    string(APPEND props " SKIP_REGULAR_EXPRESSION ${skip}")
  endif()
  if(environment)
    string(APPEND props " ENVIRONMENT [==[${environment}]==]")
  endif()
  string(MD5 key "${name}")
  if(DEFINED "labels_${key}")
    string(APPEND props " LABELS [==[${labels_${key}}]==]")
  endif()
  string(APPEND script "set_tests_properties(${test} PROPERTIES ${props})\n")
endforeach()
file(WRITE "${CTEST_FILE}" "${script}")
