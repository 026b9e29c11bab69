#pragma once
/// @file
/// HDF5 files through the HDF5 C library (Debian's libhdf5-dev, an optional component:
/// link `anvil::hdf5`): just what datasets of demonstrations and transitions need. Groups,
/// numeric datasets of any rank read into and written from float32, int64 or uint8 (whole,
/// or rows; written raw or gzip-compressed in chunks), where a dataset or each of its
/// chunks lies in the file (for reads with `pread` that bypass the library), and integer
/// and string attributes; every error names the file and the object at fault.
/// Files are written atomically: `H5Writer` writes next to the target and renames over it
/// only when `commit()` has flushed everything, so a killed run leaves the previous file
/// whole. Light header: no torch.

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <anvil/core/error.hpp>

namespace anvil::h5 {

namespace detail {

/// HDF5 prints its own error stack to stderr by default; anvil's errors say it better.
inline void quiet() {
  static const bool once = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)once;
}

/// An HDF5 identifier closed by its own close function.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  [[nodiscard]] hid_t get() const noexcept { return id_; }
  [[nodiscard]] bool valid() const noexcept { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

template <class T>
hid_t native_type() {
  if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int64_t>) return H5T_NATIVE_INT64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return H5T_NATIVE_INT32;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return H5T_NATIVE_UINT8;
  else static_assert(sizeof(T) == 0, "h5: unsupported element type");
}

}  // namespace detail

/// A dataset's extent, outermost first.
using Shape = std::vector<std::int64_t>;

[[nodiscard]] inline std::string shape_string(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// A dataset read whole: its shape and values.
template <class T>
struct Array {
  Shape shape;
  std::vector<T> values;
  [[nodiscard]] std::int64_t rows() const noexcept { return shape.empty() ? 1 : shape[0]; }
  /// Elements per row (the product of the inner extents).
  [[nodiscard]] std::int64_t row_size() const noexcept {
    return std::accumulate(shape.begin() + (shape.empty() ? 0 : 1), shape.end(), std::int64_t{1}, std::multiplies<>());
  }
};

/// An open HDF5 file, for reading (`open`) or as the body of an `H5Writer`.
class File {
 public:
  /// Opens `path` read-only; an Error naming it when it is missing or not HDF5.
  [[nodiscard]] static File open(const std::filesystem::path& path) {
    detail::quiet();
    if (!std::filesystem::exists(path)) throw Error(path.string() + ": no such file");
    if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(path.string() + ": not an HDF5 file (or a truncated one)");
    File f;
    f.name_ = path.string();
    f.file_ = detail::Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!f.file_.valid()) throw Error(f.name_ + ": cannot open as HDF5 (damaged or truncated?)");
    return f;
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// Whether the link at `path` ("data/demo_0/actions") exists, each parent included.
  [[nodiscard]] bool exists(const std::string& path) const {
    std::string prefix;
    std::size_t start = 0;
    while (start <= path.size()) {
      const std::size_t slash = path.find('/', start);
      prefix = path.substr(0, slash);
      if (H5Lexists(file_.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    return true;
  }
  /// Whether `path` is a group (false when missing).
  [[nodiscard]] bool is_group(const std::string& path) const {
    if (!exists(path)) return false;
    H5O_info_t info;
    if (H5Oget_info_by_name(file_.get(), path.c_str(), &info, H5P_DEFAULT) < 0) return false;
    return info.type == H5O_TYPE_GROUP;
  }

  /// The names of the links in group `path`, in HDF5's name order.
  [[nodiscard]] std::vector<std::string> children(const std::string& path) const {
    const auto g = open_group(path);
    H5G_info_t info;
    if (H5Gget_info(g.get(), &info) < 0) fail(path, "cannot list the group");
    std::vector<std::string> out;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t n = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
      if (n < 0) fail(path, "cannot read a link's name");
      std::string name(static_cast<std::size_t>(n), '\0');
      H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), static_cast<std::size_t>(n) + 1, H5P_DEFAULT);
      out.push_back(std::move(name));
    }
    return out;
  }

  /// A dataset's shape; an Error naming it when it is missing.
  [[nodiscard]] Shape shape(const std::string& path) const {
    const auto d = open_dataset(path);
    const detail::Handle space(H5Dget_space(d.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0) fail(path, "has no simple extent");
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    return Shape(dims.begin(), dims.end());
  }

  /// Reads dataset `path` whole, converted to T (HDF5 converts between numeric types); an
  /// Error naming the dataset when it is missing, not numeric, or unreadable.
  template <class T>
  [[nodiscard]] Array<T> read(const std::string& path) const {
    const auto d = open_dataset(path);
    const detail::Handle type(H5Dget_type(d.get()), H5Tclose);
    const H5T_class_t cls = H5Tget_class(type.get());
    if (cls != H5T_INTEGER && cls != H5T_FLOAT) fail(path, "is not numeric");
    Array<T> a;
    a.shape = shape(path);
    const auto n = std::accumulate(a.shape.begin(), a.shape.end(), std::int64_t{1}, std::multiplies<>());
    a.values.resize(static_cast<std::size_t>(n));
    if (n > 0 && H5Dread(d.get(), detail::native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, a.values.data()) < 0)
      fail(path, "cannot be read (damaged or truncated file?)");
    return a;
  }

  /// Reads rows [begin, begin + count) of dataset `path` (outermost extent), converted to
  /// T, into `out` (count * row_size values); an Error naming the dataset when the rows are
  /// out of range or unreadable.
  template <class T>
  void read_rows(const std::string& path, std::int64_t begin, std::int64_t count, T* out) const {
    if (count <= 0) return;
    const auto d = open_dataset(path);
    const auto sel = rows_selection(d, path, begin, count);
    if (H5Dread(d.get(), detail::native_type<T>(), sel.memory.get(), sel.file.get(), H5P_DEFAULT, out) < 0)
      fail(path, "rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                     ") cannot be read (damaged or truncated file?)");
  }

  /// Whether dataset `path` is stored as T exactly (same class, size and byte order as this
  /// machine's), so its bytes are T's.
  template <class T>
  [[nodiscard]] bool stored_as(const std::string& path) const {
    const auto d = open_dataset(path);
    const detail::Handle type(H5Dget_type(d.get()), H5Tclose);
    return H5Tequal(type.get(), detail::native_type<T>()) > 0;
  }

  /// Where a dataset's values lie in the file, when they lie there as one run of bytes
  /// (contiguous layout, no filter, allocated): its byte offset, else -1. Such a dataset can
  /// be read with plain `pread`, from many threads at once.
  [[nodiscard]] std::int64_t contiguous_offset(const std::string& path) const {
    const auto d = open_dataset(path);
    const detail::Handle plist(H5Dget_create_plist(d.get()), H5Pclose);
    if (H5Pget_layout(plist.get()) != H5D_CONTIGUOUS || H5Pget_nfilters(plist.get()) != 0) return -1;
    const haddr_t off = H5Dget_offset(d.get());
    return off == HADDR_UNDEF ? -1 : userblock() + static_cast<std::int64_t>(off);
  }

  /// How a dataset is stored: chunked or not (and the chunk's extent), and the filters its
  /// chunks pass through when written (HDF5's ids: 1 deflate, 2 shuffle, 3 fletcher32, ...).
  struct Storage {
    bool chunked = false;
    Shape chunk;
    std::vector<int> filters;
  };
  [[nodiscard]] Storage storage(const std::string& path) const {
    const auto d = open_dataset(path);
    const detail::Handle plist(H5Dget_create_plist(d.get()), H5Pclose);
    Storage s;
    if (H5Pget_layout(plist.get()) == H5D_CHUNKED) {
      s.chunked = true;
      const int rank = H5Pget_chunk(plist.get(), 0, nullptr);
      std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
      if (rank > 0) H5Pget_chunk(plist.get(), rank, dims.data());
      s.chunk.assign(dims.begin(), dims.end());
    }
    const int n = H5Pget_nfilters(plist.get());
    for (int i = 0; i < n; ++i) {
      unsigned flags = 0, config = 0;
      std::size_t nvalues = 0;
      const H5Z_filter_t id = H5Pget_filter2(plist.get(), static_cast<unsigned>(i), &flags, &nvalues, nullptr, 0, nullptr, &config);
      s.filters.push_back(static_cast<int>(id));
    }
    return s;
  }
  /// Whether this HDF5 library can apply filter `id` (a plugin's, say h5py's LZF, may be missing).
  [[nodiscard]] static bool filter_available(int id) { return H5Zfilter_avail(static_cast<H5Z_filter_t>(id)) > 0; }

  /// Where each chunk of a chunked dataset lies in the file, for a dataset chunked along its
  /// outermost extent only (chunks of whole rows): chunk k holds rows [k * rows, (k + 1) *
  /// rows). Each is its byte offset in the file (-1: never written, so it holds the fill
  /// value), its stored size (still compressed) and its filter mask (bit i set: filter i was
  /// skipped for it). Read with plain `pread`, chunks can be inflated by many threads while
  /// the library, which runs one call at a time, is not involved at all.
  struct Chunk {
    std::int64_t offset = -1, bytes = 0;
    unsigned mask = 0;
  };
  [[nodiscard]] std::vector<Chunk> chunk_table(const std::string& path, std::int64_t rows_per_chunk) const {
    const auto d = open_dataset(path);
    const Shape sh = shape(path);
    if (sh.empty() || rows_per_chunk < 1) fail(path, "has no rows to chunk");
    std::vector<Chunk> table(static_cast<std::size_t>((sh[0] + rows_per_chunk - 1) / rows_per_chunk));
    const std::int64_t base = userblock();
    std::vector<hsize_t> coords(sh.size(), 0);
    for (std::size_t k = 0; k < table.size(); ++k) {
      // Looked up by its coordinates (HDF5 1.10's by-index lookup walks the index from its
      // start each time: quadratic in the chunks).
      coords[0] = static_cast<hsize_t>(k) * static_cast<hsize_t>(rows_per_chunk);
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(d.get(), coords.data(), &mask, &addr, &size) < 0)
        fail(path, "the chunk at row " + std::to_string(coords[0]) + " cannot be located");
      if (addr != HADDR_UNDEF) table[k] = {base + static_cast<std::int64_t>(addr), static_cast<std::int64_t>(size), mask};
    }
    return table;
  }

  /// An integer attribute of the object at `path`; an Error naming both when missing.
  [[nodiscard]] std::int64_t int_attribute(const std::string& path, const std::string& attr) const {
    const auto a = open_attribute(path, attr);
    std::int64_t v = 0;
    if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) fail(path + "@" + attr, "is not an integer");
    return v;
  }
  /// A string attribute (fixed or variable length).
  [[nodiscard]] std::string string_attribute(const std::string& path, const std::string& attr) const {
    const auto a = open_attribute(path, attr);
    const detail::Handle type(H5Aget_type(a.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_STRING) fail(path + "@" + attr, "is not a string");
    if (H5Tis_variable_str(type.get()) > 0) {
      char* s = nullptr;
      const detail::Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem.get(), H5T_VARIABLE);
      H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
      if (H5Aread(a.get(), mem.get(), &s) < 0) fail(path + "@" + attr, "cannot be read");
      std::string out = s ? s : "";
      H5free_memory(s);
      return out;
    }
    const std::size_t n = H5Tget_size(type.get());
    std::string out(n, '\0');
    const detail::Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), n);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    H5Tset_strpad(mem.get(), H5Tget_strpad(type.get()));
    if (H5Aread(a.get(), mem.get(), out.data()) < 0) fail(path + "@" + attr, "cannot be read");
    out.resize(std::strlen(out.c_str()));
    return out;
  }
  [[nodiscard]] bool has_attribute(const std::string& path, const std::string& attr) const {
    return (path == "/" || exists(path)) && H5Aexists_by_name(file_.get(), path.c_str(), attr.c_str(), H5P_DEFAULT) > 0;
  }

  /// Throws an Error "FILE: OBJECT: WHAT".
  [[noreturn]] void fail(const std::string& object, const std::string& what) const {
    throw Error(name_ + ": " + object + ": " + what);
  }

 protected:
  File() = default;
  friend class H5Writer;

  // Bytes before HDF5's own data (a user block): its addresses count from there.
  [[nodiscard]] std::int64_t userblock() const {
    const detail::Handle plist(H5Fget_create_plist(file_.get()), H5Pclose);
    hsize_t size = 0;
    if (!plist.valid() || H5Pget_userblock(plist.get(), &size) < 0) return 0;
    return static_cast<std::int64_t>(size);
  }
  [[nodiscard]] detail::Handle open_group(const std::string& path) const {
    if (!exists(path)) fail(path, "missing (no such group)");
    detail::Handle g(H5Gopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.valid()) fail(path, "is not a group");
    return g;
  }
  // Rows [begin, begin + count) of dataset `d` (at `path`): its file space with them
  // selected, and a memory space of their shape; an Error when they are out of range.
  struct Selection {
    detail::Handle file, memory;
  };
  [[nodiscard]] Selection rows_selection(const detail::Handle& d, const std::string& path, std::int64_t begin, std::int64_t count) const {
    const Shape sh = shape(path);
    if (sh.empty() || begin < 0 || begin + count > sh[0])
      fail(path, "rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ") are outside its " + shape_string(sh));
    std::vector<hsize_t> start(sh.size(), 0), n(sh.begin(), sh.end());
    start[0] = static_cast<hsize_t>(begin);
    n[0] = static_cast<hsize_t>(count);
    Selection s{detail::Handle(H5Dget_space(d.get()), H5Sclose), detail::Handle(H5Screate_simple(static_cast<int>(n.size()), n.data(), nullptr), H5Sclose)};
    H5Sselect_hyperslab(s.file.get(), H5S_SELECT_SET, start.data(), nullptr, n.data(), nullptr);
    return s;
  }
  [[nodiscard]] detail::Handle open_dataset(const std::string& path) const {
    if (!exists(path)) fail(path, "missing (no such dataset)");
    detail::Handle d(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!d.valid()) fail(path, "is not a dataset");
    return d;
  }
  [[nodiscard]] detail::Handle open_attribute(const std::string& path, const std::string& attr) const {
    if (!has_attribute(path, attr)) fail(path, "has no attribute '" + attr + "'");
    detail::Handle a(H5Aopen_by_name(file_.get(), path.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!a.valid()) fail(path + "@" + attr, "cannot be opened");
    return a;
  }

  std::string name_;
  detail::Handle file_;
};

/// Writes an HDF5 file atomically: everything goes to a temporary file beside `path`,
/// which `commit()` flushes, syncs and renames over `path`. Destroyed without `commit()`
/// (an exception, a kill), it removes the temporary and `path` is untouched.
class H5Writer {
 public:
  explicit H5Writer(std::filesystem::path path) : path_(std::move(path)) {
    detail::quiet();
    tmp_ = path_.string() + ".tmp-" + std::to_string(::getpid());
    f_.name_ = path_.string();
    f_.file_ = detail::Handle(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!f_.file_.valid()) throw Error(path_.string() + ": cannot create '" + tmp_ + "' (no such directory, or no permission?)");
  }
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;
  ~H5Writer() {
    if (!committed_) {
      f_.file_.reset();
      std::error_code ec;
      std::filesystem::remove(tmp_, ec);
    }
  }

  /// Creates group `path` (its parents must exist).
  void group(const std::string& path) {
    const detail::Handle g(H5Gcreate2(f_.file_.get(), path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!g.valid()) f_.fail(path, "cannot create the group");
  }

  /// Writes dataset `path` of shape `shape` from `values` (row-major), stored as T.
  template <class T>
  void dataset(const std::string& path, const Shape& shape, const std::vector<T>& values) {
    const auto n = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    if (static_cast<std::size_t>(n) != values.size())
      f_.fail(path, "shape " + shape_string(shape) + " holds " + std::to_string(n) + " values, given " + std::to_string(values.size()));
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    const detail::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    const detail::Handle d(H5Dcreate2(f_.file_.get(), path.c_str(), detail::native_type<T>(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                           H5Dclose);
    if (!d.valid()) f_.fail(path, "cannot create the dataset");
    if (n > 0 && H5Dwrite(d.get(), detail::native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
      f_.fail(path, "cannot be written (disk full?)");
  }

  /// Writes dataset `path` like `dataset`, in chunks of `chunk_rows` rows (outermost
  /// extent) compressed with gzip (deflate) at `level` 1..9, as h5py's
  /// `compression="gzip"` writes them.
  template <class T>
  void compressed_dataset(const std::string& path, const Shape& shape, const std::vector<T>& values, std::int64_t chunk_rows, int level = 4) {
    if (shape.empty() || shape[0] == 0 || level < 1 || level > 9) {
      if (level < 1 || level > 9) f_.fail(path, "gzip level " + std::to_string(level) + " is outside 1..9");
      dataset(path, shape, values);  // nothing to chunk
      return;
    }
    const auto n = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    if (static_cast<std::size_t>(n) != values.size())
      f_.fail(path, "shape " + shape_string(shape) + " holds " + std::to_string(n) + " values, given " + std::to_string(values.size()));
    std::vector<hsize_t> dims(shape.begin(), shape.end()), chunk(dims);
    chunk[0] = static_cast<hsize_t>(std::clamp<std::int64_t>(chunk_rows, 1, shape[0]));
    for (auto& c : chunk) c = std::max<hsize_t>(c, 1);
    const detail::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    const detail::Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(plist.get(), static_cast<int>(chunk.size()), chunk.data());
    H5Pset_deflate(plist.get(), static_cast<unsigned>(level));
    const detail::Handle d(H5Dcreate2(f_.file_.get(), path.c_str(), detail::native_type<T>(), space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT),
                           H5Dclose);
    if (!d.valid()) f_.fail(path, "cannot create the dataset");
    if (H5Dwrite(d.get(), detail::native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
      f_.fail(path, "cannot be written (disk full?)");
  }

  /// Creates dataset `path` of shape `shape`, stored as T in one contiguous run of bytes
  /// (allocated now, so readers can `pread` it), to be filled with `write_rows`.
  template <class T>
  void allocate(const std::string& path, const Shape& shape) {
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    const detail::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    const detail::Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(plist.get(), H5D_CONTIGUOUS);
    H5Pset_alloc_time(plist.get(), H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(plist.get(), H5D_FILL_TIME_NEVER);
    const detail::Handle d(H5Dcreate2(f_.file_.get(), path.c_str(), detail::native_type<T>(), space.get(), H5P_DEFAULT,
                                      plist.get(), H5P_DEFAULT),
                           H5Dclose);
    if (!d.valid()) f_.fail(path, "cannot create the dataset " + shape_string(shape) + " (disk full?)");
  }
  /// Writes rows [begin, begin + count) of dataset `path` from `values` (count * row_size).
  template <class T>
  void write_rows(const std::string& path, std::int64_t begin, std::int64_t count, const T* values) {
    if (count <= 0) return;
    const auto d = f_.open_dataset(path);
    const auto sel = f_.rows_selection(d, path, begin, count);
    if (H5Dwrite(d.get(), detail::native_type<T>(), sel.memory.get(), sel.file.get(), H5P_DEFAULT, values) < 0)
      f_.fail(path, "cannot be written (disk full?)");
  }

  /// An integer attribute on the object at `path`.
  void attribute(const std::string& path, const std::string& name, std::int64_t v) {
    const detail::Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    const detail::Handle a(H5Acreate_by_name(f_.file_.get(), path.c_str(), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                           H5Aclose);
    if (!a.valid() || H5Awrite(a.get(), H5T_NATIVE_INT64, &v) < 0) f_.fail(path + "@" + name, "cannot be written");
  }
  /// A string attribute (variable length, as h5py writes str) on the object at `path`.
  void attribute(const std::string& path, const std::string& name, const std::string& v) {
    const detail::Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    const detail::Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    const detail::Handle a(H5Acreate_by_name(f_.file_.get(), path.c_str(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                           H5Aclose);
    const char* s = v.c_str();
    if (!a.valid() || H5Awrite(a.get(), type.get(), &s) < 0) f_.fail(path + "@" + name, "cannot be written");
  }

  /// Flushes, closes, syncs and renames over the target.
  void commit() {
    if (H5Fflush(f_.file_.get(), H5F_SCOPE_GLOBAL) < 0) throw Error(tmp_ + ": flushing failed (disk full?)");
    f_.file_.reset();
    if (const int fd = ::open(tmp_.c_str(), O_RDONLY); fd >= 0) {
      (void)::fsync(fd);
      ::close(fd);
    }
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) throw Error("cannot rename '" + tmp_ + "' to '" + path_.string() + "': " + ec.message());
    committed_ = true;
    const auto dir = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
    if (const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
      (void)::fsync(fd);
      ::close(fd);
    }
  }

  /// The file being written, to read back what is there.
  [[nodiscard]] const File& file() const noexcept { return f_; }

 private:
  std::filesystem::path path_;
  std::string tmp_;
  File f_;
  bool committed_ = false;
};

}  // namespace anvil::h5
