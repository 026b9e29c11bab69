// The software rasteriser (envs/render/canvas.hpp) and Pendulum's view: a known state gives a
// known image (where the rod is, and is not), drawings are exact mirror images where the
// state is mirrored, and each shape covers its area to within the antialiasing.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <numbers>

#include <anvil/envs/render/classic_views.hpp>

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
