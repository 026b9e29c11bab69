// The Python env bridge (envs/python_env.hpp loads it): Gymnasium-style envs written in
// Python, stepped by anvil as an `EnvBatch` (python_env_batch.hpp) in an interpreter embedded
// in this process. Built as its own shared library when pybind11 and Python's headers are
// found, and loaded only by a program that names a `python:` env, so no other program links
// or starts an interpreter. Built twice: libanvil_python_envs.so links the shared libpython;
// libanvil_python_envs_host.so (ANVIL_PYTHON_HOSTED) links no Python and binds to the
// interpreter a program holds itself (CMake's anvil_python_in_program). (In a Python process,
// `import anvil` steps them itself: python/module.cpp.)

#include <pybind11/embed.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <anvil/core/error.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/python_env.hpp>

#include "python_env_batch.hpp"

namespace anvil::envs::python {

// anvil's Python support: ../share/anvil beside this library when installed, else
// src/python_envs (the build's).
std::filesystem::path support_dir() {
  const auto file = find_support_file("ANVIL_PYTHON_SUPPORT", ANVIL_PYTHON_SUPPORT "/anvil_envs.py", "anvil_envs.py",
                                      ANVIL_PYTHON_SUPPORT_FROM_LIBRARY, reinterpret_cast<const void*>(&support_dir));
  if (file.empty()) throw ConfigError("cannot find anvil_envs.py, anvil's Python support (set ANVIL_PYTHON_SUPPORT)");
  return file.parent_path();
}

namespace {
// The interpreter, started once per process on first use; the GIL is released right after,
// and each call into Python takes it (py::gil_scoped_acquire).
void ensure_interpreter() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (Py_IsInitialized()) return;
    py::initialize_interpreter(/*init_signal_handlers=*/false);
    PyEval_SaveThread();  // every later call takes the GIL for itself
  });
}
}  // namespace

AnyEnv make_env(const std::string& id, const std::map<std::string, std::string>& kwargs) {
  if (id.rfind(kPrefix, 0) != 0) throw ConfigError("env.id=" + id + ": not a python: env");
  ensure_interpreter();
  py::gil_scoped_acquire gil;
  py::object factory;
  try {
    factory = support("anvil_envs").attr("import_factory")(id.substr(kPrefix.size()));
  } catch (const py::error_already_set& e) {
    throw ConfigError("env.id=" + id + ": " + describe(e));
  }
  return door(std::move(factory), id, kwargs,
              "python: " + id + " steps in Python " + python_version() +
#ifdef ANVIL_PYTHON_HOSTED
                  ", linked into this program (the archive of the build's ANVIL_PYTHON, " ANVIL_PYTHON_INTERPRETER
                  ", as python3 is)"
#else
                  ", embedded in this process (the shared libpython of the build's ANVIL_PYTHON, " ANVIL_PYTHON_INTERPRETER
                  ")"
#endif
                  "; the GIL is taken once per batched step");
}

}  // namespace anvil::envs::python

// The entry point `envs::python_env` finds with dlsym (C linkage: no mangled name to guess).
extern "C" __attribute__((visibility("default"))) void anvil_python_make_env(
    const std::string* id, const std::map<std::string, std::string>* kwargs, std::optional<anvil::envs::AnyEnv>* out) {
  out->emplace(anvil::envs::python::make_env(*id, *kwargs));
}

// The fingerprint `envs::python_env` checks against its own (envs/python_env.hpp).
extern "C" __attribute__((visibility("default"))) std::uint64_t anvil_python_abi() {
  return anvil::envs::python::abi_fingerprint();
}
