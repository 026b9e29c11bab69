#pragma once
/// @file
/// `Pixels<E>`: env `E` seen as pixels, for learning from images. Each step the wrapped env
/// is drawn in software (envs/render/canvas.hpp) by its `pixel_view<E>` (its drawing and
/// the name of the pixel task); the observation is the last `frames` frames stacked on the
/// channels, oldest first (`uint8 [3 frames, size, size]`, one image part named `pixels`),
/// so velocities can be seen; at an episode's start every slot holds its first frame (as
/// Gymnasium's FrameStack does). An agent's action is repeated `action_repeat` times and
/// their rewards summed (DrQ and PlaNet's action repeat, Hafner et al. 2019), so an
/// episode's return is the wrapped env's and compares with the state-based agent's; the
/// episode ends when the wrapped env's does. Its state (the wrapped env and the frames) is
/// saved in checkpoints. Light header.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/envs/env.hpp>
#include <anvil/envs/render/canvas.hpp>

namespace anvil::envs {

/// How env `E` is drawn: `name` (the pixel task's id), `view` (the world rectangle the image
/// shows) and `draw(canvas, env)`. Specialised beside each drawing (envs/render/classic_views.hpp).
template <class E>
struct pixel_view;

/// Settings of a pixel task (see file comment).
struct PixelOptions {
  int size = 64;           ///< height and width of each frame
  int frames = 3;          ///< frames stacked
  int action_repeat = 2;   ///< env steps per agent step
};

/// Env `E` seen as pixels (see file comment).
template <class E>
  requires Env<E> && requires(render::Canvas& c, const E& e) { pixel_view<E>::draw(c, e); }
class Pixels {
 public:
  static constexpr std::string_view name = pixel_view<E>::name;

  explicit Pixels(PixelOptions o = {}, E env = E{})
      : o_(o), env_(std::move(env)), canvas_(o.size, o.size, pixel_view<E>::view) {
    if (o.frames < 1 || o.action_repeat < 1)
      throw ConfigError(std::string(name) + ": frames (" + std::to_string(o.frames) + ") and action_repeat (" +
                        std::to_string(o.action_repeat) + ") must be 1 or more");
    frame_ = 3 * static_cast<std::size_t>(o.size) * static_cast<std::size_t>(o.size);
    obs_.assign(frame_ * static_cast<std::size_t>(o.frames), 0);
  }

  [[nodiscard]] ObsLayout observation_space() const {
    return ObsLayout{}.image("pixels", 3 * o_.frames, o_.size, o_.size, o_.frames);
  }
  [[nodiscard]] auto action_space() const { return env_.action_space(); }

  std::span<const std::uint8_t> reset(std::uint64_t seed) {
    env_.reset(seed);
    draw();
    for (int k = 0; k + 1 < o_.frames; ++k) std::memcpy(obs_.data() + k * frame_, newest(), frame_);
    return obs_;
  }

  ByteStepResult step(action_t<E> action) {
    double reward = 0.0;
    bool terminated = false, truncated = false;
    for (int k = 0; k < o_.action_repeat && !terminated && !truncated; ++k) {
      const auto r = env_.step(action);
      reward += r.reward;
      terminated = r.terminated;
      truncated = r.truncated;
    }
    std::memmove(obs_.data(), obs_.data() + frame_, obs_.size() - frame_);  // the oldest frame leaves
    draw();
    return {obs_, reward, terminated, truncated};
  }

  /// The wrapped env (its state, for tests) and the settings.
  [[nodiscard]] const E& env() const noexcept { return env_; }
  [[nodiscard]] const PixelOptions& options() const noexcept { return o_; }

  void save_state(BinaryWriter& w) const {
    static_assert(std::is_trivially_copyable_v<E>, "Pixels<E> saves E as bytes");
    w.bytes(&env_, sizeof(E));
    w.bytes(obs_.data(), obs_.size());
  }
  void load_state(BinaryReader& r) {
    E e = env_;
    std::vector<std::uint8_t> frames(obs_.size());
    r.bytes(&e, sizeof(E), "the pixel env's wrapped env");
    r.bytes(frames.data(), frames.size(), "the pixel env's frames");
    env_ = e;
    obs_ = std::move(frames);
  }

 private:
  std::uint8_t* newest() noexcept { return obs_.data() + (obs_.size() - frame_); }
  void draw() {
    pixel_view<E>::draw(canvas_, env_);
    std::memcpy(newest(), canvas_.pixels().data(), frame_);
  }

  PixelOptions o_;
  E env_;
  render::Canvas canvas_;
  std::size_t frame_ = 0;
  std::vector<std::uint8_t> obs_;  // [frames, 3, size, size], oldest first
};

}  // namespace anvil::envs
