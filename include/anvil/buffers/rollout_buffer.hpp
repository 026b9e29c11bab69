#pragma once
/// @file
/// `RolloutBuffer`: the storage of an on-policy algorithm (PPO). It holds one rollout of
/// `rollout.steps` steps of N envs in tensors allocated once, computes generalised
/// advantage estimates (Schulman, Moritz, Levine, Jordan, Abbeel 2016, "High-Dimensional
/// Continuous Control Using Generalized Advantage Estimation") and the value targets, then
/// hands the rollout out in shuffled minibatches, once per epoch. It is cleared for the
/// next rollout, so no transition is learned from by a policy other than the one that
/// collected it (and the epochs right after).
///
/// Episode ends are told apart, as in the replay buffers: where an episode *terminated*
/// the return ends (no bootstrap); where it was *truncated* by a time limit the return
/// continues past the cut as the value of the episode's true last state, which the
/// collector passes as `bootstrap_value`. Either way the advantage does not run on into
/// the next episode, which the vectorised env has already started in that row.
///
/// For a recurrent policy (`CarriesMemory`; the plan's `memory` > 0) the rollout also
/// keeps, beside each step, the memory the policy acted from and whether the step started
/// an episode, and hands out *sequences* (`sequences`): runs of consecutive steps of one
/// env, shuffled whole, each with the memory it started from as the policy acted: stored
/// states, not a burn-in (docs/ppo.md, "Recurrent PPO", says why).

#include <ATen/ATen.h>

#include <range/v3/view/chunk.hpp>
#include <range/v3/view/transform.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ranges>
#include <string>
#include <type_traits>
#include <vector>

#include <anvil/buffers/replay_config.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/memory.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>

namespace anvil {

/// Buffer policy for on-policy algorithms (see file comment).
class RolloutBuffer : public BufferPolicy<"rollout", RolloutBatch, RolloutStep, true> {
 public:
  using Config = RolloutBufferConfig;

  RolloutBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), obs_dim_(spec.obs_dim()), act_dim_(spec.action_dim()),
        discrete_(spec.discrete()), byte_rows_(spec.byte_rows()) {}

  /// Allocates storage for `n` envs (the Trainer calls it with env.num_envs).
  void set_num_envs(std::int64_t n) {
    if (n < 1) throw ConfigError("RolloutBuffer: needs at least one env, got " + std::to_string(n));
    envs_ = n;
    const std::int64_t t = cfg_.steps;
    const auto f = at::TensorOptions().dtype(at::kFloat);
    // Refused before anything is allocated when it cannot fit (it is zeroed, so it is touched).
    const std::int64_t bytes =
        t * n * (obs_dim_ * (byte_rows_ ? 1 : 4) + ((discrete_ ? 2 : act_dim_) + 8 + (memory_ > 0 ? memory_ + 1 : 0)) * 4);
    const std::string field = "rollout.steps=" + std::to_string(t) + " x env.num_envs=" + std::to_string(n);
    check_fits(bytes, field, "RolloutBuffer's storage");
    allocating("RolloutBuffer's storage (" + field + ")", bytes, [&] {
      obs_ = at::zeros({t, n, obs_dim_}, f.dtype(byte_rows_ ? at::kByte : at::kFloat));  // rows of parts stay bytes
      action_ = discrete_ ? at::zeros({t, n}, f.dtype(at::kLong)) : at::zeros({t, n, act_dim_}, f);
      for (auto* x : {&log_prob_, &value_, &reward_, &terminated_, &truncated_, &bootstrap_, &advantage_, &returns_})
        *x = at::zeros({t, n}, f);
      if (memory_ > 0) {
        memory_state_ = at::zeros({t, n, memory_}, f);
        first_ = at::zeros({t, n}, f);
      } else {
        memory_state_ = first_ = at::Tensor();
      }
    });
    clear();
  }
  /// The discount of the returns (the Trainer passes the algorithm's gamma; 0.99 before).
  void set_discount(double gamma) noexcept { gamma_ = gamma; }
  /// The run's plan (the loop calls it before the run and after a resume): storage for the
  /// envs (allocated when their number or the policy's memory changes), the discount.
  void plan(const StoragePlan& p) {
    if (p.memory < 0) throw ConfigError("RolloutBuffer: a policy's memory is " + std::to_string(p.memory) + " numbers wide");
    if (p.num_envs != envs_ || p.memory != memory_) {
      memory_ = p.memory;
      set_num_envs(p.num_envs);
    }
    set_discount(p.discount);
  }

  /// State protocol (core/state.hpp): the steps collected so far of the current rollout
  /// (none between rollouts, where the on-policy loop checkpoints).
  void save(BinaryWriter& w) const {
    w.value(envs_);
    w.value(steps_);
    for (const auto* t : kept())
      if (steps_ > 0) write_tensor(w, t->narrow(0, 0, steps_));
  }
  struct Saved {
    std::int64_t steps = 0;
    std::vector<at::Tensor> rows;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    r.expect(envs_, "env.num_envs");
    Saved s;
    s.steps = r.value<std::int64_t>("rollout steps");
    if (s.steps < 0 || s.steps > *cfg_.steps) r.fail("rollout steps", "are outside [0, rollout.steps]");
    if (s.steps > 0)
      for (const auto* t : kept())
        s.rows.push_back(read_tensor(r, "rollout rows", t->narrow(0, 0, s.steps)));
    return s;
  }
  void restore(const Saved& s) {
    clear();
    std::size_t i = 0;
    if (s.steps > 0)
      for (const auto* t : kept()) t->narrow(0, 0, s.steps).copy_(s.rows[i++]);
    steps_ = s.steps;
  }

  /// Stores one step of every env (row i = env i). Throws when the rollout is full.
  void add(const RolloutStep& s) {
    if (envs_ == 0) throw Error("RolloutBuffer::add: set_num_envs was not called");
    if (full()) throw Error("RolloutBuffer::add: the rollout holds " + std::to_string(*cfg_.steps) +
                            " steps already; learn from it and clear() it first");
    check_rows(s.obs, "obs");
    const std::int64_t t = steps_;
    put(obs_, t, s.obs);
    put(action_, t, s.action);
    put(log_prob_, t, s.log_prob);
    put(value_, t, s.value);
    put(reward_, t, s.reward);
    put(terminated_, t, s.terminated);
    put(truncated_, t, s.truncated);
    if (s.bootstrap_value.defined()) put(bootstrap_, t, s.bootstrap_value);
    else std::memset(bootstrap_.data_ptr<float>() + t * envs_, 0, static_cast<std::size_t>(envs_) * sizeof(float));
    if (memory_ > 0) {
      if (!s.memory.defined() || !s.first.defined())
        throw Error("RolloutBuffer::add: the rollout keeps a policy's memory (" + std::to_string(memory_) +
                    " numbers per env) but the step has none");
      put(memory_state_, t, s.memory);
      put(first_, t, s.first);
    }
    ++steps_;
    ready_ = false;
  }

  /// Computes advantages and value targets once the rollout is full. `last_value` [N] is
  /// the value of the observations the envs show after the last step (the bootstrap of
  /// episodes still running).
  void finish(const at::Tensor& last_value) {
    if (!full()) throw Error("RolloutBuffer::finish: the rollout has " + std::to_string(steps_) + " of " +
                             std::to_string(*cfg_.steps) + " steps");
    const auto last = last_value.to(at::kCPU, at::kFloat).reshape({envs_}).contiguous();
    const float g = static_cast<float>(gamma_), gl = static_cast<float>(gamma_ * cfg_.gae_lambda);
    const std::int64_t n = envs_;
    const float *r = reward_.data_ptr<float>(), *v = value_.data_ptr<float>();
    const float *term = terminated_.data_ptr<float>(), *trunc = truncated_.data_ptr<float>();
    const float *boot = bootstrap_.data_ptr<float>(), *lv = last.data_ptr<float>();
    float *adv = advantage_.data_ptr<float>(), *ret = returns_.data_ptr<float>();
    // Backwards through time: A_t = delta_t + gamma lambda A_{t+1} within an episode.
    for (const std::int64_t t : std::views::iota(std::int64_t{0}, steps_) | std::views::reverse) {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t k = t * n + i;
        const float next_value = t + 1 < steps_ ? v[k + n] : lv[i];
        const float later = t + 1 < steps_ ? adv[k + n] : 0.0f;
        float a;
        if (term[k] > 0) a = r[k] - v[k];                             // the return ends here
        else if (trunc[k] > 0) a = r[k] + g * boot[k] - v[k];         // cut: bootstrap, stop
        else a = r[k] + g * next_value - v[k] + gl * later;           // the episode goes on
        adv[k] = a;
        ret[k] = a + v[k];
      }
    }
    // The learning rows, flattened to [steps * N] and on the algorithm's device once.
    const std::int64_t m = steps_ * n;
    flat_.obs = obs_.view({m, obs_dim_}).to(device_);
    flat_.action = (discrete_ ? action_.view({m}) : action_.view({m, act_dim_})).to(device_);
    flat_.log_prob = log_prob_.view({m}).to(device_);
    flat_.value = value_.view({m}).to(device_);
    flat_.advantage = advantage_.view({m}).to(device_);
    flat_.returns = returns_.view({m}).to(device_);
    if (memory_ > 0) {
      flat_.memory = memory_state_.view({m, memory_}).to(device_);
      flat_.first = first_.view({m}).to(device_);
    }
    ready_ = true;
  }

  /// One epoch of the finished rollout: its rows in a fresh random order (torch's
  /// generator, which checkpoints save), cut into minibatches of `size` rows (the last may
  /// be smaller). A lazy view: each minibatch is gathered when it is reached.
  [[nodiscard]] auto minibatches(std::int64_t size) const {
    if (!ready_) throw Error("RolloutBuffer::minibatches: call finish() on a full rollout first");
    if (size < 1) throw ConfigError("RolloutBuffer: minibatch size must be at least 1, got " + std::to_string(size));
    const std::int64_t m = flat_.obs.size(0);
    const auto perm = at::randperm(m, at::TensorOptions().dtype(at::kLong));
    auto order = std::make_shared<const std::vector<std::int64_t>>(perm.data_ptr<std::int64_t>(),
                                                                  perm.data_ptr<std::int64_t>() + m);
    // The shuffled row ids, in chunks of `size`, each gathered into a batch (the view keeps
    // the ids alive through the lambda's copy of `order`).
    return *order | ranges::views::chunk(size) | ranges::views::transform([this, order](const auto& ids) {
             auto index = at::from_blob(const_cast<std::int64_t*>(&*ranges::begin(ids)),
                                        {static_cast<std::int64_t>(ranges::distance(ids))}, at::kLong);
             return rows(index.to(device_));
           });
  }

  /// One epoch of the finished rollout as sequences (a rollout that keeps a policy's
  /// memory): each env's steps cut into runs of `length` consecutive steps (0: the whole
  /// rollout; it must divide `rollout.steps`), the runs in a fresh random order, `batch_rows
  /// / length` of them (at least one) per minibatch, time first (`RolloutBatch`), each with
  /// the memory the policy acted from at its first step and the episode starts within it.
  [[nodiscard]] auto sequences(std::int64_t batch_rows, std::int64_t length) const {
    if (!ready_) throw Error("RolloutBuffer::sequences: call finish() on a full rollout first");
    if (memory_ == 0) throw Error("RolloutBuffer::sequences: the rollout keeps no policy memory (plan one)");
    const std::int64_t t = *cfg_.steps, len = length == 0 ? t : length;
    if (len < 1 || t % len != 0)
      throw ConfigError("RolloutBuffer: sequences of " + std::to_string(len) + " steps do not divide rollout.steps (" +
                        std::to_string(t) + ")");
    const std::int64_t per = std::max<std::int64_t>(1, batch_rows / len), count = envs_ * (t / len);
    const auto perm = at::randperm(count, at::TensorOptions().dtype(at::kLong));
    auto order = std::make_shared<const std::vector<std::int64_t>>(perm.data_ptr<std::int64_t>(),
                                                                  perm.data_ptr<std::int64_t>() + count);
    // Run s is env s % N from step (s / N) * len on; its step u is rollout row
    // ((s / N) * len + u) * N + s % N.
    return *order | ranges::views::chunk(per) | ranges::views::transform([this, order, len](const auto& ids) {
             const auto k = static_cast<std::int64_t>(ranges::distance(ids));
             auto index = at::empty({len * k}, at::kLong);
             auto* ix = index.data_ptr<std::int64_t>();
             std::int64_t j = 0;
             for (const std::int64_t s : ids) {
               const std::int64_t env = s % envs_, start = (s / envs_) * len;
               for (std::int64_t u = 0; u < len; ++u) ix[u * k + j] = (start + u) * envs_ + env;
               ++j;
             }
             const auto on_device = index.to(device_);
             auto b = rows(on_device);
             b.first = flat_.first.index_select(0, on_device);
             b.memory = flat_.memory.index_select(0, on_device.narrow(0, 0, k));
             b.sequence_length = len;
             return b;
           });
  }

  /// The rollout's rows `index` (int64 on the algorithm's device), advantages normalised
  /// when `rollout.normalize_advantage` is on and there are at least two rows.
  [[nodiscard]] RolloutBatch rows(const at::Tensor& index) const {
    if (index.is_cpu() && flat_.obs.is_cpu()) return rows_on_cpu(index);
    RolloutBatch b{flat_.obs.index_select(0, index),      flat_.action.index_select(0, index),
                   flat_.log_prob.index_select(0, index), flat_.advantage.index_select(0, index),
                   flat_.returns.index_select(0, index),  flat_.value.index_select(0, index)};
    if (cfg_.normalize_advantage && index.numel() > 1)
      b.advantage = (b.advantage - b.advantage.mean()) / (b.advantage.std() + 1e-8);
    return b;
  }

  /// Empties the buffer for the next rollout (storage is kept).
  void clear() noexcept {
    steps_ = 0;
    ready_ = false;
  }

  /// Transitions held (steps x envs) and the most it holds.
  [[nodiscard]] std::int64_t size() const noexcept { return steps_ * envs_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return *cfg_.steps * envs_; }
  [[nodiscard]] bool full() const noexcept { return envs_ > 0 && steps_ == *cfg_.steps; }
  /// Whether `finish` has computed the advantages of the rollout held.
  [[nodiscard]] bool finished() const noexcept { return ready_; }
  [[nodiscard]] std::int64_t num_envs() const noexcept { return envs_; }
  [[nodiscard]] const Config& config() const noexcept { return cfg_; }

  /// [steps, N] advantages and value targets of the finished rollout (before any
  /// minibatch normalisation), and the values the policy estimated.
  [[nodiscard]] const at::Tensor& advantages() const noexcept { return advantage_; }
  [[nodiscard]] const at::Tensor& returns() const noexcept { return returns_; }
  [[nodiscard]] const at::Tensor& values() const noexcept { return value_; }
  /// The policy memory kept per env (0: none).
  [[nodiscard]] std::int64_t memory_width() const noexcept { return memory_; }

 private:
  // Row t of `dst` ([steps, N, ...], contiguous on the CPU) from `src`, the same values in
  // any shape: their bytes copied where `src` is a contiguous CPU tensor of dst's type (every
  // step of a CPU run: eight LibTorch ops a step less), else through LibTorch.
  static void put(at::Tensor& dst, std::int64_t t, const at::Tensor& src) {
    const std::int64_t row = dst.numel() / dst.size(0);
    if (src.device().is_cpu() && src.scalar_type() == dst.scalar_type() && src.is_contiguous() &&
        src.numel() == row) {
      const auto bytes = static_cast<std::size_t>(row) * dst.element_size();
      std::memcpy(static_cast<char*>(dst.data_ptr()) + static_cast<std::size_t>(t) * bytes, src.data_ptr(), bytes);
      return;
    }
    auto to = dst[t];
    to.copy_(src.reshape(to.sizes()));
  }
  // `rows` on the CPU, once per minibatch: each field's rows copied by bytes and the
  // advantages normalised in one loop (mean and unbiased standard deviation in double
  // precision, rounded to float as torch's ops would hold them), instead of thirteen
  // LibTorch ops (about 25 us of a PPO update of 256 rows at RLtools' Pendulum config).
  [[nodiscard]] RolloutBatch rows_on_cpu(const at::Tensor& index) const {
    const bool ready = index.scalar_type() == at::kLong && index.is_contiguous();
    const auto ix = ready ? index : index.to(at::kLong).contiguous();
    const std::int64_t k = ix.numel(), m = flat_.obs.size(0);
    const std::int64_t* id = ix.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < k; ++i)
      if (id[i] < 0 || id[i] >= m)
        throw Error("RolloutBuffer::rows: row " + std::to_string(id[i]) + " is outside the rollout's " +
                    std::to_string(m) + " rows");
    auto gather = [&](const at::Tensor& field) {
      const auto src = field.contiguous();  // the rollout's rows are; a no-op then
      auto sizes = src.sizes().vec();
      sizes[0] = k;
      auto out = at::empty(sizes, src.options());
      const auto bytes = static_cast<std::size_t>(src.numel() / std::max<std::int64_t>(1, m)) * src.element_size();
      const auto* from = static_cast<const char*>(src.data_ptr());
      auto* to = static_cast<char*>(out.data_ptr());
      // rows of one to four 4-byte words (a value, an action, a small observation): copies
      // of a size known here, moves rather than calls
      const auto each = [&]<std::size_t B>(std::integral_constant<std::size_t, B>) {
        for (std::int64_t i = 0; i < k; ++i)
          std::memcpy(to + static_cast<std::size_t>(i) * B, from + static_cast<std::size_t>(id[i]) * B, B);
      };
      switch (bytes) {
        case 4: each(std::integral_constant<std::size_t, 4>{}); break;
        case 8: each(std::integral_constant<std::size_t, 8>{}); break;
        case 12: each(std::integral_constant<std::size_t, 12>{}); break;
        case 16: each(std::integral_constant<std::size_t, 16>{}); break;
        default:
          for (std::int64_t i = 0; i < k; ++i)
            std::memcpy(to + static_cast<std::size_t>(i) * bytes, from + static_cast<std::size_t>(id[i]) * bytes, bytes);
      }
      return out;
    };
    RolloutBatch b{gather(flat_.obs),       gather(flat_.action),  gather(flat_.log_prob),
                   gather(flat_.advantage), gather(flat_.returns), gather(flat_.value)};
    if (cfg_.normalize_advantage && k > 1) {
      float* a = b.advantage.data_ptr<float>();
      double sum = 0;
      for (std::int64_t i = 0; i < k; ++i) sum += a[i];
      const double mean = sum / static_cast<double>(k);
      double ss = 0;
      for (std::int64_t i = 0; i < k; ++i) ss += (a[i] - mean) * (a[i] - mean);
      const auto mean_f = static_cast<float>(mean);
      const float denom = static_cast<float>(std::sqrt(ss / static_cast<double>(k - 1))) + 1e-8f;
      for (std::int64_t i = 0; i < k; ++i) a[i] = (a[i] - mean_f) / denom;
    }
    return b;
  }
  // What the rollout keeps of each step (and checkpoints mid-rollout).
  [[nodiscard]] std::vector<const at::Tensor*> kept() const {
    std::vector<const at::Tensor*> v{&obs_, &action_, &log_prob_, &value_, &reward_, &terminated_, &truncated_, &bootstrap_};
    if (memory_ > 0) v.insert(v.end(), {&memory_state_, &first_});
    return v;
  }
  void check_rows(const at::Tensor& t, const char* what) const {
    if (t.dim() < 1 || t.size(0) != envs_)
      throw Error(std::string("RolloutBuffer::add: ") + what + " has " + std::to_string(t.dim() ? t.size(0) : 0) +
                  " rows but the buffer was set up for " + std::to_string(envs_) + " envs");
  }

  Config cfg_;
  c10::Device device_;
  std::int64_t obs_dim_, act_dim_;  // obs_dim_: floats, or bytes for rows of parts
  bool discrete_, byte_rows_;
  double gamma_ = 0.99;
  std::int64_t envs_ = 0, steps_ = 0, memory_ = 0;
  bool ready_ = false;
  at::Tensor obs_, action_, log_prob_, value_, reward_, terminated_, truncated_, bootstrap_, advantage_, returns_;
  at::Tensor memory_state_, first_;  // [steps, N, memory] and [steps, N]: a recurrent policy's (memory_ > 0)
  RolloutBatch flat_;
};

static_assert(Buffer<RolloutBuffer>);

}  // namespace anvil
