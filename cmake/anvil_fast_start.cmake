# anvil_fast_start(<target>): links a program in the library order scripts/link_order.py
# finds, which starts it faster and binds every symbol to the same library as before.
#
# Debian's LibTorch loads 288 shared libraries; the dynamic loader looks each symbol up in
# them in load order, and libraries loaded late (GDAL, Xerces, GEOS through OpenCV) resolve
# their own symbols only after some 200 failed searches each: 0.13 s of LibTorch's 0.4 s
# start. The script reads the libraries and their bindings off a probe program linked as
# anvil's training mains are (cmake/link_probe.cpp), and orders them so that the heavily
# bound ones come first while every symbol defined twice keeps its winner. The order goes
# into a response file, built once; programs link it (their direct dependencies become the
# whole list, in that order). A test (tests/CMakeLists.txt) holds the probe linked both ways
# to the same bindings. With few libraries (PyTorch's own LibTorch), the file is empty and
# nothing changes. For programs linked like the probe: anvil and LibTorch, no other shared
# libraries (they would come after the list, not where the linker would put them).
option(ANVIL_FAST_START "Link anvil's example programs in a library order that starts them faster (same symbol bindings)" ON)

if(ANVIL_FAST_START AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  find_program(ANVIL_LINK_ORDER_PYTHON NAMES python3)
endif()

if(ANVIL_FAST_START AND ANVIL_LINK_ORDER_PYTHON)
  set(ANVIL_LINK_ORDER_FILE ${CMAKE_BINARY_DIR}/anvil_link_order.rsp)
  add_executable(anvil_link_probe ${PROJECT_SOURCE_DIR}/cmake/link_probe.cpp)
  target_link_libraries(anvil_link_probe PRIVATE anvil::anvil)
  add_custom_command(
    OUTPUT ${ANVIL_LINK_ORDER_FILE}
    COMMAND ${ANVIL_LINK_ORDER_PYTHON} ${PROJECT_SOURCE_DIR}/scripts/link_order.py $<TARGET_FILE:anvil_link_probe>
            ${ANVIL_LINK_ORDER_FILE} --cache ${CMAKE_BINARY_DIR}/anvil_link_order_symbols.json
    DEPENDS anvil_link_probe ${PROJECT_SOURCE_DIR}/scripts/link_order.py
    COMMENT "Ordering the shared libraries for a fast start (scripts/link_order.py)")
  add_custom_target(anvil_link_order DEPENDS ${ANVIL_LINK_ORDER_FILE})
  # The probe again, in the order: the test compares the two probes' bindings.
  add_executable(anvil_link_probe_ordered ${PROJECT_SOURCE_DIR}/cmake/link_probe.cpp)
  target_link_libraries(anvil_link_probe_ordered PRIVATE anvil::anvil)
endif()

function(anvil_fast_start target)
  if(TARGET anvil_link_order)
    add_dependencies(${target} anvil_link_order)
    target_link_options(${target} PRIVATE "@${ANVIL_LINK_ORDER_FILE}")
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${ANVIL_LINK_ORDER_FILE})
  endif()
endfunction()

if(TARGET anvil_link_probe_ordered)
  anvil_fast_start(anvil_link_probe_ordered)
endif()
