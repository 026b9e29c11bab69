#pragma once
// anvil-report, drawing: line charts as inline SVG (no script, no font or file fetched), each
// curve a <path> named by `data-series`, evaluation points marked with a tooltip (<title>),
// min-max bands behind means; a stacked bar for the phase-time split.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace anvil::report {

/// Text made safe for HTML and SVG.
inline std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// A number as a reader wants it: 4 significant digits, no exponent for everyday sizes.
inline std::string number(double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e7 || a < 1e-3)) std::snprintf(buf, sizeof buf, "%.3g", v);
  else if (a >= 1000 && v == std::round(v)) {
    // 1234567 -> 1,234,567
    std::string digits = std::to_string(static_cast<long long>(a)), grouped;
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
      grouped += digits[i];
    }
    return (v < 0 ? "-" : "") + grouped;
  } else std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

/// Seconds to three significant digits: 0.0331, 1.95, 412.
inline std::string seconds(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : "%.3g", v);
  return buf;
}

/// A tick label: 20k, 1.5M for large counts; as many decimals as the tick step needs.
inline std::string tick_label(double v, double step) {
  char buf[64];
  const double a = std::fabs(v);
  if (a >= 1e6 && step >= 1e5) std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
  else if (a >= 1e3 && step >= 100) std::snprintf(buf, sizeof buf, "%gk", v / 1e3);
  else if (step > 0 && (step < 1e-3 || a >= 1e7)) std::snprintf(buf, sizeof buf, "%.2g", v);
  else {
    const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    std::snprintf(buf, sizeof buf, "%.*f", decimals, std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return buf;
}

/// Ticks at 1, 2 or 5 times a power of ten, about `target` of them over [lo, hi].
inline std::vector<double> nice_ticks(double lo, double hi, int target, double& step) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

/// One curve of a chart.
struct Series {
  std::string label;
  std::string color;
  std::vector<double> x, y;      ///< the line; a NaN y breaks it
  std::vector<double> lo, hi;    ///< a band behind the line (empty: none)
  std::vector<int> n;            ///< runs behind each point of a band's mean
  std::string key;               ///< `data-series`: what the curve is, for readers and tests
  bool faint = false;            ///< the raw curve under a smoothed one
  bool dots = false;             ///< mark each point, with a tooltip
  double width = 1.8;
};

/// What the axes say.
struct Axes {
  std::string x_label, y_label;
  bool y_from_zero = false;      ///< rates and shares: 0 stays on the axis
};

namespace detail {
struct Frame {
  double x0, x1, y0, y1;
  static constexpr double W = 720, H = 300, L = 74, R = 16, T = 14, B = 46;
  [[nodiscard]] double px(double x) const { return L + (x - x0) / (x1 - x0) * (W - L - R); }
  [[nodiscard]] double py(double y) const { return H - B - (y - y0) / (y1 - y0) * (H - T - B); }
};

inline std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Long curves are drawn from every k-th point (the report's data block keeps them all).
inline std::size_t stride(std::size_t n) { return n > 2000 ? (n + 1999) / 2000 : 1; }
}  // namespace detail

/// A line chart: bands first, then faint raw curves, then curves; a legend in HTML below.
inline std::string line_chart(const Axes& axes, const std::vector<Series>& series) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  auto take = [&](double x, double y) {
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  };
  for (const auto& s : series)
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      take(s.x[i], s.y[i]);
      if (!s.lo.empty()) take(s.x[i], s.lo[i]), take(s.x[i], s.hi[i]);
    }
  if (!(x0 <= x1)) return "<p class=\"empty\">no values to draw yet</p>\n";
  if (axes.y_from_zero) y0 = std::min(y0, 0.0), y1 = std::max(y1, 0.0);
  if (x1 - x0 < 1e-12 * std::max(1.0, std::fabs(x0))) {  // one point: an axis around it
    const double pad = std::max(1.0, std::fabs(x0) * 0.05);
    x0 -= pad, x1 += pad;
  }
  if (y1 - y0 < 1e-12 * std::max(1.0, std::fabs(y0))) {  // a flat curve: an axis around its value
    const double pad = y0 != 0 ? std::fabs(y0) * 0.1 : 1.0;
    if (!(axes.y_from_zero && y0 == 0)) y0 -= pad;
    y1 += pad;
  } else {
    const double pad = (y1 - y0) * 0.05;
    if (!(axes.y_from_zero && y0 == 0)) y0 -= pad;
    y1 += pad;
  }
  double xstep = 0, ystep = 0;
  const auto xt = nice_ticks(x0, x1, 6, xstep), yt = nice_ticks(y0, y1, 5, ystep);
  const detail::Frame f{x0, x1, y0, y1};
  using detail::fmt;
  std::string s = "<svg class=\"chart\" viewBox=\"0 0 720 300\" role=\"img\" aria-label=\"" + escape(axes.y_label) + " against " +
                  escape(axes.x_label) + "\">\n";
  // Grid and tick labels.
  for (double v : yt)
    s += "<line class=\"grid\" x1=\"" + fmt(f.L) + "\" x2=\"" + fmt(f.W - f.R) + "\" y1=\"" + fmt(f.py(v)) + "\" y2=\"" +
         fmt(f.py(v)) + "\"/><text class=\"tick\" x=\"" + fmt(f.L - 6) + "\" y=\"" + fmt(f.py(v) + 4) +
         "\" text-anchor=\"end\">" + tick_label(v, ystep) + "</text>\n";
  for (double v : xt)
    s += "<line class=\"grid\" x1=\"" + fmt(f.px(v)) + "\" x2=\"" + fmt(f.px(v)) + "\" y1=\"" + fmt(f.T) + "\" y2=\"" +
         fmt(f.H - f.B) + "\"/><text class=\"tick\" x=\"" + fmt(f.px(v)) + "\" y=\"" + fmt(f.H - f.B + 16) +
         "\" text-anchor=\"middle\">" + tick_label(v, xstep) + "</text>\n";
  s += "<rect class=\"frame\" x=\"" + fmt(f.L) + "\" y=\"" + fmt(f.T) + "\" width=\"" + fmt(f.W - f.L - f.R) + "\" height=\"" +
       fmt(f.H - f.T - f.B) + "\"/>\n";
  s += "<text class=\"axis\" x=\"" + fmt((f.L + f.W - f.R) / 2) + "\" y=\"" + fmt(f.H - 8) + "\" text-anchor=\"middle\">" +
       escape(axes.x_label) + "</text>\n";
  s += "<text class=\"axis\" transform=\"translate(16 " + fmt((f.T + f.H - f.B) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       escape(axes.y_label) + "</text>\n";
  // Bands (min-max over seeds), behind every line.
  for (const auto& c : series) {
    if (c.lo.empty()) continue;
    std::string d;
    std::vector<std::size_t> idx;
    for (std::size_t i = 0; i < c.x.size(); ++i)
      if (std::isfinite(c.lo[i]) && std::isfinite(c.hi[i])) idx.push_back(i);
    if (idx.empty()) continue;
    for (std::size_t k = 0; k < idx.size(); ++k)
      d += (k ? " L" : "M") + fmt(f.px(c.x[idx[k]])) + " " + fmt(f.py(c.hi[idx[k]]));
    for (std::size_t k = idx.size(); k-- > 0;) d += " L" + fmt(f.px(c.x[idx[k]])) + " " + fmt(f.py(c.lo[idx[k]]));
    s += "<path class=\"band\" data-series=\"" + escape(c.key) + "\" d=\"" + d + " Z\" fill=\"" + c.color +
         "\"><title>" + escape(c.label) + ": min-max over runs</title></path>\n";
  }
  // Lines, faint ones first.
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& c : series) {
      if (c.faint != (pass == 0)) continue;
      std::string d;
      bool pen_down = false;
      std::size_t drawn = 0;
      const std::size_t k = detail::stride(c.x.size());
      for (std::size_t i = 0; i < c.x.size(); ++i) {
        const bool last = i + 1 == c.x.size();
        if (!std::isfinite(c.y[i]) || !std::isfinite(c.x[i])) {
          pen_down = false;
          continue;
        }
        if (i % k != 0 && !last) continue;
        d += (pen_down ? " L" : (d.empty() ? "M" : " M")) + fmt(f.px(c.x[i])) + " " + fmt(f.py(c.y[i]));
        pen_down = true;
        ++drawn;
      }
      if (drawn == 0) continue;
      s += std::string("<path class=\"") + (c.faint ? "line faint" : "line") + "\" data-series=\"" + escape(c.key) +
           "\" data-points=\"" + std::to_string(drawn) + "\" d=\"" + d + "\" stroke=\"" + c.color + "\" stroke-width=\"" +
           fmt(c.width) + "\"><title>" + escape(c.label) + "</title></path>\n";
      if (drawn == 1 && !c.dots)  // a single value is a point, not a line
        for (std::size_t i = 0; i < c.x.size(); ++i)
          if (std::isfinite(c.y[i]))
            s += "<circle cx=\"" + fmt(f.px(c.x[i])) + "\" cy=\"" + fmt(f.py(c.y[i])) + "\" r=\"2.5\" fill=\"" + c.color + "\"/>\n";
      if (!c.dots || c.faint || c.x.size() > 400) continue;
      for (std::size_t i = 0; i < c.x.size(); ++i) {
        if (!std::isfinite(c.y[i])) continue;
        std::string tip = c.label + "\n" + axes.x_label + " " + number(c.x[i]) + ": " + number(c.y[i]);
        if (!c.lo.empty()) tip += " (min " + number(c.lo[i]) + ", max " + number(c.hi[i]) + ")";
        if (!c.n.empty()) tip += ", n=" + std::to_string(c.n[i]);
        s += "<circle class=\"dot\" cx=\"" + fmt(f.px(c.x[i])) + "\" cy=\"" + fmt(f.py(c.y[i])) + "\" r=\"2.6\" fill=\"" +
             c.color + "\"><title>" + escape(tip) + "</title></circle>\n";
      }
    }
  s += "</svg>\n<div class=\"legend\">";
  for (const auto& c : series) {
    if (c.faint) continue;
    s += "<span><i style=\"background:" + c.color + "\"></i>" + escape(c.label) + "</span>";
  }
  return s + "</div>\n";
}

/// The phase-time split as one stacked bar, each phase with its seconds and share.
inline std::string phase_bar(const std::vector<std::pair<std::string, double>>& phases, const std::vector<std::string>& colors) {
  double total = 0;
  for (const auto& [name, sec] : phases) total += std::max(0.0, sec);
  if (total <= 0) return "<p class=\"empty\">no phase times recorded</p>\n";
  std::string s = "<svg class=\"bar\" viewBox=\"0 0 720 34\" role=\"img\" aria-label=\"share of the run's time in each phase\">\n";
  std::string legend = "<div class=\"legend\">";
  double x = 0;
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const auto& [name, sec] = phases[i];
    if (sec <= 0) continue;
    const double w = sec / total * 720;
    char share[32];
    std::snprintf(share, sizeof share, "%.1f%%", 100 * sec / total);
    const std::string& color = colors[i % colors.size()];
    s += "<rect data-phase=\"" + escape(name) + "\" x=\"" + detail::fmt(x) + "\" y=\"2\" width=\"" + detail::fmt(w) +
         "\" height=\"30\" fill=\"" + color + "\"><title>" + escape(name) + ": " + seconds(sec) + " s (" + share +
         ")</title></rect>\n";
    if (w > 60)
      s += "<text class=\"barlabel\" x=\"" + detail::fmt(x + w / 2) + "\" y=\"22\" text-anchor=\"middle\">" + escape(name) + " " +
           share + "</text>\n";
    legend += "<span><i style=\"background:" + color + "\"></i>" + escape(name) + " " + seconds(sec) + " s (" + share + ")</span>";
    x += w;
  }
  return s + "</svg>\n" + legend + "</div>\n";
}

}  // namespace anvil::report
