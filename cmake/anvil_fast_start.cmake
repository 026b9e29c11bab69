# anvil_fast_start(<target>): links a program in the library order scripts/link_order.py
# finds, which starts it faster and binds every symbol to the same library as before.
#
# Debian's LibTorch loads 288 shared libraries; the dynamic loader looks each symbol up in
# them in load order, and libraries loaded late (GDAL, Xerces, GEOS through OpenCV) resolve
# their own symbols only after some 200 failed searches each: 0.13 s of LibTorch's 0.4 s
# start. The script reads the libraries and their bindings off a probe program linked as
# anvil's training mains are (link_probe.cpp), and orders them so that the heavily bound
# ones come first while every symbol defined twice keeps its winner. The order goes into a
# response file, built once (at the first call, the probe and the file become targets of the
# build); programs link it, so their direct dependencies become the whole list, in that
# order. anvil's own build tests that the probe linked both ways binds alike. With few
# libraries (PyTorch's own LibTorch) the file is empty and nothing changes; off with
# -DANVIL_FAST_START=OFF. For programs linked like the probe: anvil and LibTorch, no other
# shared libraries (those would come after the list, not where the linker puts them).
option(ANVIL_FAST_START "Link programs that ask for it (anvil_fast_start) in a library order that starts them faster (same symbol bindings)" ON)

function(anvil_fast_start target)
  if(NOT ANVIL_FAST_START OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  set(order ${CMAKE_BINARY_DIR}/anvil_link_order.rsp)
  if(NOT TARGET anvil_link_order)
    find_program(ANVIL_LINK_ORDER_PYTHON NAMES python3)
    if(NOT ANVIL_LINK_ORDER_PYTHON)
      message(STATUS "anvil: no python3, so programs link in the linker's own library order")
      return()
    endif()
    set(here ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
    set(script ${here}/link_order.py)  # beside this file once installed
    if(NOT EXISTS ${script})
      set(script ${here}/../scripts/link_order.py)  # in anvil's sources
    endif()
    add_executable(anvil_link_probe ${here}/link_probe.cpp)
    target_link_libraries(anvil_link_probe PRIVATE anvil::anvil)
    add_custom_command(
      OUTPUT ${order}
      COMMAND ${ANVIL_LINK_ORDER_PYTHON} ${script} $<TARGET_FILE:anvil_link_probe> ${order}
              --cache ${CMAKE_BINARY_DIR}/anvil_link_order_symbols.json
      DEPENDS anvil_link_probe ${script}
      COMMENT "Ordering the shared libraries for a fast start (link_order.py)")
    add_custom_target(anvil_link_order DEPENDS ${order})
    # The probe again, linked in the order: a test compares the two probes' bindings.
    add_executable(anvil_link_probe_ordered ${here}/link_probe.cpp)
    target_link_libraries(anvil_link_probe_ordered PRIVATE anvil::anvil)
    anvil_fast_start(anvil_link_probe_ordered)
  endif()
  add_dependencies(${target} anvil_link_order)
  target_link_options(${target} PRIVATE "@${order}")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${order})
endfunction()
