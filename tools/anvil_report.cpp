// anvil-report: run directories and sweeps -> one self-contained HTML page (inline SVG and
// CSS; no script, font or file fetched), viewable offline in any browser.
//   anvil-report RUN_DIR... [-o report.html] [--x clock|steps|updates|wall] [--smooth W] [--title T]
// For each run: evaluation return (and per-task curves where the run has them) against the
// run's own clock, training losses, throughput, the phase-time split, provenance and config.
// For two runs or more (a sweep's directory, or several run directories): runs grouped by
// setting (the config keys that differ, seeds aside), each group's mean with its min-max band
// over seeds and n, on one axis, and the final/best table. What cannot be read is named, file
// and line, on the page and on stderr, and the rest is still reported.
// Exit status: 0 written; 1 written, but some input was damaged or missing (listed); 2 nothing
// to report, or a bad command line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/run_dir.hpp"
#include "report/svg_chart.hpp"

namespace {

using namespace anvil::report;

struct Options {
  std::vector<std::string> inputs;
  std::string out = "report.html";
  std::string x = "clock";  // clock (the run's own), steps, updates, wall
  double smooth = 0;        // exponential moving average weight, 0 (off) to 0.99
  std::string title = "anvil report";
};

constexpr const char* kUsage =
    "usage: anvil-report RUN_DIR... [-o report.html] [--x clock|steps|updates|wall] [--smooth W] [--title TEXT]\n"
    "  RUN_DIR      a run directory (metrics.csv, config.yaml, summary.json), or a directory of them (a sweep)\n"
    "  -o FILE      where the HTML goes (default report.html)\n"
    "  --x AXIS     x-axis: clock = each run's own (env steps; gradient updates for offline and staged runs),\n"
    "               steps, updates, or wall (wall-clock seconds)\n"
    "  --smooth W   exponential moving average of the curves, weight W in [0, 0.99] (0: off); raw curves stay, faint\n";

const std::vector<std::string> kColors = {"#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c",
                                          "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d"};

// What a metrics column is, in words a reader understands without the docs.
std::string describe(const std::string& col) {
  static const std::map<std::string, std::string> k = {
      {"recent_return", "return of recent training episodes"},
      {"eval_success", "evaluation success rate"},
      {"actor_loss", "actor loss"},
      {"critic_loss", "critic loss"},
      {"alpha", "entropy temperature (alpha)"},
      {"alpha_loss", "temperature loss"},
      {"entropy", "policy entropy"},
      {"q_mean", "mean Q value of the batch"},
      {"q_taken", "Q value of the actions taken"},
      {"policy_loss", "policy loss (clipped surrogate)"},
      {"value_loss", "value loss"},
      {"approx_kl", "approximate KL, new to rollout policy"},
      {"clip_fraction", "share of clipped probability ratios"},
      {"epochs", "epochs run per rollout"},
      {"loss", "training loss"},
      {"lr", "learning rate"},
      {"env_steps_per_s", "throughput (env steps per second)"},
      {"advantage_abs", "mean absolute advantage"},
      {"epsilon", "exploration epsilon"},
      {"transitions", "transitions learnt from"},
  };
  const auto it = k.find(col);
  return it != k.end() ? it->second : col;
}

std::string axis_column(const Run& r, const std::string& x) {
  if (x == "clock") return r.clock;
  if (x == "steps") return "env_steps";
  if (x == "wall") return "wall_s";
  return "updates";
}

std::string axis_label(const std::string& column) {
  if (column == "env_steps") return "env steps";
  if (column == "updates") return "gradient updates";
  return "wall-clock time (s; a resumed run's sessions end to end)";
}

// An exponential moving average over the finite values, in order, debiased at the start.
std::vector<double> smoothed(const std::vector<double>& y, double w) {
  if (w <= 0) return y;
  std::vector<double> out(y.size(), NAN);
  double acc = 0, weight = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    acc = w * acc + (1 - w) * y[i];
    weight = w * weight + (1 - w);
    out[i] = acc / weight;
  }
  return out;
}

// The rows that hold an evaluation. metrics.csv repeats the latest evaluation in every row
// after it; an evaluation happened at the first row at or past each multiple of
// train.eval_interval, and at the end of a finished run. Without the interval (no config):
// the rows where the value changes.
std::vector<bool> evaluation_rows(const Run& r, const std::vector<double>& values) {
  const auto* clock = r.metrics.find(r.clock);
  std::vector<bool> at(values.size(), false);
  const std::string* e = r.config_value("train.eval_interval");
  const double every = e ? std::strtod(e->c_str(), nullptr) : 0;
  double before = NAN;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    if (every > 0 && clock) {
      const double k = std::floor((*clock)[i] / every);
      at[i] = i == 0 ? k >= 1 : k > std::floor((*clock)[i - 1] / every);
    } else {
      at[i] = !(values[i] == before);
    }
    before = values[i];
  }
  if (r.summary && !values.empty() && std::isfinite(values.back())) at.back() = true;  // the final evaluation
  return at;
}

// The finite points of one column against the chosen x column (evaluation columns: the rows
// of evaluations only).
struct Curve {
  std::vector<double> x, y, clock;  // clock: the run's own clock at each point (to align seeds)
};
Curve curve(const Run& r, const std::string& col, const std::string& xcol) {
  Curve c;
  const auto* ys = r.metrics.find(col);
  const auto* xs = r.metrics.find(xcol);
  const auto* ks = r.metrics.find(r.clock);
  if (!ys || !xs || !ks) return c;
  const bool evaluation = col.rfind("eval_", 0) == 0;
  const std::vector<bool> keep = evaluation ? evaluation_rows(r, *ys) : std::vector<bool>(ys->size(), true);
  for (std::size_t i = 0; i < ys->size(); ++i)
    if (keep[i] && std::isfinite((*ys)[i]) && std::isfinite((*xs)[i])) {
      c.x.push_back((*xs)[i]);
      c.y.push_back((*ys)[i]);
      c.clock.push_back((*ks)[i]);
    }
  return c;
}

// Adds a run's curve (raw faint and smoothed when smoothing is on).
void add_curve(std::vector<Series>& out, const Curve& c, const std::string& label, const std::string& color,
               const std::string& key, double smooth, bool dots) {
  if (smooth > 0) out.push_back({label + " (raw)", color, c.x, c.y, {}, {}, {}, key, true, false, 1.0});
  out.push_back({label, color, c.x, smoothed(c.y, smooth), {}, {}, {}, key + (smooth > 0 ? " smoothed" : ""), false, dots, 1.8});
}

// The mean and min-max of a group's runs at each value of their clock.
struct Band {
  std::vector<double> x, mean, lo, hi;
  std::vector<int> n;
};
Band band(const std::vector<Run>& runs, const Group& g, const std::string& col, const std::string& xopt, double smooth) {
  struct Acc {
    double sum = 0, lo = INFINITY, hi = -INFINITY, xsum = 0;
    int n = 0;
  };
  std::map<double, Acc> at;
  for (std::size_t i : g.runs) {
    const Run& r = runs[i];
    const std::string xcol = axis_column(r, xopt);
    const Curve c = curve(r, col, xcol);
    const auto ys = smoothed(c.y, smooth);
    for (std::size_t k = 0; k < c.y.size(); ++k) {
      Acc& a = at[c.clock[k]];
      a.sum += ys[k], a.lo = std::min(a.lo, ys[k]), a.hi = std::max(a.hi, ys[k]), a.xsum += c.x[k], ++a.n;
    }
  }
  Band b;
  for (const auto& [k, a] : at) {
    b.x.push_back(a.xsum / a.n);  // the clock itself, or the runs' mean wall time there
    b.mean.push_back(a.sum / a.n);
    b.lo.push_back(a.lo);
    b.hi.push_back(a.hi);
    b.n.push_back(a.n);
  }
  return b;
}

bool has_values(const std::vector<Run>& runs, const std::string& col) {
  for (const auto& r : runs)
    if (const auto* v = r.metrics.find(col))
      if (std::any_of(v->begin(), v->end(), [](double d) { return std::isfinite(d); })) return true;
  return false;
}

std::string eval_label(const Run& r) {
  const std::string* e = r.config_value("train.eval_episodes");
  return "evaluation return" + (e ? " (mean of " + *e + " episodes)" : std::string());
}

struct Figures {
  double final_eval = NAN, best_eval = NAN, clock = NAN, wall = NAN, steps_per_s = NAN;
  bool so_far = false;
};
Figures figures(const Run& r) {
  Figures f;
  auto last_finite = [&](const std::string& col) {
    double v = NAN;
    if (const auto* c = r.metrics.find(col))
      for (double d : *c)
        if (std::isfinite(d)) v = d;
    return v;
  };
  if (const auto* c = r.metrics.find("eval_return"))
    for (double d : *c)
      if (std::isfinite(d)) f.best_eval = std::isfinite(f.best_eval) ? std::max(f.best_eval, d) : d;
  f.final_eval = last_finite("eval_return");
  f.clock = last_finite(r.clock);
  f.wall = last_finite("wall_s");
  f.steps_per_s = last_finite("env_steps_per_s");
  f.so_far = !r.summary;
  if (r.summary) {
    const auto& s = *r.summary;
    auto num = [&](const char* k, double& v) {
      if (s.contains(k) && s[k].is_number()) v = s[k].get<double>();
    };
    num("final_eval_return", f.final_eval);
    num("best_eval_return", f.best_eval);
    if (r.sessions == 1) num("wall_seconds", f.wall);  // a resumed run's summary counts its last session only
    num("env_steps_per_s", f.steps_per_s);
    num(r.clock == "updates" ? "updates" : "env_steps", f.clock);
  }
  return f;
}

std::string stat_cell(const std::vector<double>& v) {
  std::vector<double> f;
  for (double d : v)
    if (std::isfinite(d)) f.push_back(d);
  if (f.empty()) return "n/a";
  double sum = 0;
  for (double d : f) sum += d;
  const auto [lo, hi] = std::minmax_element(f.begin(), f.end());
  return number(sum / f.size()) + (f.size() > 1 ? " <small>[" + number(*lo) + ", " + number(*hi) + "]</small>" : "");
}

const char* kStyle = R"(<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px auto;max-width:1500px;padding:0 16px;color:#1f2937;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 2px;color:#374151}
.meta{color:#4b5563}.problems{background:#fef3c7;border:1px solid #f59e0b;padding:8px 14px;border-radius:6px}
.problems li{font-family:ui-monospace,monospace;font-size:12px}
.grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:4px 24px}
svg.chart{width:100%;max-width:720px;height:auto;display:block}svg.bar{width:100%;max-width:720px;height:auto;display:block}
svg text{font-size:11px;fill:#374151}svg text.axis{font-size:12px;fill:#111827}svg text.barlabel{fill:#fff;font-size:11px}
.grid{stroke:#e5e7eb;stroke-width:1}.frame{fill:none;stroke:#9ca3af;stroke-width:1}
.line{fill:none;stroke-linejoin:round;stroke-linecap:round}.faint{opacity:.3}.band{opacity:.16;stroke:none}
.legend{font-size:12px;margin:2px 0 8px}.legend span{margin-right:14px;display:inline-block;overflow-wrap:anywhere}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:4px;vertical-align:-1px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{border:1px solid #e5e7eb;padding:3px 8px;text-align:left}
th{background:#f9fafb}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f9fafb;border:1px solid #e5e7eb;padding:8px;font-size:12px;max-height:480px;overflow:auto}
.status{font-weight:600}.empty{color:#6b7280;font-style:italic}
</style>
)";

std::string run_section(const std::vector<Run>& runs, std::size_t ri, const Options& o, nlohmann::json& data) {
  const Run& r = runs[ri];
  const std::string xcol = axis_column(r, o.x);
  const std::string xl = axis_label(xcol);
  std::string s = "<section class=\"run\" data-run=\"" + escape(r.name) + "\">\n<h2>" + escape(r.name) + "</h2>\n";
  const Figures f = figures(r);
  s += "<p><span class=\"status\">" + escape(r.status) + "</span>" +
       (r.sessions > 1 ? " (resumed: " + std::to_string(r.sessions) + " sessions)" : std::string()) + " &middot; " +
       escape(r.dir.string()) + "<br>";
  s += "final evaluation return <b>" + number(f.final_eval) + "</b>, best " + number(f.best_eval) + (f.so_far ? " (so far)" : "") +
       " &middot; " + number(f.clock) + " " + axis_label(r.clock) + " &middot; " + number(f.wall) + " s wall";
  if (std::isfinite(f.steps_per_s) && r.clock == "env_steps") s += " &middot; " + number(f.steps_per_s) + " env steps/s";
  s += "</p>\n";

  nlohmann::json cols = nlohmann::json::object();
  // The data block keeps every point up to 5,000 a curve, then every k-th (and the last): a
  // run logged every step stays a page a browser opens.
  auto record = [&](const std::string& col, const Curve& c) {
    const std::size_t k = c.x.size() > 5000 ? (c.x.size() + 4999) / 5000 : 1;
    if (k == 1) {
      cols[col] = {{"x", c.x}, {"y", c.y}};
      return;
    }
    std::vector<double> x, y;
    for (std::size_t i = 0; i < c.x.size(); i += k) x.push_back(c.x[i]), y.push_back(c.y[i]);
    if ((c.x.size() - 1) % k != 0) x.push_back(c.x.back()), y.push_back(c.y.back());
    cols[col] = {{"x", x}, {"y", y}, {"every", k}};
  };
  std::string charts;
  // Returns: evaluation, and the training episodes' recent return.
  {
    std::vector<Series> ser;
    const Curve ev = curve(r, "eval_return", xcol), rec = curve(r, "recent_return", xcol);
    if (!rec.y.empty()) add_curve(ser, rec, describe("recent_return"), "#9ca3af", "recent_return", o.smooth, false), record("recent_return", rec);
    if (!ev.y.empty()) add_curve(ser, ev, eval_label(r), kColors[0], "eval_return", o.smooth, true), record("eval_return", ev);
    charts += "<div><h3>Return</h3>\n" + line_chart({xl, "return"}, ser) + "</div>\n";
  }
  // Families: "eval_return/<task>" and the like, one curve per member, the mean in black.
  std::vector<std::string> families;
  for (const auto& n : r.metrics.names)
    if (auto slash = n.find('/'); slash != std::string::npos)
      if (std::find(families.begin(), families.end(), n.substr(0, slash)) == families.end()) families.push_back(n.substr(0, slash));
  for (const auto& fam : families) {
    std::vector<Series> ser;
    std::size_t k = 0;
    for (const auto& n : r.metrics.names) {
      if (n.rfind(fam + "/", 0) != 0) continue;
      const Curve c = curve(r, n, xcol);
      record(n, c);
      add_curve(ser, c, n.substr(fam.size() + 1), kColors[k++ % kColors.size()], n, o.smooth, true);
    }
    if (r.metrics.find(fam)) {
      const Curve c = curve(r, fam, xcol);
      record(fam, c);
      add_curve(ser, c, "mean", "#111827", fam, o.smooth, true);
      ser.back().width = 2.6;
    }
    const bool success = fam.find("success") != std::string::npos;
    const std::string what = fam == "eval_return" ? eval_label(r) : describe(fam);
    const std::string members = fam.rfind("eval_", 0) == 0 ? "task" : "member";  // eval_return/<task>
    charts += "<div><h3>" + escape(what) + ", per " + members + " (" + std::to_string(k) + ")</h3>\n" +
              line_chart({xl, success ? "success rate" : what, success}, ser) + "</div>\n";
  }
  if (families.empty() || std::find(families.begin(), families.end(), "eval_success") == families.end())
    if (const Curve c = curve(r, "eval_success", xcol); !c.y.empty()) {
      std::vector<Series> ser;
      record("eval_success", c);
      add_curve(ser, c, describe("eval_success"), kColors[2], "eval_success", o.smooth, true);
      charts += "<div><h3>Evaluation success</h3>\n" + line_chart({xl, "success rate", true}, ser) + "</div>\n";
    }
  // Training metrics: every other column, one chart each (their scales differ).
  static const std::set<std::string> kNotMetrics = {"env_steps", "updates", "wall_s", "episodes", "eval_return", "recent_return", "eval_success"};
  std::size_t shade = 3;
  for (const auto& n : r.metrics.names) {
    if (n == "env_steps_per_s" && r.clock == "updates") continue;  // learns from a dataset: no env steps
    if (kNotMetrics.count(n) || n.find('/') != std::string::npos || std::find(families.begin(), families.end(), n) != families.end()) continue;
    const Curve c = curve(r, n, xcol);
    record(n, c);
    std::vector<Series> ser;
    add_curve(ser, c, describe(n), kColors[shade++ % kColors.size()], n, o.smooth, false);
    charts += "<div><h3>" + escape(describe(n)) + " <small>(" + escape(n) + ")</small></h3>\n" +
              line_chart({xl, describe(n), n == "env_steps_per_s"}, ser) + "</div>\n";
  }
  s += "<div class=\"grid2\">\n" + charts + "</div>\n";

  // Where the time went.
  if (r.summary && r.summary->contains("phase_seconds") && (*r.summary)["phase_seconds"].is_object()) {
    std::vector<std::pair<std::string, double>> phases;
    for (const auto& [k, v] : (*r.summary)["phase_seconds"].items())
      if (v.is_number()) phases.emplace_back(k, v.get<double>());
    s += "<h3>Where the time went (phase split of " + number(f.wall) + " s)</h3>\n" + phase_bar(phases, kColors);
    if (r.summary->contains("bottleneck") && (*r.summary)["bottleneck"].is_string())
      s += "<p>" + escape((*r.summary)["bottleneck"].get<std::string>()) + "</p>\n";
  } else {
    s += "<h3>Where the time went</h3><p class=\"empty\">written to summary.json when the run ends; not there yet</p>\n";
  }
  if (!r.provenance.empty()) {
    s += "<details open><summary>Provenance</summary><table>";
    for (const auto& [k, v] : r.provenance) s += "<tr><th>" + escape(k) + "</th><td>" + escape(v) + "</td></tr>";
    s += "</table></details>\n";
  }
  if (!r.config_text.empty()) s += "<details><summary>Config (config.yaml)</summary><pre>" + escape(r.config_text) + "</pre></details>\n";
  data["runs"].push_back({{"name", r.name},
                          {"dir", r.dir.string()},
                          {"status", r.status},
                          {"clock", r.clock},
                          {"x_axis", xcol},
                          {"rows", r.metrics.rows()},
                          {"columns", cols}});
  return s + "</section>\n";
}

std::string comparison(const std::vector<Run>& runs, const std::vector<Group>& groups, const Options& o, nlohmann::json& data) {
  std::string s = "<section class=\"comparison\">\n<h2>Comparison: " + std::to_string(runs.size()) + " runs, " +
                  std::to_string(groups.size()) + (groups.size() == 1 ? " setting" : " settings") + "</h2>\n";
  s += "<p class=\"meta\">Runs whose configs agree apart from seeds are one setting; each setting's line is the mean over its "
       "runs, the band their minimum and maximum, n the number of runs (hover a point for its values).</p>\n";
  const std::string xcol = axis_column(runs.front(), o.x);
  std::set<std::string> clocks;
  for (const auto& r : runs) clocks.insert(r.clock);
  std::string note;
  if (clocks.size() > 1 && o.x == "clock") note = " (the runs count different clocks; each is drawn on its own)";
  std::vector<std::string> cols = {"eval_return"};
  if (has_values(runs, "eval_success")) cols.push_back("eval_success");
  cols.push_back("recent_return");
  std::string charts;
  nlohmann::json gdata = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json names = nlohmann::json::array();
    for (std::size_t i : g.runs) names.push_back(runs[i].name);
    gdata.push_back({{"label", g.label}, {"runs", names}, {"series", nlohmann::json::object()}});
  }
  for (const auto& col : cols) {
    if (!has_values(runs, col)) continue;
    std::vector<Series> ser;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const Band b = band(runs, groups[gi], col, o.x, o.smooth);
      if (b.x.empty()) continue;
      gdata[gi]["series"][col] = {{"x", b.x}, {"mean", b.mean}, {"min", b.lo}, {"max", b.hi}, {"n", b.n}};
      ser.push_back({groups[gi].label + " (n=" + std::to_string(groups[gi].runs.size()) + ")", kColors[gi % kColors.size()], b.x,
                     b.mean, b.lo, b.hi, b.n, "group " + std::to_string(gi) + " " + col, false, col != "recent_return", 2.0});
    }
    const bool success = col == "eval_success";
    const std::string what = col == "eval_return" ? eval_label(runs.front()) : describe(col);
    charts += "<div><h3>" + escape(what) + ": mean and min-max over runs</h3>\n" +
              line_chart({axis_label(xcol) + note, success ? "success rate" : what, success}, ser) + "</div>\n";
  }
  s += "<div class=\"grid2\">\n" + charts + "</div>\n";
  data["groups"] = gdata;
  // The final/best table, by setting, then by run.
  s += "<h3>Final and best evaluation return, by setting (mean [min, max])</h3>\n<table class=\"settings\"><tr><th>setting</th>"
       "<th>n</th><th>final</th><th>best</th><th>reached</th><th>wall time (s)</th></tr>\n";
  for (const auto& g : groups) {
    std::vector<double> fin, best, clock, wall;
    bool so_far = false;
    for (std::size_t i : g.runs) {
      const Figures f = figures(runs[i]);
      fin.push_back(f.final_eval), best.push_back(f.best_eval), clock.push_back(f.clock), wall.push_back(f.wall);
      so_far |= f.so_far;
    }
    s += "<tr><td>" + escape(g.label) + "</td><td class=\"num\">" + std::to_string(g.runs.size()) + "</td><td class=\"num\">" +
         stat_cell(fin) + (so_far ? " (so far)" : "") + "</td><td class=\"num\">" + stat_cell(best) + "</td><td class=\"num\">" +
         stat_cell(clock) + " " + axis_label(runs[g.runs.front()].clock) + "</td><td class=\"num\">" + stat_cell(wall) + "</td></tr>\n";
  }
  s += "</table>\n<table class=\"runs\"><tr><th>run</th><th>setting</th><th>status</th><th>final</th><th>best</th><th>wall time (s)</th></tr>\n";
  for (const auto& g : groups)
    for (std::size_t i : g.runs) {
      const Figures f = figures(runs[i]);
      s += "<tr><td>" + escape(runs[i].name) + "</td><td>" + escape(g.label) + "</td><td>" + escape(runs[i].status) +
           "</td><td class=\"num\">" + number(f.final_eval) + "</td><td class=\"num\">" + number(f.best_eval) +
           "</td><td class=\"num\">" + number(f.wall) + "</td></tr>\n";
    }
  return s + "</table>\n</section>\n";
}

int parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* what) -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs " + what);
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a == "-o" || a == "--output") {
      o.out = value("a file name");
    } else if (a == "--x") {
      o.x = value("clock, steps, updates or wall");
      if (o.x != "clock" && o.x != "steps" && o.x != "updates" && o.x != "wall")
        throw std::runtime_error("--x " + o.x + ": the x-axis is clock, steps, updates or wall");
    } else if (a == "--smooth") {
      const std::string v = value("a weight in [0, 0.99]");
      char* end = nullptr;
      o.smooth = std::strtod(v.c_str(), &end);
      if (!end || *end || !(o.smooth >= 0 && o.smooth <= 0.99))
        throw std::runtime_error("--smooth " + v + ": the smoothing weight is a number in [0, 0.99]");
    } else if (a == "--title") {
      o.title = value("a title");
    } else if (!a.empty() && a[0] == '-') {
      throw std::runtime_error(a + ": unknown option");
    } else {
      o.inputs.push_back(a);
    }
  }
  if (o.inputs.empty()) throw std::runtime_error("no run directory given");
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    if (const int rc = parse(argc, argv, o); rc >= 0) return rc;
  } catch (const std::exception& e) {
    std::cerr << "anvil-report: " << e.what() << "\n" << kUsage;
    return 2;
  }
  Problems problems;
  std::vector<Run> runs = read_inputs(o.inputs, problems);
  for (const auto& p : problems.list) std::cerr << "anvil-report: " << p << "\n";
  if (runs.empty()) {
    std::cerr << "anvil-report: nothing to report\n";
    return 2;
  }
  nlohmann::json data = {{"runs", nlohmann::json::array()}, {"groups", nlohmann::json::array()}, {"problems", problems.list}};
  const auto groups = group_runs(runs);
  std::string body;
  if (runs.size() > 1) body += comparison(runs, groups, o, data);
  for (std::size_t i = 0; i < runs.size(); ++i) body += run_section(runs, i, o, data);

  char when[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"viewport\" "
                     "content=\"width=device-width, initial-scale=1\">\n<title>" + escape(o.title) + "</title>\n" + kStyle +
                     "</head><body>\n<h1>" + escape(o.title) + "</h1>\n<p class=\"meta\">" + std::to_string(runs.size()) +
                     (runs.size() == 1 ? " run" : " runs") + " from ";
  for (std::size_t i = 0; i < o.inputs.size(); ++i) page += (i ? ", " : "") + std::string("<code>") + escape(o.inputs[i]) + "</code>";
  page += ", written " + std::string(when) + ". x-axis: " +
          (o.x == "clock" ? std::string("each run's own clock (env steps; gradient updates for offline and staged runs)")
                          : axis_label(o.x == "steps" ? "env_steps" : o.x == "wall" ? "wall_s" : "updates")) +
          "; smoothing: " + (o.smooth > 0 ? "exponential moving average, weight " + number(o.smooth) + " (raw curves faint)" : "off") +
          ". Options: <code>--x wall</code>, <code>--smooth 0.6</code>.</p>\n";
  if (!problems.list.empty()) {
    page += "<div class=\"problems\"><b>Not all of the input could be read</b> (the rest is reported):<ul>";
    for (const auto& p : problems.list) page += "<li>" + escape(p) + "</li>";
    page += "</ul></div>\n";
  }
  page += body;
  std::string json = data.dump();
  for (std::size_t at = 0; (at = json.find("</", at)) != std::string::npos; at += 3) json.replace(at, 2, "<\\/");
  page += "<script type=\"application/json\" id=\"anvil-report-data\">" + json + "</script>\n</body></html>\n";

  const std::filesystem::path out(o.out);
  const std::filesystem::path tmp = out.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << page;
    if (!f.flush()) {
      std::cerr << "anvil-report: " << o.out << ": cannot be written\n";
      return 2;
    }
  }
  std::filesystem::rename(tmp, out);
  std::cout << "anvil-report: " << runs.size() << (runs.size() == 1 ? " run" : " runs") << " in " << groups.size()
            << (groups.size() == 1 ? " setting" : " settings") << " -> " << o.out << " (" << page.size() / 1024 << " KiB)"
            << (problems.list.empty() ? "" : "; " + std::to_string(problems.list.size()) + " problem(s) listed on the page") << "\n";
  return problems.list.empty() ? 0 : 1;
}
