// Python envs in worker processes (env.workers=W > 0; envs/python_env.hpp loads this library).
// Each worker is a fresh interpreter started by exec (posix_spawn: never a fork of this
// process, which holds LibTorch's threads) running src/python_envs/env_worker.py; it owns a
// slice of the envs. Observations, rewards, flags, tasks, seeds and actions live in one
// shared-memory block per worker (a memfd: it has no name, so nothing can be left in
// /dev/shm, whatever ends the run). A batched step is one byte to each worker and one byte
// back: no pickling, one wake-up per worker per batch.
//
// Faults: a Python exception names the env, the step and the exception with its last frames;
// a worker that dies is named with its envs and how it died (exit status or signal); one that
// does not answer within env.worker_timeout is named with the env it is in and the step, and
// the run stops (env.on_hang=stop) or keeps waiting (wait). Workers exit when this process
// ends in any way: they are told to on a normal end, and they notice the socket close (or
// their parent change) after an error, a signal or a SIGKILL. This library links no Python.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/any_env.hpp>
#include <anvil/envs/env_batch.hpp>
#include <anvil/envs/env_config.hpp>
#include <anvil/envs/python_env.hpp>

#include "python_batch.hpp"

extern char** environ;

namespace anvil::envs::python {
namespace {

// The header at the start of each worker's shared block: int64 slots, the same indices as
// in env_worker.py (HEADER there).
enum Slot : int {
  kMagic,       // kMagicValue: the block is laid out
  kCount,       // envs in the worker's slice
  kObsDim,      // elements per observation row: float32 numbers, or bytes of a row of parts (images)
  kActBytes,    // bytes per env's action (float32 x dim, or one int64)
  kActions,     // offsets of the arrays, in bytes
  kNextObs,     // float32 [count, obs_dim] (or uint8 rows of parts): what each step led to
  kResetObs,    // the same: a new episode's first (after an autoreset, or a reset)
  kReward,      // float64 [count]
  kTerminated,  // uint8 [count]
  kTruncated,   // uint8 [count]
  kTask,        // int64 [count]: each step's task (index into the env's tasks)
  kSeed,        // int64 [count]: the seed of each env's next reset
  kError,       // bytes: the text of a fault
  kErrorCap,    // its capacity
  kBegin,       // the range of a command, in the slice
  kEnd,
  kCurrent,     // the env (in the slice) the worker is in, -1 between commands
  kPhase,       // what it is doing there: 1 step, 2 reset, 3 autoreset
  kErrorLen,    // a fault: its text's length, the env (in the slice) and the phase
  kErrorEnv,
  kErrorPhase,
  kSlots
};
constexpr std::int64_t kMagicValue = 0x616e76696c313031;  // "anvil101"
constexpr std::int64_t kHeaderBytes = 4096;
constexpr std::int64_t kErrorBytes = 16384;

const char* phase_name(std::int64_t p) { return p == 1 ? "step" : p == 2 ? "reset" : p == 3 ? "autoreset" : "idle"; }

// The interpreter the workers run (ANVIL_PYTHON_EXE, else the build's ANVIL_PYTHON), and
// its script.
std::string interpreter() {
  if (const char* p = std::getenv("ANVIL_PYTHON_EXE"); p && *p) return p;
  return ANVIL_PYTHON_EXE;
}
std::string worker_script() {
  return find_support_file("ANVIL_PYTHON_WORKER", ANVIL_PYTHON_WORKER, "env_worker.py", ANVIL_PYTHON_SUPPORT_FROM_LIBRARY,
                           reinterpret_cast<const void*>(&worker_script))
      .string();
}

std::string signal_text(int sig) {
  std::string s = "killed by signal " + std::to_string(sig);
  if (const char* d = strsignal(sig)) s += std::string(" (") + d + ")";
  if (sig == SIGKILL) s += "; the kernel's OOM killer sends SIGKILL when memory runs out";
  return s;
}

// One worker process and its shared block.
class Worker {
 public:
  Worker(int index, int workers, std::int64_t first, std::int64_t count, std::int64_t global_first, const std::string& id,
         const std::string& target, const KeyValues& kwargs)
      : index_(index), workers_(workers), first_(first), count_(count), id_(id) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail_errno("socketpair");
    sock_ = sv[0];
    mem_ = memfd_create("anvil-env-worker", MFD_CLOEXEC);
    if (mem_ < 0) {
      ::close(sv[1]);
      fail_errno("memfd_create");
    }
    // The child's ends, moved above the numbers they take in the child (3, 4) so that the
    // two dup2s cannot overwrite each other.
    const int child_sock = fcntl(sv[1], F_DUPFD_CLOEXEC, 100), child_mem = fcntl(mem_, F_DUPFD_CLOEXEC, 100);
    ::close(sv[1]);
    const std::string script = worker_script();
    if (script.empty()) {
      ::close(child_sock);
      ::close(child_mem);
      throw ConfigError("env.id=" + id_ + ": cannot find the worker script env_worker.py (set ANVIL_PYTHON_WORKER)");
    }
    std::vector<std::string> args{interpreter(), script, "--target", target, "--first", std::to_string(global_first),
                                  "--count", std::to_string(count), "--parent", std::to_string(getpid()), "--name",
                                  "worker " + std::to_string(index) + " of " + std::to_string(workers)};
    for (const auto& [k, v] : kwargs) args.push_back("--kwarg=" + k + "=" + v);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, child_sock, 3);
    posix_spawn_file_actions_adddup2(&fa, child_mem, 4);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group (a Ctrl-C at the terminal reaches this process, which checkpoints
    // and then ends the workers), no blocked signals, default dispositions.
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) sigaddset(&defaults, s);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    const int rc = posix_spawn(&pid_, argv[0], &fa, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(child_sock);
    ::close(child_mem);
    if (rc != 0) {
      pid_ = -1;
      throw ConfigError("env.id=" + id_ + ": cannot start " + args[0] + " for the env workers: " + std::strerror(rc));
    }
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() { end(); }

  // "worker 1 of 2 (pid 1234, envs 8-15)"
  [[nodiscard]] std::string name() const {
    return "worker " + std::to_string(index_) + " of " + std::to_string(workers_) + " (pid " + std::to_string(pid_) +
           ", envs " + std::to_string(first_) + "-" + std::to_string(first_ + count_ - 1) + ")";
  }
  [[nodiscard]] std::int64_t first() const noexcept { return first_; }
  /// How long to look for an answer before sleeping (0: sleep at once).
  void set_spin(int microseconds) noexcept { spin_us_ = microseconds; }
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }

  // The worker's first message: its spec, or the error that stopped it making its envs.
  std::string handshake(double timeout, const HangAction on_hang) {
    std::string line;
    char c = 0;
    for (;;) {
      await(timeout, on_hang, "making its envs");
      if (!read_byte(c)) died("env.id=" + id_ + ": ", "while making its envs");
      if (c == '\n') break;
      line += c;
    }
    const auto space = line.find(' ');
    const std::string kind = line.substr(0, space);
    const auto n = static_cast<std::size_t>(std::stoll(line.substr(space + 1)));
    std::string body(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      await(timeout, on_hang, "making its envs");
      const auto r = ::recv(sock_, body.data() + got, n - got, 0);
      if (r <= 0 && !(r < 0 && errno == EINTR)) died("env.id=" + id_ + ": ", "while making its envs");
      if (r > 0) got += static_cast<std::size_t>(r);
    }
    if (kind == "error") throw ConfigError("env.id=" + id_ + ": " + body);
    if (kind != "spec") throw Error("env.id=" + id_ + ": " + name() + " sent '" + kind + "', not its spec");
    return body;
  }

  // Lays out the shared block for rows of `obs_dim` elements of `obs_bytes` bytes each and
  // actions of `act_bytes`, and tells the worker.
  void layout(std::int64_t obs_dim, std::int64_t obs_bytes, std::int64_t act_bytes) {
    auto align = [](std::int64_t x) { return (x + 63) / 64 * 64; };
    std::int64_t at = kHeaderBytes;
    std::int64_t offsets[kSlots] = {};
    auto take = [&](Slot s, std::int64_t bytes) {
      offsets[s] = at;
      at = align(at + bytes);
    };
    take(kActions, count_ * act_bytes);
    take(kNextObs, count_ * obs_dim * obs_bytes);
    take(kResetObs, count_ * obs_dim * obs_bytes);
    take(kReward, count_ * 8);
    take(kTerminated, count_);
    take(kTruncated, count_);
    take(kTask, count_ * 8);
    take(kSeed, count_ * 8);
    take(kError, kErrorBytes);
    bytes_ = static_cast<std::size_t>(at);
    if (ftruncate(mem_, static_cast<off_t>(bytes_)) != 0) fail_errno("ftruncate of the shared block");
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, mem_, 0);
    if (p == MAP_FAILED) fail_errno("mmap of the shared block");
    base_ = static_cast<std::uint8_t*>(p);
    auto* h = header();
    for (int s = kActions; s <= kError; ++s) h[s] = offsets[s];
    h[kCount] = count_;
    h[kObsDim] = obs_dim;
    h[kActBytes] = act_bytes;
    h[kErrorCap] = kErrorBytes;
    h[kCurrent] = -1;
    h[kMagic] = kMagicValue;
    send('m');
  }

  [[nodiscard]] std::int64_t* header() const noexcept { return reinterpret_cast<std::int64_t*>(base_); }
  template <class T>
  [[nodiscard]] T* array(Slot s) const noexcept {
    return reinterpret_cast<T*>(base_ + header()[s]);
  }

  // Sends a command ('S' step, 'R' reset) for envs [begin, end) of the slice.
  void command(char c, std::int64_t begin, std::int64_t end) {
    header()[kBegin] = begin;
    header()[kEnd] = end;
    header()[kErrorLen] = 0;
    send(c);
  }

  // Waits for the answer to a command: true when it went well, false on a fault in the env
  // (its text in the block). `steps`: batched steps before this one (for errors); `at`
  // names an env and step as EnvBatch::at_fault does.
  template <class At>
  bool answer(double timeout, HangAction on_hang, const At& at) {
    await(timeout, on_hang, "", at);
    char c = 0;
    if (!read_byte(c)) {
      const auto h = header();
      const auto cur = h[kCurrent];
      if (cur >= 0) died(at(first_ + cur, phase_name(h[kPhase])), std::string("in ") + phase_name(h[kPhase]) + "()");
      died("env.id=" + id_ + ": ", "between commands");
    }
    if (c == 'k') return true;
    if (c == 'e') return false;
    throw Error("env.id=" + id_ + ": " + name() + " answered '" + std::string(1, c) + "'");
  }

  // A fault the worker reported: the env (in the slice), its phase and the text.
  struct Fault {
    std::int64_t env;
    std::string phase;
    std::string text;
  };
  [[nodiscard]] Fault fault() const {
    const auto h = header();
    const auto n = std::clamp<std::int64_t>(h[kErrorLen], 0, kErrorBytes);
    return Fault{h[kErrorEnv], phase_name(h[kErrorPhase]), std::string(array<char>(kError), static_cast<std::size_t>(n))};
  }

  // Tells the worker to close its envs and exit, and waits for it a little; a worker that
  // does not go is killed. `quick`: kill at once (after a fault, a hang or a death).
  void end(bool quick = false) {
    if (pid_ > 0) {
      if (!quick) {
        const char q = 'Q';
        (void)::send(sock_, &q, 1, MSG_NOSIGNAL);
      }
      if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);
      bool gone = false;
      for (int i = 0; i < (quick ? 0 : 200) && !gone; ++i) {  // up to 2 s to close its envs
        int st = 0;
        gone = waitpid(pid_, &st, WNOHANG) == pid_;
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!gone) {
        ::kill(pid_, SIGKILL);
        int st = 0;
        while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
        }
      }
      pid_ = -1;
    }
    if (base_) munmap(base_, bytes_);
    base_ = nullptr;
    for (int* fd : {&sock_, &mem_})
      if (*fd >= 0) {
        ::close(*fd);
        *fd = -1;
      }
  }

 private:
  [[noreturn]] void fail_errno(const std::string& what) const {
    throw Error("env.id=" + id_ + ": Python env worker " + std::to_string(index_) + ": " + what + ": " +
                std::strerror(errno));
  }

  void send(char c) {
    for (;;) {
      if (::send(sock_, &c, 1, MSG_NOSIGNAL) == 1) return;
      if (errno == EINTR) continue;
      died("env.id=" + id_ + ": ", "before a command reached it");
    }
  }
  bool read_byte(char& c) {
    for (;;) {
      const auto r = ::recv(sock_, &c, 1, 0);
      if (r == 1) return true;
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
  }

  // Waits until the worker has something to say; past `timeout` seconds the worker is hung:
  // an error (HangAction::stop) or a report and more waiting (wait).
  template <class At = std::nullptr_t>
  void await(double timeout, HangAction on_hang, const std::string& doing, const At& at = nullptr) {
    const auto start = std::chrono::steady_clock::now();
    if (spin_us_ > 0) {  // a core is free for it: look for the answer before sleeping in poll
      const auto until = start + std::chrono::microseconds(spin_us_);
      pollfd p{sock_, POLLIN, 0};
      while (std::chrono::steady_clock::now() < until)
        if (::poll(&p, 1, 0) > 0) return;
    }
    for (int reports = 0;;) {
      pollfd p{sock_, POLLIN, 0};
      const int ms = static_cast<int>(std::min(timeout * 1000.0, 1e9));
      const int r = ::poll(&p, 1, std::max(ms, 1));
      if (r > 0) return;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail_errno("poll");
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string where;
      const auto h = header();
      if (!doing.empty() || !h || h[kCurrent] < 0) {
        where = "env.id=" + id_ + ": " + name() + (doing.empty() ? "" : " " + doing);
      } else if constexpr (!std::is_same_v<At, std::nullptr_t>) {
        const auto env = first_ + h[kCurrent];
        where = at(env, phase_name(h[kPhase])) + "in " + name();
      }
      char secs[64];
      std::snprintf(secs, sizeof secs, "%.1f", waited);
      const std::string what = where + ": no answer in " + secs + " s (env.worker_timeout=" + format_seconds(timeout) +
                               "); the env may be stuck in a loop";
      if (on_hang == HangAction::stop) {
        end(/*quick=*/true);
        throw EnvError(what + " (the run stops: env.on_hang=stop; the worker was killed)");
      }
      std::fprintf(stderr, "anvil: %s; waiting (env.on_hang=wait)%s\n", what.c_str(),
                   reports++ == 0 ? "" : ", again");
      std::fflush(stderr);
    }
  }
  static std::string format_seconds(double s) {
    std::ostringstream o;
    o << s;
    return o.str();
  }

  // The worker is gone: how it ended, as an error naming it and its envs.
  [[noreturn]] void died(const std::string& prefix, const std::string& when) {
    const std::string who = name();
    int st = 0;
    pid_t r = 0;
    for (int i = 0; i < 500 && r == 0; ++i) {  // its socket closed: it is exiting; up to 5 s
      r = waitpid(pid_, &st, WNOHANG);
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string how;
    if (r == pid_) {
      pid_ = -1;
      if (WIFSIGNALED(st)) how = signal_text(WTERMSIG(st));
      else if (WIFEXITED(st)) how = "exited with status " + std::to_string(WEXITSTATUS(st)) + " (os._exit or sys.exit in the env?)";
    } else {
      how = "closed its end of the socket";
    }
    end(/*quick=*/true);
    throw EnvError(prefix + who + " died" + (when.empty() ? "" : " " + when) + ": " + how);
  }

  int index_, workers_;
  std::int64_t first_, count_;
  std::string id_;
  pid_t pid_ = -1;
  int sock_ = -1, mem_ = -1;
  int spin_us_ = 0;
  std::uint8_t* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// The envs, in `workers` processes (see file comment).
class WorkerEnvBatch final : public PythonBatch {
 public:
  WorkerEnvBatch(Spec spec, std::vector<std::unique_ptr<Worker>> workers, std::int64_t n, std::uint64_t seed,
                 double timeout, HangAction on_hang)
      : PythonBatch(spec.env, n, spec.tasks, seed),
        workers_(std::move(workers)),
        timeout_(timeout),
        on_hang_(on_hang) {
    act_bytes_ = spec_.discrete() ? 8 : spec_.action_dim() * 4;
  }
  ~WorkerEnvBatch() override {
    for (auto& w : workers_) w->end();
  }


  void reset(void* rows_out, std::int64_t steps) override {
    if (spec_.byte_rows()) reset_rows<std::uint8_t>(rows_out, steps);
    else reset_rows<float>(rows_out, steps);
  }

  void step(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) override {
    if (spec_.byte_rows()) step_rows<std::uint8_t>(begin, end, actions, out, steps);
    else step_rows<float>(begin, end, actions, out, steps);
  }


 private:
  // The observation rows' element: float (a Box) or bytes (rows of parts, e.g. images).
  template <class T>
  void reset_rows(void* rows_out, std::int64_t steps) {
    auto* obs = static_cast<T*>(rows_out);
    const auto d = spec_.obs_dim();
    for (auto& w : workers_) {
      auto* seeds = w->array<std::int64_t>(kSeed);
      for (std::int64_t j = 0; j < w->count(); ++j) seeds[j] = next_seed(w->first() + j);
      w->command('R', 0, w->count());
    }
    collect(steps, "reset");
    for (auto& w : workers_) {
      const T* rows = w->array<T>(kResetObs);
      auto* seeds = w->array<std::int64_t>(kSeed);
      for (std::int64_t j = 0; j < w->count(); ++j) {
        const auto i = w->first() + j;
        const std::span<const T> o(rows + j * d, static_cast<std::size_t>(d));
        check_observation(i, o, "reset", steps);
        std::copy(o.begin(), o.end(), obs + i * d);
        begin_episode(i);
        seeds[j] = next_seed(i);
      }
    }
  }

  template <class T>
  void step_rows(std::int64_t begin, std::int64_t end, const void* actions, const StepRows& out, std::int64_t steps) {
    const auto d = spec_.obs_dim();
    const auto* bytes = static_cast<const std::uint8_t*>(actions);
    active_.clear();
    for (auto& w : workers_) {
      const auto lo = std::max(begin, w->first()), hi = std::min(end, w->first() + w->count());
      if (lo >= hi) continue;
      std::memcpy(w->array<std::uint8_t>(kActions) + (lo - w->first()) * act_bytes_, bytes + lo * act_bytes_,
                  static_cast<std::size_t>((hi - lo) * act_bytes_));
      w->command('S', lo - w->first(), hi - w->first());
      active_.push_back(w.get());
    }
    collect(steps, "step");
    for (Worker* w : active_) {
      const auto* h = w->header();
      const T* next = w->array<T>(kNextObs);
      const T* first = w->array<T>(kResetObs);
      const double* reward = w->array<double>(kReward);
      const std::uint8_t* term = w->array<std::uint8_t>(kTerminated);
      const std::uint8_t* trunc = w->array<std::uint8_t>(kTruncated);
      const std::int64_t* task = w->array<std::int64_t>(kTask);
      auto* seeds = w->array<std::int64_t>(kSeed);
      for (std::int64_t j = h[kBegin]; j < h[kEnd]; ++j) {
        const auto i = w->first() + j;
        const auto group = has_tasks_ ? static_cast<std::int32_t>(task[j]) : -1;
        if (out.task) out.task[i] = group;
        const std::span<const T> o(next + j * d, static_cast<std::size_t>(d));
        if (record_step(i, o, reward[j], term[j] != 0, trunc[j] != 0, group, -1, out, steps)) {
          const std::span<const T> f(first + j * d, static_cast<std::size_t>(d));
          check_observation(i, f, "autoreset", steps);
          std::copy(f.begin(), f.end(), static_cast<T*>(out.obs) + i * d);
          seeds[j] = next_seed(i);
        }
      }
    }
  }

  // Waits for every worker given a command; the first fault (by env) is thrown once all
  // have answered.
  void collect(std::int64_t steps, std::string_view what) {
    const auto& list = what == "reset" ? all() : active_;
    std::optional<std::pair<std::int64_t, std::string>> first_fault;
    for (Worker* w : list) {
      auto at = [&](std::int64_t env, std::string_view phase) { return at_fault(env, phase, steps); };
      if (w->answer(timeout_, on_hang_, at)) continue;
      const auto f = w->fault();
      const auto env = w->first() + f.env;
      if (!first_fault || env < first_fault->first) first_fault.emplace(env, at_fault(env, f.phase, steps) + f.text);
    }
    if (first_fault) throw EnvError(first_fault->second);
  }
  const std::vector<Worker*>& all() {
    if (all_.empty())
      for (auto& w : workers_) all_.push_back(w.get());
    return all_;
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Worker*> active_, all_;
  std::int64_t act_bytes_ = 4;
  double timeout_;
  HangAction on_hang_;
};

}  // namespace

AnyEnv worker_env(const std::string& id, const KeyValues& kwargs) {
  if (id.rfind(kPrefix, 0) != 0) throw ConfigError("env.id=" + id + ": not a python: env");
  const std::string target = id.substr(kPrefix.size());
  const auto colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == target.size())
    throw ConfigError("env.id=" + id + ": expected python:MODULE:ATTR (e.g. python:my_envs.pendulum:make)");
  auto maker = [id, target, kwargs](const VecEnvConfig& cfg, std::uint64_t seed, std::int64_t first,
                                    std::int64_t /*count*/) -> std::unique_ptr<EnvBatch> {
    cfg.refuse_python_fields(id);
    if (cfg.threads > 1)
      throw ConfigError("env.threads=" + std::to_string(*cfg.threads) + ": with env.workers=" +
                        std::to_string(*cfg.workers) +
                        " the worker processes step the envs in parallel; env.threads must be 1");
    const std::int64_t n = cfg.num_envs;
    const int w = static_cast<int>(std::min<std::int64_t>(*cfg.workers, n));
    std::vector<std::unique_ptr<Worker>> workers;
    for (int k = 0; k < w; ++k) {
      const std::int64_t lo = n * k / w, hi = n * (k + 1) / w;
      workers.push_back(std::make_unique<Worker>(k, w, lo, hi - lo, first + lo, id, target, kwargs));
    }
    std::optional<Spec> spec;
    std::string spec_text;
    for (auto& wk : workers) {
      const auto text = wk->handshake(cfg.worker_timeout, cfg.on_hang);
      if (!spec) {
        spec = parse_spec(text, id);
        spec_text = text;
      } else if (text != spec_text) {
        throw ConfigError("env.id=" + id + ": the envs of " + wk->name() +
                          " have other spaces or tasks than those of worker 0; anvil steps envs alike");
      }
    }
    const auto act_bytes = spec->env.discrete() ? std::int64_t{8} : spec->env.action_dim() * 4;
    // This thread waits for the workers; when a core is left for it besides theirs it looks for
    // their answers for a while before sleeping (a wake-up costs tens of microseconds on a VM).
    const bool spare = static_cast<unsigned>(w) + 1 <= std::max(1u, std::thread::hardware_concurrency());
    for (auto& wk : workers) {
      wk->layout(spec->env.obs_dim(), spec->env.byte_rows() ? 1 : 4, act_bytes);
      wk->set_spin(spare ? 200 : 0);
    }
    return std::make_unique<WorkerEnvBatch>(std::move(*spec), std::move(workers), n, seed, cfg.worker_timeout, cfg.on_hang);
  };
  AnyEnv env = AnyEnv::batched(id, std::move(maker));
  env.with_note("python: " + id + " steps in worker processes (env.workers), each a fresh " + interpreter() +
                " stepping a slice of the envs through shared memory, one wake-up per worker per batch");
  return env;
}

}  // namespace anvil::envs::python

// The entry point `envs::python_env` finds with dlsym (C linkage: no mangled name to guess).
extern "C" __attribute__((visibility("default"))) void anvil_python_worker_env(
    const std::string* id, const anvil::KeyValues* kwargs, std::optional<anvil::envs::AnyEnv>* out) {
  out->emplace(anvil::envs::python::worker_env(*id, *kwargs));
}

// The fingerprint `envs::python_env` checks against its own (envs/python_env.hpp).
extern "C" __attribute__((visibility("default"))) std::uint64_t anvil_python_abi() {
  return anvil::envs::python::abi_fingerprint();
}
