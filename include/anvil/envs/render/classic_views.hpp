#pragma once
/// @file
/// The classic control envs drawn as pixels (envs/render/canvas.hpp), for learning from
/// images: Pendulum as Gymnasium draws it (a rod of length 1 and width 0.2 from the pivot,
/// angle 0 upright and counter-clockwise positive, on a view of [-2.2, 2.2] in both axes; a
/// dark pivot), at any resolution (64x64 for pixel control), and `PixelPendulum`, the pixel
/// control task it makes (envs/render/pixels.hpp). Light header.

#include <cmath>
#include <string_view>

#include <anvil/envs/pendulum.hpp>
#include <anvil/envs/render/canvas.hpp>
#include <anvil/envs/render/pixels.hpp>

namespace anvil::envs::render {

/// The view Pendulum is drawn in: 2.2 units each side of the pivot.
inline constexpr View kPendulumView{-2.2, 2.2, -2.2, 2.2};

/// Colours of the drawings (background, Pendulum's rod and pivot).
inline constexpr Rgb kBackground{255, 255, 255}, kRod{204, 77, 77}, kPivot{0, 0, 0};

/// Draws Pendulum at angle `theta` (radians from upright, counter-clockwise positive) onto
/// `canvas` (made with `kPendulumView`).
inline void draw_pendulum(Canvas& canvas, double theta) {
  canvas.clear(kBackground);
  canvas.capsule({0, 0}, {-std::sin(theta), std::cos(theta)}, 0.1, kRod);
  canvas.disc({0, 0}, 0.05, kPivot);
}

}  // namespace anvil::envs::render

namespace anvil::envs {

/// Pendulum as pixels: `PixelPendulum-v1`.
template <>
struct pixel_view<Pendulum> {
  static constexpr std::string_view name = "PixelPendulum-v1";
  static constexpr render::View view = render::kPendulumView;
  static void draw(render::Canvas& c, const Pendulum& e) { render::draw_pendulum(c, e.state().theta); }
};

/// The pixel control task: Pendulum-v1 drawn at 64x64, 3 frames stacked, each action
/// repeated twice (`Pixels`).
using PixelPendulum = Pixels<Pendulum>;
static_assert(Env<PixelPendulum> && ByteObservations<PixelPendulum> && SavesOwnState<PixelPendulum>);

}  // namespace anvil::envs
