#pragma once
/// @file
/// `VecEnvBase`: N envs stepped together, with autoreset, distinct seeds, and batched tensors
/// out, behind a face that names no env type (so a Trainer's type does not depend on its
/// env's); `LocalVecEnv`, the one anvil steps itself, is compiled once whatever the env: the
/// envs come as an `EnvBatch` (envs/env_batch.hpp, where every step and reset is checked).
/// Storage is allocated once; a step copies each env's observation into preallocated rows
/// and allocates nothing.
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
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/detail/thread_pool.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/envs/env_batch.hpp>
#include <anvil/envs/env_config.hpp>

namespace anvil::envs {

/// One step of all envs. Tensors are views of the VecEnv's storage, valid until the step
/// after next (`obs` is double-buffered so the previous observation survives one step).
struct VecStep {
  at::Tensor obs;         ///< [N, obs_dim] what to act on next (the first of a new episode where one ended); uint8 rows for an env of parts
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

/// The VecEnv anvil steps itself, in this process, for envs of any type (see file comment).
class LocalVecEnv : public VecEnvBase {
 public:
  LocalVecEnv(std::unique_ptr<EnvBatch> envs, const VecEnvConfig& cfg)
      : VecEnvBase(envs->spec(), envs->size(), envs->groups()), envs_(std::move(envs)), mode_(cfg.mode), pool_(cfg.threads) {
    const auto d = spec_.obs_dim();
    const auto f = at::TensorOptions().dtype(at::kFloat);
    const auto of = f.dtype(spec_.byte_rows() ? at::kByte : at::kFloat);  // rows of parts stay bytes
    for (auto& o : obs_) o = at::zeros({n_, d}, of);
    next_obs_ = at::zeros({n_, d}, of);
    reward_ = at::zeros({n_}, f);
    terminated_ = at::zeros({n_}, f);
    truncated_ = at::zeros({n_}, f);
    if (envs_->has_tasks()) task_ = at::zeros({n_}, f.dtype(at::kLong));
    ended_.resize(static_cast<std::size_t>(n_));
    if (mode_ == VecMode::async) stepper_ = std::thread([this] { run_stepper(); });
  }
  LocalVecEnv(const LocalVecEnv&) = delete;
  LocalVecEnv& operator=(const LocalVecEnv&) = delete;
  ~LocalVecEnv() override {
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
  bool saves_state() const noexcept override { return envs_->saves_state(); }
  bool reports_success() const noexcept override { return envs_->reports_success(); }
  VecMode mode() const noexcept override { return mode_; }

  void save(BinaryWriter& w) const override {
    w.value(saves_state());
    if (!saves_state()) return;
    if (in_flight_) throw Error("VecEnv::save: a step is in flight; save between steps");
    w.string(spec_.name);
    w.value(n_);
    envs_->save_envs(w);
    w.value(started_);
    w.value(steps_);
    const auto o = obs_[cur_].contiguous();
    w.bytes(o.data_ptr(), static_cast<std::size_t>(o.nbytes()));  // float rows, or bytes of parts
    envs_->save_episodes(w);
  }

  std::function<void()> read(BinaryReader& r) override {
    if (!r.value<bool>("env state flag")) return {};
    if (!saves_state()) r.fail("env state flag", "says the envs were saved, but " + spec_.name + " cannot be restored here");
    const auto name = r.string("env name");
    if (name != spec_.name) r.fail("env name", "is '" + name + "' in the file but '" + spec_.name + "' here");
    r.expect(n_, "env.num_envs");
    auto envs = envs_->read_envs(r);
    const bool started = r.value<bool>("env started flag");
    const auto steps = r.value<std::int64_t>("env step count");
    auto obs = at::empty_like(obs_[cur_]);
    r.bytes(obs.data_ptr(), static_cast<std::size_t>(obs.nbytes()), "env observations");
    auto episodes = envs_->read_episodes(r);
    return [this, envs = std::move(envs), started, steps, obs, episodes = std::move(episodes)] {
      wait_idle();
      envs();
      started_ = started;
      steps_ = steps;
      obs_[cur_].copy_(obs);
      episodes();
    };
  }

  at::Tensor reset() override {
    wait_idle();
    envs_->reset(obs_[cur_].data_ptr(), steps_);
    started_ = true;
    return obs_[cur_];
  }

  void step_async(const at::Tensor& actions) override {
    if (!started_) throw EnvError(spec_.name + ": VecEnv stepped before reset()");
    if (in_flight_) throw EnvError(spec_.name + ": step_async called twice without step_wait");
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
    if (!in_flight_) throw EnvError(spec_.name + ": step_wait without step_async");
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
      if (ended_[static_cast<std::size_t>(i)].length > 0) out_.ended.push_back(ended_[static_cast<std::size_t>(i)]);
    return out_;
  }

  /// Batched steps taken so far (saved in checkpoints): the step errors name.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  /// The envs it steps.
  [[nodiscard]] const EnvBatch& batch() const noexcept { return *envs_; }

 private:
  void check_actions(const at::Tensor& a) const {
    const std::string who = spec_.name + " VecEnv: ";
    if (a.device().type() != at::kCPU) throw EnvError(who + "actions must be on the CPU");
    if (spec_.discrete()) {
      if (a.scalar_type() != at::kLong || a.numel() != n_)
        throw EnvError(who + "discrete actions must be an int64 tensor of " + std::to_string(n_) + " indices, got " +
                       std::string(a.dtype().name()) + " with " + std::to_string(a.numel()) + " elements");
    } else {
      const auto ad = spec_.action_dim();
      if (a.scalar_type() != at::kFloat || a.dim() != 2 || a.size(0) != n_ || a.size(1) != ad)
        throw EnvError(who + "actions must be a float32 tensor of shape [" + std::to_string(n_) + ", " + std::to_string(ad) +
                       "], got " + std::string(a.dtype().name()) + " " + shape(a));
    }
  }
  static std::string shape(const at::Tensor& t) {
    std::string s = "[";
    for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
  }

  void do_step() {
    const int next = 1 - cur_;
    const at::Tensor actions = actions_.contiguous();
    StepRows rows;
    rows.obs = obs_[next].data_ptr();
    rows.next_obs = next_obs_.data_ptr();
    rows.reward = reward_.data_ptr<float>();
    rows.terminated = terminated_.data_ptr<float>();
    rows.truncated = truncated_.data_ptr<float>();
    rows.task = task_.defined() ? task_.data_ptr<std::int64_t>() : nullptr;
    rows.ended = ended_.data();
    const void* a = actions.data_ptr();
    try {
      pool_.parallel_for(n_, [&](std::int64_t b, std::int64_t e) { envs_->step(b, e, a, rows, steps_); });
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

  std::unique_ptr<EnvBatch> envs_;
  VecMode mode_;
  anvil::detail::ThreadPool pool_;
  std::array<at::Tensor, 2> obs_;
  int cur_ = 0;
  at::Tensor next_obs_, reward_, terminated_, truncated_, task_, actions_;
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

/// `LocalVecEnv` of envs of type `E`, which knows their type (`env(i)`, e.g. for tests).
template <Env E>
class VecEnv final : public LocalVecEnv {
 public:
  /// `cfg.num_envs` copies of `prototype` (see `EnvArray` for `first` and `count`).
  VecEnv(const E& prototype, const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first = 0, std::int64_t count = 0)
      : VecEnv(std::make_unique<EnvArray<E>>(prototype, cfg, seed, first, count), cfg) {}
  /// Env `i`.
  [[nodiscard]] const E& env(std::int64_t i) const { return array_->env(i); }

 private:
  VecEnv(std::unique_ptr<EnvArray<E>> envs, const VecEnvConfig& cfg) : LocalVecEnv(std::move(envs), cfg) {
    array_ = static_cast<const EnvArray<E>*>(&batch());
  }
  const EnvArray<E>* array_ = nullptr;
};

/// The training (or evaluation) envs of `env`: `cfg.num_envs` of them, seeded from `seed`;
/// `first` and `count` place them among all of the run's (see `EnvArray`).
inline std::unique_ptr<VecEnvBase> make_vec_env(const AnyEnv& env, const VecEnvConfig& cfg, std::uint64_t seed,
                                                std::int64_t first = 0, std::int64_t count = 0) {
  if (env.vec_maker()) {
    cfg.refuse_time_limits(env.name() + " comes batched by its own maker, which keeps its own time limit");
    auto v = env.vec_maker()(cfg, seed, first, count);
    if (!v) throw Error(env.name() + ": its maker made no envs");
    if (v->num_envs() != *cfg.num_envs)
      throw ConfigError("env.num_envs=" + std::to_string(*cfg.num_envs) + ": " + env.name() + "'s maker made " +
                        std::to_string(v->num_envs()));
    return v;
  }
  return std::make_unique<LocalVecEnv>(env.batch_maker()(cfg, seed, first, count), cfg);
}

}  // namespace anvil::envs
