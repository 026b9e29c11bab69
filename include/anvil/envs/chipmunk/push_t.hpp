#pragma once
/// @file
/// Push-T on Chipmunk2D (Debian's libchipmunk-dev 7.0.3, an optional component: link
/// `anvil::chipmunk`): the planar pushing task of Florence et al. 2021 ("Implicit Behavioral
/// Cloning") on which Chi et al. 2023 ("Diffusion Policy") evaluate. The facts below are
/// those of the published task (diffusion_policy/env/pusht/pusht_env.py, which simulates
/// with pymunk, a Python binding of the same engine); the code is this file's own:
///
///  - a 512 x 512 field walled by four static segments of radius 2 from (5, 5) to (506, 506);
///    no gravity, and the space's damping 0, so the block stops the moment nothing pushes it
///    (quasi-static pushing);
///  - the pusher: a kinematic circle of radius 15. An action is the point (x, y) it is
///    driven towards, in pixels, by a PD controller (kp = 100, kv = 20) applied at every one
///    of the 10 physics substeps of 10 ms that make up a 10 Hz action;
///  - the block: a T of two 120 x 30 and 30 x 90 rectangles (scale 30, length 4), mass 1,
///    inertia twice the bar's polygon moment, centre of gravity the mean of the two
///    rectangles' centroids (0, 45), all as published;
///  - the goal pose (256, 256, pi/4); reward clip(coverage / 0.95, 0, 1), where coverage is
///    the fraction of the goal T's area the block covers; the episode terminates (success)
///    when coverage exceeds 0.95, and is truncated after 300 steps (the evaluation length);
///  - the start: pusher (x, y) uniform on the integers 50..449, block (x, y) on 100..399,
///    block angle 2 pi N(0, 1) - pi, then one physics substep, as published;
///  - the observation (20): 9 keypoints of the block in the field's pixels (the T outline's
///    8 corners and its centre of gravity: the published env's 9 points are its own
///    choice too) and the pusher's position.
///
/// Actions outside the field are clipped to it (the action space is the field). Contacts
/// are frictionless, as published (pymunk's shapes default to friction 0).
///
/// Checkpoints: `save_state` writes the bodies' positions, angles and velocities; a loaded
/// env rebuilds its space, so Chipmunk's contact cache (the warm start of its solver) starts
/// empty: a restored episode continues from the same bodies but may differ in the last bits
/// from one never saved. Copies rebuild the same way. Episodes started by `reset(seed)` or
/// `set_state` are exactly reproducible. Light header: no torch.

#include <chipmunk/chipmunk.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <span>
#include <string_view>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/detail/convex_polygon.hpp>
#include <anvil/envs/detail/episode.hpp>
#include <anvil/envs/env.hpp>

namespace anvil::envs::chipmunk {

/// Push a T-shaped block into a goal pose with a circular pusher (see file comment).
class PushT {
 public:
  static constexpr std::string_view name = "PushT";
  static constexpr double kField = 512.0;           ///< the field's side, pixels
  static constexpr int kSimHz = 100;                 ///< physics substeps per second
  static constexpr int kControlHz = 10;              ///< actions per second
  static constexpr int kSubsteps = kSimHz / kControlHz;
  static constexpr double kKp = 100.0;               ///< the pusher's PD gains
  static constexpr double kKv = 20.0;
  static constexpr double kPusherRadius = 15.0;
  static constexpr double kScale = 30.0;             ///< the T's bar is 4 x 1 scales, its stem 1 x 3
  static constexpr double kSuccessCoverage = 0.95;
  static constexpr std::int64_t kMaxEpisodeSteps = 300;
  static constexpr int kNumKeypoints = 9;
  static constexpr int kObsDim = 2 * kNumKeypoints + 2;
  /// The goal pose of the block: (x, y, angle).
  static constexpr std::array<double, 3> kGoal{256.0, 256.0, std::numbers::pi / 4};

  /// A start: the pusher's position and velocity, the block's pose (its body origin, not its
  /// centre of gravity) and velocities.
  struct State {
    double agent_x = 256.0, agent_y = 400.0;
    double block_x = 256.0, block_y = 300.0, block_angle = 0.0;
    double agent_vx = 0.0, agent_vy = 0.0;
    double block_vx = 0.0, block_vy = 0.0, block_w = 0.0;
  };

  /// The reward of a step: the published one, or its gain over the best so far.
  enum class Reward : std::int8_t {
    coverage,   ///< clip(coverage / 0.95, 0, 1), as published
    best_gain,  ///< how much that exceeds its best earlier value in the episode, so that an
                ///< episode's return is its best reward: the published score of an episode
  };

  explicit PushT(Reward reward = Reward::coverage) : reward_(reward) { build(); }
  PushT(const PushT& o)
      : episode_(o.episode_), rng_(o.rng_), obs_(o.obs_), coverage_(o.coverage_), best_(o.best_), success_(o.success_), reward_(o.reward_) {
    build();
    put(o.state());
  }
  PushT& operator=(const PushT& o) {
    if (this != &o) {
      PushT copy(o);
      *this = std::move(copy);
    }
    return *this;
  }
  PushT(PushT&&) noexcept = default;
  PushT& operator=(PushT&&) noexcept = default;
  ~PushT() = default;

  /// 9 keypoints and the pusher, in the field's pixels.
  [[nodiscard]] Box observation_space() const {
    return Box{std::vector<float>(kObsDim, 0.0f), std::vector<float>(kObsDim, static_cast<float>(kField))};
  }
  /// The point the pusher is driven towards.
  [[nodiscard]] Box action_space() const {
    return Box{{0.0f, 0.0f}, {static_cast<float>(kField), static_cast<float>(kField)}};
  }

  /// A start drawn as published (see file comment), from `seed` alone.
  std::span<const float> reset(std::uint64_t seed) {
    rng_.reseed(seed);
    State s;
    const auto integer = [&](int lo, int hi) { return static_cast<double>(lo + static_cast<int>(rng_.below(static_cast<std::uint64_t>(hi - lo + 1)))); };
    s.agent_x = integer(50, 449);
    s.agent_y = integer(50, 449);
    s.block_x = integer(100, 399);
    s.block_y = integer(100, 399);
    // A standard normal by Box-Muller from two uniforms (1 - u keeps the log finite).
    const double u1 = 1.0 - rng_.uniform(), u2 = rng_.uniform();
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    s.block_angle = normal * 2.0 * std::numbers::pi - std::numbers::pi;
    return set_state(s);
  }

  /// Starts an episode at `s` (then one physics substep, as the published env does).
  std::span<const float> set_state(const State& s) {
    episode_.start({{"agent_x", s.agent_x},
                    {"agent_y", s.agent_y},
                    {"block_x", s.block_x},
                    {"block_y", s.block_y},
                    {"block_angle", s.block_angle},
                    {"agent_vx", s.agent_vx},
                    {"agent_vy", s.agent_vy},
                    {"block_vx", s.block_vx},
                    {"block_vy", s.block_vy},
                    {"block_w", s.block_w}});
    build();
    put(s);
    cpSpaceStep(w_->space, 1.0 / kSimHz);
    success_ = false;
    best_ = 0.0;
    observe();
    return obs_;
  }

  /// One action: 10 substeps of the PD controller towards `action` (clipped to the field).
  StepResult step(std::span<const float> action) {
    episode_.check_step(action, 2);
    const double tx = std::clamp(static_cast<double>(action[0]), 0.0, kField);
    const double ty = std::clamp(static_cast<double>(action[1]), 0.0, kField);
    constexpr double dt = 1.0 / kSimHz;
    for (int i = 0; i < kSubsteps; ++i) {
      const cpVect p = cpBodyGetPosition(w_->agent);
      const cpVect v = cpBodyGetVelocity(w_->agent);
      const cpVect acc = cpv(kKp * (tx - p.x) - kKv * v.x, kKp * (ty - p.y) - kKv * v.y);
      cpBodySetVelocity(w_->agent, cpv(v.x + acc.x * dt, v.y + acc.y * dt));
      cpSpaceStep(w_->space, dt);
    }
    observe();
    success_ = coverage_ > kSuccessCoverage;
    const double r = std::clamp(coverage_ / kSuccessCoverage, 0.0, 1.0);
    const double gain = std::max(0.0, r - best_);
    best_ = std::max(best_, r);
    return episode_.finish_step(obs_, reward_ == Reward::coverage ? r : gain, success_);
  }

  /// Whether the last step reached the goal (coverage above 0.95).
  [[nodiscard]] bool success() const noexcept { return success_; }
  /// The best reward of the episode so far (its published score when it ends).
  [[nodiscard]] double best_reward() const noexcept { return best_; }
  /// The fraction of the goal region the block covers now.
  [[nodiscard]] double coverage() const noexcept { return coverage_; }
  [[nodiscard]] std::int64_t elapsed_steps() const noexcept { return episode_.steps(); }
  /// Replace the published time limit (`env.max_episode_steps`; `detail::Episode::set_max_steps`).
  void set_max_episode_steps(std::int64_t n) { episode_.set_max_steps(n); }

  /// The bodies' state now (a `set_state` of it starts an episode from here).
  [[nodiscard]] State state() const {
    State s;
    const cpVect a = cpBodyGetPosition(w_->agent), av = cpBodyGetVelocity(w_->agent);
    const cpVect b = cpBodyGetPosition(w_->block), bv = cpBodyGetVelocity(w_->block);
    s.agent_x = a.x, s.agent_y = a.y, s.agent_vx = av.x, s.agent_vy = av.y;
    s.block_x = b.x, s.block_y = b.y, s.block_angle = cpBodyGetAngle(w_->block);
    s.block_vx = bv.x, s.block_vy = bv.y, s.block_w = cpBodyGetAngularVelocity(w_->block);
    return s;
  }
  /// The block's pose (body origin and angle).
  [[nodiscard]] detail::Pose2 block_pose() const {
    const cpVect b = cpBodyGetPosition(w_->block);
    return {b.x, b.y, cpBodyGetAngle(w_->block)};
  }

  /// The T's two rectangles in the block's frame, as published.
  [[nodiscard]] static std::vector<detail::Polygon> tee() {
    const double l = 4.0 * kScale / 2.0, s = kScale, h = 4.0 * kScale;
    return {{{-l, s}, {l, s}, {l, 0.0}, {-l, 0.0}}, {{-s / 2, s}, {-s / 2, h}, {s / 2, h}, {s / 2, s}}};
  }
  /// The fraction of the goal T covered by a T at `pose`.
  [[nodiscard]] static double coverage_at(const detail::Pose2& pose) {
    static const std::vector<detail::Polygon> local = tee();
    const detail::Pose2 goal{kGoal[0], kGoal[1], kGoal[2]};
    std::vector<detail::Polygon> g, b;
    double goal_area = 0.0;
    for (const auto& p : local) {
      g.push_back(goal.apply(p));
      b.push_back(pose.apply(p));
      goal_area += detail::area(p);
    }
    return detail::overlap_area(g, b) / goal_area;
  }
  /// The keypoints in the block's frame: the outline's 8 corners and the centre of gravity.
  [[nodiscard]] static std::array<detail::Vec2, kNumKeypoints> local_keypoints() {
    const double l = 2.0 * kScale, s = kScale, h = 4.0 * kScale;
    return {{{-l, 0.0}, {l, 0.0}, {l, s}, {s / 2, s}, {s / 2, h}, {-s / 2, h}, {-s / 2, s}, {-l, s}, {0.0, 1.5 * s}}};
  }

  /// Checkpoint state: the bodies, the step count, the episode's flags, the observation.
  void save_state(BinaryWriter& w) const {
    w.value(state());
    w.value(episode_.steps());
    w.value(success_);
    w.value(coverage_);
    w.value(best_);
    w.bytes(obs_.data(), obs_.size() * sizeof(float));
  }
  /// Reads what `save_state` wrote (see the file comment on the contact cache).
  void load_state(BinaryReader& r) {
    const auto s = r.value<State>("Push-T bodies");
    const auto steps = r.value<std::int64_t>("episode steps");
    const bool success = r.value<bool>("step success");
    const double coverage = r.value<double>("coverage");
    const double best = r.value<double>("best reward");
    std::array<float, kObsDim> obs{};
    r.bytes(obs.data(), obs.size() * sizeof(float), "observation");
    build();
    put(s);
    success_ = success;
    coverage_ = coverage;
    best_ = best;
    obs_ = obs;
    episode_.resume(steps);
  }

 private:
  /// The Chipmunk space and its bodies and shapes, freed together.
  struct World {
    cpSpace* space = nullptr;
    cpBody* agent = nullptr;
    cpBody* block = nullptr;
    std::vector<cpShape*> shapes;
    World() = default;
    World(const World&) = delete;
    World& operator=(const World&) = delete;
    ~World() {
      if (space) cpSpaceFree(space);  // frees neither bodies nor shapes
      for (cpShape* s : shapes) cpShapeFree(s);
      if (agent) cpBodyFree(agent);
      if (block) cpBodyFree(block);
    }
  };

  void build() {
    auto w = std::make_unique<World>();
    w->space = cpSpaceNew();
    cpSpaceSetGravity(w->space, cpvzero);
    cpSpaceSetDamping(w->space, 0.0);
    cpBody* ground = cpSpaceGetStaticBody(w->space);
    const cpVect walls[4][2] = {{cpv(5, 506), cpv(5, 5)}, {cpv(5, 5), cpv(506, 5)}, {cpv(506, 5), cpv(506, 506)}, {cpv(5, 506), cpv(506, 506)}};
    for (const auto& seg : walls) w->shapes.push_back(cpSpaceAddShape(w->space, cpSegmentShapeNew(ground, seg[0], seg[1], 2.0)));

    w->agent = cpSpaceAddBody(w->space, cpBodyNewKinematic());
    w->shapes.push_back(cpSpaceAddShape(w->space, cpCircleShapeNew(w->agent, kPusherRadius, cpvzero)));

    const auto parts = tee();
    std::array<cpVect, 4> bar{}, stem{};
    for (int i = 0; i < 4; ++i) {
      bar[static_cast<std::size_t>(i)] = cpv(parts[0][static_cast<std::size_t>(i)].x, parts[0][static_cast<std::size_t>(i)].y);
      stem[static_cast<std::size_t>(i)] = cpv(parts[1][static_cast<std::size_t>(i)].x, parts[1][static_cast<std::size_t>(i)].y);
    }
    // As published: the moment is the bar's twice (the reference passes the bar's vertices
    // for both parts), the centre of gravity the mean of the parts' centroids.
    const double mass = 1.0;
    const double inertia = 2.0 * cpMomentForPoly(mass, 4, bar.data(), cpvzero, 0.0);
    w->block = cpSpaceAddBody(w->space, cpBodyNew(mass, inertia));
    w->shapes.push_back(cpSpaceAddShape(w->space, cpPolyShapeNew(w->block, 4, bar.data(), cpTransformIdentity, 0.0)));
    w->shapes.push_back(cpSpaceAddShape(w->space, cpPolyShapeNew(w->block, 4, stem.data(), cpTransformIdentity, 0.0)));
    const cpVect c1 = cpCentroidForPoly(4, bar.data()), c2 = cpCentroidForPoly(4, stem.data());
    cpBodySetCenterOfGravity(w->block, cpvmult(cpvadd(c1, c2), 0.5));
    w_ = std::move(w);
  }

  /// Places the bodies at `s` (the angle first, then the position, as the published env's
  /// non-legacy order does, so the body origin lands exactly at (block_x, block_y)).
  void put(const State& s) {
    cpBodySetPosition(w_->agent, cpv(s.agent_x, s.agent_y));
    cpBodySetVelocity(w_->agent, cpv(s.agent_vx, s.agent_vy));
    cpBodySetAngle(w_->block, s.block_angle);
    cpBodySetPosition(w_->block, cpv(s.block_x, s.block_y));
    cpBodySetVelocity(w_->block, cpv(s.block_vx, s.block_vy));
    cpBodySetAngularVelocity(w_->block, s.block_w);
    cpSpaceReindexShapesForBody(w_->space, w_->agent);
    cpSpaceReindexShapesForBody(w_->space, w_->block);
  }

  void observe() {
    const detail::Pose2 pose = block_pose();
    const auto kps = local_keypoints();
    for (int i = 0; i < kNumKeypoints; ++i) {
      const detail::Vec2 p = pose.apply(kps[static_cast<std::size_t>(i)]);
      obs_[static_cast<std::size_t>(2 * i)] = static_cast<float>(p.x);
      obs_[static_cast<std::size_t>(2 * i + 1)] = static_cast<float>(p.y);
    }
    const cpVect a = cpBodyGetPosition(w_->agent);
    obs_[kObsDim - 2] = static_cast<float>(a.x);
    obs_[kObsDim - 1] = static_cast<float>(a.y);
    coverage_ = coverage_at(pose);
  }

  std::unique_ptr<World> w_;
  detail::Episode episode_{name, kMaxEpisodeSteps};
  Rng rng_{};
  std::array<float, kObsDim> obs_{};
  double coverage_ = 0.0;
  double best_ = 0.0;
  bool success_ = false;
  Reward reward_ = Reward::coverage;
};

static_assert(Env<PushT>);
static_assert(ContinuousEnv<PushT>);
static_assert(SavesOwnState<PushT>);
static_assert(ReportsSuccess<PushT>);

}  // namespace anvil::envs::chipmunk
