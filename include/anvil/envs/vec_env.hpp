#pragma once
/// @file
/// `VecEnv`: N copies of an env stepped together, with autoreset, distinct seeds, and
/// batched tensors out. Storage is allocated once; a step copies each env's observation
/// into preallocated rows and allocates nothing.
///
/// Every step and reset is checked where it happens: an observation of the wrong length, a
/// non-finite observation or reward, or an exception from the env stops the run with an
/// EnvError naming the env, the step and the field (`Pendulum-v1: env 3 of 16: step 512:
/// reward is nan`). The check is a multiply-add per number, so it is always on.
///
/// Sync mode steps inside `step()`. Async mode steps on a background thread between
/// `step_async(actions)` and `step_wait()`, so a trainer can run gradient updates while
/// the envs step (the updates do not need the newest transition).

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/detail/thread_pool.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
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

/// One step of all envs. Tensors are views of the VecEnv's storage, valid until the step
/// after next (`obs` is double-buffered so the previous observation survives one step).
struct VecStep {
  at::Tensor obs;         ///< [N, obs_dim] what to act on next (the first of a new episode where one ended)
  at::Tensor next_obs;    ///< [N, obs_dim] what the step led to (the last of an ended episode)
  at::Tensor reward;      ///< [N] float
  at::Tensor terminated;  ///< [N] float 0/1
  at::Tensor truncated;   ///< [N] float 0/1
  at::Tensor task;        ///< [N] int64: each env's task during the step (envs with tasks; else undefined)
  std::vector<EpisodeEnd> ended;
};

/// The env-type-independent face of a VecEnv, so a Trainer's type does not depend on the
/// env's type. One virtual call per batched step.
class VecEnvBase {
 public:
  virtual ~VecEnvBase() = default;
  [[nodiscard]] const EnvSpec& spec() const noexcept { return spec_; }
  [[nodiscard]] std::int64_t num_envs() const noexcept { return n_; }
  /// Whether steps run inside `step_wait` (sync) or in the background from `step_async` on.
  [[nodiscard]] virtual VecMode mode() const noexcept = 0;
  /// Resets every env (env i with its own seed stream) and returns the observations.
  virtual at::Tensor reset() = 0;
  /// Starts a step with `actions`: [N, act_dim] float for a Box, [N] int64 for Discrete.
  virtual void step_async(const at::Tensor& actions) = 0;
  /// Finishes the step started by step_async.
  virtual const VecStep& step_wait() = 0;
  /// step_async then step_wait.
  const VecStep& step(const at::Tensor& actions) {
    step_async(actions);
    return step_wait();
  }

  /// The observations the envs show now (the `obs` of the last step or reset); undefined
  /// before the first reset.
  [[nodiscard]] virtual at::Tensor observations() const = 0;
  /// Whether `save` records the envs' state: env types that are trivially copyable (all the
  /// built-in ones) are saved as bytes; others are not saved, and a resumed run starts
  /// their episodes afresh.
  [[nodiscard]] virtual bool saves_state() const noexcept = 0;
  /// Writes every env's state, its seed stream, the current observations and the running
  /// episode returns and lengths, so a resumed run steps on exactly as this one would (only
  /// a flag when `saves_state()` is false).
  virtual void save(BinaryWriter& w) const = 0;
  /// Reads what `save` wrote, checking the env and the env count; changes nothing until the
  /// returned function is called (after the whole file has been checked). Returns an empty
  /// function when the file holds no env state.
  [[nodiscard]] virtual std::function<void()> read(BinaryReader& r) = 0;
  /// Applies what `read` returned (the state protocol, core/state.hpp).
  void restore(const std::function<void()>& apply) {
    if (apply) apply();
  }
  /// The discount of the algorithm learning from these envs (a reward normaliser scales by
  /// the spread of the discounted return); the loop gives it before the run starts.
  virtual void set_discount(double gamma) { (void)gamma; }
  /// With several ranks: merges statistics the envs keep (a normalising wrapper's running
  /// means) over the ranks, `sum` adding a double tensor over them in place. Plain envs
  /// keep none.
  virtual void sync_statistics(const std::function<void(at::Tensor&)>& sum) { (void)sum; }

  /// The groups episodes fall into, for breakdowns in evaluations: the tasks of a
  /// task-tagged env (`envs::TaskTagged`), in the order the env names them; empty when the
  /// env has no tasks. `EpisodeEnd::group` indexes it.
  [[nodiscard]] const std::vector<std::string>& groups() const noexcept { return groups_; }
  /// Whether the env says when an episode succeeds (`envs::ReportsSuccess`): then
  /// `EpisodeEnd::success` is 0 or 1, else -1.
  [[nodiscard]] virtual bool reports_success() const noexcept { return false; }

 protected:
  VecEnvBase(EnvSpec spec, std::int64_t n, std::vector<std::string> groups = {})
      : spec_(std::move(spec)), n_(n), groups_(std::move(groups)) {}
  EnvSpec spec_;
  std::int64_t n_;
  std::vector<std::string> groups_;
};

/// N envs of type `E` (see file comment). Env i's episodes are seeded from the stream
/// `Rng(derive(seed, i))`, so no two envs, and no two episodes, share a seed.
template <Env E>
class VecEnv final : public VecEnvBase {
 public:
  /// `first`: the index of this VecEnv's env 0 among all envs of the run (every rank's),
  /// which `envs::Placeable` envs are told (`place(first + i, count)`); `count` (0: this
  /// VecEnv's) is how many there are in all.
  VecEnv(const E& prototype, const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first = 0, std::int64_t count = 0)
      : VecEnv(configured(prototype, cfg), cfg, seed, first, count, 0) {}

 private:
  VecEnv(E prototype, const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first, std::int64_t count, int)
      : VecEnvBase(spec_of(prototype), cfg.num_envs, groups_of(prototype)), mode_(cfg.mode), pool_(cfg.threads) {
    envs_.assign(static_cast<std::size_t>(n_), prototype);
    if constexpr (Placeable<E>)
      for (std::int64_t i = 0; i < n_; ++i) envs_[static_cast<std::size_t>(i)].place(first + i, count > 0 ? count : n_);
    for (std::int64_t i = 0; i < n_; ++i)
      seeds_.emplace_back(derive_seed(seed, Stream::env, static_cast<std::uint64_t>(i)));
    const auto d = spec_.obs_dim();
    const auto f = at::TensorOptions().dtype(at::kFloat);
    for (auto& o : obs_) o = at::zeros({n_, d}, f);
    next_obs_ = at::zeros({n_, d}, f);
    reward_ = at::zeros({n_}, f);
    terminated_ = at::zeros({n_}, f);
    truncated_ = at::zeros({n_}, f);
    if constexpr (TaskTagged<E>) task_ = at::zeros({n_}, f.dtype(at::kLong));
    returns_.assign(static_cast<std::size_t>(n_), 0.0);
    succeeded_.assign(static_cast<std::size_t>(n_), 0);
    lengths_.assign(static_cast<std::size_t>(n_), 0);
    ended_.resize(static_cast<std::size_t>(n_));
    if (mode_ == VecMode::async) stepper_ = std::thread([this] { run_stepper(); });
  }

  // The prototype with the config's env.id, env.suite and env.tasks applied (or refused).
  static E configured(const E& prototype, const VecEnvConfig& cfg) {
    if (!cfg.id->empty() && *cfg.id != env_name(prototype))
      throw ConfigError("env.id=" + *cfg.id + ": this program trains " + env_name(prototype) +
                        " (env.id chooses the env only in programs that take it at run time, e.g. train_ppo)");
    E e = prototype;
    if (cfg.suite->empty() && cfg.tasks->empty()) return e;
    if constexpr (TaskSelectable<E>) e.select_tasks(*cfg.suite, *cfg.tasks);
    else
      throw ConfigError(std::string(cfg.suite->empty() ? "env.tasks" : "env.suite") + ": " + std::string(E::name) +
                        " has no tasks to choose");
    return e;
  }

 public:
  VecEnv(const VecEnv&) = delete;
  VecEnv& operator=(const VecEnv&) = delete;
  ~VecEnv() override {
    if (stepper_.joinable()) {
      {
        std::lock_guard lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      stepper_.join();
    }
  }

  at::Tensor observations() const override { return started_ ? obs_[cur_] : at::Tensor(); }
  bool saves_state() const noexcept override { return kSavesState; }
  bool reports_success() const noexcept override { return ReportsSuccess<E>; }
  VecMode mode() const noexcept override { return mode_; }

  void save(BinaryWriter& w) const override {
    w.value(saves_state());
    if constexpr (kSavesState) {
      if (in_flight_) throw Error("VecEnv::save: a step is in flight; save between steps");
      w.string(spec_.name);
      w.value(n_);
      if constexpr (std::is_trivially_copyable_v<E>) {
        w.value(static_cast<std::uint64_t>(sizeof(E)));
        w.bytes(envs_.data(), envs_.size() * sizeof(E));
      } else {
        w.value(std::uint64_t{0});  // each env writes its own state
        for (const auto& e : envs_) e.save_state(w);
      }
      for (const auto& g : seeds_) w.value(g.state());
      w.value(started_);
      w.value(steps_);
      const auto o = obs_[cur_].contiguous();
      w.bytes(o.data_ptr(), static_cast<std::size_t>(o.numel()) * sizeof(float));
      w.bytes(returns_.data(), returns_.size() * sizeof(double));
      w.bytes(lengths_.data(), lengths_.size() * sizeof(std::int64_t));
      w.bytes(succeeded_.data(), succeeded_.size());
    }
  }

  std::function<void()> read(BinaryReader& r) override {
    if (!r.value<bool>("env state flag")) return {};
    if constexpr (!kSavesState) {
      r.fail("env state flag", "says the envs were saved, but " + spec_.name + " cannot be restored here");
    } else {
      const auto name = r.string("env name");
      if (name != spec_.name) r.fail("env name", "is '" + name + "' in the file but '" + spec_.name + "' here");
      r.expect(n_, "env.num_envs");
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
      const bool started = r.value<bool>("env started flag");
      const auto steps = r.value<std::int64_t>("env step count");
      auto obs = at::empty_like(obs_[cur_]);
      r.bytes(obs.data_ptr(), static_cast<std::size_t>(obs.numel()) * sizeof(float), "env observations");
      auto returns = std::make_shared<std::vector<double>>(returns_.size());
      r.bytes(returns->data(), returns->size() * sizeof(double), "episode returns");
      auto lengths = std::make_shared<std::vector<std::int64_t>>(lengths_.size());
      r.bytes(lengths->data(), lengths->size() * sizeof(std::int64_t), "episode lengths");
      auto succeeded = std::make_shared<std::vector<std::uint8_t>>(succeeded_.size());
      r.bytes(succeeded->data(), succeeded->size(), "episode successes");
      return [this, envs, seeds, started, steps, obs, returns, lengths, succeeded] {
        wait_idle();
        envs_ = std::move(*envs);
        for (std::size_t i = 0; i < seeds_.size(); ++i) seeds_[i].set_state((*seeds)[i]);
        started_ = started;
        steps_ = steps;
        obs_[cur_].copy_(obs);
        returns_ = std::move(*returns);
        lengths_ = std::move(*lengths);
        succeeded_ = std::move(*succeeded);
      };
    }
  }

  at::Tensor reset() override {
    wait_idle();
    float* o = obs_[cur_].data_ptr<float>();
    const auto d = spec_.obs_dim();
    for (std::int64_t i = 0; i < n_; ++i) {
      const auto first = reset_env(i, "reset");
      std::copy(first.begin(), first.end(), o + i * d);
      returns_[i] = 0.0;
      lengths_[i] = 0;
      succeeded_[i] = 0;
    }
    started_ = true;
    return obs_[cur_];
  }

  void step_async(const at::Tensor& actions) override {
    if (!started_) throw EnvError(std::string(E::name) + ": VecEnv stepped before reset()");
    if (in_flight_) throw EnvError(std::string(E::name) + ": step_async called twice without step_wait");
    check_actions(actions);
    actions_ = actions;
    in_flight_ = true;
    if (mode_ == VecMode::sync) return;
    {
      std::lock_guard lock(mu_);
      requested_ = true;
    }
    cv_.notify_all();
  }

  const VecStep& step_wait() override {
    if (!in_flight_) throw EnvError(std::string(E::name) + ": step_wait without step_async");
    if (mode_ == VecMode::sync) {
      do_step();
    } else {
      // Spin only when a core is free for it: the stepper and its pool are busy meanwhile.
      if (pool_.threads() + 1 <= anvil::detail::available_cores())
        anvil::detail::spin_until([this] { return !requested_.load(std::memory_order_acquire); });
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return !requested_.load(); });
    }
    in_flight_ = false;
    if (auto err = std::exchange(error_, nullptr)) std::rethrow_exception(err);
    out_.obs = obs_[cur_];
    out_.next_obs = next_obs_;
    out_.reward = reward_;
    out_.terminated = terminated_;
    out_.truncated = truncated_;
    out_.task = task_;
    out_.ended.clear();
    for (std::int64_t i = 0; i < n_; ++i)
      if (ended_[i].length > 0) out_.ended.push_back(ended_[i]);
    return out_;
  }

  /// Batched steps taken so far (saved in checkpoints): the step errors name.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  /// Env `i`, e.g. to inspect its state in tests.
  [[nodiscard]] const E& env(std::int64_t i) const { return envs_.at(static_cast<std::size_t>(i)); }

 private:
  static constexpr bool kSavesState = std::is_trivially_copyable_v<E> || SavesOwnState<E>;

  static std::vector<std::string> groups_of(const E& e) {
    if constexpr (TaskTagged<E>) return e.task_names();
    else return {};
  }
  static std::int32_t group_of(const E& e) {
    if constexpr (TaskTagged<E>) return static_cast<std::int32_t>(e.task_index());
    else return -1;
  }

  void check_actions(const at::Tensor& a) const {
    const std::string who = std::string(E::name) + " VecEnv: ";
    if (a.device().type() != at::kCPU) throw EnvError(who + "actions must be on the CPU");
    if constexpr (DiscreteEnv<E>) {
      if (a.scalar_type() != at::kLong || a.numel() != n_)
        throw EnvError(who + "discrete actions must be an int64 tensor of " + std::to_string(n_) +
                       " indices, got " + std::string(a.dtype().name()) + " with " +
                       std::to_string(a.numel()) + " elements");
    } else {
      const auto ad = spec_.action_dim();
      if (a.scalar_type() != at::kFloat || a.dim() != 2 || a.size(0) != n_ || a.size(1) != ad)
        throw EnvError(who + "actions must be a float32 tensor of shape [" + std::to_string(n_) +
                       ", " + std::to_string(ad) + "], got " + std::string(a.dtype().name()) +
                       " " + shape(a));
    }
  }
  static std::string shape(const at::Tensor& t) {
    std::string s = "[";
    for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
  }

  // "Pendulum-v1: env 3 of 16: step 512 (step 7 of its episode): ", where `when` is "step",
  // "reset" (by the caller) or "autoreset" (after an episode ended in the step under way).
  std::string at_fault(std::int64_t i, const char* when) const {
    std::string s = std::string(E::name) + ": env " + std::to_string(i) + " of " + std::to_string(n_) + ": ";
    if (std::string_view(when) == "step")
      return s + "step " + std::to_string(steps_ + 1) + " (step " + std::to_string(lengths_[static_cast<std::size_t>(i)] + 1) +
             " of its episode): ";
    // an autoreset happens inside step steps_ + 1
    return s + "reset after step " + std::to_string(steps_ + (std::string_view(when) == "autoreset" ? 1 : 0)) + ": ";
  }

  // The observation env i returned has the space's length and only finite numbers (a NaN
  // or inf turns the sum of x * 0 into NaN: one multiply-add per number when all is well).
  void check_observation(std::int64_t i, std::span<const float> o, const char* when) const {
    const auto d = spec_.obs_dim();
    if (static_cast<std::int64_t>(o.size()) != d)
      throw EnvError(at_fault(i, when) + "observation has " + std::to_string(o.size()) + " numbers; the observation space has " +
                     std::to_string(d));
    float probe = 0.0f;
    for (float x : o) probe += x * 0.0f;
    if (probe == 0.0f) return;
    for (std::size_t k = 0; k < o.size(); ++k)
      if (!std::isfinite(o[k])) throw EnvError(at_fault(i, when) + "observation[" + std::to_string(k) + "] is " + non_finite_name(o[k]));
  }

  // Env i's first observation of a new episode (from its own seed stream), checked;
  // `when` is "reset" or "autoreset" (see at_fault).
  std::span<const float> reset_env(std::int64_t i, const char* when) {
    std::span<const float> first;
    try {
      first = envs_[static_cast<std::size_t>(i)].reset(seeds_[static_cast<std::size_t>(i)]());
    } catch (const std::exception& err) {
      throw EnvError(at_fault(i, when) + err.what());
    }
    check_observation(i, first, when);
    return first;
  }

  void do_step() {
    const int next = 1 - cur_;
    const auto d = spec_.obs_dim();
    at::Tensor actions = actions_.contiguous();
    float* obs_out = obs_[next].data_ptr<float>();
    float* next_out = next_obs_.data_ptr<float>();
    float* rew = reward_.data_ptr<float>();
    float* term = terminated_.data_ptr<float>();
    float* trunc = truncated_.data_ptr<float>();
    std::int64_t* task = task_.defined() ? task_.data_ptr<std::int64_t>() : nullptr;
    try {
      pool_.parallel_for(n_, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) {
          if (task) task[i] = group_of(envs_[i]);  // the task the step belongs to (before an autoreset)
          StepResult r;
          try {
            if constexpr (DiscreteEnv<E>) {
              r = envs_[i].step(actions.data_ptr<std::int64_t>()[i]);
            } else {
              const auto ad = spec_.action_dim();
              r = envs_[i].step(std::span<const float>(actions.data_ptr<float>() + i * ad,
                                                       static_cast<std::size_t>(ad)));
            }
          } catch (const EnvError& err) {  // it names the env and its own step count
            throw EnvError("env " + std::to_string(i) + " of " + std::to_string(n_) + ": step " + std::to_string(steps_ + 1) +
                           ": " + err.what());
          } catch (const std::exception& err) {
            throw EnvError(at_fault(i, "step") + err.what());
          }
          check_observation(i, r.observation, "step");
          if (!std::isfinite(r.reward)) throw EnvError(at_fault(i, "step") + "reward is " + non_finite_name(r.reward));
          std::copy(r.observation.begin(), r.observation.end(), next_out + i * d);
          rew[i] = static_cast<float>(r.reward);
          term[i] = r.terminated ? 1.0f : 0.0f;
          trunc[i] = r.truncated ? 1.0f : 0.0f;
          returns_[i] += r.reward;
          ++lengths_[i];
          if constexpr (ReportsSuccess<E>) succeeded_[i] |= envs_[i].success() ? 1 : 0;
          ended_[i] = EpisodeEnd{};
          if (r.terminated || r.truncated) {
            ended_[i] = EpisodeEnd{i, returns_[i], lengths_[i], r.terminated, group_of(envs_[i]),
                                   static_cast<std::int8_t>(ReportsSuccess<E> ? succeeded_[i] : -1)};
            returns_[i] = 0.0;
            lengths_[i] = 0;
            succeeded_[i] = 0;
            const auto first = reset_env(i, "autoreset");
            std::copy(first.begin(), first.end(), obs_out + i * d);
          } else {
            std::copy(r.observation.begin(), r.observation.end(), obs_out + i * d);
          }
        }
      });
      cur_ = next;
      ++steps_;
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  void run_stepper() {
    for (;;) {
      anvil::detail::spin_until([this] { return requested_.load(std::memory_order_acquire) || stop_.load(); });
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_.load() || requested_.load(); });
        if (stop_) return;
      }
      do_step();
      {
        std::lock_guard lock(mu_);
        requested_.store(false, std::memory_order_release);
      }
      cv_.notify_all();
    }
  }

  void wait_idle() {
    if (in_flight_) step_wait();
  }

  std::vector<E> envs_;
  std::vector<Rng> seeds_;
  VecMode mode_;
  anvil::detail::ThreadPool pool_;
  std::array<at::Tensor, 2> obs_;
  int cur_ = 0;
  at::Tensor next_obs_, reward_, terminated_, truncated_, task_, actions_;
  std::vector<double> returns_;
  std::vector<std::uint8_t> succeeded_;  // per env: whether a step of its episode met the goal
  std::vector<std::int64_t> lengths_;
  std::vector<EpisodeEnd> ended_;
  VecStep out_;
  std::int64_t steps_ = 0;
  bool started_ = false, in_flight_ = false;
  std::exception_ptr error_;
  std::thread stepper_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> requested_{false}, stop_{false};
};

/// A VecEnv of `cfg.num_envs` copies of `prototype`, behind the type-erased interface.
/// `first` and `count` place the envs among all of the run's (see VecEnv).
template <Env E>
std::unique_ptr<VecEnvBase> make_vec_env(const E& prototype, const VecEnvConfig& cfg, std::uint64_t seed,
                                         std::int64_t first = 0, std::int64_t count = 0) {
  return std::make_unique<VecEnv<E>>(prototype, cfg, seed, first, count);
}

}  // namespace anvil::envs
