#pragma once
/// @file
/// `EpisodeBuffer`: the storage of the episodic loop. It holds one round of whole episodes,
/// one per env, in tensors allocated once ([max_steps, N] rows), and hands the round out as
/// one `EpisodeBatch` padded to the longest episode with a mask. It is cleared for the next
/// round: like a rollout, it is learned from by the policy that collected it.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/tensor_io.hpp>

namespace anvil {

/// Buffer policy for whole episodes (see file comment).
class EpisodeBuffer : public BufferPolicy<"episodes", EpisodeBatch, EpisodeStep, true> {
 public:
  struct Config {
    Param<std::int64_t, "max_steps", "the longest episode a round holds (longer ones are an error)",
          in_range(1, 1 << 24)>
        max_steps{1000};
  };

  EpisodeBuffer(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), device_(ctx.device), obs_dim_(spec.obs_dim()), act_dim_(spec.action_dim()),
        discrete_(spec.discrete()) {}

  /// Storage for the run's envs (the loop calls it before the run and after a resume).
  void plan(const StoragePlan& p) {
    if (p.num_envs == envs_) return;
    envs_ = p.num_envs;
    const std::int64_t t = cfg_.max_steps, n = envs_;
    const auto f = at::TensorOptions().dtype(at::kFloat);
    obs_ = at::zeros({t, n, obs_dim_}, f);
    action_ = discrete_ ? at::zeros({t, n}, f.dtype(at::kLong)) : at::zeros({t, n, act_dim_}, f);
    for (auto* x : {&reward_, &terminated_, &mask_}) *x = at::zeros({t, n}, f);
    length_ = at::zeros({n}, f.dtype(at::kLong));
    last_obs_ = at::zeros({n, obs_dim_}, f);
    clear();
  }

  /// Stores one step of every env; the rows of envs no longer live are kept out of the
  /// episodes. Throws when an episode outgrows `episodes.max_steps`.
  void add(const EpisodeStep& s) {
    if (envs_ == 0) throw Error("EpisodeBuffer::add: plan() was not called");
    if (steps_ >= *cfg_.max_steps)
      throw Error("EpisodeBuffer: an episode is longer than episodes.max_steps (" + std::to_string(*cfg_.max_steps) +
                  "); raise it");
    const std::int64_t t = steps_;
    const auto live = s.live.to(at::kFloat).reshape({envs_});
    obs_[t].copy_(s.obs);
    action_[t].copy_(discrete_ ? s.action.reshape({envs_}) : s.action);
    reward_[t].copy_(s.reward * live);
    terminated_[t].copy_(s.terminated * live);
    mask_[t].copy_(live);
    const auto on = live.to(at::kBool);
    length_.masked_fill_(on, t + 1);
    const auto rows = on.nonzero().reshape({-1});
    last_obs_.index_copy_(0, rows, s.next_obs.index_select(0, rows));
    ++steps_;
    live_ += static_cast<std::int64_t>(live.sum().item<float>());
  }

  /// The round's episodes, [N, T, ...] with T the longest (on the algorithm's device).
  [[nodiscard]] EpisodeBatch episodes() const {
    if (steps_ == 0) throw Error("EpisodeBuffer::episodes: the round holds no steps");
    auto rows = [&](const at::Tensor& x) { return x.narrow(0, 0, steps_).transpose(0, 1).contiguous().to(device_); };
    return EpisodeBatch{rows(obs_), rows(action_), rows(reward_), rows(terminated_), rows(mask_), length_.to(device_),
                        last_obs_.to(device_)};
  }

  /// Empties the buffer for the next round (storage is kept).
  void clear() {
    steps_ = 0;
    live_ = 0;
    if (envs_ > 0) {
      mask_.zero_();
      length_.zero_();
    }
  }

  /// Steps stored that belong to episodes, and the most a round holds.
  [[nodiscard]] std::int64_t size() const noexcept { return live_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return *cfg_.max_steps * envs_; }
  /// Steps of the longest episode so far this round.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  /// State protocol: nothing between rounds, where the episodic loop checkpoints; a round
  /// in progress is refused.
  void save(BinaryWriter& w) const {
    if (steps_ > 0) throw Error("EpisodeBuffer::save: a round is in progress; save between rounds");
    w.value(envs_);
  }
  [[nodiscard]] std::int64_t read(BinaryReader& r) const {
    r.expect(envs_, "env.num_envs");
    return 0;
  }
  void restore(std::int64_t) { clear(); }

 private:
  Config cfg_;
  c10::Device device_;
  std::int64_t obs_dim_, act_dim_;
  bool discrete_;
  std::int64_t envs_ = 0, steps_ = 0, live_ = 0;
  at::Tensor obs_, action_, reward_, terminated_, mask_, length_, last_obs_;
};

static_assert(Buffer<EpisodeBuffer>);

}  // namespace anvil
