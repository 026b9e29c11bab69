#pragma once
/// @file
/// `EnvBatch`: N envs of one type behind a face that does not name the type, stepped into
/// rows of floats that the caller owns; `EnvArray<E>` is it for an `Env` type `E`. This is
/// the part of a VecEnv that knows the env's type: autoreset, distinct seed streams, the
/// running episode returns, and the checks of every step and reset (an observation of the
/// wrong length, a non-finite observation or reward, or an exception from the env is an
/// EnvError naming the env, the step and the field: `Pendulum-v1: env 3 of 16: step 512:
/// reward is nan`). The VecEnv around it (envs/vec_env.hpp) owns the tensors, the threads and
/// the async stepping, and is compiled once, whatever the env.
///
/// Light header: a program's own env is wrapped here, in its own translation unit, without
/// torch (`envs::AnyEnv`, envs/any_env.hpp, is the door a Trainer takes it through).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/envs/env_config.hpp>

namespace anvil::envs {

/// An episode that ended during a step.
struct EpisodeEnd {
  std::int64_t env = 0;
  double episode_return = 0.0;
  std::int64_t length = 0;
  bool terminated = false;  ///< false: truncated by the time limit
  std::int32_t group = -1;  ///< its task (index into `VecEnvBase::groups()`), -1 when the env has none
  std::int8_t success = -1;  ///< whether any step met the goal (`envs::ReportsSuccess`); -1: the env does not say
};

/// Where a batched step writes, one row (or number) per env, owned by the caller.
/// Observation rows are float32 `[N, obs_dim]`, or bytes `[N, row_bytes]` for an env of
/// parts (`EnvSpec::layout`).
struct StepRows {
  void* obs = nullptr;           ///< [N, obs_dim] what to act on next (a new episode's first where one ended)
  void* next_obs = nullptr;      ///< [N, obs_dim] what the step led to (the last of an ended episode)
  float* reward = nullptr;       ///< [N]
  float* terminated = nullptr;   ///< [N] 0/1
  float* truncated = nullptr;    ///< [N] 0/1
  std::int64_t* task = nullptr;  ///< [N] each env's task during the step (null: the envs have no tasks)
  EpisodeEnd* ended = nullptr;   ///< [N] the episode env i ended in this step (length 0: none)
};

/// N envs behind a face that names no env type (see file comment). Env i's episodes are
/// seeded from its own stream, so no two envs, and no two episodes, share a seed. Not
/// thread-safe, but `step` over disjoint ranges of envs may run on several threads at once.
class EnvBatch {
 public:
  virtual ~EnvBatch() = default;
  EnvBatch(const EnvBatch&) = delete;
  EnvBatch& operator=(const EnvBatch&) = delete;

  [[nodiscard]] const EnvSpec& spec() const noexcept { return spec_; }
  [[nodiscard]] std::int64_t size() const noexcept { return n_; }
  /// The tasks of a task-tagged env (`envs::TaskTagged`), in its order; empty without tasks.
  [[nodiscard]] const std::vector<std::string>& groups() const noexcept { return groups_; }
  /// Whether the envs' state can be saved (trivially copyable envs, or `SavesOwnState`).
  [[nodiscard]] virtual bool saves_state() const noexcept = 0;
  /// Whether the env says when an episode succeeds (`envs::ReportsSuccess`).
  [[nodiscard]] virtual bool reports_success() const noexcept = 0;
  /// Whether the envs have tasks (then `StepRows::task` must be given).
  [[nodiscard]] bool has_tasks() const noexcept { return has_tasks_; }

  /// Starts a new episode in every env, its first observation into row i of `obs` (float32
  /// rows, or byte rows for an env of parts); `steps` is how many batched steps were taken
  /// before (for errors).
  virtual void reset(void* obs, std::int64_t steps) = 0;
  /// Steps envs [begin, end) with their rows of `actions` (float [N, act_dim] for a Box,
  /// int64 [N] for Discrete) and writes their rows of `out`; an env whose episode ends is
  /// reset at once (its first observation in `out.obs`). `steps`: batched steps before this one.
  virtual void step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) = 0;

  /// State protocol, in two parts around the caller's own: the envs and their seed streams;
  /// then the running episodes (returns, lengths, successes). Each read checks what it reads
  /// and returns what applies it, changing nothing before.
  virtual void save_envs(BinaryWriter& w) const = 0;
  [[nodiscard]] virtual std::function<void()> read_envs(BinaryReader& r) = 0;
  void save_episodes(BinaryWriter& w) const {
    w.bytes(returns_.data(), returns_.size() * sizeof(double));
    w.bytes(lengths_.data(), lengths_.size() * sizeof(std::int64_t));
    w.bytes(succeeded_.data(), succeeded_.size());
  }
  [[nodiscard]] std::function<void()> read_episodes(BinaryReader& r) {
    auto returns = std::make_shared<std::vector<double>>(returns_.size());
    r.bytes(returns->data(), returns->size() * sizeof(double), "episode returns");
    auto lengths = std::make_shared<std::vector<std::int64_t>>(lengths_.size());
    r.bytes(lengths->data(), lengths->size() * sizeof(std::int64_t), "episode lengths");
    auto succeeded = std::make_shared<std::vector<std::uint8_t>>(succeeded_.size());
    r.bytes(succeeded->data(), succeeded->size(), "episode successes");
    return [this, returns, lengths, succeeded] {
      returns_ = std::move(*returns);
      lengths_ = std::move(*lengths);
      succeeded_ = std::move(*succeeded);
    };
  }

 protected:
  EnvBatch(EnvSpec spec, std::int64_t n, std::vector<std::string> groups, bool has_tasks)
      : spec_(std::move(spec)), n_(n), groups_(std::move(groups)), has_tasks_(has_tasks) {
    returns_.assign(static_cast<std::size_t>(n_), 0.0);
    lengths_.assign(static_cast<std::size_t>(n_), 0);
    succeeded_.assign(static_cast<std::size_t>(n_), 0);
  }

  // "Pendulum-v1: env 3 of 16: step 512 (step 7 of its episode): ", where `when` is "step",
  // "reset" or "autoreset" (after an episode ended in the step under way).
  [[nodiscard]] std::string at_fault(std::int64_t i, std::string_view when, std::int64_t steps) const {
    std::string s = spec_.name + ": env " + std::to_string(i) + " of " + std::to_string(n_) + ": ";
    if (when == "step")
      return s + "step " + std::to_string(steps + 1) + " (step " + std::to_string(lengths_[static_cast<std::size_t>(i)] + 1) +
             " of its episode): ";
    return s + "reset after step " + std::to_string(steps + (when == "autoreset" ? 1 : 0)) + ": ";
  }
  // The observation env i returned has the space's length and only finite numbers (a NaN or
  // inf turns the sum of x * 0 into NaN: one multiply-add per number when all is well).
  void check_observation(std::int64_t i, std::span<const float> o, std::string_view when, std::int64_t steps) const {
    const auto d = spec_.obs_dim();
    if (static_cast<std::int64_t>(o.size()) != d)
      throw EnvError(at_fault(i, when, steps) + "observation has " + std::to_string(o.size()) +
                     " numbers; the observation space has " + std::to_string(d));
    check_finite(i, o.data(), o.size(), "observation", when, steps);
  }
  // A row of parts: its length is the layout's, and its float parts are finite (images are
  // bytes: any value is one).
  void check_observation(std::int64_t i, std::span<const std::uint8_t> o, std::string_view when, std::int64_t steps) const {
    const auto d = spec_.obs_dim();
    if (static_cast<std::int64_t>(o.size()) != d)
      throw EnvError(at_fault(i, when, steps) + "observation has " + std::to_string(o.size()) + " bytes; the layout (" +
                     spec_.layout.describe() + ") has " + std::to_string(d));
    for (const auto& p : spec_.layout.parts)
      if (p.dtype == PartDtype::float32) {  // read in place, number by number: nothing allocated per step
        float probe = 0.0f;
        const auto n = static_cast<std::size_t>(p.numel());
        for (std::size_t k = 0; k < n; ++k) probe += float_at(o, p.offset, k) * 0.0f;
        if (probe == 0.0f) continue;
        for (std::size_t k = 0; k < n; ++k)
          if (const float x = float_at(o, p.offset, k); !std::isfinite(x))
            throw EnvError(at_fault(i, when, steps) + "observation part '" + p.name + "'[" + std::to_string(k) + "] is " +
                           non_finite_name(x));
      }
  }
  static float float_at(std::span<const std::uint8_t> row, std::int64_t offset, std::size_t k) noexcept {
    float x;
    std::memcpy(&x, row.data() + offset + 4 * static_cast<std::ptrdiff_t>(k), sizeof x);
    return x;
  }
  void check_finite(std::int64_t i, const float* x, std::size_t n, const std::string& what, std::string_view when,
                    std::int64_t steps) const {
    float probe = 0.0f;
    for (std::size_t k = 0; k < n; ++k) probe += x[k] * 0.0f;
    if (probe == 0.0f) return;
    for (std::size_t k = 0; k < n; ++k)
      if (!std::isfinite(x[k]))
        throw EnvError(at_fault(i, when, steps) + what + "[" + std::to_string(k) + "] is " + non_finite_name(x[k]));
  }
  // Copies observation `o` into row i of `rows` (float32 or byte rows, as `o`'s elements).
  template <class T>
  static void put_row(void* rows, std::int64_t i, std::span<const T> o) {
    std::memcpy(static_cast<T*>(rows) + i * static_cast<std::int64_t>(o.size()), o.data(), o.size_bytes());
  }

  // Env i's step into its rows of `out`, after the checks of its observation and reward,
  // and into its episode's running return and length. True when the episode ended (its end
  // is in `out.ended[i]`, and the caller resets the env and writes the new episode's first
  // observation to `out.obs`); else the observation is in `out.obs` too. `success`: whether
  // this step met the goal (-1: the env does not say).
  template <class T>
  bool record_step(std::int64_t i, std::span<const T> o, double reward, bool terminated, bool truncated,
                   std::int32_t group, int success, const StepRows& out, std::int64_t steps) {
    check_observation(i, o, "step", steps);
    if (!std::isfinite(reward)) throw EnvError(at_fault(i, "step", steps) + "reward is " + non_finite_name(reward));
    const auto k = static_cast<std::size_t>(i);
    put_row(out.next_obs, i, o);
    out.reward[i] = static_cast<float>(reward);
    out.terminated[i] = terminated ? 1.0f : 0.0f;
    out.truncated[i] = truncated ? 1.0f : 0.0f;
    returns_[k] += reward;
    ++lengths_[k];
    if (success > 0) succeeded_[k] = 1;
    out.ended[i] = EpisodeEnd{};
    if (!terminated && !truncated) {
      put_row(out.obs, i, o);
      return false;
    }
    out.ended[i] = EpisodeEnd{i, returns_[k], lengths_[k], terminated, group,
                              static_cast<std::int8_t>(success < 0 ? -1 : succeeded_[k])};
    begin_episode(i);
    return true;
  }
  // Env i starts an episode: its running return, length and success start again.
  void begin_episode(std::int64_t i) noexcept {
    const auto k = static_cast<std::size_t>(i);
    returns_[k] = 0.0;
    lengths_[k] = 0;
    succeeded_[k] = 0;
  }

  EnvSpec spec_;
  std::int64_t n_;
  std::vector<std::string> groups_;
  bool has_tasks_;
  std::vector<double> returns_;
  std::vector<std::int64_t> lengths_;
  std::vector<std::uint8_t> succeeded_;  // per env: whether a step of its episode met the goal
};

/// N envs of type `E` (see `EnvBatch`).
template <Env E>
class EnvArray final : public EnvBatch {
 public:
  /// `cfg.num_envs` copies of `prototype` with the config's env.id, env.max_episode_steps,
  /// env.suite and env.tasks applied (or refused, naming the field). `first`: the index of env 0 among all envs of
  /// the run (every rank's), which `envs::Placeable` envs are told (`place(first + i,
  /// count)`); `count` (0: this batch's size) is how many there are in all.
  EnvArray(const E& prototype, const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first = 0, std::int64_t count = 0)
      : EnvArray(configured(prototype, cfg), cfg.num_envs, seed, first, count) {}

  [[nodiscard]] bool saves_state() const noexcept override { return kSavesState; }
  [[nodiscard]] bool reports_success() const noexcept override { return ReportsSuccess<E>; }

  /// Env `i`, e.g. to inspect its state in tests.
  [[nodiscard]] const E& env(std::int64_t i) const { return envs_.at(static_cast<std::size_t>(i)); }
  [[nodiscard]] E& env(std::int64_t i) { return envs_.at(static_cast<std::size_t>(i)); }

  void reset(void* obs, std::int64_t steps) override;

  void step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) override;

  void save_envs(BinaryWriter& w) const override;

  [[nodiscard]] std::function<void()> read_envs(BinaryReader& r) override;

 private:
  static constexpr bool kSavesState = std::is_trivially_copyable_v<E> || SavesOwnState<E>;

  EnvArray(E prototype, std::int64_t n, std::uint64_t seed, std::int64_t first, std::int64_t count)
      : EnvBatch(spec_of(prototype), n, groups_of(prototype), TaskTagged<E>) {
    envs_.assign(static_cast<std::size_t>(n_), prototype);
    if constexpr (Placeable<E>)
      for (std::int64_t i = 0; i < n_; ++i) envs_[static_cast<std::size_t>(i)].place(first + i, count > 0 ? count : n_);
    for (std::int64_t i = 0; i < n_; ++i) seeds_.emplace_back(derive_seed(seed, Stream::env, static_cast<std::uint64_t>(i)));
  }

  // The prototype with the config's env.id, env.max_episode_steps, env.suite and env.tasks
  // applied (or refused).
  static E configured(const E& prototype, const VecEnvConfig& cfg) {
    if (!cfg.id->empty() && *cfg.id != env_name(prototype))
      throw ConfigError("env.id=" + *cfg.id + ": this program trains " + env_name(prototype) +
                        " (env.id chooses the env only in programs that take it at run time, e.g. train_ppo)");
    if constexpr (ByteObservations<E>) {
      if (*cfg.observation == ObservationKind::state)
        throw ConfigError("env.observation=state: " + env_name(prototype) + " hands out images (" + prototype.observation_space().describe() +
                          "), and this program builds it so");
    } else if (*cfg.observation == ObservationKind::image) {
      throw ConfigError("env.observation=image: " + env_name(prototype) + " hands out float observations, and this program has no image "
                        "variant of it (images: env.id=PixelPendulum-v1 in train_sac and train_ppo, env.observation=image in diffusion_pusht)");
    }
    if (cfg.workers > 0)
      throw ConfigError("env.workers=" + std::to_string(*cfg.workers) + ": worker processes step envs written in Python "
                        "(env.id=python:MODULE:ATTR); " + env_name(prototype) + " steps in this process (env.threads)");
    E e = prototype;
    if (*cfg.max_episode_steps > 0) {
      if constexpr (TimeLimitable<E>) e.set_max_episode_steps(*cfg.max_episode_steps);
      else
        throw ConfigError("env.max_episode_steps=" + std::to_string(*cfg.max_episode_steps) + ": " + env_name(prototype) +
                          "'s time limit is its own (a built-in env's can be set; give your env type "
                          "set_max_episode_steps, envs::TimeLimitable)");
    }
    if (cfg.suite->empty() && cfg.tasks->empty()) return e;
    if constexpr (TaskSelectable<E>) e.select_tasks(*cfg.suite, *cfg.tasks);
    else
      throw ConfigError(std::string(cfg.suite->empty() ? "env.tasks" : "env.suite") + ": " + std::string(E::name) +
                        " has no tasks to choose");
    return e;
  }
  static std::vector<std::string> groups_of(const E& e) {
    if constexpr (TaskTagged<E>) return e.task_names();
    else return {};
  }
  static std::int32_t group_of(const E& e) {
    if constexpr (TaskTagged<E>) return static_cast<std::int32_t>(e.task_index());
    else return -1;
  }

  using Obs = std::span<const obs_element_t<E>>;
  // Env i's first observation of a new episode (from its own seed stream), checked.
  Obs reset_env(std::int64_t i, std::string_view when, std::int64_t steps);

  std::vector<E> envs_;
  std::vector<Rng> seeds_;
};

template <Env E>
void EnvArray<E>::reset(void* obs, std::int64_t steps) {
  for (std::int64_t i = 0; i < n_; ++i) {
    put_row(obs, i, reset_env(i, "reset", steps));
    begin_episode(i);
  }
}

template <Env E>
void EnvArray<E>::step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) {
  for (std::int64_t i = begin; i < end; ++i) {
    const auto k = static_cast<std::size_t>(i);
    E& env = envs_[k];
    if (out.task) out.task[i] = group_of(env);  // the task the step belongs to (before an autoreset)
    BasicStepResult<obs_element_t<E>> r;
    try {
      if constexpr (DiscreteEnv<E>) {
        r = env.step(static_cast<const std::int64_t*>(actions)[i]);
      } else {
        const auto ad = spec_.action_dim();
        r = env.step(std::span<const float>(static_cast<const float*>(actions) + i * ad, static_cast<std::size_t>(ad)));
      }
    } catch (const EnvError& err) {  // it names the env and its own step count
      throw EnvError("env " + std::to_string(i) + " of " + std::to_string(n_) + ": step " + std::to_string(steps + 1) + ": " +
                     err.what());
    } catch (const std::exception& err) {
      throw EnvError(at_fault(i, "step", steps) + err.what());
    }
    int success = -1;
    if constexpr (ReportsSuccess<E>) success = env.success() ? 1 : 0;
    if (record_step(i, r.observation, r.reward, r.terminated, r.truncated, group_of(env), success, out, steps))
      put_row(out.obs, i, reset_env(i, "autoreset", steps));
  }
}

template <Env E>
void EnvArray<E>::save_envs(BinaryWriter& w) const {
  if constexpr (kSavesState) {
    if constexpr (std::is_trivially_copyable_v<E>) {
      w.value(static_cast<std::uint64_t>(sizeof(E)));
      w.bytes(envs_.data(), envs_.size() * sizeof(E));
    } else {
      w.value(std::uint64_t{0});  // each env writes its own state
      for (const auto& e : envs_) e.save_state(w);
    }
    for (const auto& g : seeds_) w.value(g.state());
  } else {
    throw Error(spec_.name + ": envs of this type cannot be saved (not trivially copyable, no save_state)");
  }
}

template <Env E>
std::function<void()> EnvArray<E>::read_envs(BinaryReader& r) {
  if constexpr (!kSavesState) {
    r.fail("env state flag", "says the envs were saved, but " + spec_.name + " cannot be restored here");
    return {};
  } else {
    auto envs = std::make_shared<std::vector<E>>(envs_);
    if constexpr (std::is_trivially_copyable_v<E>) {
      r.expect(static_cast<std::uint64_t>(sizeof(E)), "env state size");
      r.bytes(envs->data(), envs->size() * sizeof(E), "env states");
    } else {
      r.expect(std::uint64_t{0}, "env state size");
      for (auto& e : *envs) e.load_state(r);  // into copies: nothing changes until applied
    }
    auto seeds = std::make_shared<std::vector<Rng::State>>();
    for (std::int64_t i = 0; i < n_; ++i) seeds->push_back(r.value<Rng::State>("env seed streams"));
    return [this, envs, seeds] {
      envs_ = std::move(*envs);
      for (std::size_t i = 0; i < seeds_.size(); ++i) seeds_[i].set_state((*seeds)[i]);
    };
  }
}

template <Env E>
typename EnvArray<E>::Obs EnvArray<E>::reset_env(std::int64_t i, std::string_view when, std::int64_t steps) {
  Obs first;
  try {
    first = envs_[static_cast<std::size_t>(i)].reset(seeds_[static_cast<std::size_t>(i)]());
  } catch (const std::exception& err) {
    throw EnvError(at_fault(i, when, steps) + err.what());
  }
  check_observation(i, first, when, steps);
  return first;
}

}  // namespace anvil::envs
