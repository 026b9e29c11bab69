# cmake -DPYTHON=... -DSCRIPT=... -DWORK_DIR=... -P catches_upward_include.cmake
# The layering check is not a check that cannot fail: a header tree where a core header
# includes the trainer must be refused, naming the header, the line and the layers; and so
# must a header without #pragma once.
file(REMOVE_RECURSE "${WORK_DIR}")
file(WRITE "${WORK_DIR}/anvil/core/bad.hpp" "#pragma once\n#include <anvil/core/error.hpp>\n#include <anvil/train/trainer.hpp>\n")
file(WRITE "${WORK_DIR}/anvil/core/error.hpp" "#pragma once\n")
file(WRITE "${WORK_DIR}/anvil/train/trainer.hpp" "#pragma once\n#include <anvil/core/error.hpp>\n")
file(WRITE "${WORK_DIR}/anvil/core/unguarded.hpp" "#include <anvil/core/error.hpp>\n")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --include "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "the layering check passed a core header that includes the trainer:\n${out}")
endif()
string(FIND "${out}" "include/anvil/core/bad.hpp:3: includes <anvil/train/trainer.hpp>, a layer above it" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "the layering check did not name the upward include:\n${out}")
endif()
string(FIND "${out}" "include/anvil/core/unguarded.hpp:1: does not begin with #pragma once" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "the layering check did not name the header without #pragma once:\n${out}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
