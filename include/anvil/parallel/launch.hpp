#pragma once
/// @file
/// anvil's launcher: a program started plainly with `DDP<N>` becomes the launcher of its
/// node. It serves the rendezvous store (node 0), starts N ranks of the same executable
/// with the same arguments and the variables torchrun would set, and supervises them:
/// when a rank dies or fails, it names it, stops the others (SIGTERM, then SIGKILL after
/// `grace`) and exits non-zero. Ranks die with the launcher (PR_SET_PDEATHSIG), so nothing
/// is left behind. Signals sent to the launcher (Ctrl-C, SIGTERM, SIGUSR1) reach every
/// rank once: ranks run in their own process group, so a terminal's Ctrl-C reaches them
/// through the launcher only. After a SIGINT or SIGTERM the ranks stop together with a
/// checkpoint (train/signals.hpp) and exit 130 or 143: the launcher waits for them and
/// exits with that status, without treating it as a failure; a second signal is forwarded
/// too and ends them at once. Linux only.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <anvil/core/error.hpp>
#include <anvil/parallel/c10d.hpp>
#include <anvil/parallel/world.hpp>

extern char** environ;

namespace anvil::dist {

/// What a launcher starts on its node.
struct LaunchPlan {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: any free port (one node only)
  std::chrono::milliseconds timeout{120'000};  ///< how long the store waits for ranks
  std::chrono::milliseconds grace{5'000};      ///< SIGTERM to SIGKILL when stopping ranks
};

namespace detail {

// Ranks' pids, for the signal handler (only async-signal-safe calls there).
inline pid_t g_children[1024];
inline volatile std::sig_atomic_t g_child_count = 0;
inline volatile std::sig_atomic_t g_stop_signal = 0;  // the SIGINT/SIGTERM the launcher got first

inline void forward_signal(int sig) {
  for (int i = 0; i < g_child_count; ++i)
    if (g_children[i] > 0) ::kill(g_children[i], sig);
}
inline void on_signal(int sig) {
  if ((sig == SIGINT || sig == SIGTERM) && g_stop_signal == 0) g_stop_signal = sig;
  forward_signal(sig);
}

// This program's arguments, as it was started.
inline std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string cur;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) args.push_back(cur);
  return args;
}

inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "stopped with status " + std::to_string(status);
}

inline bool env_is_ours(const char* kv) {
  static constexpr const char* kOurs[] = {"RANK=",        "WORLD_SIZE=",   "LOCAL_RANK=",        "LOCAL_WORLD_SIZE=",
                                          "GROUP_RANK=",  "NODE_RANK=",    "MASTER_ADDR=",       "MASTER_PORT=",
                                          "NNODES=",      "ANVIL_AGENT_STORE=", "TORCHELASTIC_USE_AGENT_STORE="};
  for (const char* p : kOurs)
    if (std::strncmp(kv, p, std::strlen(p)) == 0) return true;
  return false;
}

}  // namespace detail

/// Runs the ranks of this node and exits with their outcome: 0 when all succeed, else the
/// status of the first rank that failed (128 + signal for a rank that was killed). Never
/// returns. Prints one line when it starts and one naming the rank at fault.
[[noreturn]] inline void launch(const LaunchPlan& plan) {
  const int world = plan.nproc_per_node * plan.nnodes;
  if (plan.nproc_per_node > static_cast<int>(std::size(detail::g_children)))
    throw ConfigError("parallel: " + std::to_string(plan.nproc_per_node) + " ranks per node is more than the launcher supports");
  // Node 0's launcher serves the store, so it outlives any rank (and a survivor can still
  // ask it which rank died).
  c10::intrusive_ptr<compat::Store> store;
  int port = plan.master_port;
  if (plan.node_rank == 0) {
    try {
      store = compat::make_tcp_store(plan.master_addr, static_cast<std::uint16_t>(port), world, /*is_server=*/true,
                                     plan.timeout);
    } catch (const std::exception& e) {
      throw DistributedError("launcher: cannot serve the rendezvous store on port " + std::to_string(port) +
                             " (MASTER_PORT): " + std::string(e.what()).substr(0, std::string(e.what()).find('\n')));
    }
    port = compat::store_port(store);
  }
  const auto args = detail::own_arguments();
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e)
    if (!detail::env_is_ours(*e)) base_env.emplace_back(*e);
  auto set = [](std::vector<std::string>& env, const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };

  std::fprintf(stderr, "launcher: starting %d rank(s) on node %d of %d (world of %d), rendezvous at %s:%d\n",
               plan.nproc_per_node, plan.node_rank, plan.nnodes, world, plan.master_addr.c_str(), port);
  std::fflush(stderr);
  struct sigaction sa {};
  sa.sa_handler = &detail::on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1}) ::sigaction(sig, &sa, nullptr);

  const pid_t me = ::getpid();
  std::vector<pid_t> pids(static_cast<std::size_t>(plan.nproc_per_node), -1);
  for (int local = 0; local < plan.nproc_per_node; ++local) {
    const int rank = plan.node_rank * plan.nproc_per_node + local;
    auto env = base_env;
    set(env, "RANK", std::to_string(rank));
    set(env, "WORLD_SIZE", std::to_string(world));
    set(env, "LOCAL_RANK", std::to_string(local));
    set(env, "LOCAL_WORLD_SIZE", std::to_string(plan.nproc_per_node));
    set(env, "GROUP_RANK", std::to_string(plan.node_rank));
    set(env, "NNODES", std::to_string(plan.nnodes));
    set(env, "MASTER_ADDR", plan.master_addr);
    set(env, "MASTER_PORT", std::to_string(port));
    set(env, "ANVIL_AGENT_STORE", "1");
    std::vector<char*> envp;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      detail::forward_signal(SIGKILL);
      throw DistributedError("launcher: cannot start rank " + std::to_string(rank) + ": fork failed");
    }
    if (pid == 0) {  // the rank: only async-signal-safe calls until exec
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::setpgid(0, 0);  // a terminal's signals reach the rank through the launcher only, once
      if (::getppid() != me) ::_exit(1);  // the launcher died before the line above
      ::execve("/proc/self/exe", argv.data(), envp.data());
      static const char msg[] = "launcher: cannot run this program again (execve of /proc/self/exe failed)\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    pids[static_cast<std::size_t>(local)] = pid;
    detail::g_children[local] = pid;
    detail::g_child_count = local + 1;
  }

  // Supervise: wait for every rank; the first failure stops the others.
  int exit_code = 0;
  int running = plan.nproc_per_node;
  auto rank_of = [&](pid_t pid) {
    for (std::size_t i = 0; i < pids.size(); ++i)
      if (pids[i] == pid) return plan.node_rank * plan.nproc_per_node + static_cast<int>(i);
    return -1;
  };
  auto forget = [&](pid_t pid) {
    for (int i = 0; i < plan.nproc_per_node; ++i)
      if (detail::g_children[i] == pid) detail::g_children[i] = -1;
  };
  std::chrono::steady_clock::time_point kill_at{};
  bool stopping = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // no children left
    }
    if (pid == 0) {  // stopping, none exited yet
      if (std::chrono::steady_clock::now() >= kill_at) detail::forward_signal(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const int rank = rank_of(pid);
    if (rank < 0) continue;
    forget(pid);
    --running;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const int asked = detail::g_stop_signal;
    if (asked != 0 && WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 128 + asked)) {
      if (WEXITSTATUS(status) != 0) exit_code = 128 + asked;  // stopped as asked, with its checkpoint: wait for the others
      continue;
    }
    if (!ok && !stopping) {
      exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::fprintf(stderr, "launcher: rank %d (pid %d) %s; stopping the other %d rank(s) on this node\n", rank,
                   static_cast<int>(pid), detail::describe_status(status).c_str(), running);
      std::fflush(stderr);
      stopping = true;
      kill_at = std::chrono::steady_clock::now() + plan.grace;
      detail::forward_signal(SIGTERM);
    }
  }
  store.reset();
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

}  // namespace anvil::dist
