#pragma once
/// @file
/// The worker side of collective distillation: a SAC expert's run that also fills the
/// collective dataset (data/collective_file.hpp). Needs `anvil::hdf5`.
///
/// `CollectiveTap<Base>` is a replay buffer (`Base`, by default UniformBuffer) that also
/// keeps each env's latest steps. Once the run has taken `collective.start` env steps, every
/// `collective.sampling_interval` env steps it copies the last `collective.samples`
/// transitions stored (the newest samples / num_envs steps of each env, a segment per env,
/// in time order) aside. When the worker finishes, `label_collective` labels each copied
/// transition with the expert's action mean and log-std and its clipped double-Q target,
/// and `append_collective` adds them to the dataset file, tagged with the task, atomically.
/// The copies are buffer state: a run that saves its buffer (`run.checkpoint_buffer`)
/// resumes with them.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/data/collective_file.hpp>

namespace anvil {

namespace collective {
template <class T>
void write_vector(BinaryWriter& w, const std::vector<T>& v) {
  w.value(static_cast<std::uint64_t>(v.size()));
  w.bytes(v.data(), v.size() * sizeof(T));
}
template <class T>
std::vector<T> read_vector(BinaryReader& r, const char* what) {
  const auto n = r.value<std::uint64_t>(what);
  r.expect_available(static_cast<std::int64_t>(n * sizeof(T)), what);
  std::vector<T> v(static_cast<std::size_t>(n));
  r.bytes(v.data(), v.size() * sizeof(T), what);
  return v;
}
inline void write_rows(BinaryWriter& w, const CollectiveRows& r) {
  w.value(r.obs_dim);
  w.value(r.act_dim);
  for (const auto* v : {&r.obs, &r.next_obs, &r.action, &r.reward, &r.mean, &r.log_std, &r.q_target}) write_vector(w, *v);
  write_vector(w, r.terminated);
  write_vector(w, r.episode_start);
}
inline CollectiveRows read_rows(BinaryReader& r) {
  CollectiveRows out;
  out.obs_dim = r.value<std::int64_t>("collective obs_dim");
  out.act_dim = r.value<std::int64_t>("collective act_dim");
  for (auto* v : {&out.obs, &out.next_obs, &out.action, &out.reward, &out.mean, &out.log_std, &out.q_target})
    *v = read_vector<float>(r, "collective rows");
  out.terminated = read_vector<std::uint8_t>(r, "collective terminated flags");
  out.episode_start = read_vector<std::uint8_t>(r, "collective episode starts");
  const auto n = out.rows();
  if (out.obs.size() != static_cast<std::size_t>(n * out.obs_dim) || out.action.size() != static_cast<std::size_t>(n * out.act_dim) ||
      out.terminated.size() != static_cast<std::size_t>(n) || out.episode_start.size() != static_cast<std::size_t>(n))
    r.fail("collective rows", "have fields of different lengths");
  return out;
}
}  // namespace collective

/// Buffer policy: a replay buffer that copies transitions aside for the collective dataset
/// (see file comment).
template <class Base = UniformBuffer>
class CollectiveTap : public BufferPolicy<"collective", typename Base::Batch, StepBatch> {
 public:
  struct Config {
    Param<std::int64_t, "start", "env steps of the run before copying begins (the warm-up)", at_least(0)> start{10'000};
    Param<std::int64_t, "sampling_interval", "env steps between copies", at_least(1)> sampling_interval{5'000};
    Param<std::int64_t, "samples", "transitions copied each time (the newest of the replay; a multiple of the envs)", at_least(1)> samples{2'000};
    Section<"replay", typename Base::Config> replay;

    /// A run of seconds (`run.smoke`): copies start early and often enough to fill a dataset.
    void shrink() {
      start = std::min<std::int64_t>(start, 200);
      sampling_interval = std::min<std::int64_t>(sampling_interval, 200);
      samples = std::min<std::int64_t>(samples, 128);
    }
  };

  CollectiveTap(const EnvSpec& spec, const Config& cfg, const RunContext& ctx) : base_(spec, *cfg.replay, ctx), cfg_(cfg) {
    if (spec.discrete()) throw ConfigError("CollectiveTap: " + spec.name + " has discrete actions; the collective dataset holds Box actions");
    staged_.obs_dim = ring_.obs_dim = spec.obs_dim();
    staged_.act_dim = ring_.act_dim = spec.action_dim();
  }

  void plan(const StoragePlan& p) {
    base_.plan(p);
    if (p.num_envs != envs_) {
      if (steps_ > 0) throw ConfigError("collective: the run's envs changed (" + std::to_string(envs_) + " to " + std::to_string(p.num_envs) + ")");
      envs_ = p.num_envs;
      per_env_ = std::max<std::int64_t>(1, cfg_.samples / envs_);
      ring_.resize(envs_ * per_env_);
      head_.assign(static_cast<std::size_t>(envs_), 0);
      count_.assign(static_cast<std::size_t>(envs_), 0);
      starts_.assign(static_cast<std::size_t>(envs_), 1);
    }
  }

  void add(const StepBatch& s) {
    base_.add(s);
    keep(s);
    steps_ += envs_;
    if (steps_ >= cfg_.start) {
      since_ += envs_;
      if (since_ >= cfg_.sampling_interval) {
        since_ = 0;
        copy_aside();
      }
    }
  }

  typename Base::Batch sample(std::int64_t n) { return base_.sample(n); }
  template <class... A>
  void update_priorities(A&&... a)
    requires PrioritizedReplay<Base>
  {
    base_.update_priorities(std::forward<A>(a)...);
  }

  [[nodiscard]] std::int64_t size() const noexcept { return base_.size(); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return base_.capacity(); }
  /// The transitions copied so far (unlabelled) and their segments' lengths.
  [[nodiscard]] const CollectiveRows& copied() const noexcept { return staged_; }
  [[nodiscard]] const std::vector<std::int64_t>& segments() const noexcept { return segments_; }
  [[nodiscard]] Base& replay() noexcept { return base_; }

  /// State protocol: the replay, the latest steps of each env and the copies.
  void save(BinaryWriter& w) const {
    base_.save(w);
    w.value(envs_);
    w.value(per_env_);
    w.value(steps_);
    w.value(since_);
    collective::write_vector(w, head_);
    collective::write_vector(w, count_);
    collective::write_vector(w, starts_);
    collective::write_rows(w, ring_);
    collective::write_rows(w, staged_);
    collective::write_vector(w, segments_);
  }
  struct Saved {
    typename Base::Saved base;
    std::int64_t envs = 0, per_env = 0, steps = 0, since = 0;
    std::vector<std::int64_t> head, count;
    std::vector<std::uint8_t> starts;
    CollectiveRows ring, staged;
    std::vector<std::int64_t> segments;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.base = base_.read(r);
    s.envs = r.value<std::int64_t>("collective envs");
    s.per_env = r.value<std::int64_t>("collective steps kept per env");
    s.steps = r.value<std::int64_t>("collective env steps");
    s.since = r.value<std::int64_t>("collective steps since the last copy");
    s.head = collective::read_vector<std::int64_t>(r, "collective ring heads");
    s.count = collective::read_vector<std::int64_t>(r, "collective ring counts");
    s.starts = collective::read_vector<std::uint8_t>(r, "collective episode flags");
    s.ring = collective::read_rows(r);
    s.staged = collective::read_rows(r);
    s.segments = collective::read_vector<std::int64_t>(r, "collective segments");
    if (s.ring.obs_dim != ring_.obs_dim || s.ring.act_dim != ring_.act_dim)
      r.fail("collective rows", "are of another env (obs_dim " + std::to_string(s.ring.obs_dim) + ")");
    return s;
  }
  void restore(Saved&& s) {
    base_.restore(std::move(s.base));
    envs_ = s.envs;
    per_env_ = s.per_env;
    steps_ = s.steps;
    since_ = s.since;
    head_ = std::move(s.head);
    count_ = std::move(s.count);
    starts_ = std::move(s.starts);
    ring_ = std::move(s.ring);
    staged_ = std::move(s.staged);
    segments_ = std::move(s.segments);
  }

 private:
  // The step into each env's ring of its latest per_env_ steps.
  void keep(const StepBatch& s) {
    const auto od = ring_.obs_dim, ad = ring_.act_dim;
    const auto obs = s.obs.to(at::kCPU, at::kFloat).contiguous(), next = s.next_obs.to(at::kCPU, at::kFloat).contiguous();
    const auto act = s.action.to(at::kCPU, at::kFloat).contiguous(), rew = s.reward.to(at::kCPU, at::kFloat).contiguous();
    const auto term = s.terminated.to(at::kCPU, at::kFloat).contiguous(), trunc = s.truncated.to(at::kCPU, at::kFloat).contiguous();
    for (std::int64_t e = 0; e < envs_; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      const auto slot = static_cast<std::size_t>(e * per_env_ + head_[ue]);
      std::copy_n(obs.data_ptr<float>() + e * od, od, ring_.obs.data() + slot * static_cast<std::size_t>(od));
      std::copy_n(next.data_ptr<float>() + e * od, od, ring_.next_obs.data() + slot * static_cast<std::size_t>(od));
      std::copy_n(act.data_ptr<float>() + e * ad, ad, ring_.action.data() + slot * static_cast<std::size_t>(ad));
      ring_.reward[slot] = rew.data_ptr<float>()[e];
      const bool t = term.data_ptr<float>()[e] > 0.5f, u = trunc.data_ptr<float>()[e] > 0.5f;
      ring_.terminated[slot] = t ? 1 : 0;
      ring_.episode_start[slot] = starts_[ue];
      starts_[ue] = (t || u) ? 1 : 0;
      head_[ue] = (head_[ue] + 1) % per_env_;
      count_[ue] = std::min(count_[ue] + 1, per_env_);
    }
  }

  // Each env's kept steps, oldest first, appended as a segment.
  void copy_aside() {
    const auto od = static_cast<std::size_t>(ring_.obs_dim), ad = static_cast<std::size_t>(ring_.act_dim);
    for (std::int64_t e = 0; e < envs_; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      const std::int64_t n = count_[ue];
      if (n == 0) continue;
      const std::int64_t first = (head_[ue] - n + per_env_) % per_env_;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto slot = static_cast<std::size_t>(e * per_env_ + (first + i) % per_env_);
        staged_.obs.insert(staged_.obs.end(), ring_.obs.begin() + static_cast<std::ptrdiff_t>(slot * od), ring_.obs.begin() + static_cast<std::ptrdiff_t>((slot + 1) * od));
        staged_.next_obs.insert(staged_.next_obs.end(), ring_.next_obs.begin() + static_cast<std::ptrdiff_t>(slot * od),
                                ring_.next_obs.begin() + static_cast<std::ptrdiff_t>((slot + 1) * od));
        staged_.action.insert(staged_.action.end(), ring_.action.begin() + static_cast<std::ptrdiff_t>(slot * ad),
                              ring_.action.begin() + static_cast<std::ptrdiff_t>((slot + 1) * ad));
        staged_.reward.push_back(ring_.reward[slot]);
        staged_.terminated.push_back(ring_.terminated[slot]);
        // A segment's first row starts the history afresh.
        staged_.episode_start.push_back(i == 0 ? 1 : ring_.episode_start[slot]);
      }
      segments_.push_back(n);
    }
  }

  Base base_;
  Config cfg_;
  std::int64_t envs_ = 0, per_env_ = 0, steps_ = 0, since_ = 0;
  CollectiveRows ring_, staged_;
  std::vector<std::int64_t> head_, count_, segments_;
  std::vector<std::uint8_t> starts_;
};

/// The standard-normal draws that label block `block` of `n` rows (the next-state actions
/// of the Q-targets): the same for the same seed, so a label can be checked.
inline at::Tensor label_noise(std::uint64_t seed, std::int64_t block, std::int64_t n, std::int64_t act_dim) {
  auto gen = at::detail::createCPUGenerator(derive_seed(seed, Stream::exploration, static_cast<std::uint64_t>(block)));
  return at::randn({n, act_dim}, gen, at::TensorOptions().dtype(at::kFloat));
}

/// Labels `rows` with `expert`'s outputs, in blocks of `block` rows: mean and log-std of its
/// Gaussian at obs; and the clipped double-Q target r + gamma (1 - terminated) (min Q'(s',
/// a') - alpha log pi(a' given s')) with a' drawn from the policy at next_obs (noise from
/// `label_noise(seed, block number, ...)`), Q' its target critics, alpha its temperature.
template <class Actor, class Critic, bool kMultiTask>
void label_collective(BasicSAC<Actor, Critic, kMultiTask>& expert, CollectiveRows& rows, std::uint64_t seed, std::int64_t block = 4096) {
  torch::NoGradGuard no_grad;
  const std::int64_t n = rows.rows(), od = rows.obs_dim, ad = rows.act_dim;
  if (expert.temperatures() != 1) throw ConfigError("label_collective: the expert has a temperature per task; label with one task's worker");
  const double alpha = expert.alpha(), gamma = expert.discount();
  const auto device = expert.actor_optimizer().parameters().flat().device();
  for (std::int64_t b = 0, k = 0; b < n; b += block, ++k) {
    const std::int64_t m = std::min(block, n - b);
    const auto rows_of = [&](std::vector<float>& v, std::int64_t w) {
      return at::from_blob(v.data() + b * w, {m, w}, at::kFloat).to(device);
    };
    const auto obs = rows_of(rows.obs, od), next = rows_of(rows.next_obs, od);
    const auto reward = at::from_blob(rows.reward.data() + b, {m}, at::kFloat).to(device);
    const auto term = at::from_blob(rows.terminated.data() + b, {m}, at::kByte).to(device, at::kFloat);
    auto [mean, log_std] = expert.actor()->forward(obs);
    const auto s = expert.actor()->sample(next, label_noise(seed, k, m, ad).to(device));
    auto [q1, q2] = expert.critic_target()->forward(next, s.action);
    const auto y = reward + gamma * (1.0 - term) * (at::min(q1, q2) - alpha * s.log_prob);
    const auto put = [&](std::vector<float>& v, const at::Tensor& t, std::int64_t w) {
      const auto c = t.to(at::kCPU, at::kFloat).contiguous();
      std::copy_n(c.data_ptr<float>(), m * w, v.data() + b * w);
    };
    put(rows.mean, mean, ad);
    put(rows.log_std, log_std, ad);
    put(rows.q_target, y, 1);
  }
}

/// A worker's end: labels what its tap copied with the expert and appends it to the
/// collective dataset at `file` as task `task`. Returns the rows appended.
template <class SacT, class Base>
std::int64_t finish_worker(SacT& expert, const CollectiveTap<Base>& tap, const std::filesystem::path& file, const std::string& task,
                           std::uint64_t seed) {
  CollectiveRows rows = tap.copied();
  if (rows.rows() == 0) throw ConfigError("collective: the worker copied no transitions (collective.start is beyond the run's steps?)");
  rows.resize(rows.rows());  // room for the labels
  label_collective(expert, rows, seed);
  append_collective(file, task, rows, tap.segments());
  return rows.rows();
}

}  // namespace anvil
