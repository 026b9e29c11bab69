#pragma once
/// @file
/// Envs written in Python, named at run time: `--env.id=python:my_pkg.my_module:make`
/// (a class or factory importable as `module:attr`; `--env.kwargs.K=V` passed to it, and
/// `index=i` when it takes an `index`). Their API is Gymnasium's, by duck typing:
/// `observation_space` and `action_space` (a Box: `shape`, `low`, `high`, `dtype`; or a
/// Discrete: `n`), `reset(seed=...)` -> `(obs, info)`, `step(action)` -> `(obs, reward,
/// terminated, truncated, info)`; a multi-task env lists its `tasks` and names each step's
/// task in `info["task"]`. See docs/python.md.
///
/// `python_env(id, kwargs)` loads the bridge (src/python_envs/bridge.cpp, a shared library
/// built when pybind11 and Python's headers are found) with `dlopen` and asks it for the
/// door (`AnyEnv`): a program links no Python and starts no interpreter until a `python:`
/// env is named. The library is found by the `ANVIL_PYTHON_ENVS` environment variable, else
/// where the build put it (`ANVIL_PYTHON_ENVS_LIBRARY`, defined by CMake), else beside the
/// program. Light header.

#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <anvil/core/error.hpp>
#include <anvil/envs/any_env.hpp>

namespace anvil::envs {
namespace python {

/// What an env id starts with to name a Python env.
inline constexpr std::string_view kPrefix = "python:";

/// Whether `id` names a Python env.
[[nodiscard]] inline bool is_python_id(std::string_view id) noexcept { return id.substr(0, kPrefix.size()) == kPrefix; }

/// The bridge library's file name.
inline constexpr const char* kLibraryName = "libanvil_python_envs.so";

/// Where the bridge library is (see file comment); empty when it is nowhere.
[[nodiscard]] inline std::filesystem::path library_path() {
  std::error_code ec;
  if (const char* p = std::getenv("ANVIL_PYTHON_ENVS"); p && *p) return p;
#ifdef ANVIL_PYTHON_ENVS_LIBRARY
  if (std::filesystem::exists(ANVIL_PYTHON_ENVS_LIBRARY, ec)) return ANVIL_PYTHON_ENVS_LIBRARY;
#endif
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (const auto& dir : {exe.parent_path(), exe.parent_path() / ".." / "lib"})
      if (std::filesystem::exists(dir / kLibraryName, ec)) return dir / kLibraryName;
  return {};
}

}  // namespace python

/// The Python env `id` (`python:module:attr`) with `kwargs`, through the door every env
/// takes (see file comment). Throws ConfigError naming env.id when the bridge is not built
/// or cannot load, or the module or attribute cannot be imported.
[[nodiscard]] inline AnyEnv python_env(const std::string& id, const std::map<std::string, std::string>& kwargs) {
  using Entry = void (*)(const std::string*, const std::map<std::string, std::string>*, std::optional<AnyEnv>*);
  static Entry entry = nullptr;
  if (!entry) {
    const auto lib = python::library_path();
    if (lib.empty())
      throw ConfigError("env.id=" + id + ": this build has no Python env bridge (" + python::kLibraryName +
                        "); install pybind11-dev and python3-dev (scripts/install-deps.sh) and rebuild, or point "
                        "ANVIL_PYTHON_ENVS at the library");
    // RTLD_GLOBAL: Python's extension modules (numpy's) find the interpreter's symbols.
    void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) throw ConfigError("env.id=" + id + ": cannot load the Python env bridge " + lib.string() + ": " + dlerror());
    entry = reinterpret_cast<Entry>(dlsym(handle, "anvil_python_make_env"));
    if (!entry) throw ConfigError("env.id=" + id + ": " + lib.string() + " is not anvil's Python env bridge");
  }
  std::optional<AnyEnv> out;
  entry(&id, &kwargs, &out);
  return std::move(*out);
}

}  // namespace anvil::envs
