# anvil_target_provenance(<target>): the program records the git commit of the checkout its
# sources are in (config.yaml, summary.json); without it a run says "git commit: unknown".
# A tiny generated file, refreshed at every build, is compiled into the target.
function(anvil_target_provenance target)
  string(MD5 _id "${CMAKE_CURRENT_SOURCE_DIR}")
  string(SUBSTRING "${_id}" 0 8 _id)
  set(_out "${CMAKE_BINARY_DIR}/anvil_provenance/git_commit_${_id}.cpp")
  if(NOT TARGET anvil_git_commit_${_id})
    add_custom_target(anvil_git_commit_${_id}
                      COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR} -DOUTPUT=${_out}
                              -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/anvil_git_commit.cmake
                      BYPRODUCTS ${_out}
                      COMMENT "" VERBATIM)
  endif()
  target_sources(${target} PRIVATE ${_out})
  set_source_files_properties(${_out} PROPERTIES GENERATED TRUE SKIP_PRECOMPILE_HEADERS ON)
  add_dependencies(${target} anvil_git_commit_${_id})
endfunction()
