#pragma once
/// @file
/// `TensorBoardWriter`: TensorBoard event files (`events.out.tfevents.<time>.<host>`)
/// written directly: each record is TFRecord-framed (length, masked CRC-32C of the length,
/// payload, masked CRC-32C of the payload) around a serialized `tensorflow.Event` protocol
/// buffer holding scalars (`Summary.Value.simple_value`) or histograms (`HistogramProto`).
/// The three messages are encoded by hand here (a few dozen lines) rather than with
/// libprotobuf: generated code would need protoc and TensorBoard's .proto files at build
/// time for three messages; the CRC-32C is the one checkpoints use. Light header.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/detail/crc32c.hpp>
#include <anvil/core/error.hpp>

namespace anvil {

namespace tb {

/// TFRecord's masked CRC-32C (a rotation plus a constant, so that a CRC of data holding
/// CRCs stays well distributed).
inline std::uint32_t masked_crc(const void* data, std::size_t n) {
  detail::Crc32c c;
  c.update(data, n);
  const std::uint32_t crc = c.value();
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/// Protocol-buffer encoding, the parts an Event needs.
class ProtoWriter {
 public:
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void key(int field, int wire) { varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire)); }
  void double_field(int field, double v) {
    key(field, 1);
    raw(&v, 8);
  }
  void float_field(int field, float v) {
    key(field, 5);
    raw(&v, 4);
  }
  void int_field(int field, std::int64_t v) {
    key(field, 0);
    varint(static_cast<std::uint64_t>(v));
  }
  void bytes_field(int field, const std::string& s) {
    key(field, 2);
    varint(s.size());
    out_ += s;
  }
  /// A packed repeated double.
  void packed_doubles(int field, std::span<const double> v) {
    key(field, 2);
    varint(v.size() * 8);
    raw(v.data(), v.size() * 8);
  }
  [[nodiscard]] const std::string& str() const noexcept { return out_; }

 private:
  void raw(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

/// A histogram in TensorBoard's layout: bucket i counts the values from limit[i-1] (or the
/// minimum) up to limit[i], the last bucket including the maximum.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;

  /// `bins` equal-width buckets over the values' range (NaNs and infinities skipped).
  static Histogram of(std::span<const float> values, int bins = 30) {
    Histogram h;
    h.min = std::numeric_limits<double>::infinity();
    h.max = -h.min;
    for (float f : values) {
      if (!std::isfinite(f)) continue;
      const double x = f;
      h.min = std::min(h.min, x);
      h.max = std::max(h.max, x);
      h.num += 1;
      h.sum += x;
      h.sum_squares += x * x;
    }
    if (h.num == 0) return Histogram{};
    const double width = h.max > h.min ? (h.max - h.min) / bins : 1.0;
    h.bucket.assign(static_cast<std::size_t>(bins), 0.0);
    for (int i = 0; i < bins; ++i) h.bucket_limit.push_back(h.min + width * (i + 1));
    h.bucket_limit.back() = std::max(h.bucket_limit.back(), h.max);
    for (float f : values) {
      if (!std::isfinite(f)) continue;
      auto i = static_cast<std::ptrdiff_t>((f - h.min) / width);
      i = std::clamp<std::ptrdiff_t>(i, 0, bins - 1);
      h.bucket[static_cast<std::size_t>(i)] += 1;
    }
    return h;
  }
};

}  // namespace tb

/// Appends events to one TensorBoard event file in `dir`. Each `scalar` or `histogram` is
/// one event; `flush` makes them visible to TensorBoard (also done every `flush_every`
/// events and on destruction).
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  explicit TensorBoardWriter(const std::filesystem::path& dir, int flush_every = 64) : flush_every_(flush_every) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    const auto secs = static_cast<long long>(now());
    path_ = dir / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(::getpid()));
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw Error("cannot write TensorBoard events to '" + path_.string() + "'");
    tb::ProtoWriter e;  // the first event names the format version
    e.double_field(1, now());
    e.bytes_field(3, "brain.Event:2");
    record(e.str());
    flush();
  }
  TensorBoardWriter(TensorBoardWriter&& o) noexcept { *this = std::move(o); }
  TensorBoardWriter& operator=(TensorBoardWriter&& o) noexcept {
    if (this != &o) {
      close();
      f_ = std::exchange(o.f_, nullptr);
      path_ = std::move(o.path_);
      flush_every_ = o.flush_every_;
      pending_ = o.pending_;
    }
    return *this;
  }
  ~TensorBoardWriter() { close(); }

  [[nodiscard]] bool is_open() const noexcept { return f_ != nullptr; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// A scalar `tag` = `value` at `step`.
  void scalar(const std::string& tag, double value, std::int64_t step) {
    if (!f_) return;
    tb::ProtoWriter v;
    v.bytes_field(1, tag);
    v.float_field(2, static_cast<float>(value));
    event(v.str(), step);
  }

  /// A text summary (TensorBoard's Text tab; Markdown) under `tag` at `step`, e.g. a run's
  /// resolved config.
  void text(const std::string& tag, const std::string& markdown, std::int64_t step) {
    if (!f_) return;
    tb::ProtoWriter plugin;  // SummaryMetadata.PluginData: plugin_name
    plugin.bytes_field(1, "text");
    tb::ProtoWriter meta;  // SummaryMetadata: plugin_data
    meta.bytes_field(1, plugin.str());
    tb::ProtoWriter tensor;  // TensorProto: dtype DT_STRING, a scalar shape, string_val
    tensor.int_field(1, 7);
    tensor.bytes_field(2, std::string());
    tensor.bytes_field(8, markdown);
    tb::ProtoWriter v;  // Summary.Value: tag, tensor, metadata
    v.bytes_field(1, tag);
    v.bytes_field(8, tensor.str());
    v.bytes_field(9, meta.str());
    event(v.str(), step);
  }

  /// A histogram of `values` (e.g. a layer's weights) under `tag` at `step`.
  void histogram(const std::string& tag, std::span<const float> values, std::int64_t step, int bins = 30) {
    if (!f_) return;
    const auto h = tb::Histogram::of(values, bins);
    tb::ProtoWriter hp;
    hp.double_field(1, h.min);
    hp.double_field(2, h.max);
    hp.double_field(3, h.num);
    hp.double_field(4, h.sum);
    hp.double_field(5, h.sum_squares);
    hp.packed_doubles(6, h.bucket_limit);
    hp.packed_doubles(7, h.bucket);
    tb::ProtoWriter v;
    v.bytes_field(1, tag);
    v.bytes_field(5, hp.str());
    event(v.str(), step);
  }

  void flush() {
    if (!f_) return;
    if (std::fflush(f_) != 0) throw Error("writing '" + path_.string() + "' failed (disk full?)");
    pending_ = 0;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  // An Event holding a Summary with one Value.
  void event(const std::string& value, std::int64_t step) {
    tb::ProtoWriter summary;
    summary.bytes_field(1, value);
    tb::ProtoWriter e;
    e.double_field(1, now());
    e.int_field(2, step);
    e.bytes_field(5, summary.str());
    record(e.str());
    if (++pending_ >= flush_every_) flush();
  }
  // TFRecord framing.
  void record(const std::string& data) {
    const std::uint64_t n = data.size();
    const std::uint32_t len_crc = tb::masked_crc(&n, sizeof n);
    const std::uint32_t data_crc = tb::masked_crc(data.data(), data.size());
    const bool ok = std::fwrite(&n, 8, 1, f_) == 1 && std::fwrite(&len_crc, 4, 1, f_) == 1 &&
                    (data.empty() || std::fwrite(data.data(), data.size(), 1, f_) == 1) &&
                    std::fwrite(&data_crc, 4, 1, f_) == 1;
    if (!ok) throw Error("writing '" + path_.string() + "' failed (disk full?)");
  }
  void close() noexcept {
    if (f_) {
      std::fflush(f_);
      std::fclose(f_);
      f_ = nullptr;
    }
  }

  std::FILE* f_ = nullptr;
  std::filesystem::path path_;
  int flush_every_ = 64;
  int pending_ = 0;
};

}  // namespace anvil
