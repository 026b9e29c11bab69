#pragma once
/// @file
/// Progress on the console: a live bar on a terminal (steps, steps/s, ETA, recent return),
/// plain periodic lines when output goes to a file or a pipe. Light header.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace anvil {

/// What the progress display shows at one moment.
struct ProgressState {
  std::int64_t step = 0, total = 0, updates = 0;
  double elapsed_s = 0.0;
  double recent_return = NAN;  ///< mean return of recent training episodes
  double eval_return = NAN;    ///< latest evaluation
  std::string gpu;             ///< GPU utilisation at the last log row ("gpu0 97%"), if any
};

/// Renders `ProgressState` as a bar (`bar == true`) or as lines.
class Progress {
 public:
  enum class Style { bar, lines, off };

  explicit Progress(Style style = Style::lines) : style_(style) {}
  /// `bar` on a terminal, `lines` otherwise.
  static Style detect() { return ::isatty(::fileno(stdout)) ? Style::bar : Style::lines; }

  /// Redraws the bar (at most 10 times a second) or prints a line (callers decide when).
  void show(const ProgressState& s, bool force = false) {
    if (style_ == Style::off) return;
    const auto now = std::chrono::steady_clock::now();
    if (style_ == Style::bar && !force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double sps = s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0;
    const double eta = sps > 0 ? static_cast<double>(s.total - s.step) / sps : 0.0;
    std::string ret = std::isnan(s.recent_return) ? "    -  " : fmt("%7.1f", s.recent_return);
    std::string ev = std::isnan(s.eval_return) ? "" : fmt("  eval %.1f", s.eval_return);
    if (!s.gpu.empty()) ev += "  " + s.gpu;
    if (style_ == Style::bar) {
      constexpr int kWidth = 24;
      const double frac = s.total > 0 ? std::min(1.0, static_cast<double>(s.step) / static_cast<double>(s.total)) : 0.0;
      const int filled = static_cast<int>(frac * kWidth);
      std::string bar(static_cast<std::size_t>(filled), '=');
      if (filled < kWidth) bar += '>';
      bar.resize(kWidth, ' ');
      std::printf("\r[%s] %3.0f%% %lld/%lld steps  %.0f steps/s  ETA %s  return %s%s\033[K",
                  bar.c_str(), 100 * frac, static_cast<long long>(s.step),
                  static_cast<long long>(s.total), sps, clock(eta).c_str(), ret.c_str(), ev.c_str());
      drawn_ = true;
    } else {
      std::printf("step %lld/%lld  %.0f steps/s  %lld updates  ETA %s  return %s%s\n",
                  static_cast<long long>(s.step), static_cast<long long>(s.total), sps,
                  static_cast<long long>(s.updates), clock(eta).c_str(), ret.c_str(), ev.c_str());
    }
    std::fflush(stdout);
  }

  /// Ends the bar's line so later output starts on a fresh one.
  void finish() {
    if (drawn_) std::printf("\n");
    drawn_ = false;
    std::fflush(stdout);
  }
  /// Prints a message on its own line without breaking the bar.
  void message(const std::string& m) {
    if (drawn_) std::printf("\r\033[K");
    std::printf("%s\n", m.c_str());
    drawn_ = false;
    std::fflush(stdout);
  }
  [[nodiscard]] Style style() const noexcept { return style_; }

 private:
  template <class... T>
  static std::string fmt(const char* f, T... v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v...);
    return buf;
  }
  static std::string clock(double s) {
    const auto t = static_cast<long long>(std::max(0.0, s));
    return t >= 3600 ? fmt("%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60)
                     : fmt("%lld:%02lld", t / 60, t % 60);
  }

  Style style_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace anvil
