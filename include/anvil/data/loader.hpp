#pragma once
/// @file
/// `DataLoader`: batches from a dataset on disk, read ahead by worker threads.
///
/// A dataset is `items` things to hand out: rows, or windows of `sequence` consecutive rows
/// (the caller lists the rows where a window may start). Epoch e's order is a permutation
/// of the items drawn from the seed and e alone (or the items in order without shuffling);
/// with several ranks, rank r takes every world-th item of it, so ranks see disjoint items.
/// Batch g is a slice of that order: which rows it holds depends on (seed, g) only, never
/// on threads or timing, so a run is reproducible and a resumed one (`seek(position())`)
/// gets the very batches the uninterrupted one would, mid-epoch included.
///
/// `workers` threads build batches ahead of the consumer, up to `prefetch` batches, each
/// into fresh tensors (pinned host memory when the batches go to a CUDA device, then copied
/// with non-blocking copies); `workers = 0` reads each batch in the calling thread when it
/// is asked for. The read function must be thread-safe (`CollectiveFile::read` is).

#include <ATen/ATen.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>

namespace anvil {

/// A batch the loader hands out: the fields the read function filled, the rows they hold
/// (item-major: with sequences, item i's rows are ids[i * sequence .. (i + 1) * sequence)),
/// and the batch's number.
struct LoaderBatch {
  std::vector<at::Tensor> fields;
  std::vector<std::int64_t> ids;
  std::int64_t number = 0;
};

class DataLoader {
 public:
  struct Options {
    std::int64_t batch = 256;    ///< items per batch
    std::int64_t sequence = 1;   ///< rows per item (consecutive)
    int workers = 2;             ///< threads reading ahead (0: read when asked)
    int prefetch = 4;            ///< batches read ahead at most
    bool shuffle = true;         ///< a permutation per epoch (else the items in order)
    bool drop_last = true;       ///< leave out the epoch's last batch when it is short
    std::uint64_t seed = 0;
    int rank = 0, world = 1;
    c10::Device device{c10::kCPU};  ///< where `next` puts the batch
    bool pin_memory = true;         ///< pinned host tensors when `device` is CUDA
  };
  /// Fills `fields` (one tensor per field, made with `opts`) with rows `ids`. Thread-safe.
  using ReadFn = std::function<void(std::span<const std::int64_t> ids, std::vector<at::Tensor>& fields, const at::TensorOptions& opts)>;

  /// Items are windows starting at `starts` (rows when `sequence` is 1).
  DataLoader(std::vector<std::int64_t> starts, ReadFn read, Options o)
      : starts_(std::move(starts)), read_(std::move(read)), o_(o) {
    if (o_.batch < 1) throw ConfigError("data loader: batch must be at least 1");
    if (o_.sequence < 1) throw ConfigError("data loader: sequence must be at least 1");
    if (o_.world < 1 || o_.rank < 0 || o_.rank >= o_.world) throw ConfigError("data loader: rank outside the world");
    per_rank_ = static_cast<std::int64_t>(starts_.size()) / o_.world;
    per_epoch_ = o_.drop_last ? per_rank_ / o_.batch : (per_rank_ + o_.batch - 1) / o_.batch;
    if (per_epoch_ < 1)
      throw ConfigError("data loader: " + std::to_string(starts_.size()) + " items over " + std::to_string(o_.world) +
                        " ranks do not make one batch of " + std::to_string(o_.batch));
    host_ = at::TensorOptions().dtype(at::kFloat);
    if (o_.device.is_cuda() && o_.pin_memory) host_ = host_.pinned_memory(true);
  }
  /// Items are the rows 0 .. rows - 1.
  DataLoader(std::int64_t rows, ReadFn read, Options o) : DataLoader(iota(rows), std::move(read), o) {}
  ~DataLoader() { stop(); }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// The next batch, on `device` (waits for a worker when it is not ready yet; rethrows a
  /// worker's error, e.g. a damaged row, naming it).
  LoaderBatch next() {
    LoaderBatch b;
    if (o_.workers == 0) {
      b = make(next_);
      ++next_;
    } else {
      start();
      std::unique_lock lock(m_);
      ready_cv_.wait(lock, [&] { return error_ || ready_.count(next_) > 0; });
      if (error_) std::rethrow_exception(error_);
      b = std::move(ready_.at(next_));
      ready_.erase(next_);
      ++next_;
      lock.unlock();
      space_cv_.notify_all();
    }
    if (!o_.device.is_cpu())
      for (auto& t : b.fields) t = t.to(o_.device, /*non_blocking=*/true);
    return b;
  }

  /// The number of the next batch `next` hands out: the loader's state for checkpoints.
  [[nodiscard]] std::int64_t position() const noexcept { return next_; }
  /// Hands out batch `g` next (what was read ahead is dropped).
  void seek(std::int64_t g) {
    if (g < 0) throw ConfigError("data loader: position " + std::to_string(g) + " is negative");
    stop();
    next_ = g;
  }
  [[nodiscard]] std::int64_t batches_per_epoch() const noexcept { return per_epoch_; }
  [[nodiscard]] std::int64_t items() const noexcept { return static_cast<std::int64_t>(starts_.size()); }
  [[nodiscard]] const Options& options() const noexcept { return o_; }

  /// The rows batch `g` holds (what `next` would read for it).
  [[nodiscard]] std::vector<std::int64_t> rows_of(std::int64_t g) {
    const std::int64_t epoch = g / per_epoch_, k = g % per_epoch_;
    const auto perm = permutation(epoch);
    const std::int64_t first = k * o_.batch, count = std::min(o_.batch, per_rank_ - first);
    std::vector<std::int64_t> ids;
    ids.reserve(static_cast<std::size_t>(count * o_.sequence));
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t item = (*perm)[static_cast<std::size_t>((first + i) * o_.world + o_.rank)];
      const std::int64_t s = starts_[static_cast<std::size_t>(item)];
      for (std::int64_t j = 0; j < o_.sequence; ++j) ids.push_back(s + j);
    }
    return ids;
  }

 private:
  static std::vector<std::int64_t> iota(std::int64_t n) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
    std::iota(v.begin(), v.end(), std::int64_t{0});
    return v;
  }

  // Epoch e's order of the items (cached: the current and the next epoch).
  std::shared_ptr<const std::vector<std::int64_t>> permutation(std::int64_t epoch) {
    {
      const std::lock_guard lock(perm_m_);
      for (const auto& [e, p] : perms_)
        if (e == epoch) return p;
    }
    auto p = std::make_shared<std::vector<std::int64_t>>(iota(static_cast<std::int64_t>(starts_.size())));
    if (o_.shuffle) {
      Rng rng(derive_seed(o_.seed, Stream::buffer, static_cast<std::uint64_t>(epoch)));
      for (std::size_t i = p->size(); i > 1; --i) std::swap((*p)[i - 1], (*p)[rng.below(i)]);
    }
    const std::lock_guard lock(perm_m_);
    perms_.emplace_back(epoch, p);
    if (perms_.size() > 2) perms_.erase(perms_.begin());
    return p;
  }

  LoaderBatch make(std::int64_t g) {
    LoaderBatch b;
    b.number = g;
    b.ids = rows_of(g);
    read_(b.ids, b.fields, host_);
    return b;
  }

  void start() {
    if (!threads_.empty()) return;
    stopping_ = false;
    made_ = next_;
    for (int i = 0; i < o_.workers; ++i)
      threads_.emplace_back([this] {
        for (;;) {
          std::int64_t g;
          {
            std::unique_lock lock(m_);
            space_cv_.wait(lock, [&] { return stopping_ || made_ < next_ + o_.prefetch; });
            if (stopping_) return;
            g = made_++;
          }
          try {
            auto b = make(g);
            const std::lock_guard lock(m_);
            ready_.emplace(g, std::move(b));
          } catch (...) {
            const std::lock_guard lock(m_);
            if (!error_) error_ = std::current_exception();
          }
          ready_cv_.notify_all();
        }
      });
  }
  void stop() {
    {
      const std::lock_guard lock(m_);
      stopping_ = true;
    }
    space_cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    ready_.clear();
    error_ = nullptr;
  }

  std::vector<std::int64_t> starts_;
  ReadFn read_;
  Options o_;
  at::TensorOptions host_;
  std::int64_t per_rank_ = 0, per_epoch_ = 0;
  std::int64_t next_ = 0;  ///< the batch `next` hands out next
  // read-ahead
  std::mutex m_;
  std::condition_variable ready_cv_, space_cv_;
  std::vector<std::thread> threads_;
  std::map<std::int64_t, LoaderBatch> ready_;
  std::int64_t made_ = 0;  ///< the next batch a worker takes
  bool stopping_ = false;
  std::exception_ptr error_;
  std::mutex perm_m_;
  std::vector<std::pair<std::int64_t, std::shared_ptr<const std::vector<std::int64_t>>>> perms_;
};

}  // namespace anvil
