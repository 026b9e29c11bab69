// The software rasteriser (envs/render/canvas.hpp) and Pendulum's view: a known state gives a
// known image (where the rod is, and is not), drawings are exact mirror images where the
// state is mirrored, and each shape covers its area to within the antialiasing.
#include <anvil/envs/render/classic_views.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <numbers>


using namespace anvil::envs::render;

namespace {
// How much of each pixel colour `c` covers on a white canvas, summed (in pixels), read from
// the green channel.
double covered(const Canvas& cv, Rgb c) {
  double sum = 0;
  for (int r = 0; r < cv.height(); ++r)
    for (int col = 0; col < cv.width(); ++col) sum += (255.0 - cv.at(1, r, col)) / (255.0 - c.g);
  return sum;
}
}  // namespace

TEST_CASE("Pendulum's view: upright, the rod fills the column above the pivot and nothing below") {
  Canvas cv(64, 64, kPendulumView);
  draw_pendulum(cv, 0.0);
  // 64 px over 4.4 units: the pivot at pixel (32, 32), the tip 14.5 px above it, the rod 2.9 px wide.
  for (int row = 19; row <= 29; ++row) {
    CAPTURE(row);
    for (int col : {31, 32}) {
      CHECK(cv.at(0, row, col) == kRod.r);
      CHECK(cv.at(1, row, col) == kRod.g);
      CHECK(cv.at(2, row, col) == kRod.b);
    }
    CHECK(cv.at(1, row, 28) == 255);  // beside the rod: background
    CHECK(cv.at(1, row, 35) == 255);
  }
  for (int row = 36; row < 64; ++row) CHECK(cv.at(1, row, 32) == 255);  // below the pivot: background
  CHECK(cv.at(0, 12, 32) == 255);  // above the tip
  // Hanging down, the same rod below the pivot.
  draw_pendulum(cv, std::numbers::pi);
  for (int row = 36; row <= 44; ++row) CHECK(cv.at(1, row, 32) == kRod.g);
  for (int row = 5; row <= 28; ++row) CHECK(cv.at(1, row, 32) == 255);
  // A quarter turn counter-clockwise: the rod points left.
  draw_pendulum(cv, std::numbers::pi / 2);
  for (int col = 19; col <= 29; ++col) CHECK(cv.at(1, 32, col) == kRod.g);
  for (int col = 36; col < 64; ++col) CHECK(cv.at(1, 32, col) == 255);
}

TEST_CASE("Pendulum's view: angles theta and -theta give mirror images, pixel for pixel") {
  for (double theta : {0.3, 1.1, 2.5, -0.7}) {
    CAPTURE(theta);
    Canvas a(64, 64, kPendulumView), b(64, 64, kPendulumView);
    draw_pendulum(a, theta);
    draw_pendulum(b, -theta);
    int differ = 0;
    for (int c = 0; c < 3; ++c)
      for (int r = 0; r < 64; ++r)
        for (int col = 0; col < 64; ++col) differ += a.at(c, r, col) != b.at(c, r, 63 - col);
    CHECK(differ == 0);
  }
}

TEST_CASE("Canvas: a disc, a capsule and a rotated square cover their areas to within 1%") {
  const Rgb black{0, 0, 0};
  Canvas cv(96, 96, View{0, 96, 0, 96});  // one unit a pixel
  cv.clear({255, 255, 255});
  cv.disc({40.3, 50.7}, 10.0, black);
  CHECK(covered(cv, black) == doctest::Approx(std::numbers::pi * 100).epsilon(0.01));
  cv.clear({255, 255, 255});
  cv.capsule({20.2, 30.1}, {70.9, 61.4}, 3.0, black);
  const double len = std::hypot(50.7, 31.3);
  CHECK(covered(cv, black) == doctest::Approx(2 * 3.0 * len + std::numbers::pi * 9).epsilon(0.01));
  cv.clear({255, 255, 255});
  const double a = std::numbers::pi / 6;
  std::array<Point, 4> square;
  for (int i = 0; i < 4; ++i) {
    const double t = a + i * std::numbers::pi / 2;
    square[i] = {48 + 20 * std::cos(t), 48 + 20 * std::sin(t)};  // a square of side 20 sqrt 2
  }
  cv.polygon(square, black);
  CHECK(covered(cv, black) == doctest::Approx(800.0).epsilon(0.01));
  // The same corners the other way round: the same image.
  Canvas other(96, 96, View{0, 96, 0, 96});
  other.clear({255, 255, 255});
  std::array<Point, 4> reversed{square[3], square[2], square[1], square[0]};
  other.polygon(reversed, black);
  int differ = 0;
  for (int r = 0; r < 96; ++r)
    for (int col = 0; col < 96; ++col) differ += cv.at(1, r, col) != other.at(1, r, col);
  CHECK(differ == 0);
  CHECK_THROWS_AS(Canvas(0, 10, View{}), anvil::ConfigError);
}

// ---- PixelPendulum: Pendulum as pixels, through the env door as rows of bytes ----

#include <anvil/envs/env_batch.hpp>

#include <cstring>
#include <vector>

TEST_CASE("PixelPendulum: one image part of 3 frames x RGB at 64x64, the frames stacked oldest first") {
  using anvil::envs::PixelPendulum;
  static_assert(anvil::envs::Env<PixelPendulum> && anvil::envs::ByteObservations<PixelPendulum>);
  PixelPendulum env;
  const auto layout = env.observation_space();
  REQUIRE(layout.parts.size() == 1);
  CHECK(layout.parts[0].name == "pixels");
  CHECK(layout.parts[0].image());
  CHECK(layout.parts[0].shape == std::vector<std::int64_t>{9, 64, 64});
  CHECK(layout.row_bytes() == 9 * 64 * 64);
  const auto spec = anvil::envs::spec_of(env);
  CHECK(spec.byte_rows());
  CHECK(spec.obs_dim() == 9 * 64 * 64);
  CHECK(spec.observation.size() == 0);  // no float parts
  CHECK(spec.name == "PixelPendulum-v1");

  const std::size_t frame = 3 * 64 * 64;
  auto first = env.reset(7);
  REQUIRE(first.size() == 3 * frame);
  // at the start every slot holds the first frame, which is Pendulum's drawing at its angle
  Canvas cv(64, 64, kPendulumView);
  draw_pendulum(cv, env.env().state().theta);
  for (int k = 0; k < 3; ++k) CHECK(std::memcmp(first.data() + k * frame, cv.pixels().data(), frame) == 0);
  std::vector<std::uint8_t> before(first.begin(), first.end());
  const float a[1] = {2.0f};
  const auto r = env.step(a);
  // the oldest frame left; the newest is the drawing after the step
  CHECK(std::memcmp(r.observation.data(), before.data() + frame, 2 * frame) == 0);
  draw_pendulum(cv, env.env().state().theta);
  CHECK(std::memcmp(r.observation.data() + 2 * frame, cv.pixels().data(), frame) == 0);
}

TEST_CASE("PixelPendulum: an action is repeated twice, the rewards summed, and episodes end with Pendulum's (100 agent steps)") {
  using anvil::envs::Pendulum;
  using anvil::envs::PixelPendulum;
  PixelPendulum px;
  Pendulum plain;
  px.reset(3);
  plain.reset(3);
  const float a[1] = {-1.5f};
  int steps = 0;
  double px_return = 0, plain_return = 0;
  for (bool done = false; !done;) {
    const auto r = px.step(a);
    px_return += r.reward;
    ++steps;
    for (int k = 0; k < 2; ++k) plain_return += plain.step(a).reward;
    CHECK(px.env().state().theta == plain.state().theta);
    done = r.terminated || r.truncated;
    if (done) CHECK(r.truncated);
  }
  CHECK(steps == 100);
  CHECK(px_return == doctest::Approx(plain_return).epsilon(1e-12));
}

TEST_CASE("PixelPendulum: an EnvArray steps it into rows of bytes, and its state (env and frames) saves and restores") {
  using anvil::envs::PixelPendulum;
  anvil::envs::VecEnvConfig cfg;
  cfg.num_envs = 2;
  anvil::envs::EnvArray<PixelPendulum> batch(PixelPendulum{}, cfg, 11);
  CHECK(batch.saves_state());
  const auto d = batch.spec().obs_dim();
  std::vector<std::uint8_t> obs(static_cast<std::size_t>(2 * d)), next(obs.size());
  std::vector<float> reward(2), term(2), trunc(2), act(2, 0.5f);
  std::vector<anvil::envs::EpisodeEnd> ended(2);
  batch.reset(obs.data(), 0);
  Canvas cv(64, 64, kPendulumView);
  draw_pendulum(cv, batch.env(1).env().state().theta);
  CHECK(std::memcmp(obs.data() + d + 2 * 3 * 64 * 64, cv.pixels().data(), 3 * 64 * 64) == 0);  // env 1's row: its drawing
  const anvil::envs::StepRows rows{obs.data(), next.data(), reward.data(), term.data(), trunc.data(), nullptr, ended.data()};
  batch.step(0, 2, act.data(), rows, 0);
  auto w = anvil::BinaryWriter::in_memory("pixels test");
  batch.save_envs(w);
  const auto bytes = w.take_bytes();
  batch.step(0, 2, act.data(), rows, 1);
  const std::vector<std::uint8_t> after_two = next;
  batch.step(0, 2, act.data(), rows, 2);
  CHECK(next != after_two);
  anvil::BinaryReader r(bytes, "saved envs", "pixels test");
  batch.read_envs(r)();
  batch.step(0, 2, act.data(), rows, 1);
  CHECK(next == after_two);  // the restored envs and frames step on exactly as before
}

namespace {
// An env of parts, an image beside two numbers, whose second number turns NaN at step 3.
struct ImageAndState {
  static constexpr std::string_view name = "ImageAndState";
  std::array<std::uint8_t, 12 + 8> row{};
  int t = 0;
  [[nodiscard]] anvil::ObsLayout observation_space() const { return anvil::ObsLayout{}.image("image", 3, 2, 2).vector("state", 2); }
  [[nodiscard]] anvil::Box action_space() const { return {{-1.f}, {1.f}}; }
  std::span<const std::uint8_t> reset(std::uint64_t) {
    t = 0;
    write(0.f);
    return row;
  }
  anvil::envs::ByteStepResult step(std::span<const float>) {
    ++t;
    write(t == 3 ? std::nanf("") : static_cast<float>(t));
    return {row, 0.0, false, false};
  }
  void write(float second) {
    const float s[2] = {1.f, second};
    std::memcpy(row.data() + 12, s, sizeof s);
  }
};
}  // namespace

TEST_CASE("An env of parts: a non-finite number in a float part stops the step, naming the env, the step and the part") {
  anvil::envs::VecEnvConfig cfg;
  cfg.num_envs = 1;
  anvil::envs::EnvArray<ImageAndState> batch(ImageAndState{}, cfg, 1);
  CHECK(batch.spec().obs_dim() == 20);
  std::vector<std::uint8_t> obs(20), next(20);
  std::vector<float> reward(1), term(1), trunc(1), act(1, 0.f);
  std::vector<anvil::envs::EpisodeEnd> ended(1);
  batch.reset(obs.data(), 0);
  const anvil::envs::StepRows rows{obs.data(), next.data(), reward.data(), term.data(), trunc.data(), nullptr, ended.data()};
  batch.step(0, 1, act.data(), rows, 0);
  batch.step(0, 1, act.data(), rows, 1);
  CHECK_THROWS_WITH_AS(batch.step(0, 1, act.data(), rows, 2),
                       doctest::Contains("ImageAndState: env 0 of 1: step 3 (step 3 of its episode): observation part 'state'[1] is nan"),
                       anvil::envs::EnvError);
}
