#pragma once
/// @file
/// Push-T seen as pixels (the image variant of Diffusion Policy, Chi et al. 2023, section V:
/// the 512 x 512 field viewed at 96 x 96 RGB): the goal T in light green, the block's T in
/// slate grey over it, the pusher a blue disc, the walls light grey, on white (the colours
/// of the published env's drawing). Field coordinates map to the image as the published env
/// draws them: x to the right along a row, y down the rows. Drawn in software
/// (envs/render/canvas.hpp) at any size. Light header: no torch.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/envs/chipmunk/push_t.hpp>
#include <anvil/envs/render/canvas.hpp>

namespace anvil::envs::chipmunk {

/// The colours of Push-T's drawing.
inline constexpr render::Rgb kPushTGoal{144, 238, 144}, kPushTBlock{119, 136, 153}, kPushTAgent{65, 105, 225},
    kPushTWall{211, 211, 211}, kPushTField{255, 255, 255};

/// A canvas for Push-T at `size` x `size` pixels (96 in the published image variant).
inline render::Canvas push_t_canvas(int size = 96) {
  // The canvas's world is y up; the field's y runs down the image, so it is drawn at
  // (x, kField - y) (see `draw_push_t`).
  return render::Canvas(size, size, render::View{0, PushT::kField, 0, PushT::kField});
}

/// Draws the field with the block at `block` (its body pose), the pusher at (`agent_x`,
/// `agent_y`) and the goal T at the published goal pose.
inline void draw_push_t(render::Canvas& canvas, const detail::Pose2& block, double agent_x, double agent_y) {
  const auto flip = [](detail::Vec2 p) { return render::Point{p.x, PushT::kField - p.y}; };
  canvas.clear(kPushTField);
  // Walls: the four segments of radius 2 from (5, 5) to (506, 506).
  const std::array<detail::Vec2, 4> corners{{{5, 5}, {506, 5}, {506, 506}, {5, 506}}};
  for (int i = 0; i < 4; ++i) canvas.capsule(flip(corners[i]), flip(corners[(i + 1) % 4]), 2.0, kPushTWall);
  const detail::Pose2 goal{PushT::kGoal[0], PushT::kGoal[1], PushT::kGoal[2]};
  static const std::vector<detail::Polygon> tee = PushT::tee();
  const auto draw_tee = [&](const detail::Pose2& pose, render::Rgb colour) {
    for (const auto& rect : tee) {
      std::array<render::Point, 4> pts;
      for (std::size_t k = 0; k < 4; ++k) pts[k] = flip(pose.apply(rect[k]));
      canvas.polygon(pts, colour);
    }
  };
  draw_tee(goal, kPushTGoal);
  draw_tee(block, kPushTBlock);
  canvas.disc(flip({agent_x, agent_y}), PushT::kPusherRadius, kPushTAgent);
}

/// Draws `env` as it is now.
inline void draw_push_t(render::Canvas& canvas, const PushT& env) {
  const auto s = env.state();
  draw_push_t(canvas, env.block_pose(), s.agent_x, s.agent_y);
}

/// The observation of Push-T's image variant, as the paper's: the field drawn at `size` x
/// `size` RGB ("image") beside the pusher's position ("agent_pos", field units).
inline ObsLayout push_t_image_layout(int size = 96) {
  ObsLayout l;
  l.image("image", 3, size, size).vector("agent_pos", 2);
  return l;
}

/// Writes `env`'s observation in the image variant into `row` (push_t_image_layout's
/// row_bytes()), drawn with `canvas` (push_t_canvas of the layout's size).
inline void push_t_image_row(render::Canvas& canvas, const PushT& env, std::uint8_t* row) {
  draw_push_t(canvas, env);
  const auto px = canvas.pixels();
  std::copy(px.begin(), px.end(), row);
  const auto s = env.state();
  const float pos[2] = {static_cast<float>(s.agent_x), static_cast<float>(s.agent_y)};
  // agent_pos follows the image, which is padded to a multiple of 4 bytes.
  std::memcpy(row + (px.size() + 3) / 4 * 4, pos, sizeof pos);
}

/// Push-T's image variant as an env: `PushT` whose observation is `push_t_image_layout`'s
/// row (the field drawn at `size` x `size` RGB beside agent_pos), drawn after every reset
/// and step; rewards, ends, success and the best reward are PushT's. Its state in
/// checkpoints is PushT's (the row is drawn again from it).
class PushTImage {
 public:
  static constexpr std::string_view name = PushT::name;

  explicit PushTImage(int size = 96, PushT::Reward reward = PushT::Reward::coverage)
      : env_(reward), canvas_(push_t_canvas(size)), layout_(push_t_image_layout(size)),
        row_(static_cast<std::size_t>(layout_.row_bytes()), 0) {}

  [[nodiscard]] ObsLayout observation_space() const { return layout_; }
  [[nodiscard]] Box action_space() const { return env_.action_space(); }

  std::span<const std::uint8_t> reset(std::uint64_t seed) {
    env_.reset(seed);
    push_t_image_row(canvas_, env_, row_.data());
    return row_;
  }
  ByteStepResult step(std::span<const float> action) {
    const auto r = env_.step(action);
    push_t_image_row(canvas_, env_, row_.data());
    return {row_, r.reward, r.terminated, r.truncated};
  }

  [[nodiscard]] bool success() const noexcept { return env_.success(); }
  [[nodiscard]] double best_reward() const noexcept { return env_.best_reward(); }
  [[nodiscard]] const PushT& env() const noexcept { return env_; }

  void save_state(BinaryWriter& w) const { env_.save_state(w); }
  void load_state(BinaryReader& r) {
    env_.load_state(r);
    push_t_image_row(canvas_, env_, row_.data());
  }

 private:
  PushT env_;
  render::Canvas canvas_;
  ObsLayout layout_;
  std::vector<std::uint8_t> row_;
};

}  // namespace anvil::envs::chipmunk
