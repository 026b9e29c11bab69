// `import anvil`'s compiled part, anvil._anvil (python/anvil/__init__.py is the API a user
// reads): the prebuilt Trainers (anvil::compiled) trained from Python, and anvil's C++ envs
// as a batched vector env for Python.
//
//  - `train(algorithm, env, name, arguments)`: the config from `arguments` (a main's command
//    line) over the Trainer's defaults, checked here with the GIL held; then the run, built
//    and trained with the GIL released. A Python env is stepped in this interpreter (the
//    GIL taken once per batched step: src/python_envs/python_env_batch.hpp, the bridge's own
//    code) or in worker processes (env.workers=W: the workers library, as a C++ main).
//    Ctrl-C during the run stops it as it stops a main (a checkpoint, then `Interrupted`),
//    which reaches Python as KeyboardInterrupt.
//  - `VecEnv(id, num_envs, threads, autoreset_mode, suite, tasks)`: an `EnvBatch` of one of
//    anvil's C++ envs (envs/env_batch.hpp) stepped into numpy arrays, with no Python per env.

#include <dlfcn.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <anvil/algorithms/policy.hpp>
#include <anvil/compiled.hpp>
#include <anvil/core/command_line.hpp>
#include <anvil/core/detail/thread_pool.hpp>
#include <anvil/core/hyperparams.hpp>
#include <anvil/envs/multi_agent/registry.hpp>
#include <anvil/envs/registry.hpp>
#include <anvil/envs/vec_env.hpp>
#include <anvil/train/signals.hpp>
#ifdef ANVIL_WITH_MUJOCO
#include <anvil/envs/mujoco/manipulation.hpp>
#endif
#ifdef ANVIL_WITH_CHIPMUNK
#include <anvil/envs/chipmunk/push_t.hpp>
#endif

#include "python_env_batch.hpp"

namespace py = pybind11;

namespace anvil::envs::python {
// anvil's Python support (anvil_envs.py, anvil_team.py): copied beside this module by the
// build (and by an install), found from the module's own file.
std::filesystem::path support_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&support_dir), &info) == 0 || !info.dli_fname)
    throw ConfigError("cannot find the anvil module's own file (dladdr), so not its Python support either");
  return std::filesystem::path(info.dli_fname).parent_path();
}
}  // namespace anvil::envs::python

namespace {

using anvil::ConfigError;
using anvil::envs::AnyEnv;
namespace pyenv = anvil::envs::python;

// ---- anvil's C++ envs by id --------------------------------------------------------------

// The ids `env(id)` knows in this build.
std::vector<std::string> cxx_env_ids() {
  std::vector<std::string> ids(anvil::envs::kBuiltinEnvs.begin(), anvil::envs::kBuiltinEnvs.end());
#ifdef ANVIL_WITH_MUJOCO
  ids.emplace_back(anvil::envs::mujoco::Manipulation::name);
#endif
#ifdef ANVIL_WITH_CHIPMUNK
  ids.emplace_back(anvil::envs::chipmunk::PushT::name);
#endif
  ids.insert(ids.end(), anvil::envs::kBuiltinTeamEnvs.begin(), anvil::envs::kBuiltinTeamEnvs.end());
  return ids;
}

// One of anvil's C++ envs (`cfg.id`, with the pixel task's env.image_size, env.frame_stack
// and env.action_repeat), through the door every env takes; a ConfigError naming env.id and
// the ids this build knows otherwise.
AnyEnv cxx_env(const anvil::envs::VecEnvConfig& cfg) {
  const auto& id = *cfg.id;
  const auto& builtin = anvil::envs::kBuiltinEnvs;
  // with_env refuses the pixel fields for any env but the pixel task, naming them
  if (std::find(builtin.begin(), builtin.end(), id) != builtin.end() || cfg.pixel_settings())
    return anvil::envs::with_env(cfg, [](const auto& e) { return AnyEnv(e); });
  for (auto n : anvil::envs::kBuiltinTeamEnvs)
    if (id == n) return anvil::envs::with_team_env(id, [](const auto& e) { return AnyEnv(e); });
#ifdef ANVIL_WITH_MUJOCO
  if (id == anvil::envs::mujoco::Manipulation::name) return AnyEnv(anvil::envs::mujoco::Manipulation{});
#endif
#ifdef ANVIL_WITH_CHIPMUNK
  if (id == anvil::envs::chipmunk::PushT::name) return AnyEnv(anvil::envs::chipmunk::PushT{});
#endif
  std::string known;
  for (const auto& n : cxx_env_ids()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("env.id='" + id + "' is not one of anvil's C++ envs in this build; choose one of " + known +
                    ", or pass a Python env (an object or a factory), or python:MODULE:ATTR");
}

// ---- training ----------------------------------------------------------------------------

// The hyperparameter files of the mains (examples/hyperparams): beside this module when
// installed, else the source tree's.
std::string hyperparams_file(const char* name) {
  const auto beside = pyenv::support_dir() / "hyperparams" / name;
  if (std::filesystem::exists(beside)) return beside.string();
  return std::string(ANVIL_HYPERPARAMS_DIR "/") + name;
}

// The door to the env a run trains (GIL held): `env` is an id (one of anvil's C++ envs, or
// python:MODULE:ATTR) or a Python factory named `name`.
// python:MODULE:ATTR a worker process imports, or empty with `why` not.
AnyEnv training_env(const py::object& env, const std::string& name, const std::string& importable,
                    const std::string& why, const anvil::envs::VecEnvConfig& cfg) {
  if (!py::isinstance<py::str>(env) || pyenv::is_python_id(env.cast<std::string>()))
    anvil::envs::refuse_pixel_fields(cfg, "the env is " + name + ", in Python");
  if (*cfg.workers > 0) {
    // The workers run this interpreter (unless ANVIL_PYTHON_EXE says another), with numpy.
    ::setenv("ANVIL_PYTHON_EXE", py::module_::import("sys").attr("executable").cast<std::string>().c_str(), 0);
    if (!py::isinstance<py::str>(env) && importable.empty())
      throw ConfigError("env.workers=" + std::to_string(*cfg.workers) + ": worker processes import the env factory by "
                        "name, and " + why + "; define it at the top level of a module and pass it (or "
                        "python:MODULE:ATTR), or set env.workers=0");
  }
  if (!py::isinstance<py::str>(env)) {
    if (*cfg.workers > 0) return anvil::envs::python_env(importable, *cfg.kwargs, *cfg.workers);
    return pyenv::door(env, name, *cfg.kwargs,
                       "python: " + name + " steps in this interpreter (Python " + pyenv::python_version() +
                           "); the GIL is taken once per batched step");
  }
  const auto id = env.cast<std::string>();
  if (!pyenv::is_python_id(id)) {
    if (!cfg.kwargs->empty())
      throw ConfigError("env.kwargs: only an env in Python takes keyword arguments; env.id is " + id);
    auto c = cfg;  // the env is the one named by `env` (the config's env.id may be empty)
    c.id = id;
    return cxx_env(c);
  }
  if (*cfg.workers > 0) return anvil::envs::python_env(id, *cfg.kwargs, *cfg.workers);  // links no Python
  py::object factory;
  try {
    factory = pyenv::support("anvil_envs").attr("import_factory")(id.substr(pyenv::kPrefix.size()));
  } catch (const py::error_already_set& e) {
    throw ConfigError("env.id=" + id + ": " + pyenv::describe(e));
  }
  return pyenv::door(std::move(factory), id, *cfg.kwargs,
                     "python: " + id + " steps in this interpreter (Python " + pyenv::python_version() +
                         "); the GIL is taken once per batched step");
}

py::dict fit_result(const anvil::FitResult& r, const std::filesystem::path& run_dir) {
  py::dict d;
  d["final_eval_return"] = r.final_eval_return;
  d["best_eval_return"] = r.best_eval_return;
  d["env_steps"] = r.env_steps;
  d["updates"] = r.updates;
  d["wall_seconds"] = r.wall_seconds;
  d["run_dir"] = run_dir.string();
  return d;
}

// Trains with the prebuilt Trainer `T`: the config checked with the GIL held, the run built
// and trained with it released (a Python env takes it to step).
struct EnvArg {
  const py::object& env;
  const std::string &name, &importable, &why;
};

// For a run whose envs step in worker processes: PYTHONPATH set to this interpreter's
// sys.path while the run lasts (workers start with the run and with each set of evaluation
// envs), so a worker imports the factory as this interpreter did; the old value after.
class WorkersPath {
 public:
  explicit WorkersPath(bool workers) {
    if (!workers) return;
    if (const char* p = std::getenv("PYTHONPATH")) old_ = p;
    std::string path;
    for (const auto& entry : py::module_::import("sys").attr("path")) {
      auto dir = py::str(entry).cast<std::string>();
      if (dir.empty()) dir = std::filesystem::current_path().string();  // "" is the current directory
      path += (path.empty() ? "" : ":") + dir;
    }
    ::setenv("PYTHONPATH", path.c_str(), 1);
    set_ = true;
  }
  WorkersPath(const WorkersPath&) = delete;
  WorkersPath& operator=(const WorkersPath&) = delete;
  ~WorkersPath() {
    if (!set_) return;
    if (old_) ::setenv("PYTHONPATH", old_->c_str(), 1);
    else ::unsetenv("PYTHONPATH");
  }

 private:
  bool set_ = false;
  std::optional<std::string> old_;
};

template <class T>
py::dict train_with(const EnvArg& e, const anvil::Args& args, typename T::Config defaults) {
  const auto cfg = T::configure(args, std::move(defaults));
  const WorkersPath path(*cfg.env->workers > 0);
  const AnyEnv door = training_env(e.env, e.name, e.importable, e.why, *cfg.env);
  anvil::FitResult result;
  std::filesystem::path run_dir;
  {
    py::gil_scoped_release nogil;
    T trainer(door, cfg, args.program);
    result = trainer.fit();  // Interrupted (Ctrl-C) comes out of here, after its checkpoint
    run_dir = trainer.run_dir();
  }
  std::fflush(stdout);
  return fit_result(result, run_dir);
}

// The algorithms `train` takes by name, each a prebuilt Trainer, with its C++ main's file of
// per-env defaults for anvil's C++ envs (examples/hyperparams; none for mt_sac).
constexpr std::array<const char*, 5> kAlgorithms{"sac", "sac_discrete", "ppo", "ppo_recurrent", "mt_sac"};

template <class F>
decltype(auto) with_algorithm(const std::string& algorithm, F&& f) {
  namespace a = anvil;
  using anvil::compiled::Trainer;
  if (algorithm == "sac") return f(std::type_identity<Trainer<a::SAC, a::UniformBuffer>>{}, "sac.yaml");
  if (algorithm == "sac_discrete")
    return f(std::type_identity<Trainer<a::DiscreteSAC, a::UniformBuffer>>{}, "sac_discrete.yaml");
  if (algorithm == "ppo") return f(std::type_identity<Trainer<a::PPO, a::RolloutBuffer>>{}, "ppo.yaml");
  if (algorithm == "ppo_recurrent")
    return f(std::type_identity<Trainer<a::RecurrentPPO, a::RolloutBuffer>>{}, "ppo_recurrent.yaml");
  if (algorithm == "mt_sac") return f(std::type_identity<Trainer<a::MultiTaskSAC, a::UniformBuffer>>{}, "");
  std::string known;
  for (const char* n : kAlgorithms) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError("algorithm='" + algorithm + "': choose one of " + known);
}

py::dict train(const std::string& algorithm, const py::object& env, const std::string& name,
               const std::string& importable, const std::string& why, const std::vector<std::string>& arguments) {
  auto args = anvil::parse_args(arguments);
  const EnvArg e{env, name, importable, why};
  const bool builtin = py::isinstance<py::str>(env) && !pyenv::is_python_id(env.cast<std::string>());
  return with_algorithm(algorithm, [&]<class T>(std::type_identity<T>, const std::string& hyperparams) {
    if (builtin && !hyperparams.empty())
      args = anvil::with_hyperparameters(args, hyperparams_file(hyperparams.c_str()), env.cast<std::string>());
    return train_with<T>(e, args, {});
  });
}

std::string config_help(const std::string& algorithm) {
  return with_algorithm(algorithm, [&]<class T>(std::type_identity<T>, const std::string&) {
    return T::help("anvil.train('" + algorithm + "')", {});
  });
}

// ---- anvil's C++ envs as a vector env for Python ------------------------------------------

// N of one of anvil's C++ envs stepped into numpy arrays (see anvil/__init__.py, VectorEnv,
// for the Python face: Gymnasium's VectorEnv shape). "next_step" autoreset (Gymnasium 1.x's
// default): the step that ends an episode returns its last observation, and the env's next
// step starts the new episode (the action is ignored; reward 0, not terminated or truncated);
// "same_step": the step that ends an episode returns the new episode's first observation,
// and the last one in infos["final_obs"]. Observations: float32 [N, obs_dim], or for an env
// of parts (a pixel task) an array per part (ObsArrays).
class VecEnv {
 public:
  VecEnv(const std::string& id, int num_envs, int threads, const std::string& autoreset_mode, const std::string& suite,
         const std::vector<std::string>& tasks, const std::array<int, 3>& pixels)
      : cfg_(config(id, num_envs, suite, tasks, pixels)), door_(cxx_env(cfg_)), pool_(std::max(1, threads)) {
    if (threads < 0) throw ConfigError("threads=" + std::to_string(threads) + ": 0 (this thread) or more threads");
    if (autoreset_mode != "next_step" && autoreset_mode != "same_step")
      throw ConfigError("autoreset_mode='" + autoreset_mode + "': choose next_step (Gymnasium's default) or same_step");
    same_step_ = autoreset_mode == "same_step";
    make(std::random_device{}());
  }

  [[nodiscard]] std::int64_t num_envs() const noexcept { return n_; }
  [[nodiscard]] const anvil::EnvSpec& spec() const noexcept { return batch_->spec(); }
  [[nodiscard]] std::vector<std::string> tasks() const { return batch_->groups(); }

  py::tuple reset(std::optional<std::uint64_t> seed) {
    if (seed) make(*seed);
    {
      py::gil_scoped_release nogil;
      batch_->reset(obs_.data(), steps_);
    }
    std::fill(pending_.begin(), pending_.end(), 0);
    started_ = true;
    return py::make_tuple(rows(obs_), py::dict());
  }

  py::tuple step(const py::array& actions) {
    if (!started_) throw anvil::Error("step() before reset(): call reset(seed=...) first");
    const void* act = action_rows(actions);
    const ObsArrays obs(spec(), n_);
    py::array_t<double> reward(n_);
    py::array_t<bool> terminated(n_), truncated(n_);
    double* r = reward.mutable_data();
    bool* te = terminated.mutable_data();
    bool* tr = truncated.mutable_data();
    const anvil::envs::StepRows rows{obs_.data(), next_.data(), reward_.data(), term_.data(), trunc_.data(),
                                     batch_->has_tasks() ? task_.data() : nullptr, ended_.data()};
    {
      py::gil_scoped_release nogil;
      // Envs whose episode ended last step (next_step) only start the new one: not stepped.
      pool_.parallel_for(n_, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end;) {
          if (pending_[static_cast<std::size_t>(i)]) {
            ++i;
            continue;
          }
          std::int64_t j = i;
          while (j < end && !pending_[static_cast<std::size_t>(j)]) ++j;
          batch_->step(i, j, act, rows, steps_);
          i = j;
        }
      });
    }
    ++steps_;
    bool any_end = false;
    for (std::int64_t i = 0; i < n_; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (pending_[k]) {  // the new episode's first observation, from the step that ended the last
        obs.put(i, row(obs_, i));
        r[i] = 0.0;
        te[i] = tr[i] = false;
        pending_[k] = 0;
        ended_[k] = {};
        continue;
      }
      r[i] = reward_[k];
      te[i] = term_[k] != 0.0f;
      tr[i] = trunc_[k] != 0.0f;
      const bool ended = ended_[k].length > 0;
      any_end = any_end || ended;
      obs.put(i, row(ended && !same_step_ ? next_ : obs_, i));
      if (ended && !same_step_) pending_[k] = 1;
    }
    py::dict infos;
    if (batch_->has_tasks()) infos["task"] = tasks_array();
    if (any_end) episode_infos(infos);
    return py::make_tuple(obs.value(), reward, terminated, truncated, infos);
  }

 private:
  // Observation rows as Python gets them: float32 [N, obs_dim] for an env of float rows; for
  // an env of parts, an array per part, [N, *shape] of its dtype (images uint8 [N, C, H, W]),
  // in a dict by name (Gymnasium's Dict space), or the one part's array where there is one.
  class ObsArrays {
   public:
    ObsArrays(const anvil::EnvSpec& s, std::int64_t n) {
      if (!s.byte_rows()) {
        add(n, {s.obs_dim()}, py::dtype::of<float>(), 0);
        value_ = arrays_.front();
        return;
      }
      py::dict parts;
      for (const auto& p : s.layout.parts) {
        add(n, p.shape, p.dtype == anvil::PartDtype::uint8 ? py::dtype::of<std::uint8_t>() : py::dtype::of<float>(), p.offset);
        parts[py::str(p.name)] = arrays_.back();
      }
      value_ = arrays_.size() == 1 ? py::object(arrays_.front()) : py::object(parts);
    }
    // Row i, from a row of the batch's (obs_row_bytes() long).
    void put(std::int64_t i, const std::uint8_t* row) const {
      for (const auto& s : slots_) std::memcpy(s.data + i * s.bytes, row + s.offset, static_cast<std::size_t>(s.bytes));
    }
    [[nodiscard]] const py::object& value() const noexcept { return value_; }

   private:
    struct Slot {
      std::uint8_t* data;
      std::int64_t offset, bytes;
    };
    void add(std::int64_t n, const std::vector<std::int64_t>& shape, const py::dtype& dtype, std::int64_t offset) {
      std::vector<py::ssize_t> dims{n};
      dims.insert(dims.end(), shape.begin(), shape.end());
      py::array a(dtype, dims);
      slots_.push_back({static_cast<std::uint8_t*>(a.mutable_data()), offset, a.nbytes() / std::max<std::int64_t>(n, 1)});
      arrays_.push_back(std::move(a));
    }
    std::vector<py::array> arrays_;
    std::vector<Slot> slots_;
    py::object value_;
  };

  static anvil::envs::VecEnvConfig config(const std::string& id, int num_envs, const std::string& suite,
                                          const std::vector<std::string>& tasks, const std::array<int, 3>& pixels) {
    anvil::envs::VecEnvConfig c;
    c.id = id;
    c.num_envs = num_envs;
    c.suite = suite;
    c.tasks = tasks;
    c.image_size = pixels[0];
    c.frame_stack = pixels[1];
    c.action_repeat = pixels[2];
    anvil::validate(c);  // each field's own range, as a run's config is checked (a ConfigError naming it)
    return c;
  }

  // Row i of a batch's observation rows (floats, or bytes of parts).
  const std::uint8_t* row(const std::vector<float>& rows, std::int64_t i) const {
    return reinterpret_cast<const std::uint8_t*>(rows.data()) + i * spec().obs_row_bytes();
  }

  // The batch, seeded from `seed` (env i's episodes from its own stream).
  void make(std::uint64_t seed) {
    batch_ = door_.batch_maker()(cfg_, seed, 0, 0);
    n_ = batch_->size();
    // rows of floats, or of bytes of parts (a multiple of 4 bytes: ObsLayout::row_bytes)
    obs_.assign(static_cast<std::size_t>(n_ * batch_->spec().obs_row_bytes() / 4), 0.0f);
    next_.assign(obs_.size(), 0.0f);
    reward_.assign(static_cast<std::size_t>(n_), 0.0f);
    term_ = trunc_ = reward_;
    task_.assign(static_cast<std::size_t>(n_), -1);
    ended_.assign(static_cast<std::size_t>(n_), {});
    pending_.assign(static_cast<std::size_t>(n_), 0);
    steps_ = 0;
  }

  py::object rows(const std::vector<float>& v) const {
    const ObsArrays a(spec(), n_);
    for (std::int64_t i = 0; i < n_; ++i) a.put(i, row(v, i));
    return a.value();
  }
  py::array_t<std::int64_t> tasks_array() const {
    py::array_t<std::int64_t> a(n_);
    std::copy(task_.begin(), task_.end(), a.mutable_data());
    return a;
  }

  // Gymnasium's episode statistics (RecordEpisodeStatistics' keys) for the envs whose
  // episode ended in this step, each with its mask ("_episode"); same_step adds the last
  // observations ("final_obs", "_final_obs").
  void episode_infos(py::dict& infos) const {
    py::array_t<double> ret(n_);
    py::array_t<std::int64_t> len(n_);
    py::array_t<bool> mask(n_), success(n_);
    for (std::int64_t i = 0; i < n_; ++i) {
      const auto& e = ended_[static_cast<std::size_t>(i)];
      mask.mutable_data()[i] = e.length > 0;
      ret.mutable_data()[i] = e.length > 0 ? e.episode_return : 0.0;
      len.mutable_data()[i] = e.length;
      success.mutable_data()[i] = e.success > 0;
    }
    py::dict episode;
    episode["r"] = ret;
    episode["l"] = len;
    if (batch_->reports_success()) episode["success"] = success;
    infos["episode"] = episode;
    infos["_episode"] = mask;
    if (same_step_) {
      infos["final_obs"] = rows(next_);
      infos["_final_obs"] = mask;
    }
  }

  // The actions as the batch reads them: float32 [N, action_dim] for a Box (a 1-D array when
  // the action has one number), int64 [N] for Discrete; a ValueError naming the shape or the
  // env at fault otherwise.
  const void* action_rows(const py::array& actions) {
    const auto& s = spec();
    if (s.discrete()) {
      if (actions.dtype().kind() != 'i' && actions.dtype().kind() != 'u')
        throw py::type_error("actions: " + py::str(actions.dtype()).cast<std::string>() + " for a Discrete action space; " +
                             "expected integers, shape (" + std::to_string(n_) + ",)");
      discrete_ = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(actions);
      if (discrete_.ndim() != 1 || discrete_.shape(0) != n_)
        throw py::value_error("actions: shape " + shape_of(actions) + "; expected (" + std::to_string(n_) + ",)");
      const auto n = std::get<anvil::Discrete>(s.action).n;
      for (std::int64_t i = 0; i < n_; ++i)
        if (discrete_.data()[i] < 0 || discrete_.data()[i] >= n)
          throw py::value_error("actions[" + std::to_string(i) + "] is " + std::to_string(discrete_.data()[i]) + "; " +
                                s.name + " has actions 0 to " + std::to_string(n - 1));
      return discrete_.data();
    }
    const auto ad = s.action_dim();
    continuous_ = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(actions);
    if (!continuous_) {
      PyErr_Clear();
      throw py::type_error("actions: not an array of numbers");
    }
    const bool ok = (continuous_.ndim() == 2 && continuous_.shape(0) == n_ && continuous_.shape(1) == ad) ||
                    (continuous_.ndim() == 1 && ad == 1 && continuous_.shape(0) == n_);
    if (!ok)
      throw py::value_error("actions: shape " + shape_of(actions) + "; expected (" + std::to_string(n_) + ", " +
                            std::to_string(ad) + ")");
    return continuous_.data();
  }
  static std::string shape_of(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t k = 0; k < a.ndim(); ++k) s += (k ? ", " : "") + std::to_string(a.shape(k));
    return s + (a.ndim() == 1 ? ",)" : ")");
  }

  anvil::envs::VecEnvConfig cfg_;
  AnyEnv door_;
  std::unique_ptr<anvil::envs::EnvBatch> batch_;
  anvil::detail::ThreadPool pool_;
  std::int64_t n_ = 0, steps_ = 0;
  bool same_step_ = false, started_ = false;
  std::vector<float> obs_, next_, reward_, term_, trunc_;
  std::vector<std::int64_t> task_;
  std::vector<anvil::envs::EpisodeEnd> ended_;
  std::vector<std::uint8_t> pending_;
  py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> discrete_;
  py::array_t<float, py::array::c_style | py::array::forcecast> continuous_;
};

// Microseconds per batched step of `num_envs` of env `id` stepped by a C++ loop over its
// EnvBatch (zero actions; no Python, no numpy): what make_vec's step is measured against
// (benchmarks/python_module_vec.py).
double bare_step_us(const std::string& id, int num_envs, std::int64_t batches) {
  anvil::envs::VecEnvConfig cfg;
  cfg.id = id;
  cfg.num_envs = num_envs;
  auto batch = cxx_env(cfg).batch_maker()(cfg, 1, 0, 0);
  const auto n = batch->size();
  std::vector<float> obs(static_cast<std::size_t>(n * batch->spec().obs_row_bytes() / 4)), next(obs.size()), reward(static_cast<std::size_t>(n)),
      term(reward.size()), trunc(reward.size()), actions(static_cast<std::size_t>(n * batch->spec().action_dim()));
  std::vector<std::int64_t> task(static_cast<std::size_t>(n)), discrete(static_cast<std::size_t>(n));
  std::vector<anvil::envs::EpisodeEnd> ended(static_cast<std::size_t>(n));
  const anvil::envs::StepRows rows{obs.data(), next.data(), reward.data(), term.data(), trunc.data(), task.data(), ended.data()};
  const void* act = batch->spec().discrete() ? static_cast<const void*>(discrete.data()) : actions.data();
  py::gil_scoped_release nogil;
  batch->reset(obs.data(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t k = 0; k < batches; ++k) batch->step(0, n, act, rows, k);
  const std::chrono::duration<double, std::micro> us = std::chrono::steady_clock::now() - t0;
  return us.count() / static_cast<double>(batches);
}

// Env steps per second of a Python env (python:MODULE:ATTR) stepped by anvil's VecEnv in this
// interpreter (env.workers=0), with fixed actions of 0.5: the loop bench_python_envs times in
// a C++ main, here with the interpreter that imported this module as the host
// (benchmarks/python_host_steps.py). The median of three timed stretches of `seconds`.
double python_step_rate(const std::string& id, int num_envs, double seconds) {
  if (!pyenv::is_python_id(id)) throw py::value_error("id: " + id + " is not python:MODULE:ATTR");
  if (num_envs < 1 || !(seconds > 0)) throw py::value_error("num_envs and seconds must be positive");
  anvil::envs::VecEnvConfig cfg;
  cfg.id = id;
  cfg.num_envs = num_envs;
  auto venv = anvil::envs::make_vec_env(training_env(py::str(id), id, "", "", cfg), cfg, 0);
  const auto actions = at::full({static_cast<std::int64_t>(num_envs), venv->spec().action_dim()}, 0.5f);
  py::gil_scoped_release nogil;  // the door takes it once per batched step, as in training
  venv->reset();
  for (int i = 0; i < 20; ++i) venv->step(actions);
  std::vector<double> rates;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    long calls = 0;
    double elapsed = 0;
    do {
      venv->step(actions);
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (elapsed < seconds);
    rates.push_back(static_cast<double>(calls) * num_envs / elapsed);
  }
  std::sort(rates.begin(), rates.end());
  return rates[1];
}

// The deterministic actions of a run's policy.bin (anvil::load_policy, the C++ policy) for
// observations [N, obs_dim]: what anvil.load_policy's torch module is checked against.
py::array_t<float> policy_act(const std::string& path, const py::array_t<float, py::array::c_style | py::array::forcecast>& obs) {
  const auto policy = anvil::load_policy(path);
  if (obs.ndim() != 2 || obs.shape(1) != policy.obs_dim())
    throw py::value_error("obs: shape " + std::to_string(obs.ndim() == 2 ? obs.shape(0) : -1) + " rows of " +
                          std::to_string(obs.ndim() == 2 ? obs.shape(1) : -1) + "; the policy reads " +
                          std::to_string(policy.obs_dim()) + " numbers a row");
  const auto n = obs.shape(0);
  auto in = at::from_blob(const_cast<float*>(obs.data()), {n, policy.obs_dim()}, at::kFloat).clone();
  const auto a = policy.act(in).contiguous();
  py::array_t<float> out({n, policy.action_dim()});
  std::memcpy(out.mutable_data(), a.data_ptr<float>(), static_cast<std::size_t>(a.numel()) * sizeof(float));
  return out;
}

py::dict space_of(const anvil::EnvSpec& s) {
  py::dict d;
  d["obs_low"] = s.observation.low;
  d["obs_high"] = s.observation.high;
  if (s.discrete()) {
    d["action_n"] = std::get<anvil::Discrete>(s.action).n;
  } else {
    d["action_low"] = std::get<anvil::Box>(s.action).low;
    d["action_high"] = std::get<anvil::Box>(s.action).high;
  }
  if (s.byte_rows()) {  // the parts: (name, dtype, shape); the float parts' bounds are obs_low/obs_high, in order
    py::list parts;
    for (const auto& p : s.layout.parts)
      parts.append(py::make_tuple(p.name, p.dtype == anvil::PartDtype::uint8 ? "uint8" : "float32", py::tuple(py::cast(p.shape))));
    d["parts"] = parts;
  }
  if (s.agents.multi_agent())
    d["agents"] = py::make_tuple(s.agents.agents, s.agents.obs_dim, s.agents.num_actions, s.agents.state_dim);
  return d;
}

}  // namespace

PYBIND11_MODULE(_anvil, m) {
  m.doc() = "anvil's compiled part; the API is the anvil package (python/anvil/__init__.py)";
  // anvil's errors as Python's: a ConfigError is a ValueError (bad input), the others
  // RuntimeErrors; an EnvError names the env, the step and the field.
  static py::exception<anvil::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<anvil::ConfigError> config_error(m, "ConfigError", PyExc_ValueError);
  static py::exception<anvil::envs::EnvError> env_error(m, "EnvError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const anvil::Interrupted& e) {
      // Ctrl-C (or SIGTERM) stopped the run after its checkpoint: Python's own way of saying so
      const std::string msg = std::string("stopped ") + e.what() +
                              "; from Python: anvil.train with the same run_dir and config {'run.resume': 'auto'}";
      if (e.signal() == SIGINT) PyErr_SetString(PyExc_KeyboardInterrupt, msg.c_str());
      else PyErr_SetObject(PyExc_SystemExit, py::int_(e.exit_code()).ptr());
    } catch (const anvil::ConfigError& e) {
      config_error(e.what());
    } catch (const anvil::envs::EnvError& e) {
      env_error(e.what());
    } catch (const anvil::Error& e) {
      error(e.what());
    }
  });

  m.def("train", &train, py::arg("algorithm"), py::arg("env"), py::arg("name"), py::arg("importable"), py::arg("why"),
        py::arg("arguments"));
  m.def("config_help", &config_help, py::arg("algorithm"));
  m.def("algorithms", [] { return std::vector<std::string>(kAlgorithms.begin(), kAlgorithms.end()); });
  m.def("env_ids", &cxx_env_ids);
  m.def("_bare_step_us", &bare_step_us, py::arg("id"), py::arg("num_envs"), py::arg("batches"));
  m.def("_python_step_rate", &python_step_rate, py::arg("id"), py::arg("num_envs"), py::arg("seconds"));
  m.def("policy_act", &policy_act, py::arg("path"), py::arg("obs"));

  py::class_<VecEnv>(m, "VecEnv")
      .def(py::init<const std::string&, int, int, const std::string&, const std::string&, const std::vector<std::string>&,
                    const std::array<int, 3>&>(),
           py::arg("id"), py::arg("num_envs"), py::arg("threads") = 0, py::arg("autoreset_mode") = "next_step",
           py::arg("suite") = "", py::arg("tasks") = std::vector<std::string>{},
           py::arg("pixels") = std::array<int, 3>{0, 0, 0})
      .def_property_readonly("num_envs", &VecEnv::num_envs)
      .def_property_readonly("spec", [](const VecEnv& v) { return space_of(v.spec()); })
      .def_property_readonly("tasks", &VecEnv::tasks)
      .def_property_readonly("name", [](const VecEnv& v) { return v.spec().name; })
      .def("_reset", &VecEnv::reset, py::arg("seed") = py::none())
      .def("step", &VecEnv::step, py::arg("actions"));
}
