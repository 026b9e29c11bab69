#pragma once
/// @file
/// `DDP<N>`: data-parallel training on PyTorch's c10d (NCCL on CUDA devices, Gloo on the
/// CPU). One rank per device; each rank has its own envs (distinct seeds) and its own
/// buffer, and every optimizer step averages the ranks' gradients (one flat, bucketed
/// all-reduce) so that parameters stay bitwise identical across ranks.
///
/// Two ways in, one code path:
/// - under torchrun, SLURM wrappers or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK,
///   MASTER_ADDR and MASTER_PORT, the process joins that world (multi-node included);
/// - started plainly, it becomes the launcher of its node (parallel/launch.hpp): it starts N
///   ranks of the same executable and supervises them. With NNODES and NODE_RANK set, one
///   such launcher per node makes a multi-node world.
/// `DDP<0>` (`DDPAuto`) takes N from parallel.nproc_per_node, --gpu-ids or --num-gpus; with
/// none of them it runs one rank per visible GPU on CUDA (run.device auto or cuda) and one
/// rank otherwise, and says so in the run's world line.

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>
#include <cstdint>
#include <string>
#include <vector>

#include <unistd.h>

#include <anvil/core/concepts.hpp>
#include <anvil/core/kept_copy.hpp>
#include <anvil/core/param.hpp>
#include <anvil/parallel/c10d.hpp>
#include <anvil/parallel/launch.hpp>
#include <anvil/parallel/world.hpp>

namespace anvil {

/// Which c10d backend runs the collectives.
enum class DistBackend { auto_, gloo, nccl };
constexpr auto enum_names(DistBackend) { return std::array<std::string_view, 3>{"auto", "gloo", "nccl"}; }

/// Settings of `DDP<N>` (section `parallel`; its keys may be written without the section:
/// `--num-gpus 2`, `--gpu-ids 0,2`).
struct DDPConfig {
  Param<int, "nproc_per_node",
        "ranks this node starts when run plainly (0: DDP<N>'s N, else one per GPU chosen; DDPAuto with no "
        "count: one per visible GPU on CUDA, one on the CPU)",
        in_range(0, 1024)>
      nproc_per_node{0};
  Param<int, "num_gpus", "GPUs to use, one rank each: cuda:0 .. cuda:n-1 (0: as nproc_per_node says)",
        in_range(0, 1024)>
      num_gpus{0};
  Param<std::vector<int>, "gpu_ids", "the GPUs to use, one rank each (rank with LOCAL_RANK i uses the i-th)">
      gpu_ids{};
  Param<DistBackend, "backend", "auto: nccl on CUDA devices, gloo on the CPU"> backend{DistBackend::auto_};
  Param<double, "timeout_s",
        "how long a collective or the rendezvous waits for the other ranks before the run fails",
        Range{.lo = 0.1, .hi = 86'400}>
      timeout_s{300};
  Param<double, "stop_grace_s", "when a rank fails, seconds the launcher gives the others to stop before SIGKILL",
        Range{.lo = 0, .hi = 3600}>
      stop_grace_s{5};
  Param<int, "nnodes", "nodes in the run (0: NNODES from the environment, else 1)", in_range(0, 1 << 20)> nnodes{0};
  Param<int, "node_rank", "this node's index (-1: NODE_RANK from the environment, else 0)", in_range(-1, 1 << 20)>
      node_rank{-1};
  Param<std::string, "master_addr", "host of the rendezvous (empty: MASTER_ADDR, else 127.0.0.1)"> master_addr{""};
  Param<int, "master_port", "port of the rendezvous (0: MASTER_PORT, else a free port on one node)",
        in_range(0, 65535)>
      master_port{0};
  Param<std::string, "interface", "network interface Gloo uses (empty: GLOO_SOCKET_IFNAME, else by address)">
      interface{""};
  Param<double, "bucket_mb", "largest piece of the gradient all-reduced in one call", Range{.lo = 0.01, .hi = 4096}>
      bucket_mb{25};
  Param<bool, "capture_all_reduce",
        "with NCCL, capture the gradient all-reduce inside the algorithm's CUDA graph, where a multi-GPU run has it "
        "(false: an update with an all-reduce runs op by op; tested on one rank, not yet measured on several GPUs)">
      capture_all_reduce{false};
};

namespace dist {

/// Collectives over c10d for one rank: the part of `DDP<N>` that does not depend on N
/// (tests and benchmarks build it directly on a store of their own).
class Group {
 public:
  Group() = default;
  /// Joins `world` through `store` with `backend` on `device`. Throws DistributedError
  /// naming this rank when the others do not arrive within `timeout`. A world of one rank
  /// has no backend (collectives do nothing) unless `even_alone` (to time a backend alone).
  Group(const World& world, c10::intrusive_ptr<compat::Store> store, c10::Device device, DistBackend backend,
        std::chrono::milliseconds timeout, const std::string& interface = "", double bucket_mb = 25,
        bool even_alone = false)
      : world_(world), store_(std::move(store)), device_(device), timeout_(timeout),
        bucket_elems_(std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_mb * (1 << 20) / 4))) {
    if (world_.world_size == 1 && !even_alone) return;
    if (backend == DistBackend::auto_)
      backend = device.is_cuda() && compat::has_nccl ? DistBackend::nccl : DistBackend::gloo;
    if (backend == DistBackend::nccl && !device.is_cuda())
      throw ConfigError("parallel.backend=nccl runs on CUDA devices; this run is on " + device.str() + " (use gloo)");
    if (backend == DistBackend::nccl && !compat::has_nccl)
      throw DeviceError("parallel.backend=nccl but this LibTorch was built without NCCL (use gloo)");
    backend_ = backend;
    try {
      // This rank's address, for survivors who need to name a rank that died.
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      host_ = host;
      const std::string me = host_ + " " + std::to_string(::getpid());
      store_->set(pid_key(world_.rank), std::vector<std::uint8_t>(me.begin(), me.end()));
      if (backend == DistBackend::nccl) {
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
        pg_ = compat::make_nccl_group(store_, world_.rank, world_.world_size, timeout_);
      } else {
        pg_ = compat::make_gloo_group(store_, world_.rank, world_.world_size,
                                      compat::gloo_device(interface, world_.master_addr), timeout_);
      }
      // Every rank is here once one collective has gone round.
      auto t = at::ones({1}, at::TensorOptions().device(device_));
      std::vector<at::Tensor> v{t};
      pg_->allreduce(v)->wait(timeout_);
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& e) {
      fail("joining the world of " + std::to_string(world_.world_size) + " ranks at " + world_.rendezvous(), e);
    }
  }
  Group(Group&&) noexcept = default;
  Group& operator=(Group&&) noexcept = default;
  ~Group() {
    // After a failed collective the backend's threads may still wait on a dead peer;
    // destroying it would join them. Let the process end instead.
    if (failed_ && pg_) (void)pg_.release();
  }

  [[nodiscard]] const World& world() const noexcept { return world_; }
  [[nodiscard]] int rank() const noexcept { return world_.rank; }
  [[nodiscard]] int world_size() const noexcept { return world_.world_size; }
  [[nodiscard]] DistBackend backend() const noexcept { return backend_; }
  /// Seconds spent in collectives so far (wall time, this rank).
  [[nodiscard]] double comm_seconds() const noexcept { return comm_seconds_; }
  [[nodiscard]] std::int64_t collectives() const noexcept { return calls_; }

  /// Averages `ts` across ranks in place: the tensors are packed into one flat buffer (each
  /// of the flat optimizers' gradients is one tensor already), reduced in pieces of at most
  /// `bucket_mb` that are all in flight at once, and unpacked.
  void all_reduce_mean(std::vector<at::Tensor>& ts) {
    if (!pg_ || ts.empty()) return;
    timed("all-reduce of the gradients", [&] {
      at::Tensor flat;
      const bool one = ts.size() == 1 && ts[0].is_contiguous() && ts[0].dim() == 1;
      if (one) {
        flat = ts[0];
      } else {
        std::vector<at::Tensor> parts;
        parts.reserve(ts.size());
        for (auto& t : ts) parts.push_back(t.reshape(-1));
        flat = at::cat(parts);
      }
      reduce_in_buckets(flat, c10d::ReduceOp::SUM);
      flat.div_(world_.world_size);
      if (!one) {
        std::int64_t off = 0;
        for (auto& t : ts) {
          t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
          off += t.numel();
        }
      }
    });
  }

  /// Rank 0's tensors on every rank, in place.
  void broadcast(std::vector<at::Tensor>& ts) {
    if (!pg_ || ts.empty()) return;
    timed("broadcast from rank 0", [&] {
      for (auto& t : ts) {
        auto d = t.is_contiguous() && t.device() == device_ ? t : t.to(device_).contiguous();
        std::vector<at::Tensor> v{d};
        c10d::BroadcastOptions o;
        o.rootRank = 0;
        pg_->broadcast(v, o)->wait(timeout_);
        mark_written(d);  // received through its pointer
        if (!d.is_same(t)) t.copy_(d);
      }
    });
  }

  /// Throws DistributedError: `what` failed on this rank because of `e`, naming the rank at
  /// fault when it can be told (a rank on this host whose process is gone, or rank 0 when it
  /// served the store and the store is unreachable).
  [[noreturn]] void fail(const std::string& what, const std::exception& e) {
    failed_ = true;
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw DistributedError("rank " + std::to_string(world_.rank) + ": " + what + " failed: " + culprit() + " (" +
                           why + ")");
  }

 private:
  static std::string pid_key(int rank) { return "pid/" + std::to_string(rank); }

  template <class F>
  void timed(const char* what, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f();
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& e) {
      fail(what, e);
    }
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++calls_;
  }

  void reduce_in_buckets(at::Tensor& flat, c10d::ReduceOp op) {
    std::vector<c10::intrusive_ptr<compat::Work>> pending;
    std::vector<std::vector<at::Tensor>> pieces;
    const std::int64_t n = flat.numel();
    pieces.reserve(static_cast<std::size_t>((n + bucket_elems_ - 1) / bucket_elems_));
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    for (std::int64_t off = 0; off < n; off += bucket_elems_) {
      pieces.push_back({flat.narrow(0, off, std::min(bucket_elems_, n - off))});
      pending.push_back(pg_->allreduce(pieces.back(), o));
    }
    for (auto& w : pending) w->wait(timeout_);
    mark_written(flat);  // received through its pointer
  }

  // Whether process `pid` of this host has ended (gone, or a zombie not yet reaped).
  static bool has_ended(pid_t pid) {
    if (::kill(pid, 0) != 0) return errno == ESRCH;
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    if (!f) return true;
    char state = '?';
    // The state follows the command name in parentheses, which may itself hold spaces.
    char line[512] = {};
    const bool got = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    if (const char* p = got ? std::strrchr(line, ')') : nullptr; p && p[1] == ' ') state = p[2];
    return state == 'Z' || state == 'X';
  }

  // Which rank is at fault, as far as this rank can tell. A peer killed a moment ago may
  // still be tearing down when its socket closes, so look for up to a second.
  std::string culprit() {
    std::string dead;
    try {
      store_->setTimeout(std::chrono::seconds(2));
      std::vector<std::pair<int, pid_t>> local;  // the other ranks on this host
      for (int r = 0; r < world_.world_size; ++r) {
        if (r == world_.rank) continue;
        const auto v = store_->get(pid_key(r));
        const std::string s(v.begin(), v.end());
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.substr(0, sp) != host_) continue;  // another host: cannot tell
        local.emplace_back(r, static_cast<pid_t>(std::stol(s.substr(sp + 1))));
      }
      for (int attempt = 0; attempt < 20 && dead.empty() && !local.empty(); ++attempt) {
        if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (const auto& [r, pid] : local)
          if (has_ended(pid))
            dead += (dead.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (pid " +
                    std::to_string(pid) + ")";
      }
    } catch (const std::exception&) {
      if (!world_.agent_store && world_.rank != 0)
        return "rank 0, which serves the rendezvous store at " + world_.rendezvous() + ", is unreachable: it has died";
      return "the rendezvous store at " + world_.rendezvous() + " is unreachable (its launcher has stopped)";
    }
    if (!dead.empty()) return dead + (dead.find(',') == std::string::npos ? " has died" : " have died");
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", static_cast<double>(timeout_.count()) / 1000.0);
    return std::string("a rank died or did not answer within parallel.timeout_s (") + secs + " s)";
  }

  World world_;
  c10::intrusive_ptr<compat::Store> store_;
  c10::intrusive_ptr<compat::Collectives> pg_;
  c10::Device device_{c10::kCPU};
  std::chrono::milliseconds timeout_{300'000};
  std::int64_t bucket_elems_ = 1 << 22;
  DistBackend backend_ = DistBackend::gloo;
  std::string host_;
  bool failed_ = false;
  double comm_seconds_ = 0;
  std::int64_t calls_ = 0;
};

/// The store a rank of `world` meets the others through: a client of the launcher's store,
/// or (without one) served by rank 0. Throws DistributedError naming the address tried.
inline c10::intrusive_ptr<compat::Store> connect_store(const World& world, std::chrono::milliseconds timeout) {
  const bool serve = world.rank == 0 && !world.agent_store;
  try {
    auto tcp = compat::make_tcp_store(world.master_addr, static_cast<std::uint16_t>(world.master_port),
                                      world.world_size, serve, timeout);
    return c10::make_intrusive<c10d::PrefixStore>(world.store_prefix, tcp);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw DistributedError("rank " + std::to_string(world.rank) + ": " +
                           (serve ? "cannot serve the rendezvous store at " + world.rendezvous()
                                  : "cannot reach the rendezvous at " + world.rendezvous() + " within " +
                                        std::to_string(timeout.count() / 1000) + " s") +
                           " (MASTER_ADDR:MASTER_PORT): " + why);
  }
}

}  // namespace dist

/// Parallelism policy: data-parallel over `N` ranks per node (see file comment). `DDP<0>`
/// decides N at run time.
template <int N>
class DDP {
  static_assert(N >= 0, "DDP<N>: N is the number of ranks per node (0: decided at run time)");

 public:
  using policy_kind = ParallelismKind;
  static constexpr FixedString config_section = "parallel";
  static constexpr bool can_use_cuda = true;
  using Config = DDPConfig;

  /// Started plainly (no RANK, WORLD_SIZE, ... in the environment) with several ranks per
  /// node or several nodes: makes this process the launcher of its node's ranks, which run
  /// the same program with the same arguments; never returns (the launcher exits with their
  /// outcome). Otherwise returns at once. `anvil::start` calls it from main; nothing else
  /// may (a constructor must not fork).
  /// `device` is the run's `run.device`: DDPAuto given no rank count runs one rank per
  /// visible GPU when it is auto or cuda (and GPUs are visible), else one.
  static void start_ranks(const Config& cfg, std::string_view device) {
    if (dist::world_from_env()) return;  // a rank already
    const auto plan = launch_plan(cfg, auto_ranks(device));
    if (plan.nproc_per_node == 1 && plan.nnodes == 1) return;  // one rank: this process
    if (!counted(cfg))
      std::fprintf(stderr, "DDPAuto: no rank count given (parallel.nproc_per_node, --num-gpus or --gpu-ids): %d ranks, "
                           "one per visible GPU\n", plan.nproc_per_node);
    dist::launch(plan);
  }

  /// Joins the world a launcher set up. A process started plainly is the only rank when the
  /// config asks for one; when it asks for more, the ranks must have been launched
  /// (`anvil::start` in main does it), else a ConfigError says so.
  explicit DDP(const Config& cfg) : cfg_(cfg) {
    if (auto w = dist::world_from_env()) {
      world_ = *w;
      joined_ = true;
      if (N > 0 && world_.local_world_size != N)
        note_ = "DDP<" + std::to_string(N) + "> joined a launcher's world of " + std::to_string(world_.local_world_size) +
                " rank(s) per node (LOCAL_WORLD_SIZE)";
      else if (N == 0 && !counted(cfg) && dist::detail::getenv_nonempty("ANVIL_AGENT_STORE"))
        note_ = "DDPAuto with no rank count: one rank per visible GPU";
    } else {
      // Started plainly: anvil::start launched the ranks if there were to be several.
      const auto plan = launch_plan(cfg, 1);
      if (N == 0 && !counted(cfg))
        note_ = "DDPAuto with no rank count: one rank (parallel.nproc_per_node, --num-gpus or --gpu-ids for more)";
      if (plan.nproc_per_node != 1 || plan.nnodes != 1)
        throw ConfigError("DDP<" + std::to_string(N) + ">: this process was started plainly and is not a rank of a world of " +
                          std::to_string(plan.nproc_per_node * plan.nnodes) +
                          " ranks; call anvil::start(argc, argv, ...) first in main (it launches them), or start it "
                          "under torchrun");
      world_ = dist::World{};  // one rank: nothing to launch or agree on
    }
    if (!cfg.gpu_ids->empty() && world_.local_rank >= static_cast<int>(cfg.gpu_ids->size()))
      throw ConfigError("parallel.gpu_ids lists " + std::to_string(cfg.gpu_ids->size()) + " GPU(s) but this rank has LOCAL_RANK=" +
                        std::to_string(world_.local_rank));
  }

  [[nodiscard]] int rank() const noexcept { return world_.rank; }
  [[nodiscard]] int local_rank() const noexcept { return world_.local_rank; }
  [[nodiscard]] int world_size() const noexcept { return world_.world_size; }
  [[nodiscard]] bool is_main() const noexcept { return world_.rank == 0; }
  [[nodiscard]] const dist::World& world() const noexcept { return world_; }
  /// The CUDA device this rank uses when the run is on CUDA: the LOCAL_RANK-th of
  /// parallel.gpu_ids, else cuda:LOCAL_RANK among the GPUs this process sees, taken modulo
  /// their number (`dist::visible_device`): under per-task binding (srun --gpus-per-task=1)
  /// each rank sees only its own GPU, cuda:0.
  [[nodiscard]] int device_index() const {
    if (!cfg_.gpu_ids->empty()) return (*cfg_.gpu_ids)[static_cast<std::size_t>(world_.local_rank)];
    const int visible = at::hasCUDA() ? static_cast<int>(torch::cuda::device_count()) : 0;
    return dist::visible_device(world_.local_rank, visible);
  }

  /// Builds the process group once the run's device is known (NCCL needs it).
  void connect(c10::Device device) {
    if (!device.is_cuda() && (*cfg_.num_gpus > 0 || !cfg_.gpu_ids->empty()))
      throw ConfigError(std::string(*cfg_.num_gpus > 0 ? "parallel.num_gpus" : "parallel.gpu_ids") +
                        " chooses GPUs but this run is on " + device.str() +
                        " (run.device); for ranks on the CPU use parallel.nproc_per_node");
    if (device.is_cuda() && cfg_.gpu_ids->empty()) {
      const int visible = static_cast<int>(torch::cuda::device_count());
      if (visible < world_.local_world_size) {
        const char* cvd = dist::detail::getenv_nonempty("CUDA_VISIBLE_DEVICES");
        note_ += std::string(note_.empty() ? "" : "; ") + "LOCAL_RANK " + std::to_string(world_.local_rank) + " of " +
                 std::to_string(world_.local_world_size) + " on this node sees " + std::to_string(visible) + " GPU(s)" +
                 (cvd ? std::string(" (CUDA_VISIBLE_DEVICES=") + cvd + ")" : std::string()) + ": it uses " + device.str() +
                 " among them";
      }
    }
    if (world_.world_size == 1) return;
    group_ = dist::Group(world_, dist::connect_store(world_, timeout()), device, cfg_.backend, timeout(),
                         cfg_.interface, cfg_.bucket_mb);
  }

  void all_reduce_mean(std::vector<at::Tensor>& ts) { group_.all_reduce_mean(ts); }
  /// Whether a CUDA graph may hold the all-reduce (`parallel.capture_all_reduce`, NCCL).
  [[nodiscard]] bool all_reduce_in_graph() const noexcept {
    return *cfg_.capture_all_reduce && group_.backend() == DistBackend::nccl;
  }
  void broadcast(std::vector<at::Tensor>& ts) { group_.broadcast(ts); }
  [[nodiscard]] double comm_seconds() const noexcept { return group_.comm_seconds(); }

  /// One line for the log: ranks, nodes, backend, how this process got here.
  [[nodiscard]] std::string describe() const {
    std::string s = std::to_string(world_.world_size) + " rank(s)";
    if (world_.nnodes > 1) s += " on " + std::to_string(world_.nnodes) + " nodes";
    if (world_.world_size > 1) s += std::string(", ") + (group_.backend() == DistBackend::nccl ? "nccl" : "gloo");
    s += joined_ ? (world_.agent_store ? ", started by a launcher" : ", joined via " + world_.source) : ", one process";
    if (world_.world_size > 1) s += ", rendezvous " + world_.rendezvous();
    if (!note_.empty()) s += "; " + note_;
    return s;
  }

 private:
  static std::chrono::milliseconds timeout_of(const Config& cfg) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(*cfg.timeout_s * 1000));
  }
  std::chrono::milliseconds timeout() const { return timeout_of(cfg_); }

  // Whether the config gives a rank count (else DDPAuto chooses one).
  static bool counted(const Config& cfg) {
    return N > 0 || *cfg.nproc_per_node > 0 || !cfg.gpu_ids->empty() || *cfg.num_gpus > 0;
  }
  // DDPAuto's ranks per node with no count given: one per visible GPU for a run on CUDA
  // (run.device auto or cuda), else one.
  static int auto_ranks(std::string_view device) {
    if (device != "auto" && device != "cuda") return 1;
    const int gpus = at::hasCUDA() ? static_cast<int>(torch::cuda::device_count()) : 0;
    return std::max(1, gpus);
  }

  // What this node's launcher starts: ranks per node (`fallback` when the config and N
  // give no count), nodes, this node's index, the rendezvous (from the config, else the
  // environment); a ConfigError naming the fields that disagree.
  static dist::LaunchPlan launch_plan(const Config& cfg, int fallback) {
    dist::LaunchPlan plan;
    plan.nproc_per_node = ranks_per_node(cfg, fallback);
    plan.nnodes = *cfg.nnodes > 0 ? *cfg.nnodes : static_cast<int>(dist::detail::env_int("NNODES", 1, 1, 1 << 20));
    plan.node_rank = *cfg.node_rank >= 0 ? *cfg.node_rank
                                         : static_cast<int>(dist::detail::env_int("NODE_RANK", 0, 0, plan.nnodes - 1));
    if (plan.node_rank >= plan.nnodes)
      throw ConfigError("parallel.node_rank=" + std::to_string(plan.node_rank) + " is not below parallel.nnodes=" +
                        std::to_string(plan.nnodes));
    plan.master_addr = !cfg.master_addr->empty() ? *cfg.master_addr
                       : dist::detail::getenv_nonempty("MASTER_ADDR") ? std::string(std::getenv("MASTER_ADDR"))
                                                                     : std::string("127.0.0.1");
    plan.master_port = *cfg.master_port > 0 ? *cfg.master_port
                                            : static_cast<int>(dist::detail::env_int("MASTER_PORT", 0, 1, 65535));
    if (plan.nnodes > 1 && plan.master_port == 0)
      throw ConfigError("parallel.nnodes=" + std::to_string(plan.nnodes) +
                        ": every node must meet at the same port; set MASTER_PORT (or parallel.master_port)");
    plan.timeout = timeout_of(cfg);
    plan.grace = std::chrono::milliseconds(static_cast<std::int64_t>(*cfg.stop_grace_s * 1000));
    return plan;
  }

  // Ranks this node starts (see DDPConfig); a ConfigError naming the field when they disagree.
  static int ranks_per_node(const Config& cfg, int fallback) {
    const int by_ids = static_cast<int>(cfg.gpu_ids->size());
    auto agree = [&](int n, const std::string& source) {
      if (*cfg.nproc_per_node > 0 && *cfg.nproc_per_node != n)
        throw ConfigError("parallel.nproc_per_node=" + std::to_string(*cfg.nproc_per_node) + " but " + source);
      if (by_ids > 0 && by_ids != n)
        throw ConfigError("parallel.gpu_ids lists " + std::to_string(by_ids) + " GPU(s) but " + source);
      if (*cfg.num_gpus > 0 && *cfg.num_gpus != n)
        throw ConfigError("parallel.num_gpus=" + std::to_string(*cfg.num_gpus) + " but " + source);
      return n;
    };
    if constexpr (N > 0) return agree(N, "the program uses DDP<" + std::to_string(N) + ">");
    if (*cfg.nproc_per_node > 0) return agree(cfg.nproc_per_node, "parallel.nproc_per_node=" + std::to_string(*cfg.nproc_per_node));
    if (by_ids > 0) return agree(by_ids, "parallel.gpu_ids lists " + std::to_string(by_ids));
    if (*cfg.num_gpus > 0) return cfg.num_gpus;
    return fallback;
  }

  Config cfg_;
  dist::World world_;
  bool joined_ = false;
  std::string note_;
  dist::Group group_;
};

/// `DDP<0>`: the number of ranks comes from the command line or the launcher; with neither,
/// one per visible GPU on CUDA and one on the CPU.
using DDPAuto = DDP<0>;

static_assert(Parallelism<DDP<2>>);

}  // namespace anvil
