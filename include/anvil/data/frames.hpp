#pragma once
/// @file
/// Stored camera frames into observation rows: datasets keep images height x width x
/// channels (robomimic, LIBERO, h5py's and OpenCV's order); anvil's image parts are
/// channels first (`ObsPart`, `[C, H, W]`). `FrameReader` transposes a frame and, when asked,
/// resizes it by area averaging (each output pixel the mean of the source area it covers,
/// fractional pixels weighted by their overlap: OpenCV's INTER_AREA when shrinking, a
/// blend of at most two neighbours per axis when enlarging). Light header: no torch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil {

/// Converts frames `[H, W, C]` of bytes into `[C, H', W']` (see file comment). Built once
/// per frame size; `convert` is const and may run in many threads at once.
class FrameReader {
 public:
  FrameReader(int height, int width, int channels, int out_height = 0, int out_width = 0)
      : h_(height), w_(width), c_(channels), oh_(out_height > 0 ? out_height : height), ow_(out_width > 0 ? out_width : width) {
    if (h_ < 1 || w_ < 1 || c_ < 1) throw ConfigError("FrameReader: a frame must be at least 1x1x1");
    rows_ = weights(h_, oh_);
    cols_ = weights(w_, ow_);
  }

  [[nodiscard]] int out_height() const noexcept { return oh_; }
  [[nodiscard]] int out_width() const noexcept { return ow_; }
  [[nodiscard]] int channels() const noexcept { return c_; }
  [[nodiscard]] bool resizes() const noexcept { return oh_ != h_ || ow_ != w_; }
  /// Bytes in one stored frame and in one converted one.
  [[nodiscard]] std::int64_t in_bytes() const noexcept { return std::int64_t{h_} * w_ * c_; }
  [[nodiscard]] std::int64_t out_bytes() const noexcept { return std::int64_t{oh_} * ow_ * c_; }

  /// Writes `src` ([H, W, C]) into `dst` ([C, H', W']).
  void convert(const std::uint8_t* src, std::uint8_t* dst) const {
    const std::size_t plane = static_cast<std::size_t>(oh_) * ow_;
    if (!resizes()) {
      for (int y = 0; y < h_; ++y)
        for (int x = 0; x < w_; ++x) {
          const std::uint8_t* p = src + (static_cast<std::size_t>(y) * w_ + x) * c_;
          for (int k = 0; k < c_; ++k) dst[k * plane + static_cast<std::size_t>(y) * w_ + x] = p[k];
        }
      return;
    }
    // Separable: columns of each source row first (into floats [H, W', C]), then rows.
    // Scratch kept per thread: no allocation per frame.
    thread_local std::vector<float> tmp;
    tmp.assign(static_cast<std::size_t>(h_) * ow_ * c_, 0.0f);
    for (int y = 0; y < h_; ++y)
      for (int x = 0; x < ow_; ++x) {
        float* t = &tmp[(static_cast<std::size_t>(y) * ow_ + x) * c_];
        for (const auto& [sx, wgt] : cols_[static_cast<std::size_t>(x)]) {
          const std::uint8_t* p = src + (static_cast<std::size_t>(y) * w_ + sx) * c_;
          for (int k = 0; k < c_; ++k) t[k] += wgt * p[k];
        }
      }
    thread_local std::vector<float> acc;
    acc.resize(static_cast<std::size_t>(c_));
    for (int y = 0; y < oh_; ++y)
      for (int x = 0; x < ow_; ++x) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (const auto& [sy, wgt] : rows_[static_cast<std::size_t>(y)]) {
          const float* t = &tmp[(static_cast<std::size_t>(sy) * ow_ + x) * c_];
          for (int k = 0; k < c_; ++k) acc[static_cast<std::size_t>(k)] += wgt * t[k];
        }
        for (int k = 0; k < c_; ++k)
          dst[k * plane + static_cast<std::size_t>(y) * ow_ + x] =
              static_cast<std::uint8_t>(std::clamp(std::lround(acc[static_cast<std::size_t>(k)]), 0L, 255L));
      }
  }

 private:
  struct Tap {
    int src;
    float weight;
  };
  // For each of `out` pixels along an axis of `in`: the source pixels its footprint
  // [o * in / out, (o + 1) * in / out) overlaps and their shares of it (summing to 1).
  static std::vector<std::vector<Tap>> weights(int in, int out) {
    std::vector<std::vector<Tap>> taps(static_cast<std::size_t>(out));
    const double scale = static_cast<double>(in) / out;
    for (int o = 0; o < out; ++o) {
      const double a = o * scale, b = (o + 1) * scale;
      for (int s = static_cast<int>(std::floor(a)); s < std::min(in, static_cast<int>(std::ceil(b))); ++s) {
        const double overlap = std::min<double>(b, s + 1) - std::max<double>(a, s);
        if (overlap > 1e-9) taps[static_cast<std::size_t>(o)].push_back({s, static_cast<float>(overlap / scale)});
      }
    }
    return taps;
  }

  int h_, w_, c_, oh_, ow_;
  std::vector<std::vector<Tap>> rows_, cols_;
};

/// Writes `src` ([C, H, W], an image part) into `dst` ([H, W, C], as datasets store frames).
inline void frame_to_hwc(const std::uint8_t* src, int channels, int height, int width, std::uint8_t* dst) {
  const std::size_t plane = static_cast<std::size_t>(height) * width;
  for (int k = 0; k < channels; ++k)
    for (std::size_t i = 0; i < plane; ++i) dst[i * static_cast<std::size_t>(channels) + static_cast<std::size_t>(k)] = src[k * plane + i];
}

}  // namespace anvil
