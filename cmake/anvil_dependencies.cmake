# anvil's dependencies. On Debian, scripts/install-deps.sh installs them and their CMake
# packages find them. Two other ways, for machines where packages cannot be installed (a GPU
# server's image: scripts/gpu-check.sh, the `cuda` preset in CMakePresets.json):
#  - LibTorch from a PyTorch installation: ANVIL_TORCH_PYTHON names a Python (a path, or a
#    name such as python3: the first on PATH, then /usr/bin's, that imports torch), and the
#    `torch` target is made from that PyTorch's headers and libraries, CUDA's with them when
#    it has CUDA. PyTorch's own CMake package (torch.utils.cmake_prefix_path) needs the CUDA
#    toolkit (nvcc) to configure, which a PyTorch installation does not bring; this needs
#    only the installation (and CUDA's runtime headers, which its nvidia-* wheels bring).
#  - a header-only or static dependency without its CMake package is found by its header
#    (and library) under CMAKE_PREFIX_PATH: `.deps`, filled from a Debian machine
#    (docs/getting-started.md, "Building for CUDA").

set(ANVIL_TORCH_PYTHON "" CACHE STRING
    "Build against the LibTorch of this Python's PyTorch (a path, or a name such as python3) instead of CMake's Torch package")

# anvil_torch_from_python(): the `torch` target (and `torch_cuda` when PyTorch has CUDA)
# from ANVIL_TORCH_PYTHON's PyTorch; ANVIL_TORCH_PYTHON_FOUND is the interpreter used.
function(anvil_torch_from_python)
  set(candidates "")
  if(IS_ABSOLUTE "${ANVIL_TORCH_PYTHON}")
    list(APPEND candidates "${ANVIL_TORCH_PYTHON}")
  else()
    find_program(_anvil_torch_py NAMES ${ANVIL_TORCH_PYTHON} NO_CACHE)
    list(APPEND candidates ${_anvil_torch_py} /usr/bin/${ANVIL_TORCH_PYTHON})
  endif()
  set(tried "")
  foreach(py IN LISTS candidates)
    execute_process(COMMAND "${py}" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/torch_info.py"
                    OUTPUT_VARIABLE info ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0)
      set(python "${py}")
      break()
    endif()
    string(STRIP "${err}" err)
    list(APPEND tried "${py} (${err})")
  endforeach()
  if(NOT python)
    list(JOIN tried ", " tried)
    message(FATAL_ERROR "ANVIL_TORCH_PYTHON=${ANVIL_TORCH_PYTHON}: no Python with torch (tried: ${tried}); "
                        "name one whose `import torch` works, or leave it empty for CMake's Torch package")
  endif()
  string(REPLACE "\n" ";" lines "${info}")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([a-z_]+)=(.*)$")
      set(t_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
    endif()
  endforeach()
  string(REPLACE "," ";" t_cuda_includes "${t_cuda_includes}")
  set(libs torch torch_cpu c10)
  if(t_cuda)
    list(APPEND libs torch_cuda c10_cuda)
  endif()
  foreach(name IN LISTS libs)
    find_library(ANVIL_TORCH_LIB_${name} ${name} PATHS "${t_dir}/lib" NO_DEFAULT_PATH NO_CACHE)
    if(NOT ANVIL_TORCH_LIB_${name})
      message(FATAL_ERROR "ANVIL_TORCH_PYTHON=${python}: PyTorch ${t_version} at ${t_dir} has no lib${name}.so in lib/")
    endif()
  endforeach()
  if(t_cuda AND NOT t_cuda_includes)
    message(FATAL_ERROR "ANVIL_TORCH_PYTHON=${python}: PyTorch ${t_version} has CUDA ${t_cuda}, but CUDA's runtime "
                        "headers (cuda_runtime.h) are neither under CUDA_HOME nor in its nvidia-* wheels")
  endif()
  add_library(torch INTERFACE IMPORTED GLOBAL)
  set(defs "_GLIBCXX_USE_CXX11_ABI=${t_abi}")
  if(t_distributed)
    list(APPEND defs USE_DISTRIBUTED)  # c10d's headers declare their classes only under these
  endif()
  if(t_gloo)
    list(APPEND defs USE_C10D_GLOO)
  endif()
  if(t_nccl)
    list(APPEND defs USE_C10D_NCCL)
  endif()
  # libstdc++ first and bound whole: PyTorch's wheels carry and export their own copy of
  # std::filesystem (built for an older libstdc++), and the first library that defines a
  # symbol wins. Bound to that copy, std::filesystem::remove_all called address 0 on an H200.
  # LibTorch's libraries are bound whole too: they register their operators when loaded.
  set(link "-Wl,--push-state,--no-as-needed" stdc++ "${ANVIL_TORCH_LIB_torch}" "${ANVIL_TORCH_LIB_torch_cpu}")
  if(t_cuda)
    add_library(torch_cuda SHARED IMPORTED GLOBAL)
    set_target_properties(torch_cuda PROPERTIES IMPORTED_LOCATION "${ANVIL_TORCH_LIB_torch_cuda}")
    list(APPEND link torch_cuda "${ANVIL_TORCH_LIB_c10_cuda}")
    if(t_cudart)
      list(APPEND link "${t_cudart}")
      get_filename_component(cudart_dir "${t_cudart}" DIRECTORY)
      list(APPEND link "-Wl,-rpath,${cudart_dir}")
    endif()
  endif()
  list(APPEND link "${ANVIL_TORCH_LIB_c10}" "-Wl,--pop-state" Threads::Threads ${CMAKE_DL_LIBS})
  set_target_properties(torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${t_dir}/include;${t_dir}/include/torch/csrc/api/include;${t_cuda_includes}"
    INTERFACE_COMPILE_DEFINITIONS "${defs}"
    INTERFACE_LINK_LIBRARIES "${link}")
  set(cuda_note "CPU")
  if(t_cuda)
    set(cuda_note "CUDA ${t_cuda}")
  endif()
  message(STATUS "anvil: LibTorch ${t_version} (${cuda_note}) from ${python}'s PyTorch at ${t_dir}")
  set(ANVIL_TORCH_PYTHON_FOUND "${python}" CACHE INTERNAL "")
endfunction()

if(TARGET torch)
  # found already: a project that takes anvil in (add_subdirectory, find_package) found it first
elseif(ANVIL_TORCH_PYTHON)
  set(THREADS_PREFER_PTHREAD_FLAG ON)
  find_package(Threads REQUIRED)
  anvil_torch_from_python()
else()
  find_package(Torch REQUIRED)
endif()

# anvil_find_dependency(<package> <target> HEADER <file> [LIBRARY <name>] [VERSION <v>]
#                       DEBIAN <package>)
# <package>'s CMake package, else <target> made from <file> (and the library) found under
# CMAKE_PREFIX_PATH, else an error naming the Debian package.
function(anvil_find_dependency package target)
  cmake_parse_arguments(ARG "" "HEADER;LIBRARY;VERSION;DEBIAN" "" ${ARGN})
  find_package(${package} ${ARG_VERSION} QUIET)
  if(${package}_FOUND)
    return()
  endif()
  string(MAKE_C_IDENTIFIER "${package}" id)
  find_path(ANVIL_${id}_INCLUDE_DIR ${ARG_HEADER})
  set(what "${ARG_HEADER}")
  set(lib "")
  if(ARG_LIBRARY)
    # a static library first: the machine that runs the program need not have it
    find_library(ANVIL_${id}_LIBRARY NAMES lib${ARG_LIBRARY}.a ${ARG_LIBRARY})
    set(lib "${ANVIL_${id}_LIBRARY}")
    string(APPEND what " and lib${ARG_LIBRARY}")
  endif()
  if(NOT ANVIL_${id}_INCLUDE_DIR OR (ARG_LIBRARY AND NOT lib))
    message(FATAL_ERROR "anvil needs ${package}: neither its CMake package nor ${what} under CMAKE_PREFIX_PATH "
                        "was found (Debian: ${ARG_DEBIAN}, which scripts/install-deps.sh installs)")
  endif()
  add_library(${target} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${ANVIL_${id}_INCLUDE_DIR}"
                                             INTERFACE_LINK_LIBRARIES "${lib}")
  message(STATUS "anvil: ${package} from its files: ${ANVIL_${id}_INCLUDE_DIR} ${lib}")
endfunction()

# anvil_find_dependencies(): what anvil::anvil links besides LibTorch. Boost for Boost.PFR
# (header-only); nlohmann-json for typed JSON (summary.json, sweep tables).
function(anvil_find_dependencies)
  anvil_find_dependency(yaml-cpp yaml-cpp::yaml-cpp HEADER yaml-cpp/yaml.h LIBRARY yaml-cpp DEBIAN libyaml-cpp-dev)
  anvil_find_dependency(Boost Boost::headers VERSION 1.75 HEADER boost/pfr.hpp DEBIAN libboost1.81-dev)
  anvil_find_dependency(range-v3 range-v3::range-v3 HEADER range/v3/all.hpp DEBIAN librange-v3-dev)
  anvil_find_dependency(nlohmann_json nlohmann_json::nlohmann_json VERSION 3 HEADER nlohmann/json.hpp DEBIAN nlohmann-json3-dev)
endfunction()
