#pragma once
/// @file
/// Spaces and the env spec: what a policy needs to know about an environment to be built
/// (its observation and action spaces). They live in core, below every layer that builds
/// networks or storage from them; the env contract (envs/env.hpp) uses them. Light header.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil {

/// A box in R^n: `low[i] <= x[i] <= high[i]` (bounds may be +-infinity).
struct Box {
  std::vector<float> low;
  std::vector<float> high;

  /// Number of dimensions.
  [[nodiscard]] std::size_t size() const noexcept { return low.size(); }
  /// True when `x` has the right size and every element is finite and inside the bounds.
  [[nodiscard]] bool contains(std::span<const float> x) const noexcept {
    if (x.size() != low.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(x[i] >= low[i] && x[i] <= high[i])) return false;  // also false for NaN
    return true;
  }
};

/// `n` discrete choices, 0 .. n-1.
struct Discrete {
  std::int64_t n = 0;
  [[nodiscard]] bool contains(std::int64_t a) const noexcept { return a >= 0 && a < n; }
};

/// How a multi-agent env's step travels through the single-agent machinery (VecEnv,
/// buffers, loops): as one observation row and one joint action index
/// (envs/multi_agent/multi_agent_env.hpp). The row is
///
///     [ obs of agent 0 | ... | obs of agent k-1 | available actions of agent 0 | ... | of agent k-1 | state | first ]
///
/// with each agent's available actions as 1/0 and `first` 1 on an episode's first row
/// (0 after), so that a policy with memory (a recurrent actor) knows when to forget,
/// whichever loop or evaluation steps the env. The joint action's digits in base
/// `num_actions` are the agents' actions, agent 0's the least significant.
/// Maps at the start of a vector of floats: `channels` maps of `height` x `width`,
/// channel-major (a multi-agent env's observation or state, `AgentLayout`); all 0: none.
struct MapShape {
  std::int64_t channels = 0, height = 0, width = 0;
  [[nodiscard]] bool any() const noexcept { return channels > 0; }
  [[nodiscard]] std::int64_t numel() const noexcept { return channels * height * width; }
};

struct AgentLayout {
  std::int64_t agents = 0;       ///< 0: a single-agent env
  std::int64_t obs_dim = 0;      ///< one agent's observation
  std::int64_t num_actions = 0;  ///< one agent's discrete actions
  std::int64_t state_dim = 0;    ///< the global state (the centralised critic's input)
  MapShape obs_map{};            ///< maps at the start of each agent's observation (none: 0)
  MapShape state_map{};          ///< maps at the start of the state (none: 0)

  [[nodiscard]] bool multi_agent() const noexcept { return agents > 0; }
  [[nodiscard]] std::int64_t avail_offset() const noexcept { return agents * obs_dim; }
  [[nodiscard]] std::int64_t state_offset() const noexcept { return agents * (obs_dim + num_actions); }
  [[nodiscard]] std::int64_t first_offset() const noexcept { return state_offset() + state_dim; }
  [[nodiscard]] std::int64_t row_size() const noexcept { return first_offset() + 1; }
  /// num_actions ^ agents, or 0 when it would not fit in an int64.
  [[nodiscard]] std::int64_t joint_actions() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t i = 0; i < agents; ++i) {
      if (num_actions > 0 && n > (std::int64_t{1} << 62) / num_actions) return 0;
      n *= num_actions;
    }
    return n;
  }
};

/// The element type of an observation part.
enum class PartDtype : std::uint8_t { float32, uint8 };

/// One named part of an observation: an image (`uint8` `[C, H, W]`, channels first) or a
/// vector of float32 numbers (`[n]`), at `offset` bytes into the observation's row.
struct ObsPart {
  std::string name;
  PartDtype dtype = PartDtype::float32;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  ///< bytes into the row (a multiple of 4)
  /// An image's frames stacked on its channels, oldest first, each `channels / frames`
  /// deep (`envs::Pixels`' stack): replay buffers then store each frame once. It does not
  /// change the part's bytes or what a network sees; 1 for a single frame.
  std::int64_t frames = 1;

  [[nodiscard]] std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  [[nodiscard]] std::int64_t bytes() const noexcept { return numel() * (dtype == PartDtype::uint8 ? 1 : 4); }
  [[nodiscard]] bool image() const noexcept { return dtype == PartDtype::uint8 && shape.size() == 3; }
};

/// An observation of named parts, packed into one row of bytes: each part at its offset, in
/// the order given, padded to 4 bytes so a float part can be read in place. An env whose
/// observation space is an `ObsLayout` hands out rows of bytes (`std::span<const
/// std::uint8_t>`, `row_bytes()` long); images stay bytes from the env through the buffers
/// to the device, where the encoder converts them (nn/observation_encoder.hpp). An env
/// whose observation space is a `Box` is the one-part case, `obs`, float32 `[obs_dim]`.
struct ObsLayout {
  std::vector<ObsPart> parts;

  /// An image part `[channels, height, width]` of bytes; `frames` > 1: a stack of that many
  /// frames on the channels, oldest first (ObsPart::frames).
  ObsLayout& image(std::string name, std::int64_t channels, std::int64_t height, std::int64_t width,
                   std::int64_t frames = 1) {
    if (frames < 1 || channels % frames != 0)
      throw ConfigError("observation part " + name + ": " + std::to_string(channels) + " channels are not a stack of " +
                        std::to_string(frames) + " frames");
    return add({std::move(name), PartDtype::uint8, {channels, height, width}, 0, frames});
  }
  /// A part of `n` float32 numbers.
  ObsLayout& vector(std::string name, std::int64_t n) { return add({std::move(name), PartDtype::float32, {n}, 0}); }

  /// Bytes in one row (a multiple of 4).
  [[nodiscard]] std::int64_t row_bytes() const noexcept {
    return parts.empty() ? 0 : (parts.back().offset + parts.back().bytes() + 3) / 4 * 4;
  }
  [[nodiscard]] bool has_images() const noexcept {
    for (const auto& p : parts)
      if (p.image()) return true;
    return false;
  }
  /// Numbers in the float parts, together.
  [[nodiscard]] std::int64_t float_numel() const noexcept {
    std::int64_t n = 0;
    for (const auto& p : parts)
      if (p.dtype == PartDtype::float32) n += p.numel();
    return n;
  }
  /// The part named `name`, or null.
  [[nodiscard]] const ObsPart* find(std::string_view name) const noexcept {
    for (const auto& p : parts)
      if (p.name == name) return &p;
    return nullptr;
  }
  /// "image uint8 [3,64,64], state float32 [2]"
  [[nodiscard]] std::string describe() const {
    std::string s;
    for (const auto& p : parts) {
      // Appended piece by piece (GCC 12 misreads `"" + std::string` chains as overflows).
      if (!s.empty()) s.append(", ");
      s.append(p.name).append(p.dtype == PartDtype::uint8 ? " uint8 [" : " float32 [");
      for (std::size_t i = 0; i < p.shape.size(); ++i) {
        if (i) s.push_back(',');
        s.append(std::to_string(p.shape[i]));
      }
      s.push_back(']');
    }
    return s;
  }

  /// A window of `n` of these rows side by side, oldest first (envs::MultiStep's
  /// observation): each part repeated, named `<name>@<i>`. Its rows are the n rows
  /// concatenated, byte for byte (row_bytes() is a multiple of 4).
  [[nodiscard]] ObsLayout stacked(int n) const {
    ObsLayout out;
    for (int i = 0; i < n; ++i)
      for (const auto& p : parts) out.add({p.name + "@" + std::to_string(i), p.dtype, p.shape, 0, p.frames});
    return out;
  }
  /// The layout of one step of a `stacked(n)` window (the names without `@0`); a
  /// ConfigError when this is not such a window. A layout that is not a window is its own
  /// window of one.
  [[nodiscard]] ObsLayout unstacked(int n) const {
    if (n == 1 && (parts.empty() || !parts.front().name.ends_with("@0"))) return *this;
    const auto k = n > 0 ? parts.size() / static_cast<std::size_t>(n) : 0;
    ObsLayout out;
    for (std::size_t j = 0; j < k; ++j) {
      const auto& name = parts[j].name;
      const auto at = name.rfind("@0");
      if (at == std::string::npos || at + 2 != name.size()) break;
      out.add({name.substr(0, at), parts[j].dtype, parts[j].shape, 0, parts[j].frames});
    }
    if (k == 0 || out.parts.size() != k || out.stacked(n).describe() != describe())
      throw ConfigError("the observation (" + describe() + ") is not a window of " + std::to_string(n) +
                        " steps (wrap the env in envs::MultiStep with the same horizon)");
    return out;
  }

 private:
  ObsLayout& add(ObsPart p) {
    p.offset = row_bytes();
    parts.push_back(std::move(p));
    return *this;
  }
};

/// What a policy needs to know about an env to be built: its name and spaces.
struct EnvSpec {
  std::string name;
  /// The observation's bounds (float observations); for an env of parts (`layout`), the
  /// bounds of its float numbers, in the parts' order.
  Box observation;
  std::variant<Box, Discrete> action;
  /// The env's tasks, for envs that have several (a multi-task suite); empty otherwise.
  /// Replay buffers then store each transition's task and algorithms may condition on it.
  std::vector<std::string> tasks{};
  /// The agents of a multi-agent env (`agents.agents == 0` for a single-agent one).
  AgentLayout agents{};
  /// The observation's parts when the env hands out rows of bytes (images, or images
  /// beside numbers); empty for an env of float rows (a `Box`).
  ObsLayout layout{};

  [[nodiscard]] bool discrete() const noexcept { return std::holds_alternative<Discrete>(action); }
  /// Whether observations are rows of bytes of several parts (`layout`), not float rows.
  [[nodiscard]] bool byte_rows() const noexcept { return !layout.parts.empty(); }
  /// Width of an observation row: floats in a float row, bytes in a row of parts.
  [[nodiscard]] std::int64_t obs_dim() const noexcept {
    return byte_rows() ? layout.row_bytes() : static_cast<std::int64_t>(observation.size());
  }
  /// Bytes in an observation row.
  [[nodiscard]] std::int64_t obs_row_bytes() const noexcept { return byte_rows() ? obs_dim() : 4 * obs_dim(); }
  /// Width of an action row: the Box's size, or 1 for a discrete index.
  [[nodiscard]] std::int64_t action_dim() const noexcept {
    return discrete() ? 1 : static_cast<std::int64_t>(std::get<Box>(action).size());
  }
  /// Number of discrete actions (0 for a Box).
  [[nodiscard]] std::int64_t num_actions() const noexcept {
    return discrete() ? std::get<Discrete>(action).n : 0;
  }
};

}  // namespace anvil
