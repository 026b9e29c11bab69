#pragma once
/// @file
/// Progress on the console: a live bar on a terminal (steps, steps/s, ETA, recent return),
/// plain periodic lines when output goes to a file or a pipe. Light header.

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace anvil {

/// A metric (a return, a score, a success rate) at its own scale: at least three significant
/// digits and one decimal ("0.0129", "0.172", "5.30", "-153.3"), "-" when it is not a number.
[[nodiscard]] inline std::string metric_text(double x) {
  if (std::isnan(x)) return "-";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  const int decimals = x == 0 ? 1 : std::clamp(2 - static_cast<int>(std::floor(std::log10(std::fabs(x)))), 1, 6);
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, x);
  return b;
}

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
  /// The bar fits the terminal's width (never wraps); the ETA comes from a smoothed recent
  /// speed measured once updates have begun (`rate`).
  void show(const ProgressState& s, bool force = false) {
    if (style_ == Style::off) return;
    const auto now = std::chrono::steady_clock::now();
    if (style_ == Style::bar && !force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double sps = s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0;
    const double speed = rate(s);
    const double eta = speed > 0 ? static_cast<double>(s.total - s.step) / speed : NAN;
    const std::string eta_s = std::isnan(eta) ? std::string("-:--") : clock(eta);
    std::string ret = metric_text(s.recent_return);
    std::string ev = std::isnan(s.eval_return) ? "" : "eval " + metric_text(s.eval_return);
    if (style_ == Style::bar) {
      const double frac = s.total > 0 ? std::min(1.0, static_cast<double>(s.step) / static_cast<double>(s.total)) : 0.0;
      // Parts by priority; the last ones go first when the terminal is narrow.
      std::vector<std::string> parts{fmt("%3.0f%%", 100 * frac), fmt("%lld/%lld", static_cast<long long>(s.step), static_cast<long long>(s.total)),
                                     "ETA " + eta_s, fmt("%.0f/s", speed > 0 ? speed : sps), "ret " + ret};
      if (!ev.empty()) parts.push_back(ev);
      if (!s.gpu.empty()) parts.push_back(s.gpu);
      const int width = terminal_width() - 1;  // the last column would wrap on some terminals
      auto length = [&](std::size_t n) {
        std::size_t l = 0;
        for (std::size_t i = 0; i < n; ++i) l += parts[i].size() + 1;
        return static_cast<int>(l);
      };
      std::size_t n = parts.size();
      while (n > 1 && length(n) + 2 + kMinBar > width) --n;
      const int bar_width = std::clamp(width - length(n) - 2, 0, kMaxBar);
      std::string line;
      if (bar_width >= kMinBar) {
        const int filled = static_cast<int>(frac * bar_width);
        std::string bar(static_cast<std::size_t>(filled), '=');
        if (filled < bar_width) bar += '>';
        bar.resize(static_cast<std::size_t>(bar_width), ' ');
        line = "[" + bar + "]";
      }
      for (std::size_t i = 0; i < n; ++i) line += (line.empty() ? "" : " ") + parts[i];
      if (static_cast<int>(line.size()) > width) line.resize(static_cast<std::size_t>(std::max(0, width)));
      std::printf("\r%s\033[K", line.c_str());
      drawn_ = true;
    } else {
      if (!s.gpu.empty()) ev += (ev.empty() ? "" : "  ") + s.gpu;
      std::printf("step %lld/%lld  %.0f steps/s  %lld updates  ETA %s  return %s%s%s\n",
                  static_cast<long long>(s.step), static_cast<long long>(s.total), sps,
                  static_cast<long long>(s.updates), eta_s.c_str(), ret.c_str(), ev.empty() ? "" : "  ", ev.c_str());
    }
    std::fflush(stdout);
  }

  /// Steps per second for the ETA: an exponential average (time constant 20 s) of the
  /// speed between calls at least half a second apart, counted from the first call after
  /// updates began (the random warm-up runs several times faster than training). Before
  /// updates begin, the whole run's speed so far.
  double rate(const ProgressState& s) {
    const bool updating = s.updates > 0;
    if (!updating || s.step < rate_step_) {  // warm-up (or a new stage): no smoothed figure yet
      rate_step_ = s.step;
      rate_time_ = s.elapsed_s;
      rate_ = 0;
      rate_warm_ = updating;
      return s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0;
    }
    if (!rate_warm_) {  // the first call with updates: measure from here
      rate_warm_ = true;
      rate_step_ = s.step;
      rate_time_ = s.elapsed_s;
      return s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0;
    }
    const double dt = s.elapsed_s - rate_time_;
    if (dt >= 0.5) {
      const double v = static_cast<double>(s.step - rate_step_) / dt;
      const double a = rate_ > 0 ? 1.0 - std::exp(-dt / 20.0) : 1.0;
      rate_ += a * (v - rate_);
      rate_step_ = s.step;
      rate_time_ = s.elapsed_s;
    }
    return rate_ > 0 ? rate_ : (s.elapsed_s > 0 ? static_cast<double>(s.step) / s.elapsed_s : 0.0);
  }

  /// Columns of the terminal on stdout (COLUMNS, then 80, when it cannot tell).
  static int terminal_width() {
    winsize w{};
    if (::ioctl(::fileno(stdout), TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
    if (const char* c = std::getenv("COLUMNS")) {
      const int n = std::atoi(c);
      if (n > 0) return n;
    }
    return 80;
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

  static constexpr int kMinBar = 10, kMaxBar = 30;
  Style style_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
  std::int64_t rate_step_ = 0;
  double rate_time_ = 0, rate_ = 0;
  bool rate_warm_ = false;
};

}  // namespace anvil
