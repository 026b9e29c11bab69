#pragma once
/// @file
/// The files a run writes in its run directory: `config.yaml`, `metrics.csv` and
/// `summary.json`, each written so that a crash never leaves a half-written file in place
/// of a good one. Light header.

#include <algorithm>
#include <chrono>
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
      if (steps <= static_cast<double>(env_steps) && ups <= static_cast<double>(updates)) keep.push_back(line);
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

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  std::vector<std::string> columns_;
  std::vector<std::vector<std::pair<std::string, double>>> pending_;
  bool header_written_ = false;
};

/// Local time as `YYYYmmdd-HHMMSS`, for run directory names.
inline std::string timestamp_for_path() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace anvil
