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
/// `python_env(id, kwargs, workers)` loads one of three libraries with `dlopen` and asks it
/// for the door (`AnyEnv`): with `env.workers=0` the bridge (src/python_envs/bridge.cpp,
/// built when pybind11 and Python's headers are found), which steps the envs in an
/// interpreter embedded in this process (the shared libpython; or, in a program that holds
/// the interpreter itself, linked by CMake's `anvil_python_in_program`, the same bridge
/// built with no Python, `libanvil_python_envs_host.so`); with W > 0 the workers (src/python_envs/workers.cpp,
/// built when a python3 with numpy is found; it links no Python), which exec W fresh
/// interpreters that step slices of the envs through shared memory. A program links no
/// Python and starts no interpreter until a `python:` env is named. Each library is found by
/// an environment variable (`ANVIL_PYTHON_ENVS`, `ANVIL_PYTHON_ENVS_HOST`, `ANVIL_PYTHON_WORKERS`), else where the
/// build put it (defined by CMake), else beside the program or in ../lib. Each exports
/// `anvil_python_abi`, the fingerprint of the types that cross between them and the program
/// (`abi_fingerprint`): a library built from other anvil headers than the program is refused,
/// naming both, rather than misreading the program's fields. Light header.

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/envs/any_env.hpp>

namespace anvil::envs {
namespace python {

/// What an env id starts with to name a Python env.
inline constexpr std::string_view kPrefix = "python:";

/// Whether `id` names a Python env.
[[nodiscard]] inline bool is_python_id(std::string_view id) noexcept { return id.substr(0, kPrefix.size()) == kPrefix; }

/// A library of Python envs loaded at run time: its file, the environment variable that
/// points at it, where the build put it (empty when not built here), and the Debian packages
/// a build needs to make it.
struct Library {
  const char* file;
  const char* variable;
  const char* built;
  const char* entry;  // the C entry point: void(const std::string*, const KeyValues*, std::optional<AnyEnv>*)
  const char* packages;
};

/// The bridge: envs stepped in this process (env.workers=0), an embedded interpreter.
inline constexpr Library kBridge{"libanvil_python_envs.so", "ANVIL_PYTHON_ENVS",
#ifdef ANVIL_PYTHON_ENVS_LIBRARY
                                 ANVIL_PYTHON_ENVS_LIBRARY,
#else
                                 "",
#endif
                                 "anvil_python_make_env", "pybind11-dev, python3-dev and python3-numpy"};
/// The bridge for a process that already holds an interpreter (a program linked with
/// CMake's `anvil_python_in_program`, which holds Python's own archive, as python3 does): the
/// same bridge linked with no Python, bound to the process's interpreter.
inline constexpr Library kHostBridge{"libanvil_python_envs_host.so", "ANVIL_PYTHON_ENVS_HOST",
#ifdef ANVIL_PYTHON_ENVS_HOST_LIBRARY
                                     ANVIL_PYTHON_ENVS_HOST_LIBRARY,
#else
                                     "",
#endif
                                     "anvil_python_make_env", "pybind11-dev, python3-dev and python3-numpy"};
/// The workers: envs stepped in worker processes (env.workers=W > 0); links no Python.
inline constexpr Library kWorkers{"libanvil_python_workers.so", "ANVIL_PYTHON_WORKERS",
#ifdef ANVIL_PYTHON_WORKERS_LIBRARY
                                  ANVIL_PYTHON_WORKERS_LIBRARY,
#else
                                  "",
#endif
                                  "anvil_python_worker_env", "python3-numpy"};

/// A file of anvil's Python envs: the path in the environment variable `variable` when set,
/// else `built` (where the build put it) when it is there, else `file` in one of the folders
/// `beside` names relative to the program's own; empty when it is nowhere.
[[nodiscard]] inline std::filesystem::path find_file(const char* variable, const char* built, const char* file,
                                                     std::initializer_list<const char*> beside) {
  std::error_code ec;
  if (const char* p = std::getenv(variable); p && *p) return p;
  if (*built && std::filesystem::exists(built, ec)) return built;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (const char* dir : beside)
      if (std::filesystem::exists(exe.parent_path() / dir / file, ec)) return exe.parent_path() / dir / file;
  return {};
}

/// A file of anvil's Python support that a library of Python envs reads (anvil_envs.py, the
/// env workers' script): the path in the environment variable `variable` when set, else
/// `file` in `from_library` (e.g. ../share/anvil) relative to the folder of the library that
/// holds `in_library` (an installed anvil's, wherever it was installed or moved to), else
/// `built` (where the build found it); empty when it is nowhere.
[[nodiscard]] inline std::filesystem::path find_support_file(const char* variable, const char* built, const char* file,
                                                             const char* from_library, const void* in_library) {
  std::error_code ec;
  if (const char* p = std::getenv(variable); p && *p) return p;
  Dl_info info{};
  if (dladdr(in_library, &info) != 0 && info.dli_fname && *info.dli_fname) {
    const auto beside = std::filesystem::path(info.dli_fname).parent_path() / from_library / file;
    if (std::filesystem::exists(beside, ec)) return beside;
  }
  if (*built && std::filesystem::exists(built, ec)) return built;
  return {};
}

/// The sizes of the types a program and the Python env libraries hand each other, folded
/// into one number (FNV-1a): any field added to one of them changes it.
[[nodiscard]] constexpr std::uint64_t abi_fingerprint() noexcept {
  std::uint64_t h = 14695981039346656037ull;
  for (const std::uint64_t v : {sizeof(AnyEnv), sizeof(VecEnvConfig), sizeof(EnvSpec), sizeof(ObsLayout), sizeof(ObsPart),
                                sizeof(Box), sizeof(AgentLayout), sizeof(KeyValues), sizeof(StepRows), sizeof(EpisodeEnd),
                                sizeof(ByteStepResult), sizeof(EnvBatch)})
    h = (h ^ v) * 1099511628211ull;
  return h;
}

/// Where `lib` is (see file comment): beside the program or in ../lib when installed.
[[nodiscard]] inline std::filesystem::path library_path(const Library& lib) {
  return find_file(lib.variable, lib.built, lib.file, {".", "../lib"});
}

/// Whether this program holds the interpreter itself: Python's symbols defined in the
/// executable (python3, or a program linked with CMake's `anvil_python_in_program`), not in a
/// shared libpython some library brought (a program embedding Python through pybind11, or a
/// bridge loaded earlier), which the shared bridge then uses as its own.
[[nodiscard]] inline bool interpreter_in_program() noexcept {
  void* symbol = dlsym(RTLD_DEFAULT, "Py_IsInitialized");
  if (!symbol) return false;
  Dl_info info{};
  link_map* where = nullptr;
  if (dladdr1(symbol, &info, reinterpret_cast<void**>(&where), RTLD_DL_LINKMAP) == 0 || !where) return false;
  void* self = dlopen(nullptr, RTLD_LAZY | RTLD_NOLOAD);
  link_map* program = nullptr;
  const bool known = self && dlinfo(self, RTLD_DI_LINKMAP, &program) == 0;
  if (self) dlclose(self);
  return known && where == program;
}

}  // namespace python

/// The Python env `id` (`python:module:attr`) with `kwargs`, through the door every env
/// takes (see file comment): stepped in this process (`workers` 0) or in worker processes
/// (`workers` > 0; how many, and their time limits, come from the env config the door's
/// maker is given). Throws ConfigError naming env.id when the library is not built or cannot
/// load, or (in this process) the module or attribute cannot be imported.
[[nodiscard]] inline AnyEnv python_env(const std::string& id, const KeyValues& kwargs, int workers = 0) {
  using Entry = void (*)(const std::string*, const KeyValues*, std::optional<AnyEnv>*);
  static Entry entries[2] = {nullptr, nullptr};
  Entry& entry = entries[workers > 0 ? 1 : 0];
  if (!entry) {
    // In this process: the host bridge where the program itself defines Python's symbols (it
    // holds the interpreter), else the bridge that embeds the shared libpython.
    const bool hosted = workers == 0 && python::interpreter_in_program();
    const python::Library& lib = workers > 0 ? python::kWorkers : hosted ? python::kHostBridge : python::kBridge;
    const auto path = python::library_path(lib);
    if (const char* other = std::getenv(python::kBridge.variable); hosted && other && *other)
      std::fprintf(stderr, "anvil: %s is set, but this program holds the interpreter: it loads %s (%s), not %s\n",
                   python::kBridge.variable, lib.file, path.empty() ? "not found" : path.c_str(), other);
    if (path.empty() && hosted)
      throw ConfigError("env.id=" + id + ": this program holds a Python interpreter (anvil_python_in_program), but " +
                        lib.file + " is not found; build it (anvil's build makes it for such programs), install it "
                        "beside the program or in ../lib, or point " + lib.variable + " at it");
    if (path.empty())
      throw ConfigError("env.id=" + id + ": this build has no " +
                        (workers > 0 ? std::string("Python env workers (") : std::string("Python env bridge (")) +
                        lib.file + "); install " + lib.packages + " (scripts/install-deps.sh) and rebuild, or point " +
                        lib.variable + " at the library");
    // RTLD_GLOBAL: Python's extension modules (numpy's) find the interpreter's symbols.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) throw ConfigError("env.id=" + id + ": cannot load " + path.string() + ": " + dlerror());
    entry = reinterpret_cast<Entry>(dlsym(handle, lib.entry));
    if (!entry) {
      dlclose(handle);
      throw ConfigError("env.id=" + id + ": " + path.string() + " is not " + lib.file);
    }
    using Abi = std::uint64_t (*)();
    const auto abi = reinterpret_cast<Abi>(dlsym(handle, "anvil_python_abi"));
    if (!abi || abi() != python::abi_fingerprint()) {
      entry = nullptr;
      const bool predates = !abi;
      dlclose(handle);
      throw ConfigError("env.id=" + id + ": " + path.string() + " was built from other anvil headers than this program (" +
                        (predates ? "it predates the check" : "their shared types differ") +
                        "); rebuild both (a stale build directory?), or point " + lib.variable + " at a matching library");
    }
  }
  std::optional<AnyEnv> out;
  entry(&id, &kwargs, &out);
  return std::move(*out);
}

}  // namespace anvil::envs
