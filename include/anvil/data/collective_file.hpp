#pragma once
/// @file
/// The collective dataset: transitions copied from SAC worker experts, each labelled with
/// its expert's action distribution and Q-target, in one HDF5 file a user can open
/// elsewhere (h5py, HDFView). Needs `anvil::hdf5`. Light header: no torch.
///
/// Layout (version 1), N rows, S segments:
///
/// | object | shape, type | meaning |
/// |---|---|---|
/// | `/` attributes | `format` = "anvil collective transitions", `version` = 1, `obs_dim`, `act_dim`, `tasks` (names, one per line) | |
/// | `obs`, `next_obs` | [N, obs_dim] float32 | the state and the state after the step |
/// | `action` | [N, act_dim] float32 | the action taken, in [-1, 1] (the policy's units) |
/// | `reward` | [N] float32 | the env's reward |
/// | `terminated` | [N] uint8 | 1 where the episode ended in a terminal state |
/// | `episode_start` | [N] uint8 | 1 where the row is the first step of an episode |
/// | `mean`, `log_std` | [N, act_dim] float32 | the expert's Gaussian before tanh at `obs` |
/// | `q_target` | [N] float32 | the expert's clipped double-Q target r + gamma (1 - terminated) (min Q'(s', a') - alpha log pi(a' given s')) |
/// | `segments` | [S, 3] int64 | (first row, rows, task): the rows of a segment are consecutive steps of one env of one worker, in time order; segments cover the rows in order |
///
/// Every dataset is contiguous and uncompressed, so `CollectiveFile` maps the file and
/// copies rows straight out of it: reads from any number of threads, no HDF5 call per
/// batch, and nothing loaded whole (5M rows of the manipulation suite are ~3.3 GB on disk
/// and cost only the page cache). A file another tool rewrote with chunks or compression is
/// still read, through HDF5, one reader at a time.
///
/// Appending (`append_collective`) writes a new file of the old rows (streamed in blocks)
/// and the new ones next to the target and renames it over the target once complete: a
/// killed run leaves the previous file valid.

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/data/hdf5.hpp>

namespace anvil {

namespace collective {
inline constexpr const char* kFormat = "anvil collective transitions";
inline constexpr std::int64_t kVersion = 1;
/// The per-row datasets, in the order `CollectiveFile::Field` numbers them.
inline constexpr std::array<const char*, 9> kFields{"obs",      "next_obs", "action",        "reward", "terminated",
                                                    "episode_start", "mean", "log_std", "q_target"};
}  // namespace collective

/// Rows of a collective dataset in memory, row-major, one vector per field.
struct CollectiveRows {
  std::int64_t obs_dim = 0, act_dim = 0;
  std::vector<float> obs, next_obs, action, reward, mean, log_std, q_target;
  std::vector<std::uint8_t> terminated, episode_start;

  [[nodiscard]] std::int64_t rows() const noexcept { return static_cast<std::int64_t>(reward.size()); }
  /// Room for `n` rows (values unset).
  void resize(std::int64_t n) {
    const auto un = static_cast<std::size_t>(n), od = static_cast<std::size_t>(obs_dim), ad = static_cast<std::size_t>(act_dim);
    obs.resize(un * od);
    next_obs.resize(un * od);
    action.resize(un * ad);
    mean.resize(un * ad);
    log_std.resize(un * ad);
    reward.resize(un);
    q_target.resize(un);
    terminated.resize(un);
    episode_start.resize(un);
  }
};

/// A collective dataset file, open for reading (see file comment). Thread-safe: `read`
/// may be called from many threads at once.
class CollectiveFile {
 public:
  enum Field : int { obs, next_obs, action, reward, terminated, episode_start, mean, log_std, q_target };
  struct Segment {
    std::int64_t begin = 0, rows = 0, task = 0;
  };

  /// Opens and checks `path`: every attribute and dataset, their shapes and types, the
  /// segment table, and that the file holds every byte its datasets claim. An Error naming
  /// the file and the field at fault otherwise.
  explicit CollectiveFile(const std::filesystem::path& path) : h5_(h5::File::open(path)) {
    const auto& f = h5_;
    if (!f.has_attribute("/", "format") || f.string_attribute("/", "format") != collective::kFormat)
      f.fail("/", std::string("is not a collective dataset (its attribute 'format' is not \"") + collective::kFormat + "\")");
    if (const auto v = f.int_attribute("/", "version"); v != collective::kVersion)
      f.fail("/@version", "is " + std::to_string(v) + "; this anvil reads version " + std::to_string(collective::kVersion));
    obs_dim_ = f.int_attribute("/", "obs_dim");
    act_dim_ = f.int_attribute("/", "act_dim");
    if (obs_dim_ < 1 || act_dim_ < 1) f.fail("/", "obs_dim and act_dim must be positive");
    std::istringstream names(f.string_attribute("/", "tasks"));
    for (std::string line; std::getline(names, line);)
      if (!line.empty()) tasks_.push_back(line);
    rows_ = f.shape("reward").empty() ? -1 : f.shape("reward")[0];
    for (int k = 0; k < static_cast<int>(collective::kFields.size()); ++k) {
      const std::string name = collective::kFields[static_cast<std::size_t>(k)];
      const auto want = expected_shape(static_cast<Field>(k));
      if (f.shape(name) != want) f.fail(name, "has shape " + h5::shape_string(f.shape(name)) + ", expected " + h5::shape_string(want));
    }
    // Segments: in order, covering the rows, each of a known task.
    const auto seg = f.read<std::int64_t>("segments");
    if (seg.shape.size() != 2 || seg.shape[1] != 3) f.fail("segments", "has shape " + h5::shape_string(seg.shape) + ", expected [S, 3]");
    std::int64_t next = 0;
    for (std::int64_t s = 0; s < seg.shape[0]; ++s) {
      const Segment g{seg.values[static_cast<std::size_t>(3 * s)], seg.values[static_cast<std::size_t>(3 * s + 1)],
                      seg.values[static_cast<std::size_t>(3 * s + 2)]};
      if (g.begin != next || g.rows < 1)
        f.fail("segments", "row " + std::to_string(s) + " starts at " + std::to_string(g.begin) + " with " + std::to_string(g.rows) +
                               " rows; segments must cover the rows in order (expected a start at " + std::to_string(next) + ")");
      if (g.task < 0 || g.task >= static_cast<std::int64_t>(tasks_.size()))
        f.fail("segments", "row " + std::to_string(s) + " names task " + std::to_string(g.task) + ", but the file lists " +
                               std::to_string(tasks_.size()) + " tasks");
      segments_.push_back(g);
      next += g.rows;
    }
    if (next != rows_) f.fail("segments", "cover " + std::to_string(next) + " rows, but the datasets hold " + std::to_string(rows_));
    map_raw(path);
  }
  ~CollectiveFile() {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
  }
  CollectiveFile(const CollectiveFile&) = delete;
  CollectiveFile& operator=(const CollectiveFile&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return h5_.name(); }
  [[nodiscard]] std::int64_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t obs_dim() const noexcept { return obs_dim_; }
  [[nodiscard]] std::int64_t act_dim() const noexcept { return act_dim_; }
  [[nodiscard]] const std::vector<std::string>& tasks() const noexcept { return tasks_; }
  [[nodiscard]] const std::vector<Segment>& segments() const noexcept { return segments_; }
  /// Whether rows are copied from a mapping of the file (else read through HDF5, serially).
  [[nodiscard]] bool mapped() const noexcept { return map_ != nullptr; }
  /// Values per row of a field.
  [[nodiscard]] std::int64_t width(Field k) const noexcept {
    switch (k) {
      case obs:
      case next_obs: return obs_dim_;
      case action:
      case mean:
      case log_std: return act_dim_;
      default: return 1;
    }
  }
  [[nodiscard]] static bool is_flag(Field k) noexcept { return k == terminated || k == episode_start; }

  /// Copies rows `ids` (any order, repeats allowed) of field `k` into `out` (ids.size() *
  /// width(k) values, row i of `out` = row ids[i]). Float fields are checked finite: an
  /// Error names the file, field and row otherwise.
  void read(Field k, std::span<const std::int64_t> ids, float* out) const { gather(k, ids, out); }
  void read(Field k, std::span<const std::int64_t> ids, std::uint8_t* out) const { gather(k, ids, out); }

  /// Rows `ids` of every field into `out` (resized; row i of `out` = row ids[i]).
  void read(std::span<const std::int64_t> ids, CollectiveRows& out) const {
    out.obs_dim = obs_dim_;
    out.act_dim = act_dim_;
    out.resize(static_cast<std::int64_t>(ids.size()));
    read(obs, ids, out.obs.data());
    read(next_obs, ids, out.next_obs.data());
    read(action, ids, out.action.data());
    read(reward, ids, out.reward.data());
    read(terminated, ids, out.terminated.data());
    read(episode_start, ids, out.episode_start.data());
    read(mean, ids, out.mean.data());
    read(log_std, ids, out.log_std.data());
    read(q_target, ids, out.q_target.data());
  }

  /// Every row of the file, in blocks of `block` rows: `f(first_row, rows)` gets them in
  /// `CollectiveRows` (for copying a file; memory stays one block).
  template <class F>
  void for_each_block(std::int64_t block, F&& f) const {
    CollectiveRows r;
    std::vector<std::int64_t> ids;
    for (std::int64_t b = 0; b < rows_; b += block) {
      const std::int64_t n = std::min(block, rows_ - b);
      ids.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = b + i;
      read(ids, r);
      f(b, static_cast<const CollectiveRows&>(r));
    }
  }

 private:
  [[nodiscard]] h5::Shape expected_shape(Field k) const {
    if (k == reward || k == terminated || k == episode_start || k == q_target) return {rows_};
    return {rows_, width(k)};
  }
  [[nodiscard]] static std::int64_t elem_bytes(Field k) noexcept { return is_flag(k) ? 1 : 4; }

  // Maps the file when every dataset is stored raw and whole; checks the file's length.
  void map_raw(const std::filesystem::path& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) h5_.fail("/", "cannot stat the file");
    const auto size = static_cast<std::int64_t>(st.st_size);
    bool raw = rows_ > 0;
    for (int k = 0; k < static_cast<int>(collective::kFields.size()) && raw; ++k) {
      const auto field = static_cast<Field>(k);
      const std::string name = collective::kFields[static_cast<std::size_t>(k)];
      const bool typed = is_flag(field) ? h5_.stored_as<std::uint8_t>(name) : h5_.stored_as<float>(name);
      offset_[static_cast<std::size_t>(k)] = typed ? h5_.contiguous_offset(name) : -1;
      if (offset_[static_cast<std::size_t>(k)] < 0) {
        raw = false;
        break;
      }
      const std::int64_t end = offset_[static_cast<std::size_t>(k)] + rows_ * width(field) * elem_bytes(field);
      if (end > size)
        h5_.fail(name, "is cut short: its values end at byte " + std::to_string(end) + " of a file of " + std::to_string(size) +
                           " bytes (a truncated copy?)");
    }
    if (!raw) return;
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) h5_.fail("/", "cannot open the file for reading");
    map_bytes_ = static_cast<std::size_t>(size);
    void* m = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return;  // read through HDF5 instead
    map_ = static_cast<char*>(m);
  }

  template <class T>
  void gather(Field k, std::span<const std::int64_t> ids, T* out) const {
    const std::int64_t w = width(k);
    const std::string name = collective::kFields[static_cast<std::size_t>(k)];
    for (const auto id : ids)
      if (id < 0 || id >= rows_) h5_.fail(name, "row " + std::to_string(id) + " asked for; the file has " + std::to_string(rows_));
    if (map_ != nullptr) {
      const char* base = map_ + offset_[static_cast<std::size_t>(k)];
      const std::size_t row_bytes = static_cast<std::size_t>(w) * sizeof(T);
      for (std::size_t i = 0; i < ids.size(); ++i) std::memcpy(out + i * static_cast<std::size_t>(w), base + static_cast<std::size_t>(ids[i]) * row_bytes, row_bytes);
    } else {
      // Through HDF5 (a rewritten file): consecutive ids in one read.
      const std::lock_guard lock(hdf5_mutex());
      for (std::size_t i = 0; i < ids.size();) {
        std::size_t j = i + 1;
        while (j < ids.size() && ids[j] == ids[j - 1] + 1) ++j;
        h5_.read_rows<T>(name, ids[i], static_cast<std::int64_t>(j - i), out + i * static_cast<std::size_t>(w));
        i = j;
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      const std::size_t n = ids.size() * static_cast<std::size_t>(w);
      for (std::size_t i = 0; i < n; ++i)
        if (!std::isfinite(out[i])) [[unlikely]]
          h5_.fail(name, "row " + std::to_string(ids[i / static_cast<std::size_t>(w)]) + " holds a non-finite value");
    }
  }
  static std::mutex& hdf5_mutex() {
    static std::mutex m;
    return m;
  }

  h5::File h5_;
  std::int64_t rows_ = 0, obs_dim_ = 0, act_dim_ = 0;
  std::vector<std::string> tasks_;
  std::vector<Segment> segments_;
  std::array<std::int64_t, collective::kFields.size()> offset_{};
  char* map_ = nullptr;
  std::size_t map_bytes_ = 0;
};

/// Appends `rows` of task `task` to the collective dataset at `path` (created when
/// missing), as segments of `segment_rows` rows each (their sum must be rows.rows()). The
/// old rows are copied in blocks; the new file replaces the old one atomically.
inline void append_collective(const std::filesystem::path& path, const std::string& task, const CollectiveRows& rows,
                              const std::vector<std::int64_t>& segment_rows) {
  std::int64_t total_new = 0;
  for (const auto s : segment_rows) {
    if (s < 1) throw Error(path.string() + ": segments: a segment of " + std::to_string(s) + " rows");
    total_new += s;
  }
  if (total_new != rows.rows())
    throw Error(path.string() + ": segments: they hold " + std::to_string(total_new) + " rows, given " + std::to_string(rows.rows()));
  if (task.empty() || task.find('\n') != std::string::npos) throw Error(path.string() + ": a task's name must be one non-empty line");
  std::unique_ptr<CollectiveFile> old;
  if (std::filesystem::exists(path)) {
    old = std::make_unique<CollectiveFile>(path);
    if (old->obs_dim() != rows.obs_dim || old->act_dim() != rows.act_dim)
      throw Error(path.string() + ": holds obs_dim " + std::to_string(old->obs_dim()) + ", act_dim " + std::to_string(old->act_dim()) +
                  "; the rows to append have " + std::to_string(rows.obs_dim) + ", " + std::to_string(rows.act_dim));
  }
  std::vector<std::string> tasks = old ? old->tasks() : std::vector<std::string>{};
  auto it = std::find(tasks.begin(), tasks.end(), task);
  const auto task_id = static_cast<std::int64_t>(it - tasks.begin());
  if (it == tasks.end()) tasks.push_back(task);
  const std::int64_t n_old = old ? old->rows() : 0, n = n_old + rows.rows();
  const std::int64_t od = rows.obs_dim, ad = rows.act_dim;

  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  h5::H5Writer w(path);
  w.attribute("/", "format", std::string(collective::kFormat));
  w.attribute("/", "version", collective::kVersion);
  w.attribute("/", "obs_dim", od);
  w.attribute("/", "act_dim", ad);
  std::string names;
  for (const auto& t : tasks) names += t + "\n";
  w.attribute("/", "tasks", names);
  w.allocate<float>("obs", {n, od});
  w.allocate<float>("next_obs", {n, od});
  w.allocate<float>("action", {n, ad});
  w.allocate<float>("reward", {n});
  w.allocate<std::uint8_t>("terminated", {n});
  w.allocate<std::uint8_t>("episode_start", {n});
  w.allocate<float>("mean", {n, ad});
  w.allocate<float>("log_std", {n, ad});
  w.allocate<float>("q_target", {n});
  const auto put = [&w](std::int64_t at, const CollectiveRows& r, std::int64_t from, std::int64_t count) {
    const auto od = static_cast<std::size_t>(r.obs_dim), ad = static_cast<std::size_t>(r.act_dim), f = static_cast<std::size_t>(from);
    w.write_rows("obs", at, count, r.obs.data() + f * od);
    w.write_rows("next_obs", at, count, r.next_obs.data() + f * od);
    w.write_rows("action", at, count, r.action.data() + f * ad);
    w.write_rows("reward", at, count, r.reward.data() + f);
    w.write_rows("terminated", at, count, r.terminated.data() + f);
    w.write_rows("episode_start", at, count, r.episode_start.data() + f);
    w.write_rows("mean", at, count, r.mean.data() + f * ad);
    w.write_rows("log_std", at, count, r.log_std.data() + f * ad);
    w.write_rows("q_target", at, count, r.q_target.data() + f);
  };
  std::vector<std::int64_t> seg;
  if (old) {
    old->for_each_block(65536, [&](std::int64_t first, const CollectiveRows& r) { put(first, r, 0, r.rows()); });
    for (const auto& s : old->segments()) seg.insert(seg.end(), {s.begin, s.rows, s.task});
  }
  for (std::int64_t b = 0; b < rows.rows(); b += 65536) put(n_old + b, rows, b, std::min<std::int64_t>(65536, rows.rows() - b));
  std::int64_t at = n_old;
  for (const auto s : segment_rows) {
    seg.insert(seg.end(), {at, s, task_id});
    at += s;
  }
  w.dataset("segments", {static_cast<std::int64_t>(seg.size() / 3), 3}, seg);
  old.reset();
  w.commit();
}

/// Appends every row of the collective dataset `src` to `dst` (created when missing), task
/// by task in `src`'s task order, segments kept whole: e.g. workers that ran at once, each
/// into a file of its own. `src` is read into memory one task at a time.
inline void merge_collective(const std::filesystem::path& dst, const std::filesystem::path& src) {
  const CollectiveFile in(src);
  for (std::int64_t task = 0; task < static_cast<std::int64_t>(in.tasks().size()); ++task) {
    std::vector<std::int64_t> ids, lengths;
    for (const auto& s : in.segments())
      if (s.task == task) {
        for (std::int64_t r = s.begin; r < s.begin + s.rows; ++r) ids.push_back(r);
        lengths.push_back(s.rows);
      }
    if (ids.empty()) continue;
    CollectiveRows rows;
    in.read(ids, rows);
    append_collective(dst, in.tasks()[static_cast<std::size_t>(task)], rows, lengths);
  }
}

}  // namespace anvil
