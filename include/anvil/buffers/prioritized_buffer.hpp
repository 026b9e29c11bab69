#pragma once
/// @file
/// `PrioritizedBuffer`: proportional prioritized experience replay (Schaul, Quan,
/// Antonoglou, Silver 2016, "Prioritized Experience Replay", ICLR), on the cache-line sum
/// tree of buffers/sum_tree.hpp. Defaults are the paper's proportional variant: alpha 0.6,
/// beta annealed from 0.4 to 1.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

// replay_core.hpp brings the ring, its config, batches, the context, state, errors and Rng
#include <anvil/buffers/detail/replay_core.hpp>
#include <anvil/buffers/sum_tree.hpp>
#include <anvil/core/memory.hpp>
#include <anvil/core/simd.hpp>

namespace anvil {

/// Buffer policy: a ring of transitions like `UniformBuffer`, sampled in proportion to
/// priority p = (|TD error| + eps)^alpha. New transitions enter at the largest priority
/// seen so far, so each is replayed at least about once. A batch of n is drawn stratified:
/// one transition from each of n equal slices of the total priority. Each comes with the
/// importance weight (p / p_min)^-beta, i.e. (N P(i))^-beta divided by the largest weight
/// any stored transition could get, with beta rising linearly to 1 over the run. The
/// Trainer feeds each update's TD errors back through `update_priorities`.
class PrioritizedBuffer : public detail::ReplayBase<PrioritizedBuffer, PrioritizedBufferConfig> {
 public:
  /// The format tag of the files `save(path)` writes.
  static constexpr const char* file_format = "anvil PrioritizedBuffer v4";

  PrioritizedBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : ReplayBase(spec, cfg, ctx, "PrioritizedBuffer", tree_bytes(spec, cfg)), cfg_(cfg), horizon_(cfg.beta_steps) {
    const std::size_t count = balance_ ? spec.tasks.size() : 1;
    allocating("PrioritizedBuffer's priority " + std::string(count > 1 ? "trees (one per task)" : "tree") +
                   " (buffer.capacity=" + std::to_string(*cfg.capacity) + ")",
               tree_bytes(spec, cfg), [&] {
                 for (std::size_t k = 0; k < count; ++k) trees_.emplace_back(cfg.capacity);
                 if (balance_) leaf_tree_.assign(static_cast<std::size_t>(*cfg.capacity), -1);
               });
  }

  /// Adds one step of N envs (row i = env i) at the largest priority so far.
  void add(const StepBatch& step) {
    const auto [first, n] = store_.add(step);
    if (!balance_) {
      slots_.resize(static_cast<std::size_t>(n));
      values_.assign(static_cast<std::size_t>(n), max_priority_);
      for (std::int64_t i = 0; i < n; ++i) slots_[static_cast<std::size_t>(i)] = store_.slot_of(first + i);
      trees_[0].set(slots_, values_);
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t s = store_.slot_of(first + i);
        set_leaf(s, tree_of(s), max_priority_);
      }
    }
    // Transitions that left early (their observation was overwritten) can no longer be drawn.
    for (auto k : store_.killed())
      if (!store_.valid(k)) set_leaf(k, holder(k), 0.0);
  }

  /// `n` transitions, one from each of n equal slices of the total priority, with their
  /// importance weights in `weight` and ids in `index`. With an env that has tasks and
  /// `balance_tasks`, each task that has transitions gets an equal share of the batch,
  /// drawn the same way from its own priorities (a tree per task); the importance weights
  /// then correct for the probability of the draw: a task's share times the transition's
  /// priority over its task's total.
  ReplayBatch sample(std::int64_t n) {
    check_batch(n);
    mass_.resize(static_cast<std::size_t>(n));
    sampled_.resize(static_cast<std::size_t>(n));
    // (P / P_min)^-beta = exp(-beta (log P - log P_min)), P the probability of the draw.
    priority_.resize(static_cast<std::size_t>(n));
    log_p_.resize(static_cast<std::size_t>(n));
    double log_p_min = INFINITY;
    auto draw = [&](std::size_t k, std::int64_t begin, std::int64_t q, double share) {
      auto& tree = trees_[k];
      const double total = tree.total(), slice = total / static_cast<double>(q), top = std::nextafter(total, 0.0);
      for (std::int64_t j = 0; j < q; ++j)
        mass_[static_cast<std::size_t>(begin + j)] = std::min((static_cast<double>(j) + rng_.uniform()) * slice, top);
      tree.find(std::span<const double>(mass_).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(q)),
                std::span<std::int64_t>(sampled_).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(q)));
      for (std::int64_t j = begin; j < begin + q; ++j)
        priority_[static_cast<std::size_t>(j)] = tree.get(sampled_[static_cast<std::size_t>(j)]);
      simd::log(log_p_.data() + begin, priority_.data() + begin, q);
      const double base = balance_ ? std::log(share) - std::log(total) : 0.0;  // (one tree: P ~ p)
      if (balance_)
        for (std::int64_t j = begin; j < begin + q; ++j) log_p_[static_cast<std::size_t>(j)] += base;
      log_p_min = std::min(log_p_min, base + std::log(tree.min()));
    };
    if (!balance_) {
      draw(0, 0, n, 1.0);
    } else {
      const auto quota = task_quotas(n, calls_++);
      std::int64_t begin = 0;
      for (std::size_t k = 0; k < quota.size(); ++k) {
        if (quota[k] == 0) continue;
        draw(k, begin, quota[k], static_cast<double>(quota[k]) / static_cast<double>(n));
        begin += quota[k];
      }
    }
    // (on the host, the last batch's weights again once let go of: detail::ReusedTensor)
    auto w = store_.device().is_cpu() ? weight_.take({n}, at::kFloat) : at::empty({n}, at::TensorOptions().dtype(at::kFloat));
    const double b = beta();
    for (std::int64_t k = 0; k < n; ++k)
      log_p_[static_cast<std::size_t>(k)] = -b * (log_p_[static_cast<std::size_t>(k)] - log_p_min);
    simd::exp(priority_.data(), log_p_.data(), n);  // (the priorities are no longer needed)
    auto* wp = w.data_ptr<float>();
    for (std::int64_t k = 0; k < n; ++k) wp[k] = static_cast<float>(priority_[static_cast<std::size_t>(k)]);
    auto batch = store_.gather(sampled_);
    batch.weight = store_.device().is_cpu() ? w : w.to(store_.device(), /*non_blocking=*/true);
    return batch;
  }

  /// Sets the priorities of transitions `index` (ids from `sample`) to
  /// (|td_error| + eps)^alpha. Ids of transitions overwritten since they were sampled are
  /// skipped. `td_error` must be finite; ids must come from this buffer.
  void update_priorities(const at::Tensor& index, const at::Tensor& td_error) {
    const double a = cfg_.alpha, eps = cfg_.eps;
    assign("update_priorities", "TD error", index, td_error, [&](const double* td, double* p, std::int64_t n) {
      log_p_.resize(static_cast<std::size_t>(n));
      for (std::int64_t k = 0; k < n; ++k) p[k] = std::abs(td[k]) + eps;
      simd::log(log_p_.data(), p, n);
      for (std::int64_t k = 0; k < n; ++k) log_p_[static_cast<std::size_t>(k)] *= a;
      simd::exp(p, log_p_.data(), n);
    });
  }

  /// Sets the sampling priorities of transitions `index` directly (no eps, no exponent).
  /// Priorities must be finite and >= 0.
  void set_priorities(const at::Tensor& index, const at::Tensor& priority) {
    assign("set_priorities", "priority", index, priority,
           [](const double* v, double* p, std::int64_t n) { std::copy(v, v + n, p); });
  }

  /// The importance-weight exponent now: `beta` rising linearly to 1 over the horizon.
  [[nodiscard]] double beta() const noexcept {
    if (horizon_ <= 0) return cfg_.beta;
    const double f = std::min(1.0, static_cast<double>(store_.added()) / static_cast<double>(horizon_));
    return cfg_.beta + (1.0 - cfg_.beta) * f;
  }
  /// The run's length in env steps, for the beta schedule when `beta_steps` is 0 (the
  /// Trainer calls this with train.steps).
  void set_horizon(std::int64_t env_steps) noexcept {
    if (*cfg_.beta_steps == 0) horizon_ = env_steps;
  }

  /// The priority of stored transition `id`.
  [[nodiscard]] double priority(std::int64_t id) const {
    if (!store_.live(id)) throw Error("PrioritizedBuffer::priority: id " + std::to_string(id) + " is not stored");
    const auto s = store_.slot_of(id);
    return trees_[holder(s)].get(s);
  }
  /// Sum of all stored priorities.
  [[nodiscard]] double total_priority() const noexcept {
    double sum = 0;
    for (const auto& t : trees_) sum += t.total();
    return sum;
  }
  /// Priority updates skipped because their transition had been overwritten.
  [[nodiscard]] std::int64_t stale_updates() const noexcept { return stale_; }

  /// The run's plan (the loop calls it before the run and after a resume): the discount of
  /// n-step returns, and the run's length for the beta schedule.
  void plan(const StoragePlan& p) noexcept {
    set_discount(p.discount);
    set_horizon(p.horizon);
  }

  /// State protocol (core/state.hpp): transitions, priorities, n-step windows, sampling state.
  using ReplayBase::save, ReplayBase::load;  // (the buffer file)
  void save(BinaryWriter& w) const {
    store_.save(w);
    w.value(rng_.state());
    w.value(max_priority_);
    w.value(stale_);
    w.value(horizon_);
    w.value(calls_);
    for (std::int64_t i = 0; i < store_.stored(); ++i) w.value(trees_[holder(i)].get(i));
  }
  struct Saved {
    detail::TransitionStore::Saved core;
    Rng::State rng{};
    double max_priority = 1.0;
    std::int64_t stale = 0, horizon = 0, calls = 0;
    std::vector<double> priorities;
  };
  /// Reads what `save` wrote, checked against this buffer's config; changes nothing.
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{store_.read(r), {}, 1.0, 0, 0, 0, {}};
    s.rng = r.value<Rng::State>("sampling state");
    s.max_priority = r.value<double>("largest priority");
    s.stale = r.value<std::int64_t>("stale update count");
    s.horizon = r.value<std::int64_t>("beta horizon");
    s.calls = r.value<std::int64_t>("balanced batches drawn");
    s.priorities.resize(static_cast<std::size_t>(std::min(s.core.added, capacity())));
    r.bytes(s.priorities.data(), s.priorities.size() * sizeof(double), "priorities");
    for (double v : s.priorities)
      if (!std::isfinite(v) || v < 0) r.fail("priorities", "contain a negative or non-finite value");
    return s;
  }
  void restore(Saved&& s) {
    store_.restore(std::move(s.core));
    rng_.set_state(s.rng);
    max_priority_ = s.max_priority;
    stale_ = s.stale;
    horizon_ = s.horizon;
    calls_ = s.calls;
    for (auto& tree : trees_) tree = detail::PriorityTree(capacity());
    if (!balance_) {
      std::vector<std::int64_t> idx(s.priorities.size());
      for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i);
      trees_[0].set(idx, s.priorities);
      return;
    }
    std::fill(leaf_tree_.begin(), leaf_tree_.end(), -1);
    for (std::size_t i = 0; i < s.priorities.size(); ++i) {  // each leaf in its task's tree
      const auto slot = static_cast<std::int64_t>(i);
      const std::int32_t k = store_.task_of(slot);
      if (k >= 0) set_leaf(slot, static_cast<std::size_t>(k), s.priorities[i]);
    }
  }

  /// Bytes of preallocated storage, trees included.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    std::int64_t b = store_.bytes() + static_cast<std::int64_t>(leaf_tree_.size() * sizeof(std::int32_t));
    for (const auto& t : trees_) b += t.bytes();
    return b;
  }

 private:
  // The host memory of the priority trees (one per task when balancing) and their index.
  static std::int64_t tree_bytes(const EnvSpec& spec, const Config& cfg) {
    const bool per_task = cfg.balance_tasks && spec.tasks.size() > 1;
    const auto count = static_cast<std::int64_t>(per_task ? spec.tasks.size() : 1);
    return count * detail::PriorityTree::bytes_for(cfg.capacity) + (per_task ? *cfg.capacity * 4 : 0);
  }
  // The tree row `slot`'s transition belongs in (its task's when balancing), and the one its
  // leaf is in now.
  [[nodiscard]] std::size_t tree_of(std::int64_t slot) const noexcept {
    return balance_ ? static_cast<std::size_t>(store_.task_of(slot)) : 0;
  }
  [[nodiscard]] std::size_t holder(std::int64_t slot) const noexcept {
    if (!balance_) return 0;
    const std::int32_t k = leaf_tree_[static_cast<std::size_t>(slot)];
    return k < 0 ? 0 : static_cast<std::size_t>(k);
  }
  // Sets row `slot`'s priority in tree `k`, clearing its leaf in the tree it was in before.
  void set_leaf(std::int64_t slot, std::size_t k, double value) {
    const std::int64_t one[1] = {slot};
    if (balance_) {
      const std::int32_t was = leaf_tree_[static_cast<std::size_t>(slot)];
      if (was >= 0 && static_cast<std::size_t>(was) != k) {
        const double zero[1] = {0.0};
        trees_[static_cast<std::size_t>(was)].set(one, zero);
      }
      leaf_tree_[static_cast<std::size_t>(slot)] = static_cast<std::int32_t>(k);
    }
    const double v[1] = {value};
    trees_[k].set(one, v);
  }

  // Checks ids and values, maps the values to priorities all at once with `to_priorities`
  // (given values, priorities out, count: one vectorised pass; a non-finite value's result
  // is ignored and the value itself reported), and sets the live ones. Bad input changes
  // nothing.
  template <class F>
  void assign(const char* fn, const char* what, const at::Tensor& index, const at::Tensor& values,
              F to_priorities) {
    const auto who = [fn] { return std::string("PrioritizedBuffer::") + fn + ": "; };
    const auto idx = detail::host_as(index, at::kLong);
    const auto val = detail::host_as(values, values.scalar_type() == at::kFloat ? at::kFloat : at::kDouble);
    if (idx.numel() != val.numel())
      throw Error(who() + std::to_string(idx.numel()) + " ids but " + std::to_string(val.numel()) + " " +
                  what + " values");
    const std::int64_t n = val.numel();
    given_.resize(static_cast<std::size_t>(n));
    if (val.scalar_type() == at::kFloat)
      std::copy(val.data_ptr<float>(), val.data_ptr<float>() + n, given_.begin());
    else
      std::copy(val.data_ptr<double>(), val.data_ptr<double>() + n, given_.begin());
    priority_.resize(static_cast<std::size_t>(n));
    to_priorities(given_.data(), priority_.data(), n);  // all at once (vectorised); checked below
    const auto* ip = idx.data_ptr<std::int64_t>();
    slots_.resize(static_cast<std::size_t>(n));
    values_.resize(static_cast<std::size_t>(n));
    const auto lap = store_.lap();  // ids to rows without a division each
    const std::int64_t added = store_.added();
    std::size_t live = 0;
    double top = max_priority_;
    for (std::int64_t k = 0; k < n; ++k) {
      const double v = given_[static_cast<std::size_t>(k)];
      const double p = std::isfinite(v) ? priority_[static_cast<std::size_t>(k)] : v;
      if (!std::isfinite(p) || p < 0)
        throw Error(who() + what + " " + std::to_string(k) + " (id " + std::to_string(ip[k]) + ") is " +
                    std::to_string(v) + "; priorities must be finite and >= 0 (a NaN TD error "
                    "usually means the losses diverged)");
      if (ip[k] < 0 || ip[k] >= added)
        throw Error(who() + "id " + std::to_string(ip[k]) + " (entry " + std::to_string(k) +
                    ") is out of range: " + std::to_string(added) + " transitions were added");
      const std::int64_t slot = lap.slot(ip[k]);
      if (!lap.recent(ip[k]) || !store_.valid(slot)) continue;  // overwritten since it was sampled
      slots_[live] = slot;
      values_[live] = p;
      ++live;
      top = std::max(top, p);
    }
    stale_ += n - static_cast<std::int64_t>(live);
    max_priority_ = top;
    slots_.resize(live);
    values_.resize(live);
    if (!balance_) {
      trees_[0].set(slots_, values_);
      return;
    }
    for (std::size_t k = 0; k < slots_.size(); ++k) set_leaf(slots_[k], tree_of(slots_[k]), values_[k]);
  }

  Config cfg_;
  std::vector<detail::PriorityTree> trees_;  // one, or one per task when balancing
  std::vector<std::int32_t> leaf_tree_;     // per row, when balancing: the tree its leaf is in (-1: none)
  std::int64_t horizon_;
  std::int64_t calls_ = 0;  // balanced batches drawn (which task gets the remainder rotates)
  double max_priority_ = 1.0;
  std::int64_t stale_ = 0;
  std::vector<std::int64_t> slots_, sampled_;
  std::vector<double> values_, mass_;
  std::vector<double> priority_, log_p_, given_;  // scratch of sample and assign
  detail::ReusedTensor weight_;                   // sample's importance weights
};

static_assert(PrioritizedReplay<PrioritizedBuffer>);

}  // namespace anvil
