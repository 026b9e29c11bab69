#pragma once
/// @file
/// Signals a training run answers (the run's side; parallel/launch.hpp forwards them to
/// the ranks):
///  - the first SIGINT (Ctrl-C) or SIGTERM (a cluster's preemption: SLURM sends SIGTERM,
///    then SIGKILL after a grace period) asks the run to stop: it finishes the current
///    iteration, writes a log row, a checkpoint and summary.json, and `fit` throws
///    `Interrupted`, which exits 130 (SIGINT) or 143 (SIGTERM). `--resume=auto` in the
///    same run directory continues it, e.g. in a requeued job;
///  - a second SIGINT or SIGTERM ends the process at once (exit 130 or 143). The same signal
///    delivered twice within half a second (by the terminal to a whole process group and
///    by a launcher forwarding it) counts once;
///  - SIGUSR1 asks for a checkpoint at the end of the current iteration; the run goes on.
///
/// The handlers only set flags (async-signal-safe); a `Run` installs them for the run's
/// life (`Handlers`) and reads the flags between iterations. Linux/POSIX.

#include <array>
#include <csignal>
#include <ctime>
#include <string>

#include <unistd.h>

#include <anvil/core/error.hpp>

namespace anvil {

/// What `fit` throws after a run stopped on SIGINT or SIGTERM had saved what it had
/// (checkpoint, summary): its exit code is 128 + the signal, and an uncaught one prints
/// `stopped: <message>`.
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& message) : Error(message), signal_(signal) {}
  [[nodiscard]] int exit_code() const noexcept override { return 128 + signal_; }
  [[nodiscard]] const char* label() const noexcept override { return "stopped"; }
  [[nodiscard]] int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

namespace signals {

namespace detail {
inline volatile std::sig_atomic_t g_stop = 0;        // SIGINT or SIGTERM, once asked
inline volatile std::sig_atomic_t g_checkpoint = 0;  // SIGUSR1 since the last take
inline std::timespec g_first{};                      // when the stop signal came

inline void on_signal(int sig) {
  if (sig == SIGUSR1) {
    g_checkpoint = 1;
    return;
  }
  std::timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  if (g_stop == 0) {
    g_stop = sig;
    g_first = now;
    return;
  }
  const double since = static_cast<double>(now.tv_sec - g_first.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec - g_first.tv_nsec);
  if (sig == g_stop && since < 0.5) return;  // one signal, delivered twice
  static const char msg[] = "\nstopped: a second signal; exiting at once (the last checkpoint is intact)\n";
  (void)!::write(2, msg, sizeof msg - 1);
  ::_exit(128 + sig);
}
}  // namespace detail

/// The handlers, installed for an object's life (a `Run` holds one from `begin` to the
/// end of the run); the actions there were before come back after. Flags from an earlier
/// run are forgotten on install.
class Handlers {
 public:
  Handlers() = default;
  Handlers(const Handlers&) = delete;
  Handlers& operator=(const Handlers&) = delete;
  ~Handlers() { restore(); }
  void install() {
    if (installed_) return;
    detail::g_stop = 0;
    detail::g_checkpoint = 0;
    struct sigaction sa {};
    sa.sa_handler = &detail::on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
    installed_ = true;
  }
  void restore() {
    if (!installed_) return;
    for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    installed_ = false;
  }

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGUSR1};
  std::array<struct sigaction, 3> old_{};
  bool installed_ = false;
};

/// The stop signal received (SIGINT or SIGTERM), or 0.
[[nodiscard]] inline int stop_requested() noexcept { return detail::g_stop; }
/// Whether SIGUSR1 came since the last call (and forgets it).
[[nodiscard]] inline bool take_checkpoint_request() noexcept {
  if (!detail::g_checkpoint) return false;
  detail::g_checkpoint = 0;
  return true;
}
/// "SIGINT", "SIGTERM", ... for messages.
[[nodiscard]] inline std::string name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal " + std::to_string(sig);
  }
}

}  // namespace signals

}  // namespace anvil
