// The Python env bridge (envs/python_env.hpp loads it): Gymnasium-style envs written in
// Python, stepped by anvil as an `EnvBatch` (envs/env_batch.hpp) in an interpreter embedded
// in this process. Built as its own shared library when pybind11 and Python's headers are
// found, and loaded only by a program that names a `python:` env, so no other program links
// or starts an interpreter.
//
// The GIL is taken once per batched step (or reset) and released between them, so Python
// threads of the program (a renderer, a logger) run while anvil learns. Observations are
// read through the buffer protocol without a copy when they are float32 and contiguous.

#include <dlfcn.h>
#include <pybind11/embed.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/env_batch.hpp>
#include <anvil/envs/python_env.hpp>

#include "python_batch.hpp"

namespace py = pybind11;

namespace anvil::envs::python {
namespace {

// The interpreter, started once per process on first use; the GIL is released right after,
// and each call into Python takes it (py::gil_scoped_acquire).
void ensure_interpreter() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (Py_IsInitialized()) return;
    py::initialize_interpreter(/*init_signal_handlers=*/false);
    {
      // `module:attr` is looked up on PYTHONPATH and in the current directory, as `python -m` does.
      auto sys = py::module_::import("sys");
      auto os = py::module_::import("os");
      sys.attr("path").attr("insert")(0, os.attr("getcwd")());
    }
    PyEval_SaveThread();  // every later call takes the GIL for itself
  });
}

// An exception from Python as one line with the last lines of its traceback (GIL held).
std::string describe(const py::error_already_set& e) {
  std::string s = e.what();
  const auto nl = s.find('\n');  // pybind11 appends the whole traceback: keep its last lines
  std::string head = nl == std::string::npos ? s : s.substr(0, nl);
  std::string tail;
  try {
    auto tb = py::module_::import("traceback");
    py::list lines = tb.attr("format_exception")(e.type(), e.value(), e.trace());
    std::vector<std::string> v;
    for (const auto& l : lines) v.push_back(py::str(l).cast<std::string>());
    // the frames just before the exception line: where in the env it was raised
    std::vector<std::string> frames;
    for (std::size_t i = 0; i + 1 < v.size(); ++i)
      if (v[i].rfind("  File ", 0) == 0 && v[i].rfind("  File \"<frozen", 0) != 0) frames.push_back(v[i]);
    const std::size_t keep = std::min<std::size_t>(frames.size(), 2);
    for (std::size_t i = frames.size() - keep; i < frames.size(); ++i) {
      // "File ..., line n, in f" and its source line; not the markers under it (^^^)
      std::string line, kept;
      for (std::size_t p = 0; p <= frames[i].size(); ++p) {
        if (p < frames[i].size() && frames[i][p] != '\n') {
          line += frames[i][p];
          continue;
        }
        const auto b = line.find_first_not_of(' ');
        if (b != std::string::npos && line.find_first_not_of(" ^~", b) != std::string::npos)
          kept += (kept.empty() ? "" : ": ") + line.substr(b);
        line.clear();
      }
      tail += "\n    " + kept;
    }
  } catch (...) {
  }
  return head + tail;
}

// A config value as Python reads it: a literal where it is one ("9.81", "[1, 2]", "True"),
// else the string itself.
py::object literal(const std::string& text) {
  try {
    return py::module_::import("ast").attr("literal_eval")(text);
  } catch (const py::error_already_set&) {
    return py::str(text);
  }
}

// A space's numbers as float32 (shape, low, high), `what` naming it in errors.
struct BoxSpace {
  std::vector<std::int64_t> shape;
  std::vector<float> low, high;
  [[nodiscard]] std::int64_t size() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

BoxSpace box_of(const py::object& space, const std::string& what) {
  BoxSpace b;
  if (!py::hasattr(space, "shape") || !py::hasattr(space, "low") || !py::hasattr(space, "high"))
    throw ConfigError(what + " has neither `n` (a Discrete space) nor `shape`, `low` and `high` (a Box)");
  for (const auto& d : space.attr("shape")) b.shape.push_back(d.cast<std::int64_t>());
  auto np = py::module_::import("numpy");
  const auto n = static_cast<std::size_t>(b.size());
  auto as_row = [&](const char* attr) {
    py::array_t<float, py::array::c_style | py::array::forcecast> a =
        np.attr("broadcast_to")(np.attr("asarray")(space.attr(attr), "float32"), space.attr("shape"));
    if (static_cast<std::size_t>(a.size()) != n)
      throw ConfigError(what + "." + attr + " has " + std::to_string(a.size()) + " numbers; its shape has " +
                        std::to_string(n));
    return std::vector<float>(a.data(), a.data() + n);
  };
  b.low = as_row("low");
  b.high = as_row("high");
  if (py::hasattr(space, "dtype")) {
    const auto kind = py::str(np.attr("dtype")(space.attr("dtype")).attr("kind")).cast<std::string>();
    if (kind != "f" && kind != "i" && kind != "u" && kind != "b")
      throw ConfigError(what + " has dtype " + py::str(space.attr("dtype")).cast<std::string>() +
                        "; anvil reads numeric Box spaces (float, int, uint, bool)");
  }
  return b;
}

// The envs, made by `factory(index=i, **kwargs)` (or without `index` when it takes none).
class PythonEnvBatch final : public PythonBatch {
 public:
  PythonEnvBatch(EnvSpec spec, std::vector<std::string> tasks, std::vector<py::object> envs,
                 std::vector<std::int64_t> action_shape, std::uint64_t seed)
      : PythonBatch(std::move(spec), static_cast<std::int64_t>(envs.size()), tasks),
        envs_(std::move(envs)),
        action_shape_(action_shape.begin(), action_shape.end()) {
    for (std::int64_t i = 0; i < n_; ++i) seeds_.emplace_back(derive_seed(seed, Stream::env, static_cast<std::uint64_t>(i)));
    for (auto& e : envs_) step_fns_.push_back(e.attr("step"));
  }
  ~PythonEnvBatch() override {
    py::gil_scoped_acquire gil;
    for (auto& e : envs_) {
      try {
        if (py::hasattr(e, "close")) e.attr("close")();
      } catch (const py::error_already_set&) {  // closing is best effort
      }
    }
    step_fns_.clear();
    envs_.clear();
    obs_ = {};
  }


  void reset(float* obs, std::int64_t steps) override {
    py::gil_scoped_acquire gil;
    const auto d = spec_.obs_dim();
    for (std::int64_t i = 0; i < n_; ++i) {
      reset_env(i, obs + i * d, "reset", steps);
      begin_episode(i);
    }
  }

  void step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) override {
    py::gil_scoped_acquire gil;
    const auto d = spec_.obs_dim();
    for (std::int64_t i = begin; i < end; ++i) {
      // The step, through CPython's own calls (this loop is the bridge's whole cost per env
      // step): the bound method looked up once, a new action array, the five-tuple read in place.
      PyObject* action = action_of(actions, i);
      PyObject* called = PyObject_CallOneArg(step_fns_[static_cast<std::size_t>(i)].ptr(), action);
      Py_DECREF(action);
      if (!called) {
        py::error_already_set e;
        throw EnvError(at_fault(i, "step", steps) + describe(e));
      }
      const auto result = py::reinterpret_steal<py::object>(called);
      py::tuple r;
      if (PyTuple_CheckExact(called)) {
        r = py::reinterpret_borrow<py::tuple>(result);
      } else if (py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result)) {
        r = py::tuple(result);
      } else {
        throw EnvError(at_fault(i, "step", steps) + "step() returned " + type_of(result) +
                       "; expected (obs, reward, terminated, truncated, info)");
      }
      if (r.size() == 4)
        throw EnvError(at_fault(i, "step", steps) +
                       "step() returned 4 values, the old Gym API (obs, reward, done, info); anvil reads Gymnasium's "
                       "(obs, reward, terminated, truncated, info)");
      if (r.size() != 5)
        throw EnvError(at_fault(i, "step", steps) + "step() returned " + std::to_string(r.size()) +
                       " values; expected (obs, reward, terminated, truncated, info)");
      PyObject* const* item = &PyTuple_GET_ITEM(r.ptr(), 0);
      const auto o = observation(item[0], i, "step", steps);
      const double reward = PyFloat_AsDouble(item[1]);  // a float, a numpy number, or anything with __float__
      if (reward == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        throw EnvError(at_fault(i, "step", steps) + "reward is " + type_of(item[1]) + ", not a number");
      }
      const int terminated = PyObject_IsTrue(item[2]), truncated = PyObject_IsTrue(item[3]);
      if (terminated < 0 || truncated < 0) {
        py::error_already_set e;
        throw EnvError(at_fault(i, "step", steps) + "terminated or truncated is not a truth value: " + describe(e));
      }
      const std::int32_t group = has_tasks_ ? task_of(item[4], i, steps) : -1;
      if (out.task) out.task[i] = group;
      if (record_step(i, o, reward, terminated != 0, truncated != 0, group, -1, out, steps))
        reset_env(i, out.obs + i * d, "autoreset", steps);
    }
  }


 private:
  static std::string type_of(const py::handle& h) { return py::str(py::type::of(h).attr("__name__")).cast<std::string>(); }

  // Env i's action as its `step` takes it (a new reference): an int for a Discrete space, a
  // new float32 array of the space's shape for a Box (its own copy of anvil's row, which the
  // env may keep), made with numpy's C API (pybind11's array constructor costs more).
  PyObject* action_of(const void* actions, std::int64_t i) const {
    if (spec_.discrete()) return PyLong_FromLongLong(static_cast<const std::int64_t*>(actions)[i]);
    const auto ad = spec_.action_dim();
    const float* row = static_cast<const float*>(actions) + i * ad;
    auto& api = py::detail::npy_api::get();
    PyObject* a = api.PyArray_NewFromDescr_(api.PyArray_Type_, api.PyArray_DescrFromType_(py::detail::npy_api::NPY_FLOAT_),
                                            static_cast<int>(action_shape_.size()), action_shape_.data(), nullptr,
                                            nullptr, 0, nullptr);
    if (!a) throw py::error_already_set();
    std::memcpy(py::detail::array_proxy(a)->data, row, static_cast<std::size_t>(ad) * sizeof(float));
    return a;
  }

  // An observation as a float32 row, checked (length, finiteness); held in `obs_` until the
  // next call.
  std::span<const float> observation(const py::handle& o, std::int64_t i, std::string_view when, std::int64_t steps) {
    py::array_t<float, py::array::c_style | py::array::forcecast> a;
    try {
      a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(o);
    } catch (const py::error_already_set& e) {
      throw EnvError(at_fault(i, when, steps) + "observation is " + type_of(o) + ", not an array of numbers (" +
                     describe(e) + ")");
    }
    if (!a) {
      PyErr_Clear();
      throw EnvError(at_fault(i, when, steps) + "observation is " + type_of(o) + ", not an array of numbers");
    }
    obs_ = std::move(a);
    std::span<const float> s(obs_.data(), static_cast<std::size_t>(obs_.size()));
    check_observation(i, s, when, steps);
    return s;
  }

  // The task of a step, from info["task"] (a name in `tasks` or its index).
  std::int32_t task_of(const py::handle& info, std::int64_t i, std::int64_t steps) const {
    py::object t;
    if (py::isinstance<py::dict>(info) && info.contains("task")) t = info["task"];
    if (!t) throw EnvError(at_fault(i, "step", steps) + "the env declares tasks, but info has no \"task\"");
    if (py::isinstance<py::str>(t)) {
      const auto name = t.cast<std::string>();
      for (std::size_t k = 0; k < groups_.size(); ++k)
        if (groups_[k] == name) return static_cast<std::int32_t>(k);
      throw EnvError(at_fault(i, "step", steps) + "info[\"task\"] is '" + name + "', not one of the env's tasks");
    }
    const auto k = py::cast<std::int64_t>(py::int_(t));
    if (k < 0 || k >= static_cast<std::int64_t>(groups_.size()))
      throw EnvError(at_fault(i, "step", steps) + "info[\"task\"] is " + std::to_string(k) + "; the env has " +
                     std::to_string(groups_.size()) + " tasks");
    return static_cast<std::int32_t>(k);
  }

  // Env i's first observation of a new episode (seeded from its own stream) into `row`.
  void reset_env(std::int64_t i, float* row, std::string_view when, std::int64_t steps) {
    const auto seed = static_cast<std::uint32_t>(seeds_[static_cast<std::size_t>(i)]());
    py::object result;
    try {
      result = envs_[static_cast<std::size_t>(i)].attr("reset")(py::arg("seed") = seed);
    } catch (const py::error_already_set& e) {
      throw EnvError(at_fault(i, when, steps) + describe(e));
    }
    if (!py::isinstance<py::tuple>(result) || py::len(result) != 2)
      throw EnvError(at_fault(i, when, steps) + "reset() returned " + type_of(result) +
                     (py::isinstance<py::tuple>(result) ? " of " + std::to_string(py::len(result)) + " values" : "") +
                     "; expected (obs, info) (Gymnasium's API; the old Gym API returned obs alone)");
    const auto o = observation(py::reinterpret_borrow<py::tuple>(result)[0], i, when, steps);
    std::copy(o.begin(), o.end(), row);
  }

  std::vector<py::object> envs_;
  std::vector<py::object> step_fns_;  // each env's bound `step`, looked up once
  std::vector<Py_intptr_t> action_shape_;
  std::vector<Rng> seeds_;
  py::array_t<float, py::array::c_style | py::array::forcecast> obs_;
};

// A module of anvil's own Python support (src/python_envs, or ../share/anvil beside the
// program when installed), imported (GIL held).
py::module_ support(const char* name) {
  static const bool on_path = [] {
    std::error_code ec;
    std::string dir = ANVIL_PYTHON_SUPPORT;
    if (!std::filesystem::exists(dir, ec)) {
      const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
      dir = (exe.parent_path() / ".." / "share" / "anvil").string();
    }
    py::module_::import("sys").attr("path").attr("append")(dir);
    return true;
  }();
  (void)on_path;
  return py::module_::import(name);
}

// `module:attr`, imported (GIL held); a ConfigError naming what cannot be found.
py::object import_factory(const std::string& target, const std::string& id) {
  const auto colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == target.size())
    throw ConfigError("env.id=" + id + ": expected python:MODULE:ATTR (e.g. python:my_envs.pendulum:make)");
  const auto module = target.substr(0, colon), attr = target.substr(colon + 1);
  py::object m;
  try {
    m = py::module_::import(module.c_str());
  } catch (const py::error_already_set& e) {
    // a module that is not there: one line; one that fails as it runs: where it failed
    std::string why = describe(e);
    if (e.matches(PyExc_ModuleNotFoundError)) why = why.substr(0, why.find('\n'));
    throw ConfigError("env.id=" + id + ": cannot import module '" + module + "' (" + why +
                      "); it is looked up on PYTHONPATH and in the current directory");
  }
  py::object f = m;
  std::string path = module;
  std::string_view rest = attr;
  while (!rest.empty()) {
    const auto dot = rest.find('.');
    const std::string part(rest.substr(0, dot));
    if (!py::hasattr(f, part.c_str()))
      throw ConfigError("env.id=" + id + ": module '" + module + "' has no attribute '" + attr + "'");
    f = f.attr(part.c_str());
    path += "." + part;
    rest = dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
  }
  if (!PyCallable_Check(f.ptr())) throw ConfigError("env.id=" + id + ": '" + path + "' is not callable (a class or a factory)");
  return f;
}

// Whether `f` takes an `index` keyword (or **kwargs).
bool takes_index(const py::object& f) {
  try {
    auto sig = py::module_::import("inspect").attr("signature")(f);
    for (const auto& p : sig.attr("parameters").attr("values")()) {
      const auto kind = py::str(p.attr("kind")).cast<std::string>();
      if (py::str(p.attr("name")).cast<std::string>() == "index" || kind == "VAR_KEYWORD") return true;
    }
  } catch (const py::error_already_set&) {  // builtins without a signature
  }
  return false;
}

}  // namespace

AnyEnv make_env(const std::string& id, const std::map<std::string, std::string>& kwargs) {
  if (id.rfind(kPrefix, 0) != 0) throw ConfigError("env.id=" + id + ": not a python: env");
  ensure_interpreter();
  const std::string target = id.substr(kPrefix.size());
  py::gil_scoped_acquire gil;
  // The factory, shared by the maker's copies (it runs for the training envs and each set of
  // evaluation envs) and released with the GIL held (the deleter takes it).
  std::shared_ptr<py::object> held(new py::object(import_factory(target, id)), [](py::object* p) {
    py::gil_scoped_acquire g;
    delete p;
  });
  const bool index = takes_index(*held);
  auto maker = [held, index, id, kwargs](const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first,
                                         std::int64_t /*count*/) -> std::unique_ptr<EnvBatch> {
    if (!cfg.suite->empty() || !cfg.tasks->empty())
      throw ConfigError(std::string(cfg.suite->empty() ? "env.tasks" : "env.suite") + ": " + id +
                        " declares its own tasks (its `tasks` attribute); env.suite and env.tasks choose among a C++ "
                        "suite's");
    py::gil_scoped_acquire g;
    py::dict kw;
    for (const auto& [k, v] : kwargs) kw[py::str(k)] = literal(v);
    std::vector<py::object> envs;
    for (std::int64_t i = 0; i < cfg.num_envs; ++i) {
      try {
        if (index) kw["index"] = py::int_(first + i);
        envs.push_back((*held)(**kw));
      } catch (const py::error_already_set& e) {
        throw ConfigError("env.id=" + id + ": making env " + std::to_string(first + i) + " failed: " + describe(e));
      }
    }
    if (py::hasattr(envs.front(), "possible_agents")) {
      // A PettingZoo parallel env: one team env in anvil's multi-agent layout (anvil_team.py).
      auto team = support("anvil_team");
      for (auto& e : envs) {
        try {
          e = team.attr("Team")(e);
        } catch (const py::error_already_set& err) {
          throw ConfigError("env.id=" + id + ": " + describe(err));
        }
      }
    }
    const py::object& e0 = envs.front();
    if (!py::hasattr(e0, "observation_space") || !py::hasattr(e0, "action_space") || !py::hasattr(e0, "reset") ||
        !py::hasattr(e0, "step"))
      throw ConfigError("env.id=" + id + ": the env (" +
                        py::str(py::type::of(e0).attr("__name__")).cast<std::string>() +
                        ") lacks observation_space, action_space, reset or step (Gymnasium's Env API)");
    EnvSpec spec;
    spec.name = id;
    const auto obs = box_of(e0.attr("observation_space"), id + ": observation_space");
    spec.observation = Box{obs.low, obs.high};
    const py::object as = e0.attr("action_space");
    std::vector<std::int64_t> action_shape;
    if (py::hasattr(as, "n")) {  // a Discrete space (a Box has no `n`)
      const auto n = py::cast<std::int64_t>(py::int_(as.attr("n")));
      if (n < 2) throw ConfigError("env.id=" + id + ": action_space.n is " + std::to_string(n) + "; needs 2 or more actions");
      spec.action = Discrete{n};
    } else {
      const auto a = box_of(as, id + ": action_space");
      for (std::size_t k = 0; k < a.low.size(); ++k)
        if (!(a.low[k] <= a.high[k]))
          throw ConfigError("env.id=" + id + ": action_space.low[" + std::to_string(k) + "] is above its high");
      spec.action = Box{a.low, a.high};
      action_shape = a.shape;
    }
    if (py::hasattr(e0, "agent_layout")) {
      const auto l = e0.attr("agent_layout").cast<std::vector<std::int64_t>>();
      spec.agents = AgentLayout{l.at(0), l.at(1), l.at(2), l.at(3)};
    }
    std::vector<std::string> tasks;
    if (py::hasattr(e0, "tasks"))
      for (const auto& t : e0.attr("tasks")) tasks.push_back(py::str(t).cast<std::string>());
    spec.tasks = tasks;
    return std::make_unique<PythonEnvBatch>(std::move(spec), std::move(tasks), std::move(envs), std::move(action_shape),
                                            seed);
  };
  const auto version = py::str(py::module_::import("sys").attr("version")).cast<std::string>();
  AnyEnv env = AnyEnv::batched(id, std::move(maker));
  env.with_note("python: " + id + " steps in Python " + version.substr(0, version.find(' ')) +
                ", embedded in this process (the build's ANVIL_PYTHON, " ANVIL_PYTHON_INTERPRETER
                "); the GIL is taken once per batched step");
  return env;
}

}  // namespace anvil::envs::python

// The entry point `envs::python_env` finds with dlsym (C linkage: no mangled name to guess).
extern "C" __attribute__((visibility("default"))) void anvil_python_make_env(
    const std::string* id, const std::map<std::string, std::string>* kwargs, std::optional<anvil::envs::AnyEnv>* out) {
  out->emplace(anvil::envs::python::make_env(*id, *kwargs));
}
