#pragma once
/// @file
/// `DemoReader`: the observations of a demonstration file in robomimic's HDF5 layout
/// (data/demonstrations.hpp) as rows of parts, read on demand from many threads at once: the
/// reader behind `read_demonstrations` and behind a `DataLoader` over a dataset larger than
/// memory (needs `anvil::hdf5`).
///
/// Observation keys are datasets `data/demo_<k>/obs/<key>` (or one `obs` dataset):
/// - float numbers `[T]` or `[T, d]` (any numeric type, read as float32), a part of d floats;
/// - images: one-byte integers `[T, H, W, C]` (C of 1 to 4; robomimic's and LIBERO's
///   `agentview_rgb`, `eye_in_hand_rgb`, ...) or `[T, H, W]` (C = 1), a part `[C, H', W']`
///   of uint8, transposed to channels first and, when `image_height`/`image_width` are
///   given, resized by area averaging (data/frames.hpp).
/// Image datasets may be contiguous or chunked, raw or gzip-compressed (h5py's
/// `compression="gzip"`, with or without its shuffle filter). The HDF5 library runs one
/// call at a time (its thread-safe build holds one lock), so it is asked only when the file
/// is opened: where each dataset, or each chunk of one, lies in the file. Reads then take
/// the bytes with `pread` and inflate, transpose and resize them in the calling thread: N
/// threads read N frames at once, the library not involved. Float keys are read whole when
/// the file is opened. Other filters (h5py's LZF, Blosc, ...) and chunks that split frames
/// go through the library when it has the filters, and are refused naming the filter when
/// it does not.
/// Every key's shape is checked against the first demonstration's and its row count against
/// the demo's actions; errors name the file and the dataset. Light header: no torch.

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <anvil/core/detail/huge_pages.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/data/frames.hpp>
#include <anvil/data/hdf5.hpp>

namespace anvil {

/// What `DemoReader` (and `read_demonstrations`) read and how.
struct DemoReadOptions {
  /// Observation keys to read, in order (empty: every key of the first demo, by name).
  std::vector<std::string> obs_keys{};
  /// Resize every image to image_height x image_width on read (0: as stored).
  int image_height = 0, image_width = 0;
  /// Threads reading observation rows in `read_demonstrations` (0: the calling thread).
  int threads = 0;
};

namespace detail {
/// demo_<k> names in numeric order (HDF5 lists them by name: demo_10 before demo_2).
inline std::vector<std::string> demo_names(const h5::File& f) {
  std::vector<std::pair<std::int64_t, std::string>> k;
  for (auto& n : f.children("data")) {
    if (n.rfind("demo_", 0) != 0) continue;
    try {
      std::size_t used = 0;
      const auto i = std::stoll(n.substr(5), &used);
      if (used == n.size() - 5) k.emplace_back(i, n);
    } catch (const std::exception&) {
    }
  }
  std::sort(k.begin(), k.end());
  std::vector<std::string> out;
  for (auto& [i, n] : k) out.push_back(n);
  return out;
}
}  // namespace detail

class DemoReader {
 public:
  DemoReader(const std::filesystem::path& path, DemoReadOptions o)
      : f_(h5::File::open(path)), fd_(path), o_(std::move(o)) {
    if (!f_.is_group("data")) f_.fail("data", "missing: not a demonstration file in robomimic's layout (no group 'data')");
    if ((o_.image_height > 0) != (o_.image_width > 0) || o_.image_height < 0 || o_.image_width < 0)
      throw ConfigError(path.string() + ": image size " + std::to_string(o_.image_height) + "x" + std::to_string(o_.image_width) +
                        ": give both height and width (or neither, to keep the stored size)");
    demos_ = detail::demo_names(f_);
    if (demos_.empty()) f_.fail("data", "holds no demo_<k> groups");
    const std::string g0 = "data/" + demos_.front();
    grouped_ = f_.is_group(g0 + "/obs");
    if (!grouped_) o_.obs_keys = {""};
    else if (o_.obs_keys.empty()) o_.obs_keys = f_.children(g0 + "/obs");
    if (o_.obs_keys.empty()) f_.fail(g0 + "/obs", "holds no observation keys");
    starts_.push_back(0);
    for (const auto& name : demos_) index_demo("data/" + name);
  }

  [[nodiscard]] const h5::File& file() const noexcept { return f_; }
  /// The demonstrations' group names, in numeric order (demo_0, demo_1, ..., demo_10).
  [[nodiscard]] const std::vector<std::string>& demos() const noexcept { return demos_; }
  /// Demo e's steps are [starts()[e], starts()[e + 1]).
  [[nodiscard]] const std::vector<std::int64_t>& starts() const noexcept { return starts_; }
  [[nodiscard]] std::int64_t steps() const noexcept { return starts_.back(); }
  /// The parts of a row (images `[C, H', W']`, floats `[d]`), in the keys' order.
  [[nodiscard]] const ObsLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::int64_t row_bytes() const noexcept { return layout_.row_bytes(); }
  /// The dataset of key `k` in demo `e` ("data/demo_3/obs/agentview_rgb").
  [[nodiscard]] std::string dataset(std::size_t e, std::size_t k) const {
    return "data/" + demos_[e] + "/obs" + (grouped_ ? "/" + o_.obs_keys[k] : std::string());
  }

  /// Reads the observation rows of global steps `ids` into `out` (ids.size() rows of
  /// row_bytes()). Safe to call from many threads at once.
  void read(std::span<const std::int64_t> ids, std::uint8_t* out) const {
    const std::int64_t rb = row_bytes();
    std::vector<std::uint8_t> chunk, stored;
    for (std::size_t i = 0; i < ids.size();) {
      const std::int64_t s = ids[i];
      if (s < 0 || s >= steps()) throw Error(f_.name() + ": step " + std::to_string(s) + " is outside the demonstrations' " + std::to_string(steps()));
      const auto e = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), s) - starts_.begin() - 1);
      std::size_t j = i + 1;
      while (j < ids.size() && ids[j] == ids[j - 1] + 1 && ids[j] < starts_[e + 1]) ++j;
      const std::int64_t t0 = s - starts_[e], n = static_cast<std::int64_t>(j - i);
      for (std::size_t k = 0; k < keys_.size(); ++k)
        read_part(e, k, t0, n, out + static_cast<std::int64_t>(i) * rb, chunk, stored);
      i = j;
    }
  }

  /// Reads every row, with `threads` threads (0: this one), into a vector of steps() rows
  /// (on huge pages, `detail::HugePageAllocator`).
  [[nodiscard]] std::vector<std::uint8_t, detail::HugePageAllocator<std::uint8_t>> read_all(int threads) const {
    // Unset until read, on huge pages: the threads that read the rows touch them first.
    std::vector<std::uint8_t, detail::HugePageAllocator<std::uint8_t>> rows(static_cast<std::size_t>(steps() * row_bytes()));
    // Blocks of consecutive steps, handed out in order; each a read of its own.
    constexpr std::int64_t kBlock = 64;
    const std::int64_t blocks = (steps() + kBlock - 1) / kBlock;
    std::mutex m;
    std::int64_t next = 0;
    std::exception_ptr error;
    const auto work = [&] {
      std::vector<std::int64_t> ids;
      for (;;) {
        std::int64_t b;
        {
          const std::lock_guard lock(m);
          if (next >= blocks || error) return;
          b = next++;
        }
        const std::int64_t first = b * kBlock, n = std::min(kBlock, steps() - first);
        ids.resize(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = first + i;
        try {
          read(ids, rows.data() + first * row_bytes());
        } catch (...) {
          const std::lock_guard lock(m);
          if (!error) error = std::current_exception();
        }
      }
    };
    if (threads <= 0) {
      work();
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(work);
      for (auto& t : pool) t.join();
    }
    if (error) std::rethrow_exception(error);
    return rows;
  }

 private:
  // One observation key: its part in the row and how it is stored.
  struct Key {
    bool image = false;
    h5::Shape frame;          ///< a row's extent as stored ([H, W, C] or [d])
    std::int64_t numel = 0;   ///< elements in a stored row
    std::int64_t offset = 0;  ///< bytes into the row
    std::optional<FrameReader> frames;  ///< image keys: the converter
  };
  // Key k of demo e: how its rows are read.
  struct Stored {
    enum class Kind { floats, library, contiguous, chunks } kind = Kind::library;
    std::int64_t offset = -1;           ///< contiguous: the first row's byte offset in the file
    std::vector<h5::File::Chunk> table;  ///< chunks: where each chunk lies
    std::int64_t chunk_rows = 0;        ///< chunks: rows per chunk
    bool deflate = false;               ///< chunks: gzip-compressed
    int deflate_index = 0;              ///< chunks: the deflate filter's place in the pipeline
    std::vector<float> floats;          ///< floats: every row, read when the file is opened
  };

  void index_demo(const std::string& g) {
    const bool first = keys_.empty();
    const auto act_shape = f_.shape(g + "/actions");
    if (act_shape.size() != 2) f_.fail(g + "/actions", "has shape " + h5::shape_string(act_shape) + "; expected [T, action dims]");
    const std::int64_t t = act_shape[0];
    std::vector<Stored> stored;
    for (std::size_t k = 0; k < o_.obs_keys.size(); ++k) {
      const std::string ds = g + "/obs" + (grouped_ ? "/" + o_.obs_keys[k] : std::string());
      const auto sh = f_.shape(ds);
      const bool bytes = f_.stored_as<std::uint8_t>(ds);
      const bool image = bytes && (sh.size() == 3 || (sh.size() == 4 && sh[3] >= 1 && sh[3] <= 4));
      if (!image && (sh.empty() || sh.size() > 2))
        f_.fail(ds, "has shape " + h5::shape_string(sh) + "; expected [T] or [T, d] numbers, or images of bytes [T, H, W, C] (C of 1 to 4) or [T, H, W]");
      if (sh[0] != t) f_.fail(ds, "has " + std::to_string(sh[0]) + " rows but " + g + "/actions has " + std::to_string(t));
      const h5::Shape row(sh.begin() + 1, sh.end());
      if (first) {
        add_key(k, image, row);
      } else if (keys_[k].image != image || keys_[k].frame != row) {
        f_.fail(ds, std::string(image ? "holds images " : "holds rows ") + h5::shape_string(row) + "; the first demo's '" + o_.obs_keys[k] +
                        "' are " + (keys_[k].image ? "images " : "rows ") + h5::shape_string(keys_[k].frame));
      }
      stored.push_back(image ? storage_of(ds, sh) : floats_of(ds));
    }
    stored_.push_back(std::move(stored));
    starts_.push_back(starts_.back() + t);
  }

  void add_key(std::size_t k, bool image, const h5::Shape& row) {
    Key key;
    key.image = image;
    key.frame = row;
    key.numel = 1;
    for (auto d : row) key.numel *= d;
    const std::string name = grouped_ ? o_.obs_keys[k] : std::string("obs");
    if (image) {
      const int h = static_cast<int>(row[0]), w = static_cast<int>(row[1]), c = row.size() == 3 ? static_cast<int>(row[2]) : 1;
      const auto& fr = key.frames.emplace(h, w, c, o_.image_height, o_.image_width);
      layout_.image(name, c, fr.out_height(), fr.out_width());
    } else {
      layout_.vector(name, key.numel);
    }
    key.offset = layout_.parts.back().offset;
    keys_.push_back(std::move(key));
  }

  // How an image dataset is read: with pread from the file, by the calling thread, when it is
  // contiguous, or chunked in whole frames through gzip (and shuffle, a no-op on bytes), the
  // chunks inflated here; through the library otherwise, which must have the filters.
  [[nodiscard]] Stored storage_of(const std::string& ds, const h5::Shape& sh) const {
    const auto st = f_.storage(ds);
    for (int id : st.filters)
      if (!h5::File::filter_available(id))
        f_.fail(ds, "is compressed with HDF5 filter " + std::to_string(id) + filter_name(id) +
                        ", which this HDF5 library does not have; rewrite it with gzip (h5repack -f GZIP=4) or without compression");
    Stored s;
    if (!st.chunked) {
      s.offset = f_.contiguous_offset(ds);
      if (s.offset >= 0) s.kind = Stored::Kind::contiguous;
      return s;
    }
    if (st.chunk.size() != sh.size()) return s;
    for (std::size_t d = 1; d < sh.size(); ++d)
      if (st.chunk[d] != sh[d]) return s;  // chunks that split frames: the library assembles them
    bool ours = true;
    for (int id : st.filters) ours = ours && (id == H5Z_FILTER_DEFLATE || id == H5Z_FILTER_SHUFFLE);
    if (!ours) return s;
    s.kind = Stored::Kind::chunks;
    s.chunk_rows = st.chunk[0];
    s.table = f_.chunk_table(ds, s.chunk_rows);
    const auto it = std::find(st.filters.begin(), st.filters.end(), H5Z_FILTER_DEFLATE);
    s.deflate = it != st.filters.end();
    s.deflate_index = static_cast<int>(it - st.filters.begin());
    return s;
  }
  // A float key: read whole now (numbers are small beside images), checked for NaN and inf.
  [[nodiscard]] Stored floats_of(const std::string& ds) const {
    Stored s;
    s.kind = Stored::Kind::floats;
    auto a = f_.read<float>(ds);
    for (std::size_t i = 0; i < a.values.size(); ++i)
      if (!std::isfinite(a.values[i])) f_.fail(ds, "holds a non-finite value (row " + std::to_string(static_cast<std::int64_t>(i) / a.row_size()) + ")");
    s.floats = std::move(a.values);
    return s;
  }
  [[nodiscard]] static std::string filter_name(int id) {
    switch (id) {
      case 32000: return " (LZF, h5py's own)";
      case 32001: return " (Blosc)";
      case 32004: return " (LZ4)";
      case 32015: return " (Zstandard)";
      case 4: return " (SZIP)";
      default: return "";
    }
  }

  // Reads `n` bytes at `offset` of the file into `dst` (pread: safe from many threads).
  void read_at(const std::string& ds, std::int64_t offset, std::int64_t n, std::uint8_t* dst) const {
    while (n > 0) {
      const ssize_t got = ::pread(fd_.fd, dst, static_cast<std::size_t>(n), static_cast<off_t>(offset));
      if (got <= 0) f_.fail(ds, "cannot be read at byte " + std::to_string(offset) + " (truncated file?)");
      dst += got;
      offset += got;
      n -= got;
    }
  }

  // Rows t0 .. t0 + n - 1 of key k in demo e into rows of `out`.
  void read_part(std::size_t e, std::size_t k, std::int64_t t0, std::int64_t n, std::uint8_t* out, std::vector<std::uint8_t>& chunk,
                 std::vector<std::uint8_t>& stored) const {
    const Key& key = keys_[k];
    const std::int64_t rb = row_bytes();
    const Stored& st = stored_[e][k];
    if (st.kind == Stored::Kind::floats) {
      for (std::int64_t i = 0; i < n; ++i)
        std::memcpy(out + i * rb + key.offset, st.floats.data() + (t0 + i) * key.numel, static_cast<std::size_t>(key.numel) * sizeof(float));
      return;
    }
    const FrameReader& fr = *key.frames;
    const std::int64_t frame = fr.in_bytes();
    if (st.kind != Stored::Kind::chunks) {
      stored.resize(static_cast<std::size_t>(n * frame));
      if (st.kind == Stored::Kind::contiguous) {
        read_at(dataset(e, k), st.offset + t0 * frame, n * frame, stored.data());
      } else {
        const std::lock_guard lock(h5_);
        f_.read_rows(dataset(e, k), t0, n, stored.data());
      }
      for (std::int64_t i = 0; i < n; ++i) fr.convert(stored.data() + i * frame, out + i * rb + key.offset);
      return;
    }
    for (std::int64_t t = t0; t < t0 + n;) {
      const std::int64_t c = t / st.chunk_rows, c0 = c * st.chunk_rows;
      const std::int64_t end = std::min(t0 + n, c0 + st.chunk_rows);
      const auto& where = st.table[static_cast<std::size_t>(c)];
      const auto want = static_cast<std::size_t>(st.chunk_rows * frame);
      const std::uint8_t* bytes = nullptr;
      if (where.offset < 0) {
        chunk.assign(want, 0);  // never written: the fill value
        bytes = chunk.data();
      } else {
        stored.resize(static_cast<std::size_t>(where.bytes));
        read_at(dataset(e, k), where.offset, where.bytes, stored.data());
        if (st.deflate && !(where.mask & (1u << st.deflate_index))) {
          chunk.resize(want);
          uLongf got = static_cast<uLongf>(want);
          const int rc = ::uncompress(chunk.data(), &got, stored.data(), static_cast<uLong>(stored.size()));
          if (rc != Z_OK || got != want)
            f_.fail(dataset(e, k), "the chunk at row " + std::to_string(c0) + " does not inflate to " + std::to_string(want) + " bytes (damaged file?)");
          bytes = chunk.data();
        } else {
          if (stored.size() != want)
            f_.fail(dataset(e, k), "the chunk at row " + std::to_string(c0) + " holds " + std::to_string(stored.size()) + " bytes, not " + std::to_string(want));
          bytes = stored.data();
        }
      }
      for (; t < end; ++t) fr.convert(bytes + (t - c0) * frame, out + (t - t0) * rb + key.offset);
    }
  }

  // The file's descriptor, for pread.
  struct Fd {
    int fd = -1;
    explicit Fd(const std::filesystem::path& p) : fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC)) {
      if (fd < 0) throw Error(p.string() + ": cannot be opened for reading");
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  };

  h5::File f_;
  Fd fd_;
  DemoReadOptions o_;
  bool grouped_ = true;
  std::vector<std::string> demos_;
  std::vector<std::int64_t> starts_;
  std::vector<Key> keys_;
  ObsLayout layout_;
  std::vector<std::vector<Stored>> stored_;  ///< [demo][key]
  mutable std::mutex h5_;                    ///< one HDF5 call at a time
};

}  // namespace anvil
