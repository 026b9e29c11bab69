#pragma once
/// @file
/// `TransitionStore`: the preallocated rings both replay buffers keep (transitions, and
/// observations stored once), and the ids that name a transition while it is stored.

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <anvil/buffers/detail/frame_chains.hpp>
#include <anvil/buffers/detail/ring_rows.hpp>
#include <anvil/buffers/detail/n_step.hpp>
#include <anvil/buffers/replay_config.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>
#include <anvil/core/detail/huge_pages.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/memory.hpp>
#include <anvil/core/spaces.hpp>

namespace anvil {

namespace detail {

/// Replay storage in two preallocated rings.
///
/// Transitions: `capacity` rows of [action | reward | terminated (| discount)] floats,
/// plus, for each, the slots of its obs and next_obs in the observation ring. Transition
/// number k (counting every transition ever added, from 0) is its id; it lives in row
/// k % capacity until `capacity` more are added after it.
///
/// Observations are stored once. When env i's observation at this step is bitwise the one
/// its previous step led to (always, within an episode), the transition reuses that row,
/// so an episode of L steps costs L + 1 observations instead of 2L: about half the memory
/// of observation-heavy buffers. The observation ring has capacity * 5/4 + 256 rows, which
/// covers episodes of 4 steps or more. With shorter episodes, or transitions whose
/// observations do not chain, a transition whose observation is overwritten leaves
/// early; `size()` counts what is stored and `dropped()` what left early.
///
/// With an env that has tasks (`EnvSpec::tasks`), each row also holds its transition's
/// task, batches carry it (`ReplayBatch::task`), and the store counts the live
/// transitions of each task (`task_count`, `task_of`) for task-balanced sampling.
///
/// Frame stacks (image parts with `frames` > 1, as `envs::Pixels` hands out) are stored a
/// frame a row: a row keeps its stacks' newest frames and links to its env's previous row,
/// and a sample rebuilds each stack by following the links (`FrameChains`). A transition
/// then also leaves early when a row its stacks read is overwritten; the observation ring
/// has (frames - 1) * 256 more rows for them.
///
/// n-step returns (`n_step` > 1) are formed before storing by an `NStepWindow` per env.
/// Rows live with the networks (`device`); on the CPU a batch comes out as contiguous
/// float32 tensors gathered with prefetching; on a GPU by `index_select`, so transitions
/// never cross to the host. Discrete actions are stored as floats (exact below 2^24).
class TransitionStore {
 public:
  using Link = ObsLink;  ///< a transition's obs and next_obs rows (-1: none)

  /// `extra_host_bytes`: host memory the owner allocates beside the store (a priority
  /// tree), counted in the check that the whole fits before anything is allocated.
  TransitionStore(const EnvSpec& spec, std::int64_t capacity, c10::Device device, std::string owner,
                  int n_step = 1, ObsDtype obs_dtype = ObsDtype::float32, std::int64_t extra_host_bytes = 0)
      : capacity_(capacity),
        obs_capacity_(capacity + (capacity + 3) / 4 + 256),
        device_(device),
        owner_(std::move(owner)),
        od_(spec.obs_dim()),
        row_bytes_(spec.obs_row_bytes()),
        bytes_(spec.byte_rows()),
        ad_(spec.action_dim()),
        discrete_(spec.discrete()),
        with_discount_(n_step > 1),
        obs_dtype_(obs_dtype),
        tasks_(static_cast<std::int64_t>(spec.tasks.size())),
        width_(ad_ + 2 + (n_step > 1 ? 1 : 0) + (tasks_ > 0 ? 1 : 0)),
        window_(n_step, 0.99) {
    if (bytes_) frames_ = FrameChains(spec.layout, row_bytes_);
    sd_ = frames_.on() ? frames_.stored_bytes() : od_;
    obs_capacity_ += (frames_.depth() - 1) * 256;
    if (bytes_ && obs_dtype_ != ObsDtype::float32)
      throw ConfigError("buffer.obs_dtype: " + spec.name + "'s observations are rows of parts (" + spec.layout.describe() +
                        "), stored as they come; obs_dtype applies to float observations only");
    if (obs_capacity_ > INT32_MAX)
      throw Error(owner_ + ": buffer.capacity=" + std::to_string(capacity) +
                  " is above the largest supported (1,700,000,000 transitions)");
    // Refused before a byte is allocated when it cannot fit (host memory; a GPU's own
    // allocator reports its out-of-memory errors, named below).
    const std::int64_t obs_size = bytes_ ? 1 : obs_dtype_ == ObsDtype::float32 ? 4 : 2;
    const std::int64_t host = static_cast<std::int64_t>(capacity_ * sizeof(Link) + obs_capacity_ * sizeof(std::int32_t)) +
                              (tasks_ > 0 ? capacity_ * static_cast<std::int64_t>(sizeof(std::int32_t)) : 0) +
                              (frames_.on() ? obs_capacity_ * 2 * static_cast<std::int64_t>(sizeof(std::int32_t)) : 0) +
                              extra_host_bytes;
    const std::int64_t need = capacity_ * width_ * 4 + obs_capacity_ * sd_ * obs_size + host;
    const std::string field = "buffer.capacity=" + std::to_string(capacity);
    check_fits(device_.is_cpu() ? need : host, field, owner_ + "'s storage");
    allocating(owner_ + "'s storage (" + field + ")", need, [&] {
      const auto f = at::TensorOptions().dtype(at::kFloat).device(device_);
      data_ = at::empty({capacity_, width_}, f);
      obs_ = at::empty({obs_capacity_, sd_}, f.dtype(bytes_                                ? at::kByte
                                                     : obs_dtype_ == ObsDtype::float32    ? at::kFloat
                                                     : obs_dtype_ == ObsDtype::bfloat16 ? at::kBFloat16
                                                                                        : at::kHalf));
      if (device_.is_cpu()) {  // read at random: huge pages spare most TLB misses
        advise_huge_pages(data_.data_ptr(), static_cast<std::size_t>(data_.nbytes()));
        advise_huge_pages(obs_.data_ptr(), static_cast<std::size_t>(obs_.nbytes()));
      }
      // Both tables fill front to back as rows are first written (put, append_obs): a run
      // shorter than the capacity touches only the pages it uses.
      link_ = HugeArray<Link>(static_cast<std::size_t>(capacity_), Link{}, HugeArray<Link>::Lazy{});
      owner_of_ = HugeArray<std::int32_t>(static_cast<std::size_t>(obs_capacity_), -1, HugeArray<std::int32_t>::Lazy{});
      if (tasks_ > 0) task_of_ = HugeArray<std::int32_t>(static_cast<std::size_t>(capacity_), -1);
      if (frames_.on()) frames_.allocate(obs_capacity_);
    });
    task_count_.assign(static_cast<std::size_t>(tasks_), 0);
  }

  /// Stores one step of N envs (row i = env i; the ring wraps as needed), or with n-step
  /// returns the transitions it completes. Returns the id of the first stored transition
  /// and how many were stored; `killed()` then lists the rows of older transitions that
  /// left early because their observations were overwritten.
  std::pair<std::int64_t, std::int64_t> add(const StepBatch& s) {
    const std::int64_t n = s.obs.size(0);
    if (n > capacity_)
      throw Error(owner_ + ": adding " + std::to_string(n) +
                  " transitions at once exceeds buffer.capacity=" + std::to_string(capacity_));
    if (2 * n * frames_.depth() > obs_capacity_)
      throw Error(owner_ + ": adding " + std::to_string(n) + " transitions at once needs up to " +
                  std::to_string(2 * n * frames_.depth()) + " observation rows; this buffer has " + std::to_string(obs_capacity_) +
                  " (buffer.capacity=" + std::to_string(capacity_) + ")");
    const auto obs = host_obs(s.obs, n, "obs"), next = host_obs(s.next_obs, n, "next_obs");
    const auto act = host(s.action, n, ad_, "action"), rew = host(s.reward, n, 1, "reward");
    const auto term = host(s.terminated, n, 1, "terminated");
    const auto trunc = s.truncated.defined() ? host(s.truncated, n, 1, "truncated") : at::zeros({n});
    at::Tensor task;
    if (tasks_ > 0) {
      if (!s.task.defined() || s.task.numel() != n)
        throw Error(owner_ + ": StepBatch.task must give each of the " + std::to_string(n) + " envs' task (the env has " +
                    std::to_string(tasks_) + " tasks)");
      task = s.task.to(at::kCPU, at::kLong).contiguous();
      const auto* tk = task.data_ptr<std::int64_t>();
      for (std::int64_t i = 0; i < n; ++i)
        if (tk[i] < 0 || tk[i] >= tasks_)
          throw Error(owner_ + ": StepBatch.task[" + std::to_string(i) + "] is " + std::to_string(tk[i]) +
                      "; the env has tasks 0 to " + std::to_string(tasks_ - 1));
    }
    const std::int64_t* tk = task.defined() ? task.data_ptr<std::int64_t>() : nullptr;
    const auto *o = static_cast<const std::uint8_t*>(obs.data_ptr()), *no = static_cast<const std::uint8_t*>(next.data_ptr());
    const float* a = act.data_ptr<float>();
    const float *r = rew.data_ptr<float>(), *t = term.data_ptr<float>(), *tr = trunc.data_ptr<float>();

    killed_.clear();
    const std::int64_t first_obs = obs_added_, first_row = added_;  // this add's ids are consecutive
    obs_stage_.clear();
    row_stage_.clear();
    if (open_.size() != static_cast<std::size_t>(n)) {
      open_.assign(static_cast<std::size_t>(n), -1);
      open_obs_.assign(static_cast<std::size_t>(n * row_bytes_), 0);
      window_.resize(static_cast<std::size_t>(n));
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const auto e = static_cast<std::size_t>(i);
      const std::uint8_t* oi = o + i * row_bytes_;
      std::uint8_t* open = open_obs_.data() + i * row_bytes_;
      std::int64_t oid = open_[e];
      if (!obs_live(oid) || std::memcmp(oi, open, static_cast<std::size_t>(row_bytes_)) != 0)
        oid = store_obs(oi, open_[e], open);
      const std::int64_t nid = store_obs(no + i * row_bytes_, oid, oi);
      open_[e] = nid;
      std::memcpy(open, no + i * row_bytes_, static_cast<std::size_t>(row_bytes_));
      const std::int32_t ti = tk ? static_cast<std::int32_t>(tk[i]) : -1;
      if (window_.n() == 1) {
        if (obs_live(oid))
          put(oid, nid, a + i * ad_, r[i], t[i], 1.0, ti);
        else
          ++dropped_;  // storing next_obs overwrote a row obs needs (a ring too small for this many envs)
      } else {
        window_.push(e, {oid, nid, std::vector<float>(a + i * ad_, a + (i + 1) * ad_), r[i], t[i] > 0.5f},
                     t[i] > 0.5f || tr[i] > 0.5f, done_);
        for (const auto& d : done_) {
          if (obs_live(d.obs)) {  // (and the rows its stacks read)
            put(d.obs, d.next, d.action.data(), static_cast<float>(d.reward), d.terminated ? 1.f : 0.f, d.discount, ti);
          } else {
            ++dropped_;  // its first observation was overwritten while the window filled
          }
        }
        done_.clear();
      }
    }
    flush(first_obs, first_row);
    return {first_row, added_ - first_row};
  }

  /// The transitions in rows `slots` (each must be `valid`) as a batch of contiguous
  /// tensors on the storage device, with their ids in `index`. On the host, the tensors of
  /// the previous batch are written again once the caller has let go of them (`ReusedTensor`).
  ReplayBatch gather(std::span<const std::int64_t> slots) {
    const auto n = static_cast<std::int64_t>(slots.size());
    ReplayBatch b;
    if (device_.is_cpu()) {
      auto& c = batch_cache_;
      b.obs = c.obs.take({n, od_}, bytes_ ? at::kByte : at::kFloat);
      b.next_obs = c.next_obs.take({n, od_}, b.obs.scalar_type());
      at::Tensor action = c.action.take({n, ad_}, at::kFloat);
      b.reward = c.reward.take({n}, at::kFloat);
      b.terminated = c.terminated.take({n}, at::kFloat);
      if (with_discount_) b.discount = c.discount.take({n}, at::kFloat);
      float* a = action.data_ptr<float>();
      float *r = b.reward.data_ptr<float>(), *t = b.terminated.data_ptr<float>();
      float* d = with_discount_ ? b.discount.data_ptr<float>() : nullptr;
      std::int64_t* tk = nullptr;
      if (tasks_ > 0) {
        b.task = c.task.take({n}, at::kLong);
        tk = b.task.data_ptr<std::int64_t>();
      }
      const HostGather g{data_.data_ptr<float>(), width_, link_.data(), ad_, tasks_ > 0 ? ad_ + 2 + (with_discount_ ? 1 : 0) : -1,
                         with_discount_, od_, sd_, frames_.on() ? &frames_ : nullptr, a, r, t, d, tk};
      if (bytes_) {
        gather_on_host(g, slots, obs_.data_ptr<std::uint8_t>(), b.obs.data_ptr<std::uint8_t>(), b.next_obs.data_ptr<std::uint8_t>());
      } else {
        float *o = b.obs.data_ptr<float>(), *no = b.next_obs.data_ptr<float>();
        switch (obs_dtype_) {
          case ObsDtype::float32: gather_on_host(g, slots, obs_.data_ptr<float>(), o, no); break;
          case ObsDtype::bfloat16: gather_on_host(g, slots, obs_.data_ptr<c10::BFloat16>(), o, no); break;
          case ObsDtype::float16: gather_on_host(g, slots, obs_.data_ptr<c10::Half>(), o, no); break;
        }
      }
      b.action = discrete_ ? action.view({n}).to(at::kLong) : action;
    } else {
      return gather_indexed(slots);
    }
    b.index = batch_cache_.index.take({n}, at::kLong);
    write_ids(slots, b.index);
    return b;
  }

  /// `gather` by tensor indexing on the storage device: how a batch is drawn from storage
  /// on a GPU, where the rows never cross to the host (one host-to-device copy of 3n
  /// indices). On the CPU, the same batch as `gather`, as columns of the gathered rows.
  ReplayBatch gather_indexed(std::span<const std::int64_t> slots) const {
    const auto n = static_cast<std::int64_t>(slots.size());
    ReplayBatch b;
    {
      // the transitions' rows, then each one's obs and next_obs rows: each one's chain of k
      // rows, newest first (k = 1, the row alone, without frame stacks)
      const std::int64_t k = frames_.depth();
      auto idx = at::empty({n + 2 * n * k}, at::TensorOptions().dtype(at::kLong));
      auto* ip = idx.data_ptr<std::int64_t>();
      std::array<std::int32_t, FrameChains::kMaxFrames> chain{};
      for (std::int64_t i = 0; i < n; ++i) {
        const auto s = static_cast<std::size_t>(slots[static_cast<std::size_t>(i)]);
        ip[i] = slots[static_cast<std::size_t>(i)];
        frames_.chain(link_[s].obs, chain.data());
        for (std::int64_t m = 0; m < k; ++m) ip[n + i * k + m] = chain[static_cast<std::size_t>(m)];
        frames_.chain(link_[s].next, chain.data());
        for (std::int64_t m = 0; m < k; ++m) ip[n + (n + i) * k + m] = chain[static_cast<std::size_t>(m)];
      }
      const auto di = idx.to(device_, /*non_blocking=*/true);
      const auto rows = data_.index_select(0, di.narrow(0, 0, n));
      const auto rows2 = obs_.index_select(0, di.narrow(0, n, 2 * n * k));
      const auto both = k > 1     ? frames_.rebuild(rows2.view({2 * n, k, sd_}))
                        : bytes_ ? rows2
                                 : rows2.to(at::kFloat);  // rows of parts cross as bytes
      b.obs = both.narrow(0, 0, n);
      b.next_obs = both.narrow(0, n, n);
      b.action = discrete_ ? rows.select(1, 0).to(at::kLong) : rows.narrow(1, 0, ad_);
      b.reward = rows.select(1, ad_);
      b.terminated = rows.select(1, ad_ + 1);
      if (with_discount_) b.discount = rows.select(1, ad_ + 2);
      if (tasks_ > 0) b.task = rows.select(1, ad_ + 2 + (with_discount_ ? 1 : 0)).to(at::kLong);
    }
    b.index = ids(slots);
    return b;
  }

  /// Writes the stored rows, links, counters and n-step windows.
  void save(BinaryWriter& w) const {
    w.value(capacity_);
    w.value(obs_capacity_);
    w.value(width_);
    w.value(od_);
    if (frames_.on()) w.value(sd_);
    w.value(ad_);
    w.value<std::uint8_t>(static_cast<std::uint8_t>(obs_dtype_));
    w.value(added_);
    w.value(obs_added_);
    w.value(live_);
    w.value(dropped_);
    const auto rows = data_.narrow(0, 0, stored()).to(at::kCPU).contiguous();
    w.bytes(rows.data_ptr<float>(), static_cast<std::size_t>(rows.numel()) * sizeof(float));
    const auto obs = obs_.narrow(0, 0, obs_stored()).to(at::kCPU).contiguous();
    w.bytes(obs.data_ptr(), static_cast<std::size_t>(obs.numel() * obs.element_size()));
    w.bytes(link_.data(), static_cast<std::size_t>(stored()) * sizeof(Link));
    w.bytes(owner_of_.data(), static_cast<std::size_t>(obs_stored()) * sizeof(std::int32_t));
    if (frames_.on()) frames_.save(w, obs_stored());
    w.value<std::uint64_t>(open_.size());
    w.bytes(open_.data(), open_.size() * sizeof(std::int64_t));
    w.bytes(open_obs_.data(), open_obs_.size());
    window_.save(w);
  }
  /// What `save` wrote, read and checked against this store's shape, not yet applied.
  struct Saved {
    at::Tensor rows, obs;
    std::int64_t added = 0, obs_added = 0, live = 0, dropped = 0;
    std::vector<Link> links;
    std::vector<std::int32_t> owner_of;
    std::vector<std::int64_t> open;
    std::vector<std::uint8_t> open_obs;  // each env's row's bytes
    NStepWindow::Saved window;
    FrameChains::Saved frames;
  };
  Saved read(BinaryReader& r) const {
    r.expect(capacity_, "buffer.capacity");
    r.expect(obs_capacity_, "observation ring size");
    r.expect(width_, "row width");
    r.expect(od_, "observation size");
    if (frames_.on()) r.expect(sd_, "stored observation row size (a frame of each stack)");
    r.expect(ad_, "action size");
    r.expect<std::uint8_t>(static_cast<std::uint8_t>(obs_dtype_), "buffer.obs_dtype (0 float32, 1 bfloat16, 2 float16)");
    Saved s;
    s.added = r.value<std::int64_t>("transitions added");
    s.obs_added = r.value<std::int64_t>("observations added");
    s.live = r.value<std::int64_t>("transitions stored");
    s.dropped = r.value<std::int64_t>("transitions dropped");
    if (s.added < 0 || s.obs_added < 0 || s.live < 0 || s.dropped < 0)
      r.fail("transition counters", "are negative");
    const std::int64_t n = std::min(s.added, capacity_), m = std::min(s.obs_added, obs_capacity_);
    s.rows = at::empty({n, width_}, at::kFloat);
    r.bytes(s.rows.data_ptr<float>(), static_cast<std::size_t>(n * width_) * sizeof(float), "transitions");
    s.obs = at::empty({m, sd_}, obs_.options().device(at::kCPU));
    r.bytes(s.obs.data_ptr(), static_cast<std::size_t>(m * sd_ * s.obs.element_size()), "observations");
    auto ints = [&](std::vector<std::int32_t>& v, std::int64_t k, const char* what) {
      v.resize(static_cast<std::size_t>(k));
      r.bytes(v.data(), v.size() * sizeof(std::int32_t), what);
    };
    s.links.resize(static_cast<std::size_t>(n));
    r.bytes(s.links.data(), s.links.size() * sizeof(Link), "observation links");
    ints(s.owner_of, m, "observation owners");
    if (frames_.on()) s.frames = frames_.read(r, m);
    std::int64_t live = 0;
    for (const auto& l : s.links) {
      const auto a = l.obs, b = l.next;
      if (a < -1 || a >= m || b < -1 || b >= m || (a >= 0) != (b >= 0))
        r.fail("observation links", "point outside the stored observations");
      live += a >= 0;
    }
    if (live != s.live) r.fail("transitions stored", "does not match the observation links");
    for (auto t : s.owner_of)
      if (t < -1 || t >= n) r.fail("observation owners", "point outside the stored transitions");
    const auto envs = r.value<std::uint64_t>("env count");
    if (envs > (1u << 20)) r.fail("env count", "is implausibly large");
    s.open.resize(envs);
    r.bytes(s.open.data(), s.open.size() * sizeof(std::int64_t), "current observation ids");
    s.open_obs.resize(envs * static_cast<std::size_t>(row_bytes_));
    r.bytes(s.open_obs.data(), s.open_obs.size(), "current observations");
    s.window = window_.read(r);
    return s;
  }
  void restore(Saved&& s) {
    data_.narrow(0, 0, s.rows.size(0)).copy_(s.rows);
    obs_.narrow(0, 0, s.obs.size(0)).copy_(s.obs);
    link_.restart(s.links.size());  // the rows written so far; the rest fill as before
    owner_of_.restart(s.owner_of.size());
    if (frames_.on()) frames_.restore(std::move(s.frames));
    std::copy(s.links.begin(), s.links.end(), link_.begin());
    std::copy(s.owner_of.begin(), s.owner_of.end(), owner_of_.begin());
    added_ = s.added;
    obs_added_ = s.obs_added;
    live_ = s.live;
    dropped_ = s.dropped;
    open_ = std::move(s.open);
    open_obs_ = std::move(s.open_obs);
    window_.restore(std::move(s.window));
    window_.resize(open_.size());
    if (tasks_ > 0) {  // each row's task, from the task column
      std::fill(task_of_.begin(), task_of_.end(), -1);
      std::fill(task_count_.begin(), task_count_.end(), 0);
      const std::int64_t col = ad_ + 2 + (with_discount_ ? 1 : 0);
      const auto rows = s.rows.contiguous();
      const float* p = rows.data_ptr<float>();
      for (std::int64_t k = 0; k < rows.size(0); ++k) {
        const auto tk = static_cast<std::int32_t>(p[k * width_ + col]);
        task_of_[static_cast<std::size_t>(k)] = tk;
        if (valid(k) && tk >= 0 && tk < tasks_) ++task_count_[static_cast<std::size_t>(tk)];
      }
    }
  }

  /// The id of the transition now in `slot` (slot < stored()).
  [[nodiscard]] std::int64_t id_of(std::int64_t slot) const noexcept { return lap().id(slot); }
  /// Whether transition `id` is still stored.
  [[nodiscard]] bool live(std::int64_t id) const noexcept {
    return id >= 0 && id < added_ && id + capacity_ >= added_ && valid(slot_of(id));
  }
  /// Where the ring is: the newest row, and the id stored in row 0 of this lap. `id` maps a
  /// row to the id of the transition in it; `recent` and `slot` map an id back without the
  /// division per id that `live` and `slot_of` take.
  struct Lap {
    std::int64_t newest_slot, base, capacity;
    [[nodiscard]] std::int64_t id(std::int64_t slot) const noexcept {
      return slot <= newest_slot ? base + slot : base - capacity + slot;
    }
    /// Whether id `id` (>= 0) is among the last `capacity` added; then `slot` gives its row.
    [[nodiscard]] bool recent(std::int64_t id) const noexcept {
      return id <= base + newest_slot && id > base + newest_slot - capacity;
    }
    [[nodiscard]] std::int64_t slot(std::int64_t id) const noexcept { return id >= base ? id - base : id - base + capacity; }
  };
  /// The ring's `Lap` now (one division; valid until the next add).
  [[nodiscard]] Lap lap() const noexcept {
    const std::int64_t newest_slot = (added_ - 1) % capacity_;
    return {newest_slot, added_ - 1 - newest_slot, capacity_};
  }
  /// Whether row `slot` holds a stored transition.
  [[nodiscard]] bool valid(std::int64_t slot) const noexcept { return link_[static_cast<std::size_t>(slot)].obs >= 0; }
  [[nodiscard]] std::int64_t slot_of(std::int64_t id) const noexcept { return id % capacity_; }
  /// Rows of the transition ring written so far: samples are drawn from [0, stored()).
  [[nodiscard]] std::int64_t stored() const noexcept { return std::min(added_, capacity_); }
  /// Rows of older transitions that the last `add` dropped (see the class comment).
  [[nodiscard]] std::span<const std::int64_t> killed() const noexcept { return killed_; }

  /// Transitions stored now.
  [[nodiscard]] std::int64_t size() const noexcept { return live_; }
  /// The env's tasks (0: it has none), and the stored transitions of task `t` now.
  [[nodiscard]] std::int64_t tasks() const noexcept { return tasks_; }
  [[nodiscard]] std::int64_t task_count(std::int64_t t) const noexcept { return task_count_[static_cast<std::size_t>(t)]; }
  /// The task of the transition in row `slot` (-1: none).
  [[nodiscard]] std::int32_t task_of(std::int64_t slot) const noexcept {
    return tasks_ > 0 ? task_of_[static_cast<std::size_t>(slot)] : -1;
  }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t obs_capacity() const noexcept { return obs_capacity_; }
  [[nodiscard]] std::int64_t added() const noexcept { return added_; }
  /// Transitions that left before `capacity` newer ones arrived (see the class comment).
  [[nodiscard]] std::int64_t dropped() const noexcept { return dropped_; }
  [[nodiscard]] const c10::Device& device() const noexcept { return device_; }
  [[nodiscard]] const std::string& owner() const noexcept { return owner_; }
  void set_gamma(double gamma) noexcept { window_.set_gamma(gamma); }
  /// Bytes of preallocated storage.
  [[nodiscard]] std::int64_t bytes() const noexcept {
    return data_.numel() * static_cast<std::int64_t>(data_.element_size()) +
           obs_.numel() * static_cast<std::int64_t>(obs_.element_size()) +
           static_cast<std::int64_t>(link_.size() * sizeof(Link) + owner_of_.size() * sizeof(std::int32_t)) +
           frames_.link_bytes();
  }

 private:
  // `t`'s n * w values on the host as contiguous float32, or a clear error naming the field.
  at::Tensor host(const at::Tensor& t, std::int64_t n, std::int64_t w, const char* field) const {
    if (!t.defined() || t.numel() != n * w)
      throw Error(owner_ + ": StepBatch." + field + " has " + (t.defined() ? std::to_string(t.numel()) : "no") +
                  " values; expected " + std::to_string(n) + " envs x " + std::to_string(w));
    return host_as(t, at::kFloat);  // (only its data is read)
  }
  // An observation batch's n rows on the host, contiguous, in the rows' element type.
  at::Tensor host_obs(const at::Tensor& t, std::int64_t n, const char* field) const {
    if (!t.defined() || t.numel() != n * od_)
      throw Error(owner_ + ": StepBatch." + field + " has " + (t.defined() ? std::to_string(t.numel()) : "no") +
                  " values; expected " + std::to_string(n) + " envs x " + std::to_string(od_));
    if (bytes_ && t.scalar_type() != at::kByte)
      throw Error(owner_ + ": StepBatch." + field + " is " + std::string(t.dtype().name()) +
                  "; the env's observations are rows of bytes (uint8)");
    return host_as(t, bytes_ ? at::kByte : at::kFloat);
  }
  // The ids of the transitions in rows `slots`, as a host int64 tensor.
  at::Tensor ids(std::span<const std::int64_t> slots) const {
    auto t = at::empty({static_cast<std::int64_t>(slots.size())}, at::TensorOptions().dtype(at::kLong));
    write_ids(slots, t);
    return t;
  }
  // ... written into `t` (host int64, as many as `slots`).
  void write_ids(std::span<const std::int64_t> slots, const at::Tensor& t) const {
    auto* id = t.data_ptr<std::int64_t>();
    const Lap now = lap();  // (its division once for the batch)
    for (std::size_t i = 0; i < slots.size(); ++i) id[i] = now.id(slots[i]);
  }
  [[nodiscard]] std::int64_t obs_stored() const noexcept { return std::min(obs_added_, obs_capacity_); }
  // Whether observation `id` is still in the ring, and with frame stacks, every row its
  // stacks read (an older row's slot that holds a newer id now was overwritten).
  [[nodiscard]] bool obs_live(std::int64_t id) const noexcept {
    if (id < 0 || id + obs_capacity_ < obs_added_) return false;
    std::int64_t cur = id;
    for (std::int64_t m = 1; m < frames_.depth(); ++m) {
      const std::int32_t p = frames_.prev(cur % obs_capacity_);
      if (p < 0) break;
      const std::int64_t last = obs_added_ - 1, pid = last - (last - p) % obs_capacity_;  // the id now in row p
      if (pid >= cur) return false;
      cur = pid;
    }
    return true;
  }

  // Appends observation `o` (a full row). With frame stacks it is linked to observation
  // `parent` (whose full row is `parent_row`) where its stacks continue that row's; else
  // it starts a chain where every frame of its stacks is the same (an episode's start);
  // else it comes after rows of its own older frames.
  std::int64_t store_obs(const std::uint8_t* o, std::int64_t parent, const std::uint8_t* parent_row) {
    if (!frames_.on()) return append_obs(o);
    std::int64_t link = -1;
    if (parent >= 0 && obs_live(parent) && frames_.child(parent % obs_capacity_) < 0 && frames_.follows(o, parent_row))
      link = parent;
    else if (!frames_.starts(o))
      for (std::int64_t back = frames_.depth() - 1; back >= 1; --back) link = append_obs(o, link, back);
    return append_obs(o, link, 0);
  }

  // Appends one observation row (with frame stacks: the one `back` steps before full row
  // `o`, linked to observation `parent`); a stored transition that still uses the row it
  // overwrites is dropped, and with frame stacks, those whose stacks read it.
  std::int64_t append_obs(const std::uint8_t* o, std::int64_t parent = -1, std::int64_t back = 0) {
    const std::int64_t id = obs_added_++;
    const auto slot = static_cast<std::int32_t>(id % obs_capacity_);
    owner_of_.reach(static_cast<std::size_t>(slot));
    drop_user(slot);
    owner_of_[static_cast<std::size_t>(slot)] = -1;
    if (frames_.on()) {
      if (id >= obs_capacity_)  // the rows that read this one: its next depth - 1 down its env's chain
        for (std::int32_t c = frames_.child(slot), m = 1; c >= 0 && m < frames_.depth(); c = frames_.child(c), ++m)
          drop_user(c);
      frames_.link(slot, parent >= 0 ? parent % obs_capacity_ : -1);
      frames_.stored_row(o, back, obs_stage_);
    } else {
      obs_stage_.insert(obs_stage_.end(), o, o + row_bytes_);
    }
    return id;
  }

  // Drops the stored transition whose obs is in observation row `slot`, if any.
  void drop_user(std::int32_t slot) {
    const std::int32_t t = owner_of_[static_cast<std::size_t>(slot)];
    if (t >= 0 && link_[static_cast<std::size_t>(t)].obs == slot) {
      link_[static_cast<std::size_t>(t)] = Link{};
      if (tasks_ > 0) --task_count_[static_cast<std::size_t>(task_of_[static_cast<std::size_t>(t)])];
      --live_;
      ++dropped_;
      killed_.push_back(t);
    }
  }

  // Stores one transition of task `task` (-1: none) from observation `oid` to `nid`.
  void put(std::int64_t oid, std::int64_t nid, const float* action, float reward, float terminated, double discount,
           std::int32_t task) {
    const auto slot = static_cast<std::size_t>(added_ % capacity_);
    link_.reach(slot);
    if (link_[slot].obs >= 0) {
      --live_;
      if (tasks_ > 0) --task_count_[static_cast<std::size_t>(task_of_[slot])];
    }
    if (tasks_ > 0) {
      task_of_[slot] = task;
      ++task_count_[static_cast<std::size_t>(task)];
    }
    link_[slot] = Link{static_cast<std::int32_t>(oid % obs_capacity_), static_cast<std::int32_t>(nid % obs_capacity_)};
    owner_of_[static_cast<std::size_t>(link_[slot].obs)] = static_cast<std::int32_t>(slot);
    row_stage_.insert(row_stage_.end(), action, action + ad_);
    row_stage_.push_back(reward);
    row_stage_.push_back(terminated);
    if (with_discount_) row_stage_.push_back(static_cast<float>(discount));
    if (tasks_ > 0) row_stage_.push_back(static_cast<float>(task));
    ++live_;
    ++added_;
  }

  // Copies the rows this add staged into the rings (its ids are consecutive).
  void flush(std::int64_t first_obs, std::int64_t first_row) {
    copy_into_ring(obs_, first_obs, obs_stage_.data(), static_cast<std::int64_t>(obs_stage_.size()), sd_,
                   bytes_ ? at::kByte : at::kFloat);
    copy_into_ring(data_, first_row, row_stage_.data(), static_cast<std::int64_t>(row_stage_.size() * sizeof(float)),
                   width_, at::kFloat);
  }

  std::int64_t capacity_, obs_capacity_;
  c10::Device device_;
  std::string owner_;
  std::int64_t od_;                // observation row width: floats, or bytes for rows of parts
  std::int64_t row_bytes_;         // ... in bytes
  std::int64_t sd_ = 0;            // stored observation row width (od_, or a frame of each stack)
  FrameChains frames_;             // frame stacks stored once (none: rows stored whole)
  bool bytes_;                     // rows of parts (uint8), stored as they come
  std::int64_t ad_;
  bool discrete_, with_discount_;
  ObsDtype obs_dtype_;
  std::int64_t tasks_;             // the env's tasks (0: none)
  std::int64_t width_;             // columns of data_
  at::Tensor data_;                // [capacity, width]: action, reward, terminated (, discount) (, task)
  at::Tensor obs_;                 // [obs_capacity, sd_] in the storage dtype
  HugeArray<Link> link_;           // per transition row
  HugeArray<std::int32_t> owner_of_;  // per observation row: the transition row using it as obs
  HugeArray<std::int32_t> task_of_;   // per transition row: its task (envs with tasks)
  std::vector<std::int64_t> task_count_;  // per task: live transitions
  std::int64_t added_ = 0, obs_added_ = 0, live_ = 0, dropped_ = 0;
  std::vector<std::int64_t> open_;  // per env: id of the observation its last step led to
  std::vector<std::uint8_t> open_obs_;  // ... and that observation's bytes, to recognise it
  struct BatchCache {  // gather's tensors, handed out again once let go of
    ReusedTensor obs, next_obs, action, reward, terminated, discount, task, index;
  } batch_cache_;
  NStepWindow window_;
  std::vector<NStepWindow::Done> done_;
  std::vector<std::int64_t> killed_;
  std::vector<std::uint8_t> obs_stage_;  // this add's new observation rows, as bytes
  std::vector<float> row_stage_;
};

}  // namespace detail
}  // namespace anvil
