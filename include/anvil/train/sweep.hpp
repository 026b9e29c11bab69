#pragma once
/// @file
/// Sweeps, in Hydra's syntax: `--multirun seed=1,2,3 sac.batch_size=256,512` runs the cross
/// product of the comma-separated values (here 6 runs) one after the other, or N at a time
/// with `--jobs N`. Each run is this program started again with one value per key and its
/// own run directory under the sweep's (`--run_dir`, default `runs/sweep-<program>-<time>`),
/// its output in `<run>.log` beside it. At the end a table of each run's final and best
/// evaluation returns is printed and written to `sweep.csv` (and `sweep.json`) in the sweep
/// directory; the sweep exits 0 when every run did. A list value (`sac.actor.hidden=[64,64]`)
/// is one value, not a sweep. SIGINT/SIGTERM reach every running run once (each stops with
/// a checkpoint, train/signals.hpp) and no new run starts. Linux/POSIX. `anvil::start`
/// drives a sweep; this file is the part that does not depend on the Trainer's type.

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <anvil/core/error.hpp>
#include <anvil/observe/progress.hpp>
#include <anvil/observe/run_files.hpp>

extern char** environ;

namespace anvil {

/// What a sweep runs (see file comment).
struct SweepPlan {
  std::string program;                 ///< the program's name, for the default directory
  std::vector<std::string> base;       ///< arguments every run gets (no --multirun, --jobs, --run_dir or swept keys)
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;  ///< swept keys as written, with their values
  int jobs = 1;
  std::filesystem::path dir;           ///< the sweep's directory (empty: the default)

  /// Every run's overrides (`key=value`, one per axis), the last axis changing fastest.
  [[nodiscard]] std::vector<std::vector<std::string>> runs() const {
    std::vector<std::vector<std::string>> out{{}};
    for (const auto& [key, values] : axes) {
      std::vector<std::vector<std::string>> next;
      for (const auto& prefix : out)
        for (const auto& v : values) {
          auto r = prefix;
          r.push_back(key + "=" + v);
          next.push_back(std::move(r));
        }
      out = std::move(next);
    }
    return out;
  }
  /// The full arguments (after the program name) of run `overrides`, in directory `run_dir`.
  [[nodiscard]] std::vector<std::string> arguments(const std::vector<std::string>& overrides,
                                                   const std::filesystem::path& run_dir) const {
    auto a = base;
    a.insert(a.end(), overrides.begin(), overrides.end());
    a.push_back("--run_dir=" + run_dir.string());
    return a;
  }
};

namespace detail {
// Splits `v` at commas outside brackets ("1,2,[3,4]" -> "1", "2", "[3,4]").
inline std::vector<std::string> split_top_level(const std::string& v) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (char c : v) {
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0) out.emplace_back();
    else out.back() += c;
  }
  return out;
}
}  // namespace detail

/// The sweep a command line asks for (`raw`: the arguments after the program name), or
/// throws ConfigError naming what is wrong.
[[nodiscard]] inline SweepPlan plan_sweep(const std::string& program, const std::vector<std::string>& raw) {
  SweepPlan p;
  p.program = program;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const std::string& a = raw[i];
    if (a == "--multirun" || a == "-m") continue;
    if (a == "--jobs" || a.rfind("--jobs=", 0) == 0) {
      std::string v = a == "--jobs" ? (i + 1 < raw.size() ? raw[++i] : "") : a.substr(7);
      try {
        p.jobs = std::stoi(v);
      } catch (const std::exception&) {
        p.jobs = 0;
      }
      if (p.jobs < 1 || p.jobs > 1024) throw ConfigError("--jobs=" + v + ": must be a number of runs from 1 to 1024");
      continue;
    }
    const std::string body = a.rfind("--", 0) == 0 ? a.substr(2) : a;
    const auto eq = body.find('=');
    if (eq != std::string::npos) {
      const std::string key = body.substr(0, eq), value = body.substr(eq + 1);
      if (key == "run_dir" || key == "run.run_dir" || key == "run-dir") {
        p.dir = value;
        continue;
      }
      auto values = detail::split_top_level(value);
      if (values.size() > 1) {
        for (const auto& v : values)
          if (v.empty()) throw ConfigError("--multirun: '" + a + "' has an empty value");
        if (key == "resume" || key == "run.resume")
          throw ConfigError("--multirun: run.resume cannot be swept; a sweep's runs each start afresh");
        p.axes.emplace_back(key, std::move(values));
        continue;
      }
    } else if (a == "--run_dir" && i + 1 < raw.size()) {
      p.dir = raw[++i];
      continue;
    }
    p.base.push_back(a);
  }
  if (p.axes.empty())
    throw ConfigError("--multirun: no key has several values; write them comma-separated, e.g. seed=1,2,3");
  return p;
}

/// One run of a sweep, as it ended.
struct SweepRun {
  std::string name;
  std::vector<std::string> overrides;
  int status = -1;  ///< exit status (128 + signal when killed)
  double final_eval = NAN, best_eval = NAN, wall = NAN;
  std::int64_t env_steps = 0;
};

namespace detail {
inline volatile std::sig_atomic_t g_sweep_stop = 0;
inline pid_t g_sweep_children[1024];
inline volatile std::sig_atomic_t g_sweep_child_count = 0;
inline void sweep_forward(int sig) {
  g_sweep_stop = sig;
  for (int i = 0; i < g_sweep_child_count; ++i)
    if (g_sweep_children[i] > 0) ::kill(g_sweep_children[i], sig);
}
inline std::string sweep_run_name(std::size_t index, const std::vector<std::string>& overrides) {
  std::string n = std::to_string(index);
  for (const auto& o : overrides) {
    n += "_";
    for (char c : o) n += (c == '/' || c == ' ' || c == '[' || c == ']' || c == ',') ? '-' : c;
  }
  return n;
}
}  // namespace detail

/// Runs `plan` (see file comment) and returns the exit status for the sweep: 0 when every
/// run succeeded, 1 when one failed, 128 + signal when it was stopped.
inline int run_sweep(const SweepPlan& plan) {
  namespace fs = std::filesystem;
  const fs::path dir = plan.dir.empty() ? fresh_run_dir("runs", "sweep-" + plan.program) : plan.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("--run_dir: cannot create the sweep directory '" + dir.string() + "': " + ec.message());
  const auto all = plan.runs();
  if (all.size() > 100'000) throw ConfigError("--multirun: " + std::to_string(all.size()) + " runs is too many");
  std::vector<SweepRun> runs(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    runs[i].overrides = all[i];
    runs[i].name = detail::sweep_run_name(i, all[i]);
  }
  std::printf("sweep: %zu runs, %d at a time, in %s\n", runs.size(), plan.jobs, dir.string().c_str());
  std::fflush(stdout);

  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = &detail::sweep_forward;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  detail::g_sweep_stop = 0;

  std::map<pid_t, std::size_t> running;
  std::size_t next = 0, finished = 0;
  auto start = [&](std::size_t i) {
    const auto run_dir = dir / runs[i].name;
    const auto log = dir / (runs[i].name + ".log");
    std::vector<std::string> args{plan.program};  // argv[0]: the program's name; the file is /proc/self/exe
    for (auto& a : plan.arguments(runs[i].overrides, run_dir)) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("--multirun: cannot start run " + runs[i].name + ": fork failed");
    if (pid == 0) {  // only async-signal-safe calls until exec
      ::setpgid(0, 0);  // a terminal's Ctrl-C reaches it through the sweep, once
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execve("/proc/self/exe", argv.data(), environ);
      ::_exit(127);
    }
    running[pid] = i;
    int slot = 0;
    while (slot < detail::g_sweep_child_count && detail::g_sweep_children[slot] > 0) ++slot;
    detail::g_sweep_children[slot] = pid;
    if (slot == detail::g_sweep_child_count) detail::g_sweep_child_count = slot + 1;
    std::string what;
    for (const auto& o : runs[i].overrides) what += (what.empty() ? "" : " ") + o;
    std::printf("[%zu/%zu] started: %s (log: %s)\n", i + 1, runs.size(), what.c_str(), log.string().c_str());
    std::fflush(stdout);
  };
  while (finished < runs.size()) {
    while (!detail::g_sweep_stop && next < runs.size() && static_cast<int>(running.size()) < plan.jobs) start(next++);
    if (running.empty()) break;  // stopped before the rest started
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    for (int s = 0; s < detail::g_sweep_child_count; ++s)
      if (detail::g_sweep_children[s] == pid) detail::g_sweep_children[s] = -1;
    auto& r = runs[it->second];
    running.erase(it);
    ++finished;
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream in(dir / r.name / "summary.json");
    if (in) {
      try {
        const auto j = nlohmann::json::parse(in);
        auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN; };
        r.final_eval = num("final_eval_return");
        r.best_eval = num("best_eval_return");
        r.wall = num("wall_seconds");
        r.env_steps = j.contains("env_steps") && j["env_steps"].is_number() ? j["env_steps"].get<std::int64_t>() : 0;
      } catch (const std::exception&) {
      }
    }
    std::printf("[%zu/%zu] %s: %s, final eval %s (best %s)\n", finished, runs.size(), r.name.c_str(),
                r.status == 0 ? "done" : ("exit status " + std::to_string(r.status)).c_str(), metric_text(r.final_eval).c_str(),
                metric_text(r.best_eval).c_str());
    std::fflush(stdout);
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);

  // The table, on the console and in sweep.csv / sweep.json.
  std::vector<std::string> keys;
  for (const auto& [k, v] : plan.axes) keys.push_back(k);
  std::string csv = "run";
  for (const auto& k : keys) csv += "," + k;
  csv += ",exit_status,final_eval_return,best_eval_return,env_steps,wall_seconds\n";
  nlohmann::ordered_json table = nlohmann::ordered_json::array();
  std::printf("\n%-6s", "run");
  for (const auto& k : keys) std::printf(" %-16s", k.c_str());
  std::printf(" %6s %12s %12s\n", "status", "final eval", "best eval");
  int failed = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    nlohmann::ordered_json row;
    row["run"] = r.name;
    csv += std::to_string(i);
    std::printf("%-6zu", i);
    for (std::size_t a = 0; a < keys.size(); ++a) {
      const auto v = r.overrides[a].substr(r.overrides[a].find('=') + 1);
      csv += "," + v;
      row[keys[a]] = v;
      std::printf(" %-16s", v.c_str());
    }
    auto cell = [](double x) { return std::isfinite(x) ? json_number(x) : std::string(); };
    csv += "," + (r.status < 0 ? std::string() : std::to_string(r.status)) + "," + cell(r.final_eval) + "," +
           cell(r.best_eval) + "," + std::to_string(r.env_steps) + "," + cell(r.wall) + "\n";
    row["exit_status"] = r.status < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(r.status);
    row["final_eval_return"] = std::isfinite(r.final_eval) ? nlohmann::ordered_json(r.final_eval) : nlohmann::ordered_json();
    row["best_eval_return"] = std::isfinite(r.best_eval) ? nlohmann::ordered_json(r.best_eval) : nlohmann::ordered_json();
    row["env_steps"] = r.env_steps;
    table.push_back(row);
    std::printf(" %6s %12s %12s\n", r.status < 0 ? "-" : std::to_string(r.status).c_str(), metric_text(r.final_eval).c_str(),
                metric_text(r.best_eval).c_str());
    if (r.status != 0) ++failed;
  }
  write_file_atomic(dir / "sweep.csv", csv);
  write_file_atomic(dir / "sweep.json", table.dump(2) + "\n");
  std::printf("sweep: %zu of %zu runs succeeded; table in %s\n", runs.size() - static_cast<std::size_t>(failed),
              runs.size(), (dir / "sweep.csv").string().c_str());
  std::fflush(stdout);
  if (detail::g_sweep_stop) return 128 + detail::g_sweep_stop;
  return failed ? 1 : 0;
}

}  // namespace anvil
