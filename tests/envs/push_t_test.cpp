// Push-T (envs/chipmunk/push_t.hpp) and the convex-polygon geometry behind its reward:
// overlaps against areas worked by hand, a pushed block moving as the push says, the
// published start, reward and termination, and checkpoints.

#include <anvil/envs/detail/convex_polygon.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <span>
#include <limits>
#include <numbers>
#include <set>
#include <vector>

#include <anvil/core/binary_io.hpp>

#if ANVIL_WITH_CHIPMUNK
#include <anvil/envs/chipmunk/push_t.hpp>
#include <anvil/envs/chipmunk/push_t_expert.hpp>
#include <anvil/envs/chipmunk/push_t_view.hpp>
#include <anvil/envs/multi_step.hpp>
#endif

namespace {

using anvil::envs::detail::area;
using anvil::envs::detail::intersect;
using anvil::envs::detail::Polygon;
using anvil::envs::detail::Pose2;

constexpr double kPi = std::numbers::pi;

TEST_CASE("Convex polygons: intersection areas against hand computations") {
  const Polygon unit{{0, 0}, {1, 0}, {1, 1}, {0, 1}};
  CHECK(area(unit) == doctest::Approx(1.0));
  // Two unit squares half a side apart share half a square, whichever way either runs.
  const Polygon shifted{{0.5, 0}, {1.5, 0}, {1.5, 1}, {0.5, 1}};
  const Polygon shifted_cw{{0.5, 0}, {0.5, 1}, {1.5, 1}, {1.5, 0}};
  CHECK(area(intersect(unit, shifted)) == doctest::Approx(0.5));
  CHECK(area(intersect(shifted_cw, unit)) == doctest::Approx(0.5));
  // A diamond inscribed in a 2 x 2 square lies wholly inside it: its own area, 2.
  const Polygon square{{0, 0}, {2, 0}, {2, 2}, {0, 2}};
  const Polygon diamond{{1, 0}, {2, 1}, {1, 2}, {0, 1}};
  CHECK(area(intersect(square, diamond)) == doctest::Approx(2.0));
  // The unit square turned 45 degrees about its centre over itself: a regular octagon of
  // area 2 (sqrt 2 - 1) = 0.828427.
  const Pose2 turn{0.5 - 0.5 * std::sqrt(2.0) * std::cos(kPi / 4 + kPi / 4), 0.5 - 0.5 * std::sqrt(2.0) * std::sin(kPi / 2), kPi / 4};
  CHECK(area(intersect(unit, turn.apply(unit))) == doctest::Approx(2.0 * (std::sqrt(2.0) - 1.0)).epsilon(1e-9));
  // Apart, or touching along an edge: nothing.
  CHECK(area(intersect(unit, Pose2{3, 0, 0}.apply(unit))) == 0.0);
  CHECK(area(intersect(unit, Pose2{1, 0, 0}.apply(unit))) == doctest::Approx(0.0));
}

#if ANVIL_WITH_CHIPMUNK
using anvil::envs::chipmunk::PushT;

/// The goal pose moved by (dx, dy) in the goal's own frame.
Pose2 goal_shifted(double dx, double dy, double dangle = 0.0) {
  const double a = PushT::kGoal[2];
  return {PushT::kGoal[0] + std::cos(a) * dx - std::sin(a) * dy, PushT::kGoal[1] + std::sin(a) * dx + std::cos(a) * dy, a + dangle};
}

TEST_CASE("Push-T: coverage of the goal against overlaps worked by hand") {
  // The T is a 120 x 30 bar (y 0..30) and a 30 x 90 stem (y 30..120): 6300 square pixels.
  CHECK(PushT::coverage_at(goal_shifted(0, 0)) == doctest::Approx(1.0));
  // Sideways by 10: the bars share 110 x 30, the stems 20 x 90; bar and stem only touch.
  CHECK(PushT::coverage_at(goal_shifted(10, 0)) == doctest::Approx((110.0 * 30 + 20.0 * 90) / 6300));
  CHECK(PushT::coverage_at(goal_shifted(-10, 0)) == doctest::Approx((110.0 * 30 + 20.0 * 90) / 6300));
  // Along the stem by 10: bars 120 x 20, stems 30 x 80, and the moved bar over the goal's
  // stem 30 x 10.
  CHECK(PushT::coverage_at(goal_shifted(0, 10)) == doctest::Approx((120.0 * 20 + 30.0 * 80 + 30.0 * 10) / 6300));
  // Sideways by 200: nothing; turned half a turn about the origin: the bars only touch.
  CHECK(PushT::coverage_at(goal_shifted(200, 0)) == 0.0);
  CHECK(PushT::coverage_at(goal_shifted(0, 0, kPi)) == doctest::Approx(0.0));
  // Turned a quarter counter-clockwise about the origin: the bar becomes x -30..0, y -60..60
  // and the stem x -120..-30, y -15..15. The turned bar covers the goal's bar on 30 x 30 and
  // its stem on 15 x 30; the turned stem covers the goal's bar on 30 x 15.
  CHECK(PushT::coverage_at(goal_shifted(0, 0, kPi / 2)) == doctest::Approx((30.0 * 30 + 15.0 * 30 + 30.0 * 15) / 6300));
}

TEST_CASE("Push-T: a block pushed through its centre of gravity slides straight and stops when the push does") {
  PushT env;
  // The bar spans x 196..316 and y 300..330; the pusher (radius 15) waits below its middle.
  PushT::State s;
  s.block_x = 256, s.block_y = 300, s.block_angle = 0;
  s.agent_x = 256, s.agent_y = 250;
  env.set_state(s);
  const auto before = env.block_pose();
  CHECK(before.y == doctest::Approx(300.0));
  for (int i = 0; i < 8; ++i) env.step(std::array<float, 2>{256.0f, 360.0f});
  const auto pushed = env.block_pose();
  CHECK(pushed.y > 320.0);                                   // pushed up, ahead of the pusher
  CHECK(pushed.y == doctest::Approx(env.state().agent_y + 15.0).epsilon(1e-3));  // the bar's edge on the pusher's rim
  CHECK(pushed.x == doctest::Approx(256.0).epsilon(1e-9));   // the push passes the centre of gravity
  CHECK(std::abs(pushed.angle) < 1e-9);
  // The pusher backs off: the block stays where it was left (the space's damping is 0).
  for (int i = 0; i < 5; ++i) env.step(std::array<float, 2>{256.0f, 150.0f});
  const auto left = env.block_pose();
  CHECK(left.y == doctest::Approx(pushed.y).epsilon(1e-3));
  CHECK(env.state().agent_y < 200.0);

  // Pushed up at the bar's right end, the block turns counter-clockwise.
  s.agent_x = 256 + 50;
  env.set_state(s);
  for (int i = 0; i < 8; ++i) env.step(std::array<float, 2>{306.0f, 360.0f});
  CHECK(env.block_pose().angle > 0.1);
  CHECK(env.block_pose().y > 300.0);
}

TEST_CASE("Push-T: published start ranges, reward, success and time limit") {
  PushT env;
  std::set<double> angles;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    env.reset(seed);
    const auto st = env.state();
    CHECK(st.agent_x >= 50);
    CHECK(st.agent_x <= 449);
    CHECK(st.agent_x == std::floor(st.agent_x));
    CHECK(st.block_x >= 100);
    CHECK(st.block_y <= 399);
    angles.insert(st.block_angle);
  }
  CHECK(angles.size() == 200);
  // Reproducible by seed.
  const auto a = std::vector<float>(env.reset(7).begin(), env.reset(7).end());
  PushT other;
  const auto o = other.reset(7);
  CHECK(std::vector<float>(o.begin(), o.end()) == a);
  CHECK(a.size() == 20u);

  // At the goal, with the pusher away: full reward, success, the episode terminates.
  PushT::State g;
  g.block_x = PushT::kGoal[0], g.block_y = PushT::kGoal[1], g.block_angle = PushT::kGoal[2];
  g.agent_x = 40, g.agent_y = 40;
  env.set_state(g);
  auto r = env.step(std::array<float, 2>{40.0f, 40.0f});
  CHECK(env.coverage() == doctest::Approx(1.0));
  CHECK(r.reward == doctest::Approx(1.0));
  CHECK(r.terminated);
  CHECK(env.success());
  // Shifted sideways by 10 in the goal's frame: coverage 0.81, reward 0.81 / 0.95.
  const auto p = goal_shifted(10, 0);
  g.block_x = p.x, g.block_y = p.y;
  env.set_state(g);
  r = env.step(std::array<float, 2>{40.0f, 40.0f});
  CHECK(r.reward == doctest::Approx(5100.0 / 6300 / 0.95).epsilon(1e-6));
  CHECK_FALSE(r.terminated);
  // The 300-step limit.
  int steps = 1;
  while (!r.truncated) {
    r = env.step(std::array<float, 2>{40.0f, 40.0f});
    ++steps;
  }
  CHECK(steps == 300);
  // Bad actions name the env and the step.
  env.reset(1);
  env.step(std::array<float, 2>{100.0f, 100.0f});
  CHECK_THROWS_WITH_AS(env.step(std::array<float, 2>{std::numeric_limits<float>::quiet_NaN(), 1.0f}),
                       "PushT: step 1: action[0] is nan", anvil::envs::EnvError);
}

TEST_CASE("Push-T: a saved or copied env goes on from the same bodies") {
  PushT env;
  env.reset(3);
  for (int i = 0; i < 5; ++i) env.step(std::array<float, 2>{300.0f, 200.0f});
  auto w = anvil::BinaryWriter::in_memory("state");
  env.save_state(w);
  const auto bytes = w.take_bytes();
  PushT loaded;
  anvil::BinaryReader r(bytes, "state", "state");
  loaded.load_state(r);
  r.finish();
  PushT copy = env;
  CHECK(loaded.elapsed_steps() == 5);
  CHECK(loaded.state().block_x == env.state().block_x);
  CHECK(loaded.state().block_angle == env.state().block_angle);
  for (int i = 0; i < 20; ++i) {
    const std::array<float, 2> act{static_cast<float>(150 + 10 * i), static_cast<float>(260 - 5 * i)};
    env.step(act);
    loaded.step(act);
    copy.step(act);
  }
  // The contact cache restarts empty on a rebuilt space: the same path, to well below a pixel.
  CHECK(loaded.state().block_x == doctest::Approx(env.state().block_x).epsilon(1e-4));
  CHECK(loaded.state().block_angle == doctest::Approx(env.state().block_angle).epsilon(1e-3));
  CHECK(copy.state().block_y == doctest::Approx(env.state().block_y).epsilon(1e-4));
  CHECK(loaded.elapsed_steps() == 25);
}

TEST_CASE("Push-T: the scripted expert reaches the goal from most starts, with smooth commanded paths") {
  const anvil::envs::chipmunk::PushTExpert expert;
  int solved = 0;
  double largest_jump = 0;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    PushT env;
    std::array<float, 2> last{-1, -1};
    solved += expert.run(env, 5000 + seed, [&](std::span<const float> obs, std::span<const float> a) {
      const double from_last = last[0] >= 0 ? std::hypot(a[0] - last[0], a[1] - last[1]) : 0.0;
      largest_jump = std::max({largest_jump, from_last, static_cast<double>(std::hypot(a[0] - obs[18], a[1] - obs[19]))});
      last = {a[0], a[1]};
    });
    if (env.success()) CHECK(env.coverage() > 0.95);
  }
  MESSAGE("the expert solved " << solved << " of 20");
  CHECK(solved >= 17);
  // The commanded point moves at most 24 pixels a step, and stays near the pusher.
  MESSAGE("largest jump of the commanded point: " << largest_jump);
  CHECK(largest_jump <= 80.0);  // the PD controller lags its commanded point by about two steps of travel
  // The cost it plans by: 0 at the goal, the shift's length when moved without turning.
  CHECK(anvil::envs::chipmunk::PushTExpert::cost({PushT::kGoal[0], PushT::kGoal[1], PushT::kGoal[2]}) == doctest::Approx(0.0));
  CHECK(anvil::envs::chipmunk::PushTExpert::cost({PushT::kGoal[0] + 3, PushT::kGoal[1] + 4, PushT::kGoal[2]}) == doctest::Approx(5.0));
}

TEST_CASE("Push-T: the varied expert chooses as a person might, still solves, and repeats itself for a seed") {
  using anvil::envs::chipmunk::PushTExpert;
  PushTExpert::Options o;
  o.detour = 0.5;
  o.choice = 0.3;
  const PushTExpert varied(o), plain;
  auto actions = [](const PushTExpert& e, std::uint64_t seed, bool& solved) {
    PushT env;
    std::vector<float> out;
    solved = e.run(env, seed, [&](std::span<const float>, std::span<const float> a) { out.insert(out.end(), a.begin(), a.end()); });
    return out;
  };
  int solved = 0, differ = 0;
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    bool ok = false, again = false, plain_ok = false;
    const auto a = actions(varied, 7000 + seed, ok);
    CHECK(actions(varied, 7000 + seed, again) == a);  // the choices come from the episode's seed
    CHECK(again == ok);
    differ += actions(plain, 7000 + seed, plain_ok) != a;
    solved += ok;
  }
  MESSAGE("the varied expert solved " << solved << " of 12; its path differed from the plain expert's on " << differ);
  CHECK(solved >= 9);
  CHECK(differ >= 6);
  // Each kind of choice on its own changes some paths.
  PushTExpert::Options detour_only, choice_only;
  detour_only.detour = 1.0;
  choice_only.choice = 0.3;
  int detoured = 0, chose = 0;
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    bool ok = false;
    const auto p = actions(plain, 7000 + seed, ok);
    detoured += actions(PushTExpert(detour_only), 7000 + seed, ok) != p;
    chose += actions(PushTExpert(choice_only), 7000 + seed, ok) != p;
  }
  CHECK(detoured >= 1);
  CHECK(chose >= 1);
  CHECK_FALSE(PushTExpert().options().varied());
  PushTExpert::Options bad;
  bad.choice = 1.5;
  CHECK_THROWS_WITH_AS(PushTExpert{bad}, doctest::Contains("Options::choice"), anvil::ConfigError);
  bad.choice = 0;
  bad.detour = -0.1;
  CHECK_THROWS_WITH_AS(PushTExpert{bad}, doctest::Contains("Options::detour"), anvil::ConfigError);
  CHECK(varied.options().varied());
}

TEST_CASE("Push-T as pixels: a known state gives the known image at 96x96 (pusher, block, goal, y down the rows)") {
  using namespace anvil::envs::chipmunk;
  auto cv = push_t_canvas(96);
  const double px = 96.0 / 512.0;  // image pixels per field unit
  auto pixel = [&](double x, double y) {  // the pixel whose square holds field point (x, y)
    const int col = static_cast<int>(x * px), row = static_cast<int>(y * px);
    return std::array<int, 3>{cv.at(0, row, col), cv.at(1, row, col), cv.at(2, row, col)};
  };
  auto is = [](std::array<int, 3> p, anvil::envs::render::Rgb c) { return p[0] == c.r && p[1] == c.g && p[2] == c.b; };
  const Pose2 goal{256.0, 256.0, kPi / 4};
  const auto cog = [](const Pose2& p) { return p.apply(anvil::envs::detail::Vec2{0.0, 45.0}); };  // the T's centre of gravity

  // The block away from the goal, the pusher near the top: each where its pose says.
  const Pose2 block{100.0, 380.0, 0.0};
  draw_push_t(cv, block, 256.0, 50.0);
  CHECK(is(pixel(256.0, 50.0), kPushTAgent));
  CHECK(is(pixel(256.0, 462.0), kPushTField));            // y runs down: nothing at the bottom
  CHECK(is(pixel(cog(block).x, cog(block).y), kPushTBlock));
  CHECK(is(pixel(cog(goal).x, cog(goal).y), kPushTGoal));
  const auto bar = goal.apply(anvil::envs::detail::Vec2{0.0, 15.0});  // the middle of the goal's bar
  CHECK(is(pixel(bar.x, bar.y), kPushTGoal));
  CHECK(is(pixel(30.0, 256.0), kPushTField));              // open field
  // The goal T, drawn alone on white, covers its area (6,300 field units squared) to 3%.
  double goal_pixels = 0;
  for (int r = 0; r < 96; ++r)
    for (int c = 0; c < 96; ++c) {
      const double f = (255.0 - cv.at(0, r, c)) / (255.0 - kPushTGoal.r);
      if (f > 0 && std::abs((255.0 - cv.at(1, r, c)) - f * (255.0 - kPushTGoal.g)) <= 1.0 &&
          std::abs((255.0 - cv.at(2, r, c)) - f * (255.0 - kPushTGoal.b)) <= 1.0)
        goal_pixels += f;
    }
  CHECK(goal_pixels == doctest::Approx(6300.0 * px * px).epsilon(0.03));

  // The block on the goal hides it: no pixel is left of the goal's colour.
  draw_push_t(cv, goal, 450.0, 450.0);
  int goal_left = 0;
  for (int r = 0; r < 96; ++r)
    for (int c = 0; c < 96; ++c)
      goal_left += cv.at(0, r, c) == kPushTGoal.r && cv.at(1, r, c) == kPushTGoal.g && cv.at(2, r, c) == kPushTGoal.b;
  CHECK(goal_left == 0);
  CHECK(is(pixel(cog(goal).x, cog(goal).y), kPushTBlock));

  // An env draws its own state.
  PushT env;
  env.reset(7);
  draw_push_t(cv, env);
  const auto s = env.state();
  CHECK(is(pixel(s.agent_x, s.agent_y), kPushTAgent));
}
#endif

}  // namespace

TEST_CASE("Push-T's image variant: rows of the drawing and agent_pos, windows of them side by side in MultiStep, its state redrawn") {
  using namespace anvil::envs::chipmunk;
  PushTImage img(32);
  const auto layout = img.observation_space();
  CHECK(layout.describe() == "image uint8 [3,32,32], agent_pos float32 [2]");
  const auto row_bytes = static_cast<std::size_t>(layout.row_bytes());
  CHECK(row_bytes == 3 * 32 * 32 + 8);
  // The row is the drawing of the env's state, agent_pos its pusher.
  const auto first = img.reset(3);
  REQUIRE(first.size() == row_bytes);
  auto cv = push_t_canvas(32);
  draw_push_t(cv, img.env());
  CHECK(std::equal(cv.pixels().begin(), cv.pixels().end(), first.begin()));
  float pos[2];
  std::memcpy(pos, first.data() + 3 * 32 * 32, sizeof pos);
  CHECK(pos[0] == static_cast<float>(img.env().state().agent_x));
  CHECK(pos[1] == static_cast<float>(img.env().state().agent_y));

  // A window of two steps: the layout stacked (parts named <name>@<i>), rows side by side.
  anvil::envs::MultiStep<PushTImage> ms(PushTImage(32), 2, 4);
  const auto window = ms.observation_space();
  CHECK(window.describe() == "image@0 uint8 [3,32,32], agent_pos@0 float32 [2], image@1 uint8 [3,32,32], agent_pos@1 float32 [2]");
  CHECK(window.row_bytes() == 2 * layout.row_bytes());
  CHECK(window.unstacked(2).describe() == layout.describe());
  CHECK(layout.unstacked(1).describe() == layout.describe());  // a layout that is not a window is its own
  CHECK_THROWS_WITH_AS((void)window.unstacked(3), doctest::Contains("is not a window of 3 steps"), anvil::ConfigError);
  const auto w0 = std::vector<std::uint8_t>(ms.reset(3).begin(), ms.reset(3).end());
  REQUIRE(w0.size() == 2 * row_bytes);
  CHECK(std::equal(w0.begin(), w0.begin() + static_cast<std::ptrdiff_t>(row_bytes), first.begin()));  // the first row twice
  CHECK(std::equal(w0.begin() + static_cast<std::ptrdiff_t>(row_bytes), w0.end(), first.begin()));
  PushTImage ref(32);
  ref.reset(3);
  std::vector<std::uint8_t> prev, last;
  const std::array<float, 8> chunk{300, 200, 310, 210, 320, 220, 330, 230};
  double reward = 0;
  for (int k = 0; k < 4; ++k) {
    const auto r = ref.step(std::span<const float>(chunk).subspan(static_cast<std::size_t>(2 * k), 2));
    reward += r.reward;
    prev = last;
    last.assign(r.observation.begin(), r.observation.end());
  }
  const auto s = ms.step(chunk);
  CHECK(s.reward == doctest::Approx(reward));
  CHECK(std::equal(prev.begin(), prev.end(), s.observation.begin()));
  CHECK(std::equal(last.begin(), last.end(), s.observation.begin() + static_cast<std::ptrdiff_t>(row_bytes)));

  // Saved and loaded: the same window and bodies (the contact cache restarts empty, so the
  // path after it agrees to well below a pixel, as PushT's own).
  auto w = anvil::BinaryWriter::in_memory("state");
  ms.save_state(w);
  const auto bytes = w.take_bytes();
  anvil::envs::MultiStep<PushTImage> copy(PushTImage(32), 2, 4);
  copy.reset(99);
  anvil::BinaryReader r(bytes, "state", "state");
  copy.load_state(r);
  r.finish();
  ms.step(chunk);
  const auto b = copy.step(chunk);
  CHECK(copy.env().env().state().block_x == doctest::Approx(ms.env().env().state().block_x).epsilon(1e-4));
  std::memcpy(pos, b.observation.data() + 2 * row_bytes - 8, sizeof pos);
  CHECK(pos[0] == doctest::Approx(ms.env().env().state().agent_x).epsilon(1e-4));
}
