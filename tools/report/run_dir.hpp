#pragma once
// anvil-report, reading: a run directory's metrics.csv, summary.json and config.yaml, read
// as far as they are good. Anything damaged or missing is reported by a sentence naming the
// file (and line), and the rest of the run is still read: a torn last row of a run that was
// cut off, a run still in progress (no summary.json yet), an empty run (no rows yet).

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <anvil/observe/run_files.hpp>

namespace anvil::report {

namespace fs = std::filesystem;

/// What could not be read, one sentence each, naming the file.
struct Problems {
  std::vector<std::string> list;
  void add(std::string s) { list.push_back(std::move(s)); }
};

/// metrics.csv as columns of numbers (NaN where a cell is empty: a row without an evaluation).
struct Table {
  std::vector<std::string> names;
  std::vector<std::vector<double>> cols;
  [[nodiscard]] std::size_t rows() const { return cols.empty() ? 0 : cols.front().size(); }
  [[nodiscard]] const std::vector<double>* find(const std::string& name) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return &cols[i];
    return nullptr;
  }
};

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

/// Reads metrics.csv: whole rows only. A last row without its newline is torn (the run was
/// cut off while writing it, or is writing it now) and left out; a row with the wrong number
/// of fields is left out; a cell that is not a number is left empty. Each is reported.
inline Table read_metrics(const fs::path& file, Problems& problems) {
  Table t;
  if (!fs::exists(file)) {
    problems.add(file.string() + ": missing; the run has no metrics rows to draw (an empty run, or not a run directory)");
    return t;
  }
  const std::string text = read_text(file);
  if (text.empty()) {
    problems.add(file.string() + ": empty (the run wrote no row yet)");
    return t;
  }
  std::vector<std::string> lines = split(text, '\n');
  const bool ends_whole = text.back() == '\n';
  const std::string torn = lines.back();  // after the last '\n': empty, or a torn row
  lines.pop_back();
  if (!ends_whole) {
    if (lines.empty()) {
      problems.add(file.string() + ": the header line is torn (no newline); nothing can be read");
      return t;
    }
    problems.add(file.string() + ": line " + std::to_string(lines.size() + 1) + " is torn (" +
                 std::to_string(split(torn, ',').size()) + " fields, no newline: the run was cut off while writing it, "
                 "or is writing it now); left out, the rows before it are shown");
  }
  t.names = split(lines.front(), ',');
  if (t.names.size() < 2 || t.names.front() != "env_steps") {
    problems.add(file.string() + ": line 1 is not a metrics header (it should begin with env_steps); nothing read");
    t.names.clear();
    return t;
  }
  t.cols.assign(t.names.size(), {});
  int bad_cells = 0;
  std::string first_bad;
  for (std::size_t li = 1; li < lines.size(); ++li) {
    if (lines[li].empty()) continue;
    const auto cells = split(lines[li], ',');
    if (cells.size() != t.names.size()) {
      problems.add(file.string() + ": line " + std::to_string(li + 1) + " has " + std::to_string(cells.size()) +
                   " fields, the header " + std::to_string(t.names.size()) + "; left out");
      continue;
    }
    for (std::size_t c = 0; c < cells.size(); ++c) {
      double v = std::numeric_limits<double>::quiet_NaN();
      if (!cells[c].empty()) {
        char* end = nullptr;
        const double parsed = std::strtod(cells[c].c_str(), &end);
        if (end && *end == '\0') {
          v = parsed;
        } else if (bad_cells++ == 0) {
          first_bad = "line " + std::to_string(li + 1) + ", column " + t.names[c] + ": '" + cells[c] + "'";
        }
      }
      t.cols[c].push_back(v);
    }
  }
  if (bad_cells > 0)
    problems.add(file.string() + ": " + std::to_string(bad_cells) + " cell(s) are not numbers and are left empty (first: " +
                 first_bad + ")");
  if (t.rows() == 0 && ends_whole) problems.add(file.string() + ": a header but no rows yet (an empty run)");
  return t;
}

/// One run directory, as far as it could be read.
struct Run {
  fs::path dir;
  std::string name;                                  ///< how the report names it
  Table metrics;
  std::optional<nlohmann::json> summary;             ///< absent while the run is in progress
  std::string config_text;                           ///< config.yaml as written
  std::vector<std::pair<std::string, std::string>> config;  ///< flattened: "sac.batch_size" -> "256"
  std::vector<std::pair<std::string, std::string>> provenance;
  std::string clock = "env_steps";                   ///< the run's own clock: env_steps, or updates (offline, staged)
  std::string status;                                ///< finished, stopped ..., or in progress
  int sessions = 1;                                  ///< 1 + how often the run was resumed (its wall clock restarted)

  [[nodiscard]] const std::string* config_value(const std::string& key) const {
    for (const auto& [k, v] : config)
      if (k == key) return &v;
    return nullptr;
  }
};

/// Flattens anvil's config.yaml (two-space indentation, `key: value`, inline lists) into
/// dotted keys; its `# key: value` header lines are the run's provenance.
inline void read_config(Run& run, const std::string& text) {
  std::vector<std::string> stack;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      const auto colon = line.find(": ");
      if (colon != std::string::npos && colon > 2) run.provenance.emplace_back(line.substr(2, colon - 2), line.substr(colon + 2));
      continue;
    }
    const std::size_t indent = line.find_first_not_of(' ');
    const auto colon = line.find(':', indent);
    if (colon == std::string::npos) continue;
    const std::size_t level = indent / 2;
    stack.resize(std::min(stack.size(), level));
    const std::string key = line.substr(indent, colon - indent);
    std::string value = colon + 1 < line.size() ? line.substr(colon + 2) : "";
    if (value.empty()) {
      stack.push_back(key);
      continue;
    }
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    std::string full;
    for (const auto& s : stack) full += s + ".";
    run.config.emplace_back(full + key, value);
  }
}

/// Reads one run directory; every problem is added to `problems`.
inline Run read_run(const fs::path& dir, std::string name, Problems& problems) {
  Run run;
  run.dir = dir;
  run.name = std::move(name);
  run.metrics = read_metrics(dir / "metrics.csv", problems);
  if (fs::exists(dir / "config.yaml")) {
    run.config_text = read_text(dir / "config.yaml");
    read_config(run, run.config_text);
  } else {
    problems.add((dir / "config.yaml").string() + ": missing; the run is shown without its config");
  }
  const fs::path summary = dir / "summary.json";
  if (fs::exists(summary)) {
    try {
      run.summary = nlohmann::json::parse(read_text(summary));
      if (!run.summary->is_object()) throw std::runtime_error("not a JSON object");
      if (run.summary->contains("provenance") && (*run.summary)["provenance"].is_object()) {
        run.provenance.clear();
        for (const auto& [k, v] : (*run.summary)["provenance"].items())
          run.provenance.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
      }
      run.status = run.summary->value("status", "finished");
    } catch (const std::exception& e) {
      problems.add(summary.string() + ": not valid JSON (" + e.what() + "); the run is shown without it");
      run.summary.reset();
    }
  }
  // wall_s counts from each session's start; a resumed run's sessions are laid end to end.
  if (run.metrics.find("wall_s")) {
    auto& wall = run.metrics.cols[static_cast<std::size_t>(
        std::find(run.metrics.names.begin(), run.metrics.names.end(), "wall_s") - run.metrics.names.begin())];
    double offset = 0, last = 0;
    for (double& w : wall) {
      if (!std::isfinite(w)) continue;
      if (w + offset < last) offset = last, ++run.sessions;
      w += offset;
      last = w;
    }
  }
  if (run.status.empty()) {
    const auto held = RunDirLock::held_by_a_process(dir);  // the lock a run holds for its life
    run.status = held && *held    ? "in progress (running now: what is there so far)"
                 : held && !*held ? std::string(fs::exists(summary) ? "ended without a readable summary.json"
                                                                    : "ended without a summary.json (killed or crashed: its last "
                                                                      "checkpoint can be resumed)")
                                  : "no summary.json (in progress, or ended without one)";
  }
  for (const auto& [k, v] : run.provenance)
    if (k == "loop" && (v.find("Offline") != std::string::npos || v.find("Staged") != std::string::npos)) run.clock = "updates";
  if (const auto* steps = run.metrics.find("env_steps");
      steps && !steps->empty() && std::all_of(steps->begin(), steps->end(), [](double v) { return !(v > 0); }))
    run.clock = "updates";  // no env steps at all: the run learns from a dataset
  return run;
}

/// Whether `dir` holds a run (its files), as opposed to a sweep of runs.
inline bool is_run_dir(const fs::path& dir) {
  return fs::exists(dir / "metrics.csv") || fs::exists(dir / "config.yaml") || fs::exists(dir / "summary.json");
}

/// The number a sweep puts before a run's name ("12_seed=3"), for ordering runs 2 before 10.
inline long leading_number(const std::string& s) {
  char* end = nullptr;
  const long n = std::strtol(s.c_str(), &end, 10);
  return end != s.c_str() ? n : -1;
}

/// Expands the paths given on the command line into runs: a run directory is one run; a
/// directory of run directories (a sweep, or any folder of runs) is each of them.
inline std::vector<Run> read_inputs(const std::vector<std::string>& paths, Problems& problems) {
  std::vector<Run> runs;
  for (const auto& p : paths) {
    const fs::path dir(p);
    if (!fs::exists(dir)) {
      problems.add(p + ": no such file or directory");
      continue;
    }
    if (!fs::is_directory(dir)) {
      problems.add(p + ": not a directory (give a run directory, or a sweep's directory)");
      continue;
    }
    if (is_run_dir(dir)) {
      runs.push_back(read_run(dir, dir.lexically_normal().string(), problems));
      continue;
    }
    std::vector<fs::path> subs;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() && is_run_dir(e.path())) subs.push_back(e.path());
    if (subs.empty()) {
      problems.add(p + ": not a run directory (no metrics.csv, config.yaml or summary.json) and no run directories in it");
      continue;
    }
    std::sort(subs.begin(), subs.end(), [](const fs::path& a, const fs::path& b) {
      const auto na = leading_number(a.filename().string()), nb = leading_number(b.filename().string());
      return na != nb ? na < nb : a.filename() < b.filename();
    });
    const std::size_t first = runs.size();
    for (const auto& s : subs) runs.push_back(read_run(s, s.filename().string(), problems));
    // A sweep's own table says which runs failed: name them (their console output is beside them).
    if (fs::exists(dir / "sweep.json")) {
      try {
        for (const auto& r : nlohmann::json::parse(read_text(dir / "sweep.json")))
          if (r.value("exit_status", 0) != 0) {
            for (std::size_t k = first; k < runs.size(); ++k)
              if (runs[k].name == r.value("run", std::string()))
                runs[k].status = "failed: exit status " + std::to_string(r.value("exit_status", 0)) + " (see " + runs[k].name + ".log)";
            problems.add((dir / r.value("run", std::string("?"))).string() + ": the sweep says this run exited with status " +
                         std::to_string(r.value("exit_status", 0)) + " (its console output: " + r.value("run", std::string("?")) +
                         ".log beside it)");
          }
      } catch (const std::exception& e) {
        problems.add((dir / "sweep.json").string() + ": not valid JSON (" + e.what() + "); the runs are read from their directories");
      }
    }
  }
  return runs;
}

/// Config keys that do not make a setting: what differs between seeds of one setting.
inline bool ignored_in_setting(const std::string& key) {
  return key == "run.seed" || key == "run.run_dir" || key == "run.resume" || key == "run.export" ||
         (key.size() > 5 && key.compare(key.size() - 5, 5, ".seed") == 0);
}

/// Runs with the same config apart from their seeds (and directories): one setting.
struct Group {
  std::string label;                       ///< "sac.batch_size=64", the keys that differ between groups
  std::vector<std::size_t> runs;           ///< indices into the runs
};

inline std::vector<Group> group_runs(const std::vector<Run>& runs) {
  // A run's setting: its config (seeds and paths aside) and the types it was built from.
  auto setting = [](const Run& r) {
    std::vector<std::pair<std::string, std::string>> kv;
    for (const auto& [k, v] : r.provenance)
      if (k == "env" || k == "algorithm" || k == "buffer" || k == "parallelism" || k == "precision" || k == "loop")
        kv.emplace_back(k, v);
    for (const auto& [k, v] : r.config)
      if (!ignored_in_setting(k)) kv.emplace_back(k, v);
    std::sort(kv.begin(), kv.end());  // summary.json's provenance is in another order than config.yaml's header
    return kv;
  };
  std::vector<std::vector<std::pair<std::string, std::string>>> settings;
  for (const auto& r : runs) settings.push_back(setting(r));
  // The label names the keys every run has whose values differ (keys only some runs have
  // come with another algorithm or env, which the label names).
  auto value_of = [](const std::vector<std::pair<std::string, std::string>>& kv, const std::string& key) -> const std::string* {
    for (const auto& [k, v] : kv)
      if (k == key) return &v;
    return nullptr;
  };
  std::vector<std::string> differing;
  for (const auto& [k, v] : settings.front()) {
    bool everywhere = true, differs = false;
    for (const auto& kv : settings) {
      const std::string* w = value_of(kv, k);
      everywhere &= w != nullptr;
      differs |= w && *w != v;
    }
    if (everywhere && differs) differing.push_back(k);
  }
  std::vector<Group> groups;
  std::vector<const std::vector<std::pair<std::string, std::string>>*> keys;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    auto it = std::find_if(keys.begin(), keys.end(), [&](const auto* kv) { return *kv == settings[i]; });
    if (it != keys.end()) {
      groups[static_cast<std::size_t>(it - keys.begin())].runs.push_back(i);
      continue;
    }
    std::string label;
    for (const auto& k : differing) label += (label.empty() ? "" : " ") + k + "=" + *value_of(settings[i], k);
    if (label.empty()) label = runs.size() == 1 || keys.empty() ? "one setting" : runs[i].name;
    for (const auto& g : groups)
      if (g.label == label) label += " (" + runs[i].name + ")";  // differs only in keys the others lack
    keys.push_back(&settings[i]);
    groups.push_back({label, {i}});
  }
  return groups;
}

}  // namespace anvil::report
