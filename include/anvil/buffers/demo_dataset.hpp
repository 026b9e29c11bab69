#pragma once
/// @file
/// `DemoDataset`: demonstrations (read from robomimic's HDF5 layout, data/demonstrations.hpp,
/// when built with `anvil::hdf5`; or given in memory with `set`) as the storage of an offline run, handed out as windows of consecutive
/// steps for policies that predict action sequences (Diffusion Policy). A window of a
/// demonstration starting at step t holds the observations of steps t .. t + obs_horizon - 1
/// and the actions of steps t .. t + horizon - 1; windows start from -(obs_horizon - 1) to
/// length - horizon + action_horizon - 1, and steps before the first or after the last
/// repeat the first or last (the padding of the reference implementation's sampler). The
/// horizons come from the algorithm (`StoragePlan::sequence_obs`, `sequence_actions`, and
/// `action_horizon` from the env's action chunk).
///
/// Observations are float rows, or, for an env of rows of parts (images beside numbers, e.g.
/// Push-T's image variant in envs::MultiStep), rows of bytes: the file's keys are the env's
/// parts (by name, in the env's order, unless `demos.obs_keys` says otherwise), its frames
/// resized on read to the env's image size when they differ, decoded by `demos.threads`
/// threads (data/demo_reader.hpp), kept as bytes, and windows of them handed out as uint8
/// rows. `ranges()` then covers the float parts alone.
///
/// The order is a loader's: each epoch is a permutation of all windows drawn from the
/// run's seed and the epoch's number; with several ranks each takes every world-th window of
/// it (the tail that does not divide evenly is left out that epoch), so ranks see disjoint
/// windows. Batches are consecutive slices of that order, and the position (epoch, offset)
/// is the buffer's state in checkpoints: a resumed run hands out the very batches the
/// uninterrupted one would. The data itself is not in checkpoints; it is read again from
/// `train.dataset`, and a checkpoint taken on other data is refused.

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/random.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/state.hpp>
#include <anvil/data/demonstration_set.hpp>
#if defined(ANVIL_WITH_HDF5)
#include <anvil/data/demonstrations.hpp>
#endif

namespace anvil {

/// Buffer policy: demonstrations handed out as windows (see file comment).
class DemoDataset : public BufferPolicy<"demos", ReplayBatch, StepBatch> {
 public:
  /// The offline loop fills it with `load(train.dataset)` (an HDF5 file), not a buffer file.
  static constexpr bool reads_demonstrations = true;

  struct Config {
    Param<std::vector<std::string>, "obs_keys", "observation parts to use, in order (empty: all, by name)"> obs_keys{};
    Param<std::int64_t, "episodes", "use the first N demonstrations (0: all)", at_least(0)> episodes{0};
    Param<int, "threads", "threads decoding image frames when the file is read (0: the calling thread)", in_range(0, 256)> threads{2};
  };

  DemoDataset(const EnvSpec& spec, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), spec_(spec), seed_(derive_seed(ctx.seed, Stream::buffer)), rank_(ctx.rank), world_(ctx.world_size) {}

  /// Demonstrations take no env steps: using this buffer with an online loop is a mistake.
  void add(const StepBatch&) {
    throw ConfigError("DemoDataset: holds demonstrations and takes no env steps; train with the offline loop (train.dataset)");
  }

  /// Learns the window shape: `sequence_obs` observations and `sequence_actions` actions.
  void plan(const StoragePlan& p) {
    to_ = std::max<std::int64_t>(1, p.sequence_obs);
    tp_ = std::max<std::int64_t>(1, p.sequence_actions);
    index();
  }

  /// Reads the demonstrations at `path` (robomimic's layout); an Error naming the file and
  /// dataset when it does not fit the env.
  void load(const std::filesystem::path& path) {
#if defined(ANVIL_WITH_HDF5)
    DemoReadOptions o{*cfg_.obs_keys};
    o.threads = cfg_.threads;
    if (spec_.byte_rows()) {
      // The env's parts, at the env's image size (the file's frames resized when they differ).
      const auto step = step_layout();
      if (o.obs_keys.empty())
        for (const auto& p : step.parts) o.obs_keys.push_back(p.name);
      for (const auto& p : step.parts)
        if (p.image()) {
          o.image_height = static_cast<int>(p.shape[1]);
          o.image_width = static_cast<int>(p.shape[2]);
          break;
        }
    }
    source_ = path.string();
    auto d = read_demonstrations(path, o);
    set(std::move(d));
#else
    throw ConfigError("train.dataset: this program was built without HDF5 (link anvil::hdf5) and cannot read '" + path.string() +
                      "'; demonstrations in memory can still be given with DemoDataset::set");
#endif
  }

  /// Uses `d` as the data (the first `demos.episodes` of it when set).
  void set(Demonstrations d) {
    if (d.byte_rows() && !spec_.byte_rows())
      throw ConfigError("train.dataset: " + where() + " holds images (" + d.layout.describe() + "); this dataset hands out float observations to " +
                        spec_.name + ": choose its float keys with demos.obs_keys (or train on the env's image variant)");
    if (!d.byte_rows() && spec_.byte_rows())
      throw ConfigError("train.dataset: " + where() + " holds float observations (" + std::to_string(d.obs_dim) + " numbers); " + spec_.name +
                        " hands out rows of parts (" + spec_.layout.describe() + "): record or choose its image keys");
    if (cfg_.episodes > 0 && cfg_.episodes < d.episodes()) {
      const auto steps = d.starts[static_cast<std::size_t>(*cfg_.episodes)];
      if (d.byte_rows()) d.rows.resize(static_cast<std::size_t>(steps * d.obs_dim));
      else d.obs.resize(static_cast<std::size_t>(steps * d.obs_dim));
      d.actions.resize(static_cast<std::size_t>(steps * d.act_dim));
      d.rewards.resize(static_cast<std::size_t>(steps));
      d.dones.resize(static_cast<std::size_t>(steps));
      d.starts.resize(static_cast<std::size_t>(*cfg_.episodes + 1));
    }
    if (d.episodes() == 0) throw ConfigError("DemoDataset: " + where() + " holds no demonstrations");
    demos_ = std::move(d);
    // Rows of parts are used where they lie (they may be gigabytes); float rows are copied.
    obs_ = demos_.byte_rows() ? at::from_blob(demos_.rows.data(), {demos_.steps(), demos_.obs_dim}, at::kByte)
                              : at::from_blob(demos_.obs.data(), {demos_.steps(), demos_.obs_dim}, at::kFloat).clone();
    act_ = at::from_blob(demos_.actions.data(), {demos_.steps(), demos_.act_dim}, at::kFloat).clone();
    index();
  }

  /// The next `n` windows of this rank's order: obs [n, obs_horizon * obs_dim], action
  /// [n, horizon * act_dim] (env units), `index` the windows' numbers.
  ReplayBatch sample(std::int64_t n) {
    if (starts_.empty()) throw ConfigError("DemoDataset: no data: set train.dataset to a demonstration file");
    std::vector<std::int64_t> rows(static_cast<std::size_t>(n * tp_)), ids(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      if (offset_ >= share()) {
        ++epoch_;
        offset_ = 0;
      }
      if (order_epoch_ != epoch_) shuffle();
      const auto w = order_[static_cast<std::size_t>(rank_ + offset_ * world_)];
      ++offset_;
      ids[static_cast<std::size_t>(i)] = w;
      const auto [e, t] = starts_[static_cast<std::size_t>(w)];
      const auto s0 = demos_.starts[static_cast<std::size_t>(e)], len = demos_.length(e);
      for (std::int64_t j = 0; j < tp_; ++j)
        rows[static_cast<std::size_t>(i * tp_ + j)] = s0 + std::clamp<std::int64_t>(t + j, 0, len - 1);
    }
    const auto idx = at::tensor(rows, at::kLong).view({n, tp_});
    ReplayBatch b;
    b.obs = obs_.index_select(0, idx.narrow(1, 0, to_).reshape(-1)).view({n, to_ * demos_.obs_dim});
    b.action = act_.index_select(0, idx.reshape(-1)).view({n, tp_ * demos_.act_dim});
    b.index = at::tensor(ids, at::kLong);
    return b;
  }

  /// Windows in all (every rank's).
  [[nodiscard]] std::int64_t size() const noexcept { return static_cast<std::int64_t>(starts_.size()); }
  [[nodiscard]] std::int64_t capacity() const noexcept { return size(); }
  /// Windows this rank takes per epoch.
  [[nodiscard]] std::int64_t share() const noexcept { return size() / world_; }
  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }
  [[nodiscard]] const Demonstrations& demonstrations() const noexcept { return demos_; }

  /// Per-dimension minimum and maximum of the observations and the actions: {obs_min,
  /// obs_max, act_min, act_max} (for the algorithm's normalisation); of rows of parts, of
  /// their float numbers in the parts' order (empty when there are none).
  [[nodiscard]] std::array<at::Tensor, 4> ranges() const {
    at::Tensor o = obs_;
    if (demos_.byte_rows()) {
      std::vector<at::Tensor> floats;
      for (const auto& p : demos_.layout.parts)
        if (p.dtype == PartDtype::float32) floats.push_back(obs_.narrow(1, p.offset, p.bytes()).contiguous().view(at::kFloat));
      if (floats.empty()) {
        const auto none = at::zeros({0});
        return {none, none, std::get<0>(act_.min(0)), std::get<0>(act_.max(0))};
      }
      o = at::cat(floats, 1);
    }
    return {std::get<0>(o.min(0)), std::get<0>(o.max(0)), std::get<0>(act_.min(0)), std::get<0>(act_.max(0))};
  }

  /// State protocol: the position in the order, and what it is an order of (windows,
  /// steps), so that a checkpoint of other data is refused.
  struct Saved {
    std::int64_t windows = -1, steps = -1, epoch = 0, offset = 0;
  };
  void save(BinaryWriter& w) const {
    w.value(size());
    w.value(demos_.steps());
    w.value(epoch_);
    w.value(offset_);
  }
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s;
    s.windows = r.value<std::int64_t>("demonstration windows");
    s.steps = r.value<std::int64_t>("demonstration steps");
    if (!starts_.empty() && (s.windows != size() || s.steps != demos_.steps())) r.fail("demonstration windows", mismatch(s));
    s.epoch = r.value<std::int64_t>("demonstration epoch");
    s.offset = r.value<std::int64_t>("demonstration offset");
    return s;
  }
  /// Takes the position; when the data is read later (a resume reads the checkpoint first),
  /// it is checked against the checkpoint's then.
  void restore(const Saved& s) noexcept {
    epoch_ = s.epoch;
    offset_ = s.offset;
    expected_ = s;
    order_epoch_ = -1;
  }

 private:
  // One step of the env's observation window (an env of rows of parts).
  [[nodiscard]] ObsLayout step_layout() const { return spec_.layout.unstacked(static_cast<int>(to_)); }

  [[nodiscard]] std::string where() const { return source_.empty() ? std::string("the demonstrations") : "'" + source_ + "'"; }

  // The windows of every demonstration (needs the data and the plan).
  void index() {
    starts_.clear();
    order_epoch_ = -1;
    if (demos_.episodes() == 0) return;
    const auto ta = spec_.action_dim() / std::max<std::int64_t>(1, demos_.act_dim);
    if (demos_.byte_rows() && demos_.layout.describe() != step_layout().describe())
      throw ConfigError("train.dataset: " + where() + " holds observations of " + demos_.layout.describe() + "; " + spec_.name + " observes " +
                        step_layout().describe() + " per step (choose the keys with demos.obs_keys)");
    if (spec_.obs_dim() != to_ * demos_.obs_dim || spec_.action_dim() % demos_.act_dim != 0)
      throw ConfigError("train.dataset: " + where() + " has observations of " + std::to_string(demos_.obs_dim) + " and actions of " +
                        std::to_string(demos_.act_dim) + " numbers; the env (" + spec_.name + ") takes " + std::to_string(spec_.obs_dim()) +
                        " = " + std::to_string(to_) + " observations and actions in chunks of " + std::to_string(spec_.action_dim()));
    for (std::int64_t e = 0; e < demos_.episodes(); ++e)
      for (std::int64_t t = -(to_ - 1); t <= demos_.length(e) - tp_ + ta - 1; ++t) starts_.emplace_back(e, t);
    if (expected_.windows >= 0 && (expected_.windows != size() || expected_.steps != demos_.steps())) {
      const auto m = mismatch(expected_);
      starts_.clear();
      throw ConfigError("train.dataset: " + m);
    }
  }
  [[nodiscard]] std::string mismatch(const Saved& s) const {
    return "the checkpoint was taken on " + std::to_string(s.steps) + " steps in " + std::to_string(s.windows) + " windows; " + where() +
           " has " + std::to_string(demos_.steps()) + " in " + std::to_string(size()) + " (another dataset, or other demos.episodes?)";
  }
  // This epoch's permutation (Fisher-Yates from the seed and the epoch's number).
  void shuffle() {
    order_.resize(starts_.size());
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
    Rng rng(derive_seed(seed_, Stream::buffer, static_cast<std::uint64_t>(epoch_)));
    for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
    order_epoch_ = epoch_;
  }

  Config cfg_;
  EnvSpec spec_;
  std::uint64_t seed_;
  int rank_, world_;
  std::int64_t to_ = 1, tp_ = 1;
  Demonstrations demos_;
  std::string source_;
  at::Tensor obs_, act_;
  std::vector<std::pair<std::int64_t, std::int64_t>> starts_;  ///< (episode, first step) of each window
  std::vector<std::int64_t> order_;
  std::int64_t order_epoch_ = -1;
  std::int64_t epoch_ = 0, offset_ = 0;
  Saved expected_{};  ///< what a restored checkpoint was taken on
};

}  // namespace anvil
