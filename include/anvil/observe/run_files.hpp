#pragma once
/// @file
/// The files a run writes in its run directory: `config.yaml`, `metrics.csv` and
/// `summary.json`, each written so that a crash never leaves a half-written file in place
/// of a good one; the lock a run holds on its directory; fresh run directory names. Light
/// header.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <anvil/core/atomic_file.hpp>
#include <anvil/core/error.hpp>

namespace anvil {

/// A JSON string literal for `s`.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

/// A JSON number for `x` (null for NaN and infinities, which JSON cannot hold).
inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

/// A config value as written in config.yaml ("256", "true", "[64, 64]", "cpu") as a typed
/// JSON value: numbers as numbers, booleans as booleans, lists as arrays, the rest as strings.
[[nodiscard]] inline nlohmann::ordered_json typed_json(const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  if (v.size() >= 2 && v.front() == '[' && v.back() == ']') {
    auto out = nlohmann::ordered_json::array();
    std::string item;
    int depth = 0;
    for (std::size_t i = 1; i + 1 < v.size(); ++i) {
      const char c = v[i];
      if (c == '[') ++depth;
      if (c == ']') --depth;
      if (c == ',' && depth == 0) {
        out.push_back(typed_json(item.substr(item.find_first_not_of(' ') == std::string::npos ? 0 : item.find_first_not_of(' '))));
        item.clear();
      } else {
        item += c;
      }
    }
    const auto b = item.find_first_not_of(' ');
    if (b != std::string::npos) out.push_back(typed_json(item.substr(b)));
    return out;
  }
  if (!v.empty()) {
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(v.c_str(), &end, 10);
    if (end && *end == '\0' && errno == 0) return i;
    const double d = std::strtod(v.c_str(), &end);
    if (end && *end == '\0' && std::isfinite(d)) return d;
  }
  return v;
}

/// A CSV file of metrics, one row per logged step. Columns are fixed by the first row
/// that has every metric the algorithm reports (its first update); rows logged before that
/// are held back and written then, with their missing cells empty. A row is keyed by its
/// first two columns (`env_steps`, `updates`): a row with the key of the last one amends
/// it (its finite cells replace the old ones) instead of adding a second row for the step.
class MetricsCsv {
 public:
  using Values = std::vector<std::pair<std::string, double>>;
  MetricsCsv() = default;
  explicit MetricsCsv(std::filesystem::path path) : path_(std::move(path)) {}

  /// Continues the file of a resumed run: keeps its header and the rows up to the
  /// checkpoint's clock (`env_steps` and `updates`, the first two columns; rows the
  /// interrupted run wrote after it are dropped, since the resumed run writes them again),
  /// and appends from there. Only whole rows are kept: the first row that is torn (a disk
  /// that filled mid-line), has the wrong number of cells or does not come after the one
  /// before ends what is kept. A missing or empty file starts afresh.
  static MetricsCsv resume(std::filesystem::path path, std::int64_t env_steps, std::int64_t updates) {
    MetricsCsv csv(path);
    std::string all;
    {
      std::ifstream in(path, std::ios::binary);
      if (!in) return csv;
      all.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const auto eol = all.find('\n');
    if (eol == std::string::npos || eol == 0) return csv;
    const std::string header = all.substr(0, eol);
    csv.columns_ = split(header);
    std::string text = header + "\n";
    for (std::size_t b = eol + 1, e; b < all.size(); b = e + 1) {
      e = all.find('\n', b);
      if (e == std::string::npos) break;  // no newline: torn
      const std::string line = all.substr(b, e - b);
      if (line.empty()) continue;
      auto cells = split(line);
      const auto key = key_of(cells);
      if (cells.size() != csv.columns_.size() || !key || (csv.last_.first >= 0 && !(*key > csv.last_))) break;
      if (key->first > env_steps || key->second > updates) break;
      text += line + "\n";
      csv.last_ = *key;
      csv.last_cells_ = std::move(cells);
    }
    write_file_atomic(path, text);
    csv.size_ = static_cast<std::int64_t>(text.size());
    csv.last_offset_ = csv.last_.first >= 0 ? static_cast<std::int64_t>(text.rfind('\n', text.size() - 2) + 1) : csv.size_;
    csv.out_.open(path, std::ios::app | std::ios::binary);
    if (!csv.out_) throw Error("cannot write '" + path.string() + "'");
    csv.header_written_ = true;
    csv.resumed_last_ = csv.last_;
    return csv;
  }

  /// Appends a row, or amends the last one when `values` has its key (see class comment);
  /// `complete` says the row's keys are all the columns there will be. A write that fails
  /// (a full disk) throws, naming the file.
  void row(const Values& values, bool complete) {
    if (path_.empty()) return;
    const auto key = key_of(values);
    if (!pending_.empty() && key && key_of(pending_.back()) == key) {
      merge(pending_.back(), values);
    } else if (header_written_ && pending_.empty() && key && *key == last_) {
      amend_last(values);
      return;
    } else {
      pending_.push_back(values);
    }
    if (!header_written_ && !complete) return;
    if (!header_written_) {
      for (const auto& [k, v] : pending_.back()) columns_.push_back(k);
      for (const auto& r : pending_)
        for (const auto& [k, v] : r)
          if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) columns_.push_back(k);
      out_.open(path_, std::ios::trunc | std::ios::binary);
      if (!out_) throw Error("cannot write '" + path_.string() + "'");
      std::string head;
      for (std::size_t i = 0; i < columns_.size(); ++i) head += (i ? "," : "") + columns_[i];
      write(head + "\n");
      header_written_ = true;
    }
    for (const auto& r : pending_) {
      last_cells_ = cells_of(r);
      last_offset_ = size_;
      write(join(last_cells_) + "\n");
      if (const auto k = key_of(r)) last_ = *k;
    }
    pending_.clear();
    flush();
  }
  /// Writes held-back rows (with whatever columns they have) when the run ends early.
  void flush_pending() {
    if (!pending_.empty()) {
      auto last = pending_.back();
      pending_.pop_back();
      row(last, true);
    }
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The env steps and updates of the last row a resumed file kept ({-1, -1}: none).
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> last_kept() const noexcept { return resumed_last_; }

 private:
  using Key = std::pair<std::int64_t, std::int64_t>;
  static std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> out;
    for (std::size_t b = 0, e;; b = e + 1) {
      e = line.find(',', b);
      out.push_back(line.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (e == std::string::npos) return out;
    }
  }
  static std::string join(const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < cells.size(); ++i) out += (i ? "," : "") + cells[i];
    return out;
  }
  // A row's key: its first two cells, both whole numbers.
  static std::optional<Key> key_of(const std::vector<std::string>& cells) {
    if (cells.size() < 2) return std::nullopt;
    std::int64_t k[2];
    for (int i = 0; i < 2; ++i) {
      char* end = nullptr;
      const double v = std::strtod(cells[static_cast<std::size_t>(i)].c_str(), &end);
      if (cells[static_cast<std::size_t>(i)].empty() || !end || *end != '\0' || !std::isfinite(v)) return std::nullopt;
      k[i] = static_cast<std::int64_t>(v);
    }
    return Key{k[0], k[1]};
  }
  static std::optional<Key> key_of(const Values& values) {
    if (values.size() < 2 || values[0].first != "env_steps" || values[1].first != "updates") return std::nullopt;
    return Key{static_cast<std::int64_t>(values[0].second), static_cast<std::int64_t>(values[1].second)};
  }
  static void merge(Values& into, const Values& from) {
    for (const auto& [k, v] : from) {
      if (!std::isfinite(v)) continue;
      auto it = std::find_if(into.begin(), into.end(), [&](const auto& kv) { return kv.first == k; });
      if (it == into.end()) into.emplace_back(k, v);
      else it->second = v;
    }
  }
  std::vector<std::string> cells_of(const Values& r) const {
    std::vector<std::string> cells(columns_.size());
    for (const auto& [k, v] : r) {
      const auto it = std::find(columns_.begin(), columns_.end(), k);
      if (it == columns_.end() || !std::isfinite(v)) continue;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.8g", v);
      cells[static_cast<std::size_t>(it - columns_.begin())] = buf;
    }
    return cells;
  }
  // The last row again, its cells replaced by `values`' finite ones: the file is cut back
  // to where that row began and the row written anew.
  void amend_last(const Values& values) {
    const auto fresh = cells_of(values);
    for (std::size_t i = 0; i < fresh.size() && i < last_cells_.size(); ++i)
      if (!fresh[i].empty()) last_cells_[i] = fresh[i];
    out_.close();
    std::error_code ec;
    std::filesystem::resize_file(path_, static_cast<std::uintmax_t>(last_offset_), ec);
    if (ec) throw Error("cannot rewrite the last row of '" + path_.string() + "': " + ec.message());
    size_ = last_offset_;
    out_.open(path_, std::ios::app | std::ios::binary);
    if (!out_) throw Error("cannot write '" + path_.string() + "'");
    write(join(last_cells_) + "\n");
    flush();
  }
  void write(const std::string& text) {
    out_ << text;
    size_ += static_cast<std::int64_t>(text.size());
  }
  void flush() {
    out_.flush();
    if (!out_) throw Error("writing '" + path_.string() + "' failed (disk full?)");
  }

  std::filesystem::path path_;
  std::ofstream out_;
  std::vector<std::string> columns_;
  std::vector<Values> pending_;
  bool header_written_ = false;
  Key last_{-1, -1};          ///< the key of the last row in the file
  Key resumed_last_{-1, -1};  ///< the key of the last row a resumed file kept
  std::vector<std::string> last_cells_;
  std::int64_t size_ = 0, last_offset_ = 0;  ///< the file's size, and where its last row begins
};

/// A run's hold on its directory: `.lock` in it, flock'ed for the lock's life, holding the
/// pid of the process that holds it. A second run in the same directory is refused, naming
/// the directory and the other pid. The kernel drops the lock when the process ends, however
/// it ends, so a killed run leaves nothing to clean up.
class RunDirLock {
 public:
  /// The lock file's name in a run directory.
  static constexpr const char* kFile = ".lock";

  RunDirLock() = default;
  /// Locks `dir` (which must exist), or throws naming the run that holds it.
  explicit RunDirLock(const std::filesystem::path& dir) {
    const auto file = dir / kFile;
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("run.run_dir: cannot create '" + file.string() + "'");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {};
      const auto n = ::pread(fd_, buf, sizeof buf - 1, 0);
      ::close(fd_);
      fd_ = -1;
      const std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("unknown");
      throw Error("run.run_dir: '" + dir.string() + "' is in use by another run (pid " +
                  pid.substr(0, pid.find_first_of("\n ")) + "); wait for it to end or use another run directory");
    }
    const auto me = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      // the lock holds without the pid; a refused run then says "pid unknown"
    }
  }
  RunDirLock(RunDirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  RunDirLock& operator=(RunDirLock&& o) noexcept {
    if (this != &o) {
      release();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~RunDirLock() { release(); }
  [[nodiscard]] bool held() const noexcept { return fd_ >= 0; }

  /// Whether a process holds `dir`'s lock now (a run in progress), without taking it: true,
  /// false (the run ended, however it ended), or nothing where `dir` has no lock file.
  [[nodiscard]] static std::optional<bool> held_by_a_process(const std::filesystem::path& dir) {
    const int fd = ::open((dir / kFile).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
    ::close(fd);  // drops the probe's own shared lock, if it got one
    return held;
  }

 private:
  void release() noexcept {
    if (fd_ >= 0) ::close(fd_);  // closing drops the flock
    fd_ = -1;
  }
  int fd_ = -1;
};

/// Whether `dir` holds anything but a `.lock` (a run was there).
[[nodiscard]] inline bool holds_a_run(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename() != RunDirLock::kFile) return true;
  return false;
}

/// The time now in strftime's `format`, local or UTC.
inline std::string format_now(const char* format, bool utc = false) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  if (utc) gmtime_r(&t, &tm);
  else localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

/// Local time as `YYYYmmdd-HHMMSS`, for run directory names.
inline std::string timestamp_for_path() { return format_now("%Y%m%d-%H%M%S"); }

/// A new directory `<parent>/<stem>-<time>`, created here; when a run started in the same
/// second has that name, `-2`, `-3`, ... is added, so concurrent runs never share one. Any
/// character of `stem` other than letters, digits, `.`, `_` and `-` becomes `_` (an env id
/// such as `python:my_envs:make` names no subfolder and no TensorBoard `name:path` pair).
[[nodiscard]] inline std::filesystem::path fresh_run_dir(const std::filesystem::path& parent, std::string stem) {
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) throw Error("run.run_dir: cannot create '" + parent.string() + "': " + ec.message());
  for (char& c : stem)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  const auto base = stem + "-" + timestamp_for_path();
  for (int i = 1; i < 10'000; ++i) {
    auto dir = parent / (i == 1 ? base : base + "-" + std::to_string(i));
    if (std::filesystem::create_directory(dir, ec)) return dir;  // atomic: only one run creates it
    if (ec) throw Error("run.run_dir: cannot create '" + dir.string() + "': " + ec.message());
  }
  throw Error("run.run_dir: no free name for '" + (parent / base).string() + "'");
}

}  // namespace anvil
