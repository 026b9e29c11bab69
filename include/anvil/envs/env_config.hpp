#pragma once
/// @file
/// The `env` and `normalize` sections of a run's config, apart from the classes that use
/// them, so a config can be built without torch (`anvil/compiled.hpp`). Light header.

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>

namespace anvil::envs {

/// Sync: step inside `step()`; async: step on a background thread (see file comment).
enum class VecMode { sync, async };
constexpr auto enum_names(VecMode) { return std::array<std::string_view, 2>{"sync", "async"}; }

/// What a run does when a Python env's worker process stops answering (`env.on_hang`).
enum class HangAction { stop, wait };
constexpr auto enum_names(HangAction) { return std::array<std::string_view, 2>{"stop", "wait"}; }

/// What an env that can be seen two ways hands out (`env.observation`).
enum class ObservationKind { own, state, image };
constexpr auto enum_names(ObservationKind) { return std::array<std::string_view, 3>{"own", "state", "image"}; }

/// The `env` section of a run's config.
struct VecEnvConfig {
  Param<int, "num_envs", "environments stepped together (one batched action per step)",
        in_range(1, 1 << 20)>
      num_envs{1};
  Param<int, "threads", "threads stepping the envs (1: the calling thread only)", in_range(1, 1024)>
      threads{1};
  Param<VecMode, "mode", "sync: step in step(); async: step in the background during updates">
      mode{VecMode::sync};
  Param<std::string, "id",
        "the env by name, in programs that choose it at run time (Pendulum-v1, CartPole-v1, CartPoleNoVel-v1, Acrobot-v1, "
        "MountainCarContinuous-v0, PixelPendulum-v1 (images); multi-agent: Mapping, SimpleSpread, Climbing, "
        "Penalty, Credit; an env in Python: python:MODULE:ATTR); elsewhere empty or the program's env">
      id{""};
  Param<KeyValues, "kwargs",
        "keyword arguments of a python: env's factory, one key each (env.kwargs.K=V; values read as Python "
        "literals where they are one)">
      kwargs{};
  Param<int, "workers",
        "where a python: env steps: 0 in this process (an embedded interpreter); W > 0 in W worker processes, "
        "each a slice of the envs, through shared memory",
        in_range(0, 1024)>
      workers{0};
  Param<double, "worker_timeout",
        "seconds a Python env worker may take over one batched step or reset before it is reported as hung",
        Range{.lo = 0, .lo_open = true}>
      worker_timeout{60.0};
  Param<HangAction, "on_hang", "a hung Python env worker: stop (the run ends, naming the env and step) or wait "
                               "(report it each env.worker_timeout and keep waiting)">
      on_hang{HangAction::stop};
  Param<ObservationKind, "observation",
        "own: what the env hands out; state or image, in programs whose env has both (diffusion_pusht: Push-T's image "
        "variant, the field drawn at env.image_size RGB beside agent_pos); elsewhere own or the env's kind">
      observation{ObservationKind::own};
  Param<int, "image_size",
        "image observations' height and width in pixels, where the env is drawn by anvil (PixelPendulum-v1, "
        "diffusion_pusht's env.observation=image); 0: the env's own (64 and 96)",
        in_range(0, 1024)>
      image_size{0};
  Param<int, "frame_stack", "frames stacked in each observation of a pixel task (PixelPendulum-v1); 0: its own (3)",
        in_range(0, 64)>
      frame_stack{0};
  Param<int, "action_repeat",
        "env steps each agent action is repeated for, in a pixel task (PixelPendulum-v1); 0: its own (2)",
        in_range(0, 1000)>
      action_repeat{0};
  Param<std::int64_t, "max_episode_steps",
        "the training episodes' time limit in env steps, for a built-in env (not PixelPendulum-v1); 0: the env's own (Gymnasium's, "
        "MetaWorld v2's 500; MetaWorld v1 and mtrl's MT10 used 150)",
        at_least(0)>
      max_episode_steps{0};
  Param<std::int64_t, "eval_max_episode_steps",
        "the evaluation episodes' time limit in env steps, for a built-in env (not PixelPendulum-v1); 0: the env's own (not "
        "env.max_episode_steps: the two horizons are set apart)",
        at_least(0)>
      eval_max_episode_steps{0};
  Param<std::string, "suite", "a suite of tasks for envs that have tasks (the manipulation suite: mt10)"> suite{""};
  Param<std::vector<std::string>, "tasks",
        "tasks for envs that have tasks, comma-separated (e.g. reach,push); envs are spread over them">
      tasks{};

  /// `image_size`, or `own` where it is 0; a ConfigError naming the field for 1 to 7 (too
  /// small for any encoder; the field's range has to admit 0).
  [[nodiscard]] int image_size_or(int own) const {
    if (*image_size > 0 && *image_size < 8)
      throw ConfigError("env.image_size=" + std::to_string(*image_size) +
                        ": images are at least 8 pixels a side (0: the env's own size)");
    return *image_size > 0 ? *image_size : own;
  }
  /// For an env in Python (`id`), which declares its own tasks and keeps its own time limit:
  /// a ConfigError naming env.suite, env.tasks, env.max_episode_steps or
  /// env.eval_max_episode_steps where one is set (they apply to C++ envs).
  void refuse_python_fields(const std::string& id) const {
    if (!suite->empty() || !tasks->empty())
      throw ConfigError(std::string(suite->empty() ? "env.tasks" : "env.suite") + ": " + id +
                        " declares its own tasks (its `tasks` attribute); env.suite and env.tasks choose among a C++ "
                        "suite's");
    refuse_time_limits(id + " keeps its own time limit (wrap the env in gymnasium.wrappers.TimeLimit)");
  }
  /// A ConfigError naming env.eval_max_episode_steps or env.max_episode_steps, whichever is
  /// set, followed by `why` (the envs that keep their own limit: Python's, batched ones).
  void refuse_time_limits(const std::string& why) const {
    const bool eval = *eval_max_episode_steps > 0;
    if (eval || *max_episode_steps > 0)
      throw ConfigError(std::string(eval ? "env.eval_max_episode_steps=" : "env.max_episode_steps=") +
                        std::to_string(eval ? *eval_max_episode_steps : *max_episode_steps) + ": " + why);
  }
  /// Whether any of the pixel task's settings (image_size, frame_stack, action_repeat) is set.
  [[nodiscard]] bool pixel_settings() const { return *image_size > 0 || *frame_stack > 0 || *action_repeat > 0; }
};

/// The `normalize` section of a run's config.
struct NormalizeConfig {
  Param<bool, "obs", "normalise observations by their running mean and variance"> obs{false};
  Param<bool, "reward", "scale rewards by the running std of the discounted return"> reward{false};
  Param<double, "clip_obs", "clip normalised observations to [-clip, clip]", positive> clip_obs{10.0};
  Param<double, "clip_reward", "clip scaled rewards to [-clip, clip]", positive> clip_reward{10.0};
  Param<double, "gamma", "discount of the return whose std scales rewards (0: the algorithm's gamma)",
        in_range(0, 1)>
      gamma{0.0};
  Param<double, "epsilon", "added to variances before the square root", positive> epsilon{1e-8};
};

}  // namespace anvil::envs
