#pragma once
/// @file
/// Which ranks make up a run and how they meet: `World`, read from the variables that
/// torchrun, SLURM wrappers and anvil's own launcher set (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT, ...). Light header: no Torch.

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

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

/// The world a launcher put this process in, when RANK is set (torchrun, SLURM wrappers,
/// anvil's launcher): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT are
/// required, LOCAL_WORLD_SIZE, GROUP_RANK (or NODE_RANK) and NNODES are read when set.
/// Empty when RANK is not set (a plain start). Throws ConfigError naming the variable that
/// is missing or malformed.
inline std::optional<World> world_from_env() {
  if (!detail::getenv_nonempty("RANK")) return std::nullopt;
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
