# cmake -DPROGRAM= -DWORK_DIR= -P print_config_roundtrip.cmake
# --print-config's YAML, fed back with --config, resolves to the same config (same hash).
file(MAKE_DIRECTORY "${WORK_DIR}")
execute_process(COMMAND "${PROGRAM}" --print-config sac.batch_size=64 --sac.actor.hidden=32,32 seed=5
                RESULT_VARIABLE rc OUTPUT_VARIABLE first ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--print-config failed (${rc}): ${err}")
endif()
file(WRITE "${WORK_DIR}/printed.yaml" "${first}")
execute_process(COMMAND "${PROGRAM}" --print-config --config "${WORK_DIR}/printed.yaml"
                RESULT_VARIABLE rc OUTPUT_VARIABLE second ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--config of the printed YAML failed (${rc}): ${err}\n${first}")
endif()
if(NOT first STREQUAL second)
  message(FATAL_ERROR "round trip changed the config:\n${first}\n---\n${second}")
endif()
string(FIND "${first}" "batch_size: 64" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "override missing from printed config:\n${first}")
endif()
