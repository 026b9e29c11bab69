#pragma once
/// @file
/// `ProgressHook`: the console of a run (rank 0): a live bar on a terminal, redrawn as the
/// run goes (at most ten times a second), or one line per log row when the output is a file
/// or a pipe; messages on lines of their own without breaking the bar (`run.progress`).
/// Not a template.

#include <string>

#include <anvil/observe/progress.hpp>
#include <anvil/train/run_config.hpp>

namespace anvil {

/// The console of a run (see file comment).
class ProgressHook {
 public:
  /// No progress shown (ranks other than 0, which also say nothing).
  ProgressHook() : p_(Progress::Style::off) {}
  /// Shows progress as `mode` says (`auto`: a bar on a terminal, lines otherwise).
  explicit ProgressHook(ProgressMode mode)
      : p_(mode == ProgressMode::auto_ ? Progress::detect()
           : mode == ProgressMode::bar ? Progress::Style::bar
           : mode == ProgressMode::lines ? Progress::Style::lines
                                         : Progress::Style::off) {}

  /// After each iteration: redraws the bar.
  void iteration(const ProgressState& s) {
    if (p_.style() == Progress::Style::bar) p_.show(s);
  }
  /// At each log row: a line (lines mode).
  void row(const ProgressState& s) {
    if (p_.style() == Progress::Style::lines) p_.show(s, true);
  }
  /// A line under a log row (lines mode), e.g. the timing split.
  void echo(const std::string& line) {
    if (p_.style() == Progress::Style::lines) p_.message(line);
  }
  /// A message on its own line (whatever the style: `off` silences only the progress).
  void say(const std::string& m) { p_.message(m); }
  /// Ends the bar's line.
  void finish() { p_.finish(); }
  [[nodiscard]] Progress::Style style() const noexcept { return p_.style(); }

 private:
  Progress p_;
};

}  // namespace anvil
