#pragma once
/// @file
/// Which ranks make up a run and how they meet: `World`, read from the variables that
/// torchrun and anvil's own launcher set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
/// MASTER_PORT, ...) or, when none of those is set, from the ones SLURM's `srun` gives each
/// task (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST, ...). Light
/// header: no Torch.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil {

/// A failure between ranks: a rank died or stopped answering, the rendezvous could not be
/// reached, ranks disagree. The message names the rank it comes from and, where it can
/// be told, the rank at fault. Exit status 3.
class DistributedError : public Error {
 public:
  using Error::Error;
  [[nodiscard]] int exit_code() const noexcept override { return 3; }
};

namespace dist {

/// This process's place among the ranks of a run, and where they meet.
struct World {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        ///< rank among the ranks on this node: picks the GPU
  int local_world_size = 1;  ///< ranks on this node
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";  ///< host of the rendezvous store
  int master_port = 0;
  /// The store is served by a launcher (anvil's, or torchrun's agent): every rank is a
  /// client. Otherwise rank 0 serves it.
  bool agent_store = false;
  /// Key prefix in the store, so that a restarted attempt does not read stale keys.
  std::string store_prefix = "anvil";
  /// Where the world came from, for the log: "RANK/WORLD_SIZE" or "SLURM step 1234.0".
  std::string source = "RANK/WORLD_SIZE";

  /// "127.0.0.1:29500": where the rendezvous is, for messages.
  [[nodiscard]] std::string rendezvous() const { return master_addr + ":" + std::to_string(master_port); }
};

namespace detail {

inline const char* getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

/// The integer in environment variable `name`, or `fallback` when it is unset; an error
/// naming the variable when it is not a number in [lo, hi].
inline long env_int(const char* name, long fallback, long lo, long hi) {
  const char* v = getenv_nonempty(name);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end != '\0')
    throw ConfigError(std::string("environment variable ") + name + "='" + v + "' is not an integer");
  if (x < lo || x > hi)
    throw ConfigError(std::string("environment variable ") + name + "=" + v + " is out of range [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

}  // namespace detail

/// The hosts of a SLURM host list, in order, as `scontrol show hostnames` writes them:
/// "gpu[03-05,09],login1" -> gpu03 gpu04 gpu05 gpu09 login1. A range keeps the width of its
/// first number ("[08-10]": 08 09 10); several bracket groups in one name multiply
/// ("r[1-2]n[1-2]": r1n1 r1n2 r2n1 r2n2). `variable` names the list in errors (a ConfigError
/// for unbalanced brackets, a range that runs backwards or is not numbers, or more than
/// `max_hosts` hosts).
inline std::vector<std::string> expand_hostlist(std::string_view list, std::string_view variable = "the host list",
                                                std::size_t max_hosts = 1 << 20) {
  auto fail = [&](const std::string& why) -> std::vector<std::string> {
    throw ConfigError(std::string(variable) + "='" + std::string(list) + "' is not a SLURM host list: " + why);
  };
  // Split at the commas outside brackets.
  std::vector<std::string_view> names;
  int depth = 0;
  std::size_t from = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[' && ++depth > 1) return fail("nested '['");
    if (c == ']' && --depth < 0) return fail("']' without '['");
    if (c == ',' && depth == 0) {
      if (i > from) names.push_back(list.substr(from, i - from));
      from = i + 1;
    }
  }
  if (depth != 0) return fail("'[' without ']'");
  std::vector<std::string> hosts;
  for (std::string_view name : names) {
    std::vector<std::string> stems{""};  // every expansion of the name so far
    while (!name.empty()) {
      const auto open = name.find('[');
      const std::string_view literal = name.substr(0, open);
      for (auto& s : stems) s += literal;
      if (open == std::string_view::npos) break;
      const auto close = name.find(']', open);
      const std::string_view inside = name.substr(open + 1, close - open - 1);
      name.remove_prefix(close + 1);
      std::vector<std::string> items;  // the bracket's numbers, as written (widths kept)
      std::size_t at = 0;
      while (at <= inside.size()) {
        const auto comma = std::min(inside.find(',', at), inside.size());
        const std::string_view item = inside.substr(at, comma - at);
        at = comma + 1;
        const auto dash = item.find('-');
        const std::string_view lo = item.substr(0, dash), hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
        auto digits = [](std::string_view d) {
          return !d.empty() && d.size() <= 9 && d.find_first_not_of("0123456789") == std::string_view::npos;
        };
        if (!digits(lo) || !digits(hi)) return fail("'[" + std::string(inside) + "]' holds '" + std::string(item) + "', not N or N-M");
        const long a = std::stol(std::string(lo)), b = std::stol(std::string(hi));
        if (b < a) return fail("the range " + std::string(item) + " runs backwards");
        if (static_cast<std::size_t>(b - a) >= max_hosts) return fail("more than " + std::to_string(max_hosts) + " hosts");
        for (long k = a; k <= b; ++k) {
          std::string n = std::to_string(k);
          if (n.size() < lo.size()) n.insert(0, lo.size() - n.size(), '0');
          items.push_back(std::move(n));
        }
      }
      if (stems.size() * items.size() > max_hosts) return fail("more than " + std::to_string(max_hosts) + " hosts");
      std::vector<std::string> next;
      next.reserve(stems.size() * items.size());
      for (const auto& s : stems)
        for (const auto& it : items) next.push_back(s + it);
      stems = std::move(next);
    }
    for (auto& s : stems) hosts.push_back(std::move(s));
    if (hosts.size() > max_hosts) return fail("more than " + std::to_string(max_hosts) + " hosts");
  }
  if (hosts.empty()) return fail("no hosts");
  return hosts;
}

/// Tasks per node from SLURM's compressed count list ("2(x3),1" -> 2 2 2 1), as
/// SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE write it. `variable` names it in errors.
inline std::vector<int> expand_tasks_per_node(std::string_view list, std::string_view variable) {
  auto fail = [&]() -> std::vector<int> {
    throw ConfigError(std::string(variable) + "='" + std::string(list) + "' is not a SLURM task count list (e.g. 2(x3),1)");
  };
  std::vector<int> counts;
  std::size_t at = 0;
  while (at <= list.size()) {
    const auto comma = std::min(list.find(',', at), list.size());
    std::string_view item = list.substr(at, comma - at);
    at = comma + 1;
    long repeat = 1;
    if (const auto paren = item.find("(x"); paren != std::string_view::npos) {
      if (item.back() != ')') return fail();
      const std::string r(item.substr(paren + 2, item.size() - paren - 3));
      if (r.empty() || r.size() > 7 || r.find_first_not_of("0123456789") != std::string::npos) return fail();
      repeat = std::stol(r);
      item = item.substr(0, paren);
    }
    if (item.empty() || item.size() > 7 || item.find_first_not_of("0123456789") != std::string_view::npos) return fail();
    const int n = static_cast<int>(std::stol(std::string(item)));
    if (n < 1 || repeat < 1 || counts.size() + static_cast<std::size_t>(repeat) > (1u << 20)) return fail();
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), n);
  }
  return counts;
}

/// The rendezvous port of a SLURM step when MASTER_PORT is not set: 10000 + 20 x (job id
/// mod 1000) + (step id mod 20), in [10000, 29999] (below Linux's ephemeral ports), so that
/// steps of one job and jobs on one node seldom meet on one port.
[[nodiscard]] constexpr int slurm_port(unsigned long long job_id, unsigned long long step_id) noexcept {
  return 10000 + static_cast<int>(job_id % 1000) * 20 + static_cast<int>(step_id % 20);
}

namespace detail {

/// The first of `names` that is set, or nullptr.
inline const char* first_set(std::initializer_list<const char*> names, const char** which = nullptr) {
  for (const char* n : names)
    if (const char* v = getenv_nonempty(n)) {
      if (which) *which = n;
      return v;
    }
  return nullptr;
}

/// The world of a task `srun` started: SLURM_PROCID, SLURM_LOCALID and SLURM_STEP_ID set
/// (a batch script or an `salloc` shell has a SLURM_PROCID too, but no step of its own:
/// it is a plain start). Empty otherwise.
inline std::optional<World> world_from_slurm() {
  const char* step_var = nullptr;
  const char* step = first_set({"SLURM_STEP_ID", "SLURM_STEPID"}, &step_var);
  if (!getenv_nonempty("SLURM_PROCID") || !step) return std::nullopt;
  // SLURM numbers its own steps (batch script, extern, interactive) from 0xfffffff0 up.
  const long long step_id = env_int(step_var, 0, 0, 0xffffffffLL);
  if (step_id >= 0xfffffff0LL) return std::nullopt;
  World w;
  const char* tasks_var = nullptr;
  if (!first_set({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, &tasks_var))
    throw ConfigError("SLURM_PROCID and SLURM_STEP_ID are set (srun started this task) but none of SLURM_STEP_NUM_TASKS, "
                      "SLURM_NTASKS, SLURM_NPROCS is: anvil cannot tell how many ranks there are");
  w.world_size = static_cast<int>(env_int(tasks_var, 1, 1, 1 << 20));
  w.rank = static_cast<int>(env_int("SLURM_PROCID", 0, 0, w.world_size - 1));
  if (!getenv_nonempty("SLURM_LOCALID"))
    throw ConfigError("SLURM_PROCID is set (srun started this task) but SLURM_LOCALID is not: anvil cannot tell its rank "
                      "on this node");
  w.local_rank = static_cast<int>(env_int("SLURM_LOCALID", 0, 0, w.world_size - 1));
  w.node_rank = static_cast<int>(env_int("SLURM_NODEID", 0, 0, 1 << 20));
  const char* nodes_var = nullptr;
  const char* nodes = first_set({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &nodes_var);
  const char* count_var = nullptr;
  if (first_set({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, &count_var))
    w.nnodes = static_cast<int>(env_int(count_var, 1, 1, 1 << 20));
  else if (nodes)
    w.nnodes = static_cast<int>(expand_hostlist(nodes, nodes_var).size());
  if (w.node_rank >= w.nnodes)
    throw ConfigError("environment variable SLURM_NODEID=" + std::to_string(w.node_rank) + " is out of range [0, " +
                      std::to_string(w.nnodes - 1) + "] (" + (count_var ? count_var : nodes_var ? nodes_var : "nodes") + ")");
  const char* per_node_var = nullptr;
  if (const char* per_node = first_set({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &per_node_var)) {
    const auto counts = expand_tasks_per_node(per_node, per_node_var);
    w.local_world_size = counts.size() == 1 ? counts[0] : counts.at(std::min(counts.size() - 1, static_cast<std::size_t>(w.node_rank)));
  } else {
    w.local_world_size = std::max(1, w.world_size / w.nnodes);
  }
  if (w.local_rank >= w.local_world_size)
    throw ConfigError("environment variable SLURM_LOCALID=" + std::to_string(w.local_rank) + " is out of range [0, " +
                      std::to_string(w.local_world_size - 1) + "] (" + (per_node_var ? per_node_var : "tasks per node") + ")");
  if (const char* addr = getenv_nonempty("MASTER_ADDR")) {
    w.master_addr = addr;
  } else if (nodes) {
    w.master_addr = expand_hostlist(nodes, nodes_var).front();  // rank 0 runs on the step's first node
  } else {
    throw ConfigError("srun started this task but neither MASTER_ADDR nor SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or "
                      "SLURM_NODELIST is set: anvil cannot tell where rank 0 serves the rendezvous");
  }
  const char* job_var = nullptr;
  if (getenv_nonempty("MASTER_PORT")) {
    w.master_port = static_cast<int>(env_int("MASTER_PORT", 0, 1, 65535));
  } else if (first_set({"SLURM_JOB_ID", "SLURM_JOBID"}, &job_var)) {
    w.master_port = slurm_port(static_cast<unsigned long long>(env_int(job_var, 0, 0, 1LL << 62)),
                               static_cast<unsigned long long>(step_id));
  } else {
    throw ConfigError("srun started this task but neither MASTER_PORT nor SLURM_JOB_ID is set: anvil cannot choose the "
                      "rendezvous port");
  }
  const char* job = first_set({"SLURM_JOB_ID", "SLURM_JOBID"});
  w.source = std::string("SLURM step ") + (job ? job : "?") + "." + step;
  return w;
}

}  // namespace detail

/// The device index (among the CUDA devices this process sees) of the rank with `local_rank`
/// when it sees `visible` devices: its own when every rank of the node sees them all
/// (torchrun, anvil's launcher); under per-task binding (srun --gpus-per-task=1,
/// --gpu-bind), where CUDA_VISIBLE_DEVICES gives each task its own, the rank's place
/// within what it sees: `local_rank mod visible` (device 0 when it sees one).
[[nodiscard]] constexpr int visible_device(int local_rank, int visible) noexcept {
  return visible > 0 ? local_rank % visible : local_rank;
}

/// The world a launcher put this process in. When RANK is set (torchrun, anvil's launcher,
/// a wrapper script): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT are
/// required, LOCAL_WORLD_SIZE, GROUP_RANK (or NODE_RANK) and NNODES are read when set.
/// Else, in a task `srun` started: its SLURM variables (`detail::world_from_slurm`; each task
/// one rank; MASTER_ADDR and MASTER_PORT win where set, else the step's first node and a
/// port from the job id). Empty otherwise (a plain start). Throws ConfigError naming the
/// variable that is missing or malformed.
inline std::optional<World> world_from_env() {
  if (!detail::getenv_nonempty("RANK")) return detail::world_from_slurm();
  for (const char* required : {"WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (!detail::getenv_nonempty(required))
      throw ConfigError(std::string("RANK is set (a launcher started this rank) but ") + required +
                        " is not: set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT together");
  World w;
  w.world_size = static_cast<int>(detail::env_int("WORLD_SIZE", 1, 1, 1 << 20));
  w.rank = static_cast<int>(detail::env_int("RANK", 0, 0, w.world_size - 1));
  w.local_world_size = static_cast<int>(detail::env_int("LOCAL_WORLD_SIZE", w.world_size, 1, w.world_size));
  w.local_rank = static_cast<int>(detail::env_int("LOCAL_RANK", 0, 0, w.world_size - 1));
  w.node_rank = static_cast<int>(detail::env_int("GROUP_RANK", detail::env_int("NODE_RANK", 0, 0, 1 << 20), 0, 1 << 20));
  w.nnodes = static_cast<int>(detail::env_int("NNODES", 1, 1, 1 << 20));
  w.master_addr = detail::getenv_nonempty("MASTER_ADDR");
  w.master_port = static_cast<int>(detail::env_int("MASTER_PORT", 0, 1, 65535));
  // torchrun's agent serves the store; workers of attempt k use keys under /worker/attempt_k.
  if (const char* a = detail::getenv_nonempty("TORCHELASTIC_USE_AGENT_STORE"); a && std::string(a) == "True") {
    w.agent_store = true;
    w.store_prefix = "/worker/attempt_" + std::to_string(detail::env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20));
  }
  if (const char* a = detail::getenv_nonempty("ANVIL_AGENT_STORE"); a && std::string(a) == "1") w.agent_store = true;
  return w;
}

}  // namespace dist
}  // namespace anvil
