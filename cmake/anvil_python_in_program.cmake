# anvil_python_in_program(<target>): links the Python interpreter's own archive
# (libpython3.X.a: the non-PIC build Debian's python3 is linked from, in libpython3.X-dev)
# whole into the program <target>, which is then not a position-independent executable
# (-no-pie) and exports the archive's symbols and nothing of its own (a dynamic list), for
# numpy's extension modules and anvil's bridge. Such a program runs Python at python3's speed
# (10-18% faster than the shared libpython; docs/python.md). It starts no interpreter until a
# `--env.id=python:...` env is named; envs/python_env.hpp then finds Python's symbols in the
# process and loads libanvil_python_envs_host.so, the bridge built with no Python. Nothing is
# done where anvil found no archive (ANVIL_PYTHON_ARCHIVE empty) or ANVIL_PYTHON_IN_PROGRAM
# is OFF.
function(anvil_python_in_program target)
  if(NOT ANVIL_PYTHON_ARCHIVE OR NOT ANVIL_PYTHON_IN_PROGRAM OR NOT EXISTS "${ANVIL_PYTHON_DYNLIST}")
    return()
  endif()
  target_link_options(${target} PRIVATE -no-pie "LINKER:--dynamic-list=${ANVIL_PYTHON_DYNLIST}")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${ANVIL_PYTHON_DYNLIST}" "${ANVIL_PYTHON_ARCHIVE}")
  target_link_libraries(${target} PRIVATE "-Wl,--whole-archive" "${ANVIL_PYTHON_ARCHIVE}" "-Wl,--no-whole-archive"
                        ${ANVIL_PYTHON_ARCHIVE_LIBS})
  if(TARGET anvil_python_envs_host)  # anvil's own build (or add_subdirectory): built before the program
    add_dependencies(${target} anvil_python_envs_host)
  endif()
endfunction()
