#pragma once
/// @file
/// `PushTExpert`: a scripted planner that solves Push-T (envs/chipmunk/push_t.hpp) often, to
/// record demonstrations. It pushes the block with straight pushes along an edge's inward
/// normal (contacts are frictionless, so a push moves the block along the normal at the
/// contact point) and picks each push by trying them on a copy of the simulation:
///
///  1. candidates: points every `spacing` pixels along the T's eight edges whose pre-contact
///     position (the pusher `margin` pixels off the edge) is clear of the block, each pushed
///     `lengths` pixels;
///  2. each candidate's push is simulated from its pre-contact position, and the one that
///     leaves the block's nine keypoints closest to the goal's (mean distance) is taken;
///  3. the pusher then travels to that pre-contact position clear of the block (out to a circle
///     around it, round the circle, in along the edge's normal) and pushes, the commanded point
///     moving at `travel_speed` and then `push_speed` pixels per step.
///
/// It replans after every push. The actions are the commanded points, one per step, so the
/// demonstrations are smooth paths as a person's are.
///
/// By default it makes one choice at every state, which a person does not: the paper's
/// demonstrations are human (Chi et al. 2023, section V-A), and their multimodality, going
/// round the block either way, pushing one of several good places, is what Diffusion Policy
/// is built to learn. `Options::detour` and `Options::choice` make the expert choose as a
/// person might (going round the longer way at random when the shorter turns more than a
/// quarter circle; any push nearly as good as the best), drawn from a generator seeded by
/// the episode's seed, so a recording is still reproducible. Light header: no torch.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/random.hpp>
#include <anvil/envs/chipmunk/push_t.hpp>
#include <anvil/envs/detail/convex_polygon.hpp>

namespace anvil::envs::chipmunk {

/// A scripted Push-T expert (see file comment).
class PushTExpert {
 public:
  struct Options {
    double spacing = 12.0;                            ///< between candidate contact points, pixels
    std::vector<double> lengths{6.0, 14.0, 30.0, 60.0};  ///< push lengths tried
    double margin = 8.0;                              ///< pre-contact gap between pusher and edge
    double travel_speed = 24.0;                       ///< commanded point's speed when travelling
    double push_speed = 10.0;                         ///< and when pushing
    double clearance = 10.0;                          ///< kept between pusher and block when travelling
    /// Chance of going round the block the longer way when the shorter way turns more than a
    /// quarter circle (0: always the shorter).
    double detour = 0.0;
    /// A push whose gain (fall of `cost`) is at least (1 - choice) of the best push's is
    /// picked as often as the best (0: always the best).
    double choice = 0.0;
    /// Whether either of the above draws: the planner is then no longer one choice a state.
    [[nodiscard]] bool varied() const noexcept { return detour > 0 || choice > 0; }
  };

  PushTExpert() : PushTExpert(Options{}) {}
  explicit PushTExpert(Options o) : o_(std::move(o)) {
    if (!(o_.detour >= 0 && o_.detour <= 1))
      throw ConfigError("PushTExpert::Options::detour: " + std::to_string(o_.detour) + " is not a chance in [0, 1]");
    if (!(o_.choice >= 0 && o_.choice <= 1))
      throw ConfigError("PushTExpert::Options::choice: " + std::to_string(o_.choice) + " is not a fraction in [0, 1]");
    candidates();
  }

  /// The commanded points of the next push (travel, push, settle) from `env`'s state. `rng`
  /// draws the choices `Options::detour` and `Options::choice` allow (none when null).
  [[nodiscard]] std::vector<std::array<float, 2>> plan(const PushT& env, Rng* rng = nullptr) const {
    const auto pose = env.block_pose();
    const auto st = env.state();
    const double now = cost(pose);
    double best = now;
    const Candidate* pick = nullptr;
    double pick_len = 0;
    struct Tried {
      const Candidate* c;
      double len, after;
    };
    const bool draw_choice = rng && o_.choice > 0;
    std::vector<Tried> improving;  // kept only when a push is drawn among them
    PushT sim(env);
    for (const auto& c : cands_) {
      for (double len : o_.lengths) {
        const double after = try_push(sim, st, pose, c, len);
        if (draw_choice && after < now - 1e-9) improving.push_back({&c, len, after});
        if (after < best - 1e-9) {
          best = after;
          pick = &c;
          pick_len = len;
        }
      }
    }
    if (pick && draw_choice) {
      // Any push nearly as good as the best, as likely as the best.
      std::vector<const Tried*> near;
      for (const auto& t : improving)
        if (now - t.after >= (1.0 - o_.choice) * (now - best)) near.push_back(&t);
      const auto* t = near[static_cast<std::size_t>(rng->below(near.size()))];
      pick = t->c;
      pick_len = t->len;
    }
    if (!pick) {
      // No push improves: the shortest push of the first candidate that moves the block at
      // all (a nudge out of a stall), else nothing.
      pick = &cands_.front();
      pick_len = o_.lengths.front();
    }
    return path(st, pose, *pick, pick_len, rng);
  }

  /// The options it plans by.
  [[nodiscard]] const Options& options() const noexcept { return o_; }

  /// The mean distance of the block's keypoints from the goal's, pixels.
  [[nodiscard]] static double cost(const detail::Pose2& pose) {
    static const auto kps = PushT::local_keypoints();
    const detail::Pose2 goal{PushT::kGoal[0], PushT::kGoal[1], PushT::kGoal[2]};
    double s = 0;
    for (const auto& k : kps) {
      const auto a = pose.apply(k), b = goal.apply(k);
      s += std::hypot(a.x - b.x, a.y - b.y);
    }
    return s / static_cast<double>(kps.size());
  }

  /// Runs one episode from `seed` with this expert, calling `record(obs, action)` before
  /// each step; returns whether it succeeded within the time limit. A varied expert's
  /// choices are drawn from a generator seeded by `seed`.
  bool run(PushT& env, std::uint64_t seed, const std::function<void(std::span<const float>, std::span<const float>)>& record) const {
    auto obs = env.reset(seed);
    Rng rng(splitmix64(seed ^ 0x5055534854455850ull));  // "PUSHTEXP": apart from the env's own streams
    Rng* draws = o_.varied() ? &rng : nullptr;
    while (true) {
      for (const auto& a : plan(env, draws)) {
        if (record) record(obs, a);
        const auto r = env.step(a);
        obs = r.observation;
        if (r.terminated) return true;
        if (r.truncated) return false;
      }
    }
  }

 private:
  struct Candidate {
    detail::Vec2 point;   ///< on the block's outline, block frame
    detail::Vec2 normal;  ///< outward, block frame
  };

  // Contact points along the T's outline (counter-clockwise) whose pre-contact position is clear.
  void candidates() {
    const double l = 2.0 * PushT::kScale, s = PushT::kScale, h = 4.0 * PushT::kScale;
    const std::array<detail::Vec2, 8> outline{{{-l, 0}, {l, 0}, {l, s}, {s / 2, s}, {s / 2, h}, {-s / 2, h}, {-s / 2, s}, {-l, s}}};
    for (std::size_t i = 0; i < outline.size(); ++i) {
      const auto a = outline[i], b = outline[(i + 1) % outline.size()];
      const double len = std::hypot(b.x - a.x, b.y - a.y);
      const detail::Vec2 n{(b.y - a.y) / len, -(b.x - a.x) / len};
      const int k = std::max(1, static_cast<int>(std::floor(len / o_.spacing)));
      for (int j = 0; j < k; ++j) {
        const double t = (j + 0.5) / k;
        const detail::Vec2 p{a.x + t * (b.x - a.x), a.y + t * (b.y - a.y)};
        const detail::Vec2 pre{p.x + n.x * (PushT::kPusherRadius + o_.margin), p.y + n.y * (PushT::kPusherRadius + o_.margin)};
        if (distance_to_tee(pre) >= PushT::kPusherRadius + 0.5 * o_.margin) cands_.push_back({p, n});
      }
    }
  }

  // Distance from a block-frame point to the T (0 inside).
  [[nodiscard]] static double distance_to_tee(detail::Vec2 p) {
    double best = 1e18;
    for (const auto& r : std::array<std::array<double, 4>, 2>{{{-2.0 * PushT::kScale, 2.0 * PushT::kScale, 0.0, PushT::kScale},
                                                               {-PushT::kScale / 2, PushT::kScale / 2, PushT::kScale, 4.0 * PushT::kScale}}}) {
      const double dx = std::max({r[0] - p.x, 0.0, p.x - r[1]});
      const double dy = std::max({r[2] - p.y, 0.0, p.y - r[3]});
      best = std::min(best, std::hypot(dx, dy));
    }
    return best;
  }

  [[nodiscard]] double try_push(PushT& sim, const PushT::State& st, const detail::Pose2& pose, const Candidate& c, double len) const {
    PushT::State s = st;
    const auto pre = pose.apply(offset(c, PushT::kPusherRadius + o_.margin));
    s.agent_x = pre.x, s.agent_y = pre.y, s.agent_vx = 0, s.agent_vy = 0;
    sim.set_state(s);
    for (const auto& a : push_points(pose, c, len))
      if (sim.step(a).terminated) return -1.0;  // reaches the goal: nothing is better
    return cost(sim.block_pose());
  }

  [[nodiscard]] static detail::Vec2 offset(const Candidate& c, double d) { return {c.point.x + c.normal.x * d, c.point.y + c.normal.y * d}; }

  // The push: from the pre-contact point inwards by margin + len, then two steps holding.
  [[nodiscard]] std::vector<std::array<float, 2>> push_points(const detail::Pose2& pose, const Candidate& c, double len) const {
    const auto from = pose.apply(offset(c, PushT::kPusherRadius + o_.margin));
    const auto to = pose.apply(offset(c, PushT::kPusherRadius - len));
    std::vector<std::array<float, 2>> out;
    line(from, to, o_.push_speed, out);
    out.push_back(out.back());
    out.push_back(out.back());
    return out;
  }

  // The commanded points from `a` to `b` at `speed` per step (b last).
  static void line(detail::Vec2 a, detail::Vec2 b, double speed, std::vector<std::array<float, 2>>& out) {
    const double d = std::hypot(b.x - a.x, b.y - a.y);
    const int n = std::max(1, static_cast<int>(std::ceil(d / speed)));
    for (int i = 1; i <= n; ++i) {
      const double t = static_cast<double>(i) / n;
      out.push_back({static_cast<float>(std::clamp(a.x + t * (b.x - a.x), 0.0, PushT::kField)),
                     static_cast<float>(std::clamp(a.y + t * (b.y - a.y), 0.0, PushT::kField))});
    }
  }

  // Whether the segment a -> b (world) keeps the pusher clear of the block at `pose`.
  [[nodiscard]] bool clear(const detail::Pose2& pose, detail::Vec2 a, detail::Vec2 b) const {
    const double c = std::cos(-pose.angle), s = std::sin(-pose.angle);
    const int n = 1 + static_cast<int>(std::hypot(b.x - a.x, b.y - a.y) / 4.0);
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n;
      const double x = a.x + t * (b.x - a.x) - pose.x, y = a.y + t * (b.y - a.y) - pose.y;
      if (distance_to_tee({c * x - s * y, s * x + c * y}) < PushT::kPusherRadius + o_.clearance) return false;
    }
    return true;
  }

  // Travel (clear of the block) to the chosen push's pre-contact point, then the push.
  [[nodiscard]] std::vector<std::array<float, 2>> path(const PushT::State& st, const detail::Pose2& pose, const Candidate& c, double len,
                                                      Rng* rng) const {
    std::vector<std::array<float, 2>> out;
    const detail::Vec2 start{st.agent_x, st.agent_y};
    const auto pre = pose.apply(offset(c, PushT::kPusherRadius + o_.margin));
    const auto far = pose.apply(offset(c, PushT::kPusherRadius + o_.margin + 45.0));
    if (clear(pose, start, pre)) {
      line(start, pre, o_.travel_speed, out);
    } else {
      // Round a circle about the block's centre of gravity, then in along the normal.
      const auto cog = pose.apply({0.0, 1.5 * PushT::kScale});
      const double radius = 80.0 + PushT::kPusherRadius + o_.clearance;
      double a0 = std::atan2(start.y - cog.y, start.x - cog.x);
      const double a1 = std::atan2(far.y - cog.y, far.x - cog.x);
      detail::Vec2 p = start;
      const detail::Vec2 out0{cog.x + radius * std::cos(a0), cog.y + radius * std::sin(a0)};
      if (std::hypot(start.x - cog.x, start.y - cog.y) < radius) {
        line(p, out0, o_.travel_speed, out);
        p = out0;
      }
      double da = std::remainder(a1 - a0, 2.0 * std::numbers::pi);  // the shorter way round
      if (rng && o_.detour > 0 && std::abs(da) > std::numbers::pi / 2 && rng->uniform() < o_.detour)
        da -= std::copysign(2.0 * std::numbers::pi, da);
      const double r0 = std::max(radius, std::hypot(p.x - cog.x, p.y - cog.y));
      const int n = std::max(1, static_cast<int>(std::ceil(std::abs(da) * r0 / o_.travel_speed)));
      for (int i = 1; i <= n; ++i) {
        const double a = a0 + da * i / n;
        const double r = r0 + (radius - r0) * i / n;
        const detail::Vec2 q{cog.x + r * std::cos(a), cog.y + r * std::sin(a)};
        out.push_back({static_cast<float>(std::clamp(q.x, 0.0, PushT::kField)), static_cast<float>(std::clamp(q.y, 0.0, PushT::kField))});
        p = q;
      }
      line(p, far, o_.travel_speed, out);
      line(far, pre, o_.travel_speed, out);
    }
    // Let the pusher catch up with the commanded point before pushing.
    out.push_back(out.back());
    const auto push = push_points(pose, c, len);
    out.insert(out.end(), push.begin(), push.end());
    return out;
  }

  Options o_;
  std::vector<Candidate> cands_;
};

}  // namespace anvil::envs::chipmunk
