#pragma once
/// @file
/// What the Trainer (train/trainer.hpp) builds from its config that does not depend on its
/// policy types, so the host itself stays short and these are compiled once: the run's
/// context, its note on image observations, the step context's options, the update
/// threads, the policy file's parts from the envs and the normaliser, and the run's
/// description (`Run::Setup`) with its provenance. Not templates, but for the provenance's list of policy types
/// and the note on CUDA graphs.

#include <torch/cuda.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/algorithms/policy.hpp>
#include <anvil/core/blas.hpp>
#include <anvil/core/context.hpp>
#include <anvil/core/detail/thread_pool.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/core/torch_compat.hpp>
#include <anvil/core/type_name.hpp>
#include <anvil/core/version.hpp>
#include <anvil/data/step_collector.hpp>
#include <anvil/envs/normalize.hpp>
#include <anvil/observe/provenance.hpp>
#include <anvil/optim/step_context.hpp>
#include <anvil/precision/detail/common.hpp>
#include <anvil/train/loops/loop.hpp>
#include <anvil/train/run.hpp>
#include <anvil/train/run_config.hpp>

namespace anvil {

/// How the run's networks take their gradients, as the run's "gradients:" line and its
/// provenance (config.yaml's header, summary.json) say it: by the algorithm's hand-written
/// passes, or by autograd and why. `paths`: the algorithm's `gradient_paths()`
/// (anvil::DescribesGradients), empty for an algorithm (`section`) without such passes. The
/// matrix products are named as `blas::own_matmul()` says now (`run.matmul`, set first).
inline std::string describe_gradients(const std::vector<std::pair<std::string, std::string>>& paths,
                                      std::string_view section, const PrecisionSettings& precision) {
  if (paths.empty()) return "autograd (" + std::string(section) + " has no hand-written passes)";
  std::string out;
  for (const auto& [networks, why] : paths) {
    const std::string how =
        !why.empty()        ? "autograd (" + why + ")"
        : precision.autocast ? "autograd (" + std::string(precision.name) +
                                  " autocast; the hand-written passes are float32)"
                             : std::string("hand-written passes (float32, ") +
                                   (blas::own_matmul() ? "anvil's AVX-512 and BLAS products" : "BLAS products") +
                                   ", vectorised loops)";
    out += (out.empty() ? "" : "; ") + networks + " by " + how;
  }
  return out;
}

/// What the run header says of CUDA graphs on a GPU ("cuda graphs: ..."): the algorithm's
/// own account where it captures work (`cuda_graph_note(ctx)`: what is captured, and why not
/// where not), else that its update runs op by op.
template <class A>
std::string cuda_graph_note(const A& algo, const StepContext& ctx) {
  if constexpr (requires { { algo.cuda_graph_note(ctx) } -> std::convertible_to<std::string>; })
    return algo.cuda_graph_note(ctx);
  else
    return std::string(A::config_section.view()) + "'s update and acting run op by op (no captured form of them yet)";
}

/// The run's note on image observations ("observations: ..."), none without images; refuses
/// them, naming the env and the algorithm (`section`), when the algorithm reads only floats.
inline std::optional<std::string> image_note(const EnvSpec& spec, bool reads_images, std::string_view section) {
  if (!spec.byte_rows()) return std::nullopt;
  if (!reads_images)
    throw ConfigError("env.id: " + spec.name + "'s observations have images (" + spec.layout.describe() + "); " +
                      std::string(section) + " reads float observations only (SAC reads images)");
  return "observations: " + spec.layout.describe() +
         " (images as bytes to the device; the policy files hold the image encoder)";
}

/// The run's context on `device` for this rank of `world_size`: the seed, and the loop's
/// learning-rate scaling and micro-batches. Refuses a precision that needs a GPU without one.
inline RunContext run_context(c10::Device device, std::uint64_t seed, int rank, int world_size,
                              const LoopSettings& loop, const PrecisionSettings& precision) {
  if (precision.needs_cuda && !device.is_cuda()) {
    std::string name(precision.name);
    for (auto& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    throw DeviceError(name + " autocast needs a CUDA device; use BF16 on CPU (run.device is " + device.str() + ")");
  }
  RunContext ctx;
  ctx.device = device;
  ctx.seed = seed;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.lr_scaling = loop.lr_scaling;
  ctx.base_batch = loop.base_batch;
  ctx.micro_batches = loop.grad_accumulation;
  return ctx;
}

/// `run.update_threads`, with 0 resolved: SAC's update has two independent parts, so two
/// threads when this process has two cores to itself (measured 1.2-1.5x faster updates).
/// Cores it may use, not the machine's (on one core a second thread only spins), shared by
/// the `ranks_here` ranks on this node (LOCAL_WORLD_SIZE), not by the whole world.
inline int update_threads(int configured, int ranks_here) {
  if (configured > 0) return configured;
  return std::clamp(detail::available_cores() / std::max(1, ranks_here), 1, 2);
}

/// The step context's options for the run: autocast and loss scaling by the precision,
/// `threads` for an update's parts, micro-batches, the phase timers (on with `run.timings`,
/// waiting for the GPU with `run.sync_timings`), and the ranks' gradient all-reduce (which
/// a CUDA graph may hold where `all_reduce_in_graph`).
inline StepContext::Options step_options(const RunContext& ctx, const PrecisionSettings& precision, int threads,
                                         const RunConfig& run, PhaseTimes& times,
                                         std::function<void(std::vector<at::Tensor>&)> all_reduce_mean,
                                         bool all_reduce_in_graph = false) {
  StepContext::Options so;
  so.device = ctx.device;
  so.autocast = precision.autocast;
  so.autocast_dtype = precision.compute_dtype;
  so.threads = threads;
  so.micro_batches = ctx.micro_batches;
  so.times = &times;
  so.loss_scaling = precision.loss_scaling;
  times.enabled = run.timings;
  if (ctx.device.is_cuda() && run.sync_timings) times.sync = [] { torch::cuda::synchronize(); };
  if (ctx.world_size > 1) {
    so.all_reduce_mean = std::move(all_reduce_mean);
    so.all_reduce_in_graph = all_reduce_in_graph;
  }
  return so;
}

/// What a policy file holds besides the network: the env's name and action bounds, and with
/// `normalize.obs` the observation normaliser's mean and inverse standard deviation (the
/// policy acts on observations normalised as in training) and its clip.
inline PolicyFileParts policy_file_parts(const StepCollector& collector, const envs::NormalizeState* norm,
                                         const envs::NormalizeConfig& ncfg) {
  PolicyFileParts parts{collector.spec().name,
                        collector.action_scale(),
                        collector.action_offset(),
                        collector.action_low(),
                        collector.action_high(),
                        {},
                        {},
                        0};
  if (norm && ncfg.obs && !collector.spec().byte_rows()) {  // rows of parts are not normalised
    const auto& mean = norm->obs.mean();
    const auto var = norm->obs.variance();
    const auto d = collector.spec().obs_dim();
    parts.obs_mean = at::empty({d});
    parts.obs_inv_std = at::empty({d});
    for (std::int64_t j = 0; j < d; ++j) {
      parts.obs_mean[j] = mean[static_cast<std::size_t>(j)];
      parts.obs_inv_std[j] = 1.0 / std::sqrt(var[static_cast<std::size_t>(j)] + ncfg.epsilon);
    }
    parts.obs_clip = ncfg.clip_obs;
  }
  return parts;
}

/// The run's description for `Run`: its `run` section, names, config (hash, YAML, every
/// field), what it says when it starts (`world` first, after a warning when built without
/// optimisation, then `notes`) and the provenance: the env, `policy_types` (slot and type
/// name), versions, command line, host and start time. `program` empty: the executable's name.
inline Run::Setup run_setup(const RunConfig& run, std::string program, std::string algorithm, std::string precision,
                            const StepCollector& collector, c10::Device device, std::string config_hash,
                            std::string config_yaml, std::vector<std::pair<std::string, std::string>> config,
                            std::vector<std::string> acting_keys, std::string world, std::vector<std::string> notes,
                            const std::vector<std::pair<std::string, std::string>>& policy_types) {
  Run::Setup s;
  s.run = run;
  s.program = program.empty() ? std::string(program_invocation_short_name) : std::move(program);
  s.algorithm = std::move(algorithm);
  s.precision = std::move(precision);
  s.env_name = collector.spec().name;
  s.num_envs = collector.num_envs();
  s.device = device.str();
  s.config_hash = std::move(config_hash);
  s.config_yaml = std::move(config_yaml);
  s.config = std::move(config);
  s.acting_keys = std::move(acting_keys);
  s.notes = std::move(notes);
  s.notes.insert(s.notes.begin(), std::move(world));
  if (!compiled_optimised())
    s.notes.insert(s.notes.begin(), "warning: this program was compiled without optimisation, so it trains about 2x "
                                    "slower; build it with -DCMAKE_BUILD_TYPE=Release (or -O2)");
  s.provenance = {{"env", collector.spec().name}};
  s.provenance.insert(s.provenance.end(), policy_types.begin(), policy_types.end());
  s.provenance.insert(s.provenance.end(), {{"anvil", std::string(kVersion)},
                                           {"libtorch", compat::torch_version_string()},
                                           {"git_commit", program_git_commit()},
                                           {"command", command_line()},
                                           {"host", host_name()},
                                           {"started", utc_now()}});
  return s;
}

}  // namespace anvil
