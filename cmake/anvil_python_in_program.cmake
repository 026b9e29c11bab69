# anvil_python_in_program(<target>): links the Python interpreter's own archive
# (libpython3.X.a: the non-PIC build Debian's python3 is linked from, in libpython3.X-dev)
# whole into the program <target>, which is then not a position-independent executable
# (-no-pie) and exports the archive's symbols and nothing of its own (a dynamic list), for
# numpy's extension modules and anvil's bridge. Such a program runs Python at python3's speed
# (10-18% faster than the shared libpython; docs/python.md). It starts no interpreter until a
# `--env.id=python:...` env is named; envs/python_env.hpp then finds Python's symbols in the
# program itself and loads libanvil_python_envs_host.so, the bridge built with no Python. Nothing is
# done where anvil found no archive (ANVIL_PYTHON_ARCHIVE empty), where the archive anvil was
# built against is gone (an installed anvil, the Python dev package since removed or
# upgraded: said once), or ANVIL_PYTHON_IN_PROGRAM is OFF. <target> must be an executable (the
# archive is not position-independent). The archive goes straight onto the target's
# LINK_LIBRARIES, so the program's own target_link_libraries calls may take either form
# (keyword, `PRIVATE ...`, or plain): CMake refuses a target that mixes the two.
function(anvil_python_in_program target)
  get_target_property(_type ${target} TYPE)
  if(NOT _type STREQUAL "EXECUTABLE")
    message(FATAL_ERROR "anvil_python_in_program(${target}): ${target} is not an executable (its type: ${_type}); "
                        "the interpreter's archive, not position-independent, links only into a program")
  endif()
  if(NOT ANVIL_PYTHON_ARCHIVE OR NOT ANVIL_PYTHON_IN_PROGRAM OR NOT EXISTS "${ANVIL_PYTHON_DYNLIST}")
    return()
  endif()
  if(NOT EXISTS "${ANVIL_PYTHON_ARCHIVE}")
    get_property(_said GLOBAL PROPERTY ANVIL_PYTHON_ARCHIVE_GONE_SAID)
    if(NOT _said)
      message(STATUS "anvil: ${ANVIL_PYTHON_ARCHIVE}, the interpreter's archive anvil was built against, is not "
                     "here: anvil_python_in_program leaves ${target} (and any other) on the shared bridge")
      set_property(GLOBAL PROPERTY ANVIL_PYTHON_ARCHIVE_GONE_SAID TRUE)
    endif()
    return()
  endif()
  target_link_options(${target} PRIVATE -no-pie "LINKER:--dynamic-list=${ANVIL_PYTHON_DYNLIST}")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${ANVIL_PYTHON_DYNLIST}" "${ANVIL_PYTHON_ARCHIVE}")
  # As target_link_libraries(PRIVATE) would, without taking a side in its two forms.
  set_property(TARGET ${target} APPEND PROPERTY LINK_LIBRARIES "-Wl,--whole-archive" "${ANVIL_PYTHON_ARCHIVE}"
               "-Wl,--no-whole-archive" ${ANVIL_PYTHON_ARCHIVE_LIBS})
  if(TARGET anvil_python_envs_host)  # anvil's own build (or add_subdirectory): built before the program
    add_dependencies(${target} anvil_python_envs_host)
  endif()
endfunction()
