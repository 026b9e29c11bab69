# anvil_component(<NAME> <name> <what> FOUND <bool> PACKAGE <debian package>
#                 [INCLUDE_DIRS dir...] [LIBRARIES lib...])
# An optional component of anvil: the option ANVIL_WITH_<NAME> (on when found; on but not
# found is an error naming the Debian package), and when on, the INTERFACE target
# anvil::<name> (anvil with the component: its include directories and libraries, and
# ANVIL_WITH_<NAME>=1), appended to ANVIL_COMPONENT_TARGETS for install.
function(anvil_component NAME name what)
  cmake_parse_arguments(ARG "" "FOUND;PACKAGE" "INCLUDE_DIRS;LIBRARIES" ${ARGN})
  option(ANVIL_WITH_${NAME} "Build ${what}" ${ARG_FOUND})
  if(ANVIL_WITH_${NAME} AND NOT ARG_FOUND)
    message(FATAL_ERROR "ANVIL_WITH_${NAME} is on but it was not found (Debian: ${ARG_PACKAGE})")
  endif()
  message(STATUS "anvil: ${what} ${ANVIL_WITH_${NAME}}")
  if(NOT ANVIL_WITH_${NAME})
    return()
  endif()
  add_library(anvil_${name} INTERFACE)
  add_library(anvil::${name} ALIAS anvil_${name})
  set_target_properties(anvil_${name} PROPERTIES EXPORT_NAME ${name})
  # A directory inside the source or build tree (a dependency found by its files there, e.g.
  # .deps of scripts/gpu-deps.sh) is this build's alone: an install cannot name it.
  foreach(dir IN LISTS ARG_INCLUDE_DIRS)
    cmake_path(IS_PREFIX CMAKE_SOURCE_DIR "${dir}" NORMALIZE _in_source)
    cmake_path(IS_PREFIX CMAKE_BINARY_DIR "${dir}" NORMALIZE _in_build)
    if(_in_source OR _in_build)
      target_include_directories(anvil_${name} INTERFACE $<BUILD_INTERFACE:${dir}>)
    else()
      target_include_directories(anvil_${name} INTERFACE ${dir})
    endif()
  endforeach()
  target_link_libraries(anvil_${name} INTERFACE anvil ${ARG_LIBRARIES})
  target_compile_definitions(anvil_${name} INTERFACE ANVIL_WITH_${NAME}=1)
  set_property(GLOBAL APPEND PROPERTY ANVIL_COMPONENT_TARGETS anvil_${name})
endfunction()
