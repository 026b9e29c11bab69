#pragma once
/// @file
/// The files a run writes in its run directory: `config.yaml`, `metrics.csv` and
/// `summary.json`, each written so that a crash never leaves a half-written file in place
/// of a good one; the lock a run holds on its directory; fresh run directory names. Light
/// header.

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <anvil/core/error.hpp>

namespace anvil {

/// Writes `text` to `path` atomically: a temporary file beside it, flushed, then renamed
/// over the target, so readers see the old file or the new one, never a torn one.
inline void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write '" + tmp + "'");
    out << text;
    out.flush();
    if (!out) throw Error("writing '" + tmp + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path.string() + "': " + ec.message());
}

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

/// A CSV file of metrics, one row per log interval. Columns are fixed by the first row
/// that has every metric the algorithm reports (its first update); rows logged before that
/// are held back and written then, with their missing cells empty.
class MetricsCsv {
 public:
  MetricsCsv() = default;
  explicit MetricsCsv(std::filesystem::path path) : path_(std::move(path)) {}

  /// Continues the file of a resumed run: keeps its header and the rows up to the
  /// checkpoint's clock (`env_steps` and `updates`, the first two columns; rows the
  /// interrupted run wrote after it are dropped, since the resumed run writes them again),
  /// and appends from there. A missing or empty file starts afresh.
  static MetricsCsv resume(std::filesystem::path path, std::int64_t env_steps, std::int64_t updates) {
    MetricsCsv csv(path);
    std::ifstream in(path);
    std::string header, line;
    if (!in || !std::getline(in, header) || header.empty()) return csv;
    std::vector<std::string> keep;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      char* end = nullptr;
      const double steps = std::strtod(line.c_str(), &end);
      const double ups = end && *end == ',' ? std::strtod(end + 1, nullptr) : 0.0;
      if (steps <= static_cast<double>(env_steps) && ups <= static_cast<double>(updates)) {
        keep.push_back(line);
        csv.last_ = {static_cast<std::int64_t>(steps), static_cast<std::int64_t>(ups)};
      }
    }
    in.close();
    std::string text = header + "\n";
    for (const auto& l : keep) text += l + "\n";
    write_file_atomic(path, text);
    for (std::size_t b = 0, e; b <= header.size(); b = e + 1) {
      e = header.find(',', b);
      if (e == std::string::npos) e = header.size();
      csv.columns_.push_back(header.substr(b, e - b));
    }
    csv.out_.open(path, std::ios::app);
    if (!csv.out_) throw Error("cannot write '" + path.string() + "'");
    csv.header_written_ = true;
    return csv;
  }

  /// Appends a row; `complete` says the row's keys are all the columns there will be.
  void row(const std::vector<std::pair<std::string, double>>& values, bool complete) {
    if (path_.empty()) return;
    pending_.push_back(values);
    if (!header_written_ && !complete) return;
    if (!header_written_) {
      for (const auto& [k, v] : values) columns_.push_back(k);
      for (const auto& r : pending_)
        for (const auto& [k, v] : r)
          if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) columns_.push_back(k);
      out_.open(path_, std::ios::trunc);
      if (!out_) throw Error("cannot write '" + path_.string() + "'");
      for (std::size_t i = 0; i < columns_.size(); ++i) out_ << (i ? "," : "") << columns_[i];
      out_ << "\n";
      header_written_ = true;
    }
    for (const auto& r : pending_) {
      std::map<std::string, double> m(r.begin(), r.end());
      for (std::size_t i = 0; i < columns_.size(); ++i) {
        if (i) out_ << ",";
        if (auto it = m.find(columns_[i]); it != m.end() && std::isfinite(it->second)) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.8g", it->second);
          out_ << buf;
        }
      }
      out_ << "\n";
    }
    pending_.clear();
    out_.flush();
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
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> last_kept() const noexcept { return last_; }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  std::vector<std::string> columns_;
  std::vector<std::vector<std::pair<std::string, double>>> pending_;
  bool header_written_ = false;
  std::pair<std::int64_t, std::int64_t> last_{-1, -1};
};

/// A run's hold on its directory: `.lock` in it, flock'ed for the lock's life, holding the
/// pid of the process that holds it. A second run in the same directory is refused, naming
/// the directory and the other pid. The kernel drops the lock when the process ends, however
/// it ends, so a killed run leaves nothing to clean up.
class RunDirLock {
 public:
  RunDirLock() = default;
  /// Locks `dir` (which must exist), or throws naming the run that holds it.
  explicit RunDirLock(const std::filesystem::path& dir) {
    const auto file = dir / ".lock";
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
    if (e.path().filename() != ".lock") return true;
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
/// second has that name, `-2`, `-3`, ... is added, so concurrent runs never share one.
[[nodiscard]] inline std::filesystem::path fresh_run_dir(const std::filesystem::path& parent, const std::string& stem) {
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) throw Error("run.run_dir: cannot create '" + parent.string() + "': " + ec.message());
  const auto base = stem + "-" + timestamp_for_path();
  for (int i = 1; i < 10'000; ++i) {
    auto dir = parent / (i == 1 ? base : base + "-" + std::to_string(i));
    if (std::filesystem::create_directory(dir, ec)) return dir;  // atomic: only one run creates it
    if (ec) throw Error("run.run_dir: cannot create '" + dir.string() + "': " + ec.message());
  }
  throw Error("run.run_dir: no free name for '" + (parent / base).string() + "'");
}

}  // namespace anvil
