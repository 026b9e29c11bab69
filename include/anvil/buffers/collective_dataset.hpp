#pragma once
/// @file
/// `CollectiveDataset`: a collective dataset file (data/collective_file.hpp) as the storage of
/// an offline run, streamed: nothing is loaded whole, a `DataLoader` reads batches ahead on
/// `collective_data.workers` threads. An item is a window of H + 1 consecutive rows of one
/// segment (H from the algorithm's `sequence()`): its first H rows are the history tokens,
/// its last the target row with the expert's labels; history tokens from before the
/// target's episode began are masked. Needs `anvil::hdf5`.
///
/// The loader's position (the next batch's number) is the buffer's state, in every
/// checkpoint: a resumed run gets the very batches the uninterrupted one would, mid-epoch
/// included. A checkpoint of a run on another file (another row count) is refused.

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/core/random.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/state.hpp>
#include <anvil/data/collective_file.hpp>
#include <anvil/data/loader.hpp>

namespace anvil {

class CollectiveDataset : public BufferPolicy<"collective_data", CollectiveBatch, StepBatch> {
 public:
  static constexpr bool reads_demonstrations = true;  ///< the offline loop calls load(train.dataset)

  struct Config {
    Param<int, "workers", "threads reading batches ahead (0: read each batch when it is asked for)", in_range(0, 64)> workers{2};
    Param<int, "prefetch", "batches read ahead at most", in_range(1, 1024)> prefetch{4};
    Param<bool, "pin_memory", "pinned host memory and non-blocking copies when training on CUDA"> pin_memory{true};
  };

  CollectiveDataset(const EnvSpec& /*spec*/, const Config& cfg, const RunContext& ctx)
      : cfg_(cfg), seed_(derive_seed(ctx.seed, Stream::buffer)), rank_(ctx.rank), world_(ctx.world_size), device_(ctx.device) {}

  void add(const StepBatch&) {
    throw ConfigError("CollectiveDataset: holds a collective dataset and takes no env steps; train with the offline loop (train.dataset)");
  }
  /// Learns the window: `sequence_obs` rows per item (H history tokens and the target).
  void plan(const StoragePlan& p) {
    const auto l = std::max<std::int64_t>(2, p.sequence_obs);
    if (l != window_) {
      window_ = l;
      loader_.reset();
    }
  }

  /// Opens the dataset at `path` (checked whole: see CollectiveFile).
  void load(const std::filesystem::path& path) {
    file_ = std::make_shared<CollectiveFile>(path);
    loader_.reset();
  }

  /// The next batch of `n` windows in the loader's order.
  CollectiveBatch sample(std::int64_t n) {
    if (!file_) throw ConfigError("CollectiveDataset: no dataset loaded (train.dataset)");
    if (!loader_ || loader_->options().batch != n) make_loader(n);
    auto b = loader_->next();
    return {b.fields[0], b.fields[1], b.fields[2], b.fields[3], b.fields[4], b.fields[5], b.fields[6], b.fields[7]};
  }

  /// The states' ranges over the whole file (obs min and max; then the action bounds, -1 and
  /// 1), read in blocks; for an algorithm's `fit_normalizer`.
  [[nodiscard]] std::array<at::Tensor, 4> ranges() const {
    if (!file_) throw ConfigError("CollectiveDataset: no dataset loaded (train.dataset)");
    const std::int64_t od = file_->obs_dim(), ad = file_->act_dim(), n = file_->rows();
    std::vector<float> lo(static_cast<std::size_t>(od), INFINITY), hi(static_cast<std::size_t>(od), -INFINITY), block;
    std::vector<std::int64_t> ids;
    for (std::int64_t b = 0; b < n; b += 65536) {
      const std::int64_t m = std::min<std::int64_t>(65536, n - b);
      ids.resize(static_cast<std::size_t>(m));
      for (std::int64_t i = 0; i < m; ++i) ids[static_cast<std::size_t>(i)] = b + i;
      block.resize(static_cast<std::size_t>(m * od));
      file_->read(CollectiveFile::obs, ids, block.data());
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < od; ++j) {
          const float v = block[static_cast<std::size_t>(i * od + j)];
          lo[static_cast<std::size_t>(j)] = std::min(lo[static_cast<std::size_t>(j)], v);
          hi[static_cast<std::size_t>(j)] = std::max(hi[static_cast<std::size_t>(j)], v);
        }
    }
    return {at::tensor(lo), at::tensor(hi), at::full({ad}, -1.0f), at::full({ad}, 1.0f)};
  }

  [[nodiscard]] std::int64_t size() const noexcept { return file_ ? file_->rows() : 0; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return size(); }
  [[nodiscard]] const CollectiveFile* file() const noexcept { return file_.get(); }
  /// Windows the file holds (items of an epoch, over all ranks).
  [[nodiscard]] std::int64_t windows() const { return static_cast<std::int64_t>(starts().size()); }

  /// State protocol: the row count (to refuse another file) and the loader's position.
  void save(BinaryWriter& w) const {
    w.value(size());
    w.value(loader_ ? loader_->position() : position_);
  }
  struct Saved {
    std::int64_t rows = 0, position = 0;
  };
  [[nodiscard]] Saved read(BinaryReader& r) const {
    Saved s{r.value<std::int64_t>("collective dataset rows"), r.value<std::int64_t>("collective loader position")};
    if (file_ && s.rows != size())
      r.fail("collective dataset", "the checkpoint was taken on a dataset of " + std::to_string(s.rows) + " rows; " + file_->name() +
                                       " has " + std::to_string(size()));
    if (s.position < 0) r.fail("collective loader position", "is negative");
    return s;
  }
  void restore(const Saved& s) {
    position_ = s.position;
    if (loader_) loader_->seek(s.position);
  }

 private:
  // Rows where a window of window_ rows starts inside one segment.
  [[nodiscard]] std::vector<std::int64_t> starts() const {
    std::vector<std::int64_t> v;
    for (const auto& s : file_->segments())
      for (std::int64_t r = s.begin; r + window_ <= s.begin + s.rows; ++r) v.push_back(r);
    return v;
  }

  void make_loader(std::int64_t n) {
    DataLoader::Options o;
    o.batch = n;
    o.sequence = window_;
    o.workers = cfg_.workers;
    o.prefetch = cfg_.prefetch;
    o.seed = seed_;
    o.rank = rank_;
    o.world = world_;
    o.device = device_;
    o.pin_memory = cfg_.pin_memory;
    const std::int64_t pos = loader_ ? loader_->position() : position_;
    auto st = starts();
    if (st.empty())
      throw ConfigError(file_->name() + ": no segment holds a window of " + std::to_string(window_) + " rows (a history of " +
                        std::to_string(window_ - 1) + " steps and its target)");
    const auto windows = static_cast<std::int64_t>(st.size());
    if (windows / world_ < n)
      throw ConfigError(file_->name() + ": holds " + std::to_string(windows) + " windows of " + std::to_string(window_) + " rows" +
                        (world_ > 1 ? " (" + std::to_string(windows / world_) + " for each of " + std::to_string(world_) + " ranks)" : std::string()) +
                        ", fewer than one batch of " + std::to_string(n) + "; lower the algorithm's batch_size (e.g. distill.batch_size)");
    loader_ = std::make_unique<DataLoader>(std::move(st), reader(file_, window_), o);
    loader_->seek(pos);
  }

  // Reads windows (ids: window-major, window_ rows each) into the batch's eight fields.
  static DataLoader::ReadFn reader(std::shared_ptr<const CollectiveFile> file, std::int64_t window) {
    return [file, window](std::span<const std::int64_t> ids, std::vector<at::Tensor>& out, const at::TensorOptions& opts) {
      const std::int64_t n = static_cast<std::int64_t>(ids.size()) / window, h = window - 1;
      const std::int64_t od = file->obs_dim(), ad = file->act_dim(), td = od + ad + 1;
      std::vector<float> obs(ids.size() * static_cast<std::size_t>(od)), act(ids.size() * static_cast<std::size_t>(ad)), rew(ids.size());
      std::vector<std::uint8_t> start(ids.size());
      file->read(CollectiveFile::obs, ids, obs.data());
      file->read(CollectiveFile::action, ids, act.data());
      file->read(CollectiveFile::reward, ids, rew.data());
      file->read(CollectiveFile::episode_start, ids, start.data());
      std::vector<std::int64_t> last(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) last[static_cast<std::size_t>(i)] = ids[static_cast<std::size_t>(i * window + h)];
      auto tokens = at::empty({n, h, td}, opts), mask = at::empty({n, h}, opts), state = at::empty({n, od}, opts);
      auto action = at::empty({n, ad}, opts), mean = at::empty({n, ad}, opts), log_std = at::empty({n, ad}, opts);
      auto q = at::empty({n}, opts), task = at::empty({n}, opts.dtype(at::kLong));
      float *tk = tokens.data_ptr<float>(), *mk = mask.data_ptr<float>(), *st = state.data_ptr<float>(), *ac = action.data_ptr<float>();
      std::int64_t* ts = task.data_ptr<std::int64_t>();
      const auto& segs = file->segments();
      for (std::int64_t i = 0; i < n; ++i) {
        const auto row0 = static_cast<std::size_t>(i * window);
        // History token j is of the target's episode when no episode starts after it.
        bool valid = true;
        for (std::int64_t j = h - 1; j >= 0; --j) {
          if (start[row0 + static_cast<std::size_t>(j + 1)]) valid = false;
          mk[i * h + j] = valid ? 1.0f : 0.0f;
          float* t = tk + (i * h + j) * td;
          const auto r = row0 + static_cast<std::size_t>(j);
          std::copy_n(obs.data() + r * static_cast<std::size_t>(od), od, t);
          std::copy_n(act.data() + r * static_cast<std::size_t>(ad), ad, t + od);
          t[od + ad] = rew[r];
        }
        const auto r = row0 + static_cast<std::size_t>(h);
        std::copy_n(obs.data() + r * static_cast<std::size_t>(od), od, st + i * od);
        std::copy_n(act.data() + r * static_cast<std::size_t>(ad), ad, ac + i * ad);
        const auto seg = std::upper_bound(segs.begin(), segs.end(), last[static_cast<std::size_t>(i)],
                                          [](std::int64_t row, const CollectiveFile::Segment& s) { return row < s.begin; });
        ts[i] = std::prev(seg)->task;
      }
      file->read(CollectiveFile::mean, last, mean.data_ptr<float>());
      file->read(CollectiveFile::log_std, last, log_std.data_ptr<float>());
      file->read(CollectiveFile::q_target, last, q.data_ptr<float>());
      out = {tokens, mask, state, action, mean, log_std, q, task};
    };
  }

  Config cfg_;
  std::uint64_t seed_;
  int rank_, world_;
  c10::Device device_;
  std::int64_t window_ = 2;
  std::shared_ptr<const CollectiveFile> file_;
  std::unique_ptr<DataLoader> loader_;
  std::int64_t position_ = 0;  ///< restored before the loader exists
};

}  // namespace anvil
