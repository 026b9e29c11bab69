#pragma once
/// @file
/// The manipulation suite's tasks (envs/mujoco/manipulation.hpp): MetaWorld v2's MT10 by
/// name, what each draws per episode and how it is judged (its published ranges and
/// success thresholds), each task's scene and compiled model, the suite's constants
/// (MetaWorld's hand box, action scale, frame skip, episode length) and the tolerances and
/// product MetaWorld's rewards are made of.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include <anvil/core/error.hpp>
#include <anvil/envs/mujoco/models.hpp>
#include <anvil/envs/mujoco/sim.hpp>

namespace anvil::envs::mujoco {

/// The ten tasks of MetaWorld's MT10, in its one-hot order.
enum class Task : std::int8_t {
  reach,
  push,
  pick_place,
  door_open,
  drawer_open,
  drawer_close,
  button_press_topdown,
  peg_insert_side,
  window_open,
  window_close,
};
inline constexpr int kNumTasks = 10;

/// A task's name as MetaWorld spells it, without the version ("pick-place").
inline constexpr std::array<std::string_view, kNumTasks> kTaskNames{
    "reach",       "push",         "pick-place",           "door-open",       "drawer-open",
    "drawer-close", "button-press-topdown", "peg-insert-side", "window-open", "window-close"};

/// The task named `name`; a ConfigError naming `field` and the known names otherwise.
[[nodiscard]] inline Task task_named(std::string_view name, const std::string& field = "env.tasks") {
  for (int i = 0; i < kNumTasks; ++i)
    if (kTaskNames[static_cast<std::size_t>(i)] == name) return static_cast<Task>(i);
  std::string known;
  for (auto n : kTaskNames) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError(field + ": '" + std::string(name) + "' is not a task of the manipulation suite; choose from " + known +
                    " (or env.suite=mt10)");
}

/// What a task draws per episode and how it is judged (MetaWorld v2's figures, from
/// sawyer_<task>_v2.py, adapted to this suite's models where they differ; see each task).
struct TaskSpec {
  std::string_view objects;      ///< its bodies (models.hpp)
  std::string_view excludes;     ///< contacts its fixture leaves out
  std::array<double, 3> hand_init;
  std::array<double, 3> obj_low, obj_high;    ///< the object's (or fixture's) position
  std::array<double, 3> goal_low, goal_high;  ///< the goal's, when drawn (else computed)
  bool goal_drawn;                            ///< false: the goal follows from the fixture
  double success_distance;                    ///< the published threshold
};

/// Task `t`'s spec (see `TaskSpec`).
[[nodiscard]] inline const TaskSpec& task_spec(Task t) {
  // hand_init (0, 0.6, 0.2); (0, 0.4, 0.2) for the button and window tasks, as published.
  static const std::array<TaskSpec, kNumTasks> specs{{
      // reach-v2: puck (a distractor) in [-0.1, 0.1] x [0.6, 0.7]; goal in [-0.1, 0.1] x [0.8, 0.9] x [0.05, 0.3];
      // success: |tcp - goal| <= 0.05.
      {models::kPuck, {}, {0, 0.6, 0.2}, {-0.1, 0.6, 0.02}, {0.1, 0.7, 0.02}, {-0.1, 0.8, 0.05}, {0.1, 0.9, 0.3}, true, 0.05},
      // push-v2: goal on the table; success: |puck - goal| <= 0.05.
      {models::kPuck, {}, {0, 0.6, 0.2}, {-0.1, 0.6, 0.02}, {0.1, 0.7, 0.02}, {-0.1, 0.8, 0.02}, {0.1, 0.9, 0.02}, true, 0.05},
      // pick-place-v2: goal in the air; success: |puck - goal| <= 0.07.
      {models::kPuck, {}, {0, 0.6, 0.2}, {-0.1, 0.6, 0.02}, {0.1, 0.7, 0.02}, {-0.1, 0.8, 0.05}, {0.1, 0.9, 0.3}, true, 0.07},
      // door-open-v2: the door's frame in [0, 0.1] x [0.85, 0.95]; the goal is where the handle is with the
      // door open 90 degrees; success: |handle_x - goal_x| <= 0.08 (the door open about 75 degrees or more).
      {models::kDoor, models::kDoorExcludes, {0, 0.6, 0.2}, {0, 0.85, 0.15}, {0.1, 0.95, 0.15}, {}, {}, false, 0.08},
      // drawer-open-v2: the case at x in [-0.1, 0.1], y = 0.9; goal: the handle 16 cm out; success: |handle -
      // goal| <= 0.03.
      {models::kDrawer, models::kDrawerExcludes, {0, 0.6, 0.2}, {-0.1, 0.9, 0}, {0.1, 0.9, 0}, {}, {}, false, 0.03},
      // drawer-close-v2: the drawer starts 15 cm open; goal: the handle closed; success within 3 cm (MetaWorld's
      // 0.065 threshold, measured from a point 5 cm above its handle, amounts to about that).
      {models::kDrawer, models::kDrawerExcludes, {0, 0.6, 0.2}, {-0.1, 0.9, 0}, {0.1, 0.9, 0}, {}, {}, false, 0.03},
      // button-press-topdown-v2: the box in [-0.1, 0.1] x [0.8, 0.9]; goal: the button's top pressed fully;
      // success: |top_z - goal_z| <= 0.02 (half the travel).
      {models::kButton, models::kButtonExcludes, {0, 0.4, 0.2}, {-0.1, 0.8, 0}, {0.1, 0.9, 0}, {}, {}, false, 0.02},
      // peg-insert-side-v2: peg in [0, 0.2] x [0.5, 0.7]; block in [-0.35, -0.25] x [0.4, 0.7]; goal 7 cm inside
      // the tunnel; success: |(head - goal) * (1, 2, 2)| <= 0.07.
      {models::kPegAndHole, {}, {0, 0.6, 0.2}, {0, 0.5, 0.015}, {0.2, 0.7, 0.015}, {-0.35, 0.4, 0}, {-0.25, 0.7, 0}, true,
       0.07},
      // window-open-v2: the frame in [-0.1, 0.1] x [0.7, 0.9]; goal: the handle with the pane slid 20 cm;
      // success: |handle_x - goal_x| <= 0.05.
      {models::kWindow, models::kWindowExcludes, {0, 0.4, 0.2}, {-0.1, 0.7, 0.16}, {0.1, 0.9, 0.16}, {}, {}, false, 0.05},
      // window-close-v2: the frame at x = 0, y in [0.75, 0.9]; the pane starts open; goal: the handle closed.
      {models::kWindow, models::kWindowExcludes, {0, 0.4, 0.2}, {0, 0.75, 0.16}, {0, 0.9, 0.16}, {}, {}, false, 0.05},
  }};
  return specs[static_cast<std::size_t>(t)];
}

/// The MJCF of task `t`'s scene.
[[nodiscard]] inline std::string scene_xml(Task t) {
  std::string xml(models::kScene);
  xml.replace(xml.find("%OBJECTS%"), 9, std::string(task_spec(t).objects));
  xml.replace(xml.find("%EXCLUDES%"), 10, std::string(task_spec(t).excludes));
  return xml;
}

/// Task `t`'s compiled model, compiled once per process and shared (thread-safe).
[[nodiscard]] inline std::shared_ptr<const Model> model_of(Task t) {
  static std::mutex mu;
  static std::map<Task, std::shared_ptr<const Model>> cache;
  std::lock_guard lock(mu);
  auto& m = cache[t];
  if (!m) m = Model::compile(scene_xml(t), std::string(kTaskNames[static_cast<std::size_t>(t)]));
  return m;
}

/// The hand's box: where the mocap target may go (MetaWorld v2's hand_low / hand_high), but
/// for its floor: 0.056, not 0.05. This suite's pads reach 5.5 cm below the hand body, so at
/// 0.05 the lowest hand pressed them into the table, whose friction held the fingers open: a
/// closing command there did nothing, and SAC's push policies hovered there, over the puck.
/// At 0.056 the pads' bottoms clear the table by a millimetre.
inline constexpr std::array<double, 3> kHandLow{-0.5, 0.40, 0.056}, kHandHigh{0.5, 1.0, 0.5};
/// Metres of mocap motion per unit of action (MetaWorld's action_scale, 1/100).
inline constexpr double kActionScale = 0.01;
/// Physics steps per env step (MetaWorld's frame_skip).
inline constexpr int kFrameSkip = 5;
/// Steps per episode (MetaWorld v2's max_path_length, 500; v1's sawyer envs, which mtrl's MT10
/// ran, set 150: `env.max_episode_steps=150`).
inline constexpr std::int64_t kMaxEpisodeSteps = 500;
/// The observation without the task one-hot.
inline constexpr std::int64_t kObsDim = 39;

/// MetaWorld's `reward_utils.tolerance` with bounds (dm_control's, long-tailed sigmoid, 0.1
/// at the margin): 1 for x in [lo, hi], else 1 / (1 + (3 d)^2) with d the distance to the
/// nearer bound over `margin`; 0 outside when the margin is 0 or less.
[[nodiscard]] inline double tolerance_between(double x, double lo, double hi, double margin) noexcept {
  if (x >= lo && x <= hi) return 1.0;
  if (margin <= 0.0) return 0.0;
  const double s = 3.0 * (x < lo ? lo - x : x - hi) / margin;
  return 1.0 / (1.0 + s * s);
}

/// `tolerance_between` with dm_control's gaussian sigmoid (MetaWorld's `sigmoid='gaussian'`):
/// 1 for x in [lo, hi], else 0.1^(d^2) with d the distance to the nearer bound over `margin`.
[[nodiscard]] inline double gaussian_between(double x, double lo, double hi, double margin) noexcept {
  if (x >= lo && x <= hi) return 1.0;
  if (margin <= 0.0) return 0.0;
  const double d = (x < lo ? lo - x : x - hi) / margin;
  return std::pow(0.1, d * d);
}

/// MetaWorld's `reward_utils.hamacher_product` of a, b in [0, 1]: a b / (a + b - a b), 0 when
/// both are 0; 1 only when both are, and at most the smaller of the two.
[[nodiscard]] inline double hamacher(double a, double b) noexcept {
  const double d = a + b - a * b;
  return d > 0.0 ? a * b / d : 0.0;
}

}  // namespace anvil::envs::mujoco
