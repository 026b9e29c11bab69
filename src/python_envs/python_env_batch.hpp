#pragma once
// Envs written in Python stepped in this process, as an `EnvBatch` (envs/env_batch.hpp):
// what the bridge (bridge.cpp: an interpreter embedded in a C++ program) and the Python
// module (python/module.cpp: the interpreter that imported anvil) share. The GIL is taken
// once per batched step (or reset) and released between them, so the program's Python
// threads run while anvil learns. Observations are read through the buffer protocol without
// a copy when they are float32 and contiguous; observations with images (a Box of bytes
// [H, W, C], or a Dict of parts) are written into rows of parts by anvil_envs.Rows.
//
// The includer defines `support_dir()`: the folder of anvil's Python support files
// (anvil_envs.py, anvil_team.py).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/env_batch.hpp>

#include "python_batch.hpp"

namespace anvil::envs::python {

namespace py = pybind11;

/// The folder holding anvil_envs.py and anvil_team.py (defined by the includer).
std::filesystem::path support_dir();

// A module of anvil's own Python support (anvil_envs, anvil_team), imported (GIL held):
// the folder `support_dir()` names (defined by the includer) goes on sys.path once.
inline py::module_ support(const char* name) {
  static const bool on_path = [] {
    py::module_::import("sys").attr("path").attr("append")(support_dir().string());
    return true;
  }();
  (void)on_path;
  return py::module_::import(name);
}

// What anvil shows for an exception from Python (GIL held): anvil_envs.fault_text, the same
// words the env workers send.
inline std::string describe(const py::error_already_set& e) {
  try {
    if (e.trace()) PyException_SetTraceback(e.value().ptr(), e.trace().ptr());  // where it was raised
    return py::str(support("anvil_envs").attr("fault_text")(e.value())).cast<std::string>();
  } catch (const py::error_already_set&) {
    return e.what();
  }
}

// The envs, made by `factory(index=i, **kwargs)` (or without `index` when it takes none).
// Hidden, as pybind11's own types are (its members hold them).
class __attribute__((visibility("hidden"))) PythonEnvBatch final : public PythonBatch {
 public:
  /// `rows`: anvil_envs.Rows of an env with parts (None for float observations). GIL held.
  PythonEnvBatch(Spec spec, std::vector<py::object> envs, std::uint64_t seed, py::object rows)
      : PythonBatch(std::move(spec.env), static_cast<std::int64_t>(envs.size()), spec.tasks, seed),
        envs_(std::move(envs)),
        action_shape_(spec.action_shape.begin(), spec.action_shape.end()) {
    for (auto& e : envs_) step_fns_.push_back(e.attr("step"));
    if (spec_.byte_rows()) {
      rows_ = rows.attr("write");
      row_ = py::array_t<std::uint8_t>(spec_.obs_dim());
    }
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
    rows_ = {};
    row_ = {};
  }


  void reset(void* rows_out, std::int64_t steps) override {
    auto* obs = static_cast<std::uint8_t*>(rows_out);
    py::gil_scoped_acquire gil;
    const auto b = spec_.obs_row_bytes();
    for (std::int64_t i = 0; i < n_; ++i) {
      reset_env(i, obs + i * b, "reset", steps);
      begin_episode(i);
    }
  }

  void step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) override {
    py::gil_scoped_acquire gil;
    const auto b = spec_.obs_row_bytes();
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
      const auto o = row_of(item[0], i, "step", steps);
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
      const bool ended = spec_.byte_rows() ? record_step(i, o, reward, terminated != 0, truncated != 0, group, -1, out, steps)
                                           : record_step(i, as_floats(o), reward, terminated != 0, truncated != 0, group, -1, out, steps);
      if (ended) reset_env(i, static_cast<std::uint8_t*>(out.obs) + i * b, "autoreset", steps);
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

  // An observation as its row's bytes: float32 numbers (`observation`), or a row of parts
  // written by anvil_envs.Rows (images transposed), checked (length, finiteness of the
  // numbers); valid until the next call.
  std::span<const std::uint8_t> row_of(const py::handle& o, std::int64_t i, std::string_view when, std::int64_t steps) {
    if (!spec_.byte_rows()) {
      const auto f = observation(o, i, when, steps);
      return {reinterpret_cast<const std::uint8_t*>(f.data()), f.size_bytes()};
    }
    try {
      rows_(o, row_);
    } catch (const py::error_already_set& e) {
      throw EnvError(at_fault(i, when, steps) + describe(e));
    }
    const std::span<const std::uint8_t> s(row_.data(), static_cast<std::size_t>(row_.size()));
    check_observation(i, s, when, steps);
    return s;
  }
  static std::span<const float> as_floats(std::span<const std::uint8_t> b) {
    return {reinterpret_cast<const float*>(b.data()), b.size() / sizeof(float)};
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
  void reset_env(std::int64_t i, std::uint8_t* row, std::string_view when, std::int64_t steps) {
    const auto seed = next_seed(i);
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
    const auto o = row_of(py::reinterpret_borrow<py::tuple>(result)[0], i, when, steps);
    std::copy(o.begin(), o.end(), row);
  }

  std::vector<py::object> envs_;
  std::vector<py::object> step_fns_;  // each env's bound `step`, looked up once
  std::vector<Py_intptr_t> action_shape_;
  py::array_t<float, py::array::c_style | py::array::forcecast> obs_;
  py::object rows_;                // anvil_envs.Rows(...).write, for an env with parts
  py::array_t<std::uint8_t> row_;  // the row it writes into
};


/// The door (`AnyEnv`) to the envs `factory` makes (`anvil_envs.make_envs`: `factory(index=i,
/// **kwargs)`, a PettingZoo parallel env as one team env), named `id`, said of by `note`
/// when a run starts. GIL held. The factory is shared by the maker's copies (it runs for the
/// training envs and each set of evaluation envs) and released with the GIL held.
inline AnyEnv door(py::object factory, const std::string& id, const std::map<std::string, std::string>& kwargs,
                   std::string note) {
  std::shared_ptr<py::object> held(new py::object(std::move(factory)), [](py::object* p) {
    py::gil_scoped_acquire g;
    delete p;
  });
  auto maker = [held, id, kwargs](const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first,
                                  std::int64_t /*count*/) -> std::unique_ptr<EnvBatch> {
    cfg.refuse_python_fields(id);
    py::gil_scoped_acquire g;
    auto envs_py = support("anvil_envs");
    try {
      py::list made = envs_py.attr("make_envs")(*held, kwargs, first, *cfg.num_envs);
      const py::tuple spec = envs_py.attr("spec")(made[0], id);
      const auto text = spec[0].cast<std::string>();
      std::vector<py::object> envs;
      for (const auto& e : made) envs.push_back(py::reinterpret_borrow<py::object>(e));
      return std::make_unique<PythonEnvBatch>(parse_spec(text, id), std::move(envs), seed, py::tuple(spec[1])[3]);
    } catch (const py::error_already_set& e) {
      throw ConfigError("env.id=" + id + ": " + describe(e));
    }
  };
  AnyEnv env = AnyEnv::batched(id, std::move(maker));
  env.with_note(std::move(note));
  return env;
}

/// The Python that runs here, e.g. "3.11.2".
inline std::string python_version() {
  const auto version = py::str(py::module_::import("sys").attr("version")).cast<std::string>();
  return version.substr(0, version.find(' '));
}

}  // namespace anvil::envs::python
