#pragma once
/// @file
/// `Demonstrations`: episodes of (observation, action, reward, done) held in memory, the
/// form demonstrations take between their file (data/demonstrations.hpp reads and writes
/// robomimic's HDF5 layout) and a `DemoDataset`. Observations are float rows (`obs`), or,
/// when they hold images, rows of bytes of named parts (`layout`, `rows`: images uint8
/// `[C, H, W]` beside float numbers, as an env of parts hands them out). Light header: no
/// torch, no HDF5.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/detail/huge_pages.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>

namespace anvil {

/// Episodes of (observation, action, reward, done), flat: episode e is steps
/// [starts[e], starts[e + 1]).
struct Demonstrations {
  std::string env_name;
  /// The observation's parts, in order, and their widths (they sum to obs_dim).
  std::vector<std::pair<std::string, std::int64_t>> obs_parts;
  std::int64_t obs_dim = 0;       ///< floats in a float row; bytes in a row of parts
  std::int64_t act_dim = 0;
  std::vector<float> obs;       ///< [steps, obs_dim] (float rows)
  /// The parts of a row when observations hold images (empty for float rows); then `rows`
  /// holds the observations, [steps, layout.row_bytes()], and obs_dim is row_bytes.
  ObsLayout layout;
  std::vector<std::uint8_t, detail::HugePageAllocator<std::uint8_t>> rows;
  std::vector<float> actions;   ///< [steps, act_dim]
  std::vector<float> rewards;   ///< [steps]
  std::vector<std::uint8_t> dones;  ///< [steps]
  std::vector<std::int64_t> starts{0};

  [[nodiscard]] std::int64_t episodes() const noexcept { return static_cast<std::int64_t>(starts.size()) - 1; }
  [[nodiscard]] std::int64_t steps() const noexcept { return starts.back(); }
  [[nodiscard]] std::int64_t length(std::int64_t e) const { return starts.at(static_cast<std::size_t>(e + 1)) - starts.at(static_cast<std::size_t>(e)); }

  /// Whether observations are rows of bytes of parts (`layout`, `rows`).
  [[nodiscard]] bool byte_rows() const noexcept { return !layout.parts.empty(); }

  /// Appends one episode; the vectors hold T rows each (`o` float rows).
  void add_episode(const std::vector<float>& o, const std::vector<float>& a, const std::vector<float>& r,
                   const std::vector<std::uint8_t>& d) {
    if (byte_rows()) throw Error("Demonstrations: these observations are rows of parts (" + layout.describe() + "); add them with add_episode_rows");
    check_episode(static_cast<std::int64_t>(o.size()), a, r, d);
    obs.insert(obs.end(), o.begin(), o.end());
    append(a, r, d);
  }
  /// Appends one episode whose observations are rows of parts (`layout`; `o` holds T rows
  /// of layout.row_bytes() bytes).
  void add_episode_rows(const std::vector<std::uint8_t>& o, const std::vector<float>& a, const std::vector<float>& r,
                        const std::vector<std::uint8_t>& d) {
    if (!byte_rows()) throw Error("Demonstrations: set layout before adding rows of parts");
    obs_dim = layout.row_bytes();
    check_episode(static_cast<std::int64_t>(o.size()), a, r, d);
    rows.insert(rows.end(), o.begin(), o.end());
    append(a, r, d);
  }

 private:
  void check_episode(std::int64_t obs_size, const std::vector<float>& a, const std::vector<float>& r, const std::vector<std::uint8_t>& d) const {
    const auto t = static_cast<std::int64_t>(r.size());
    if (obs_dim <= 0 || act_dim <= 0) throw Error("Demonstrations: set obs_dim and act_dim before adding episodes");
    if (obs_size != t * obs_dim || static_cast<std::int64_t>(a.size()) != t * act_dim || static_cast<std::int64_t>(d.size()) != t)
      throw Error("Demonstrations: episode " + std::to_string(episodes()) + ": observations, actions, rewards and dones disagree on its length");
  }
  void append(const std::vector<float>& a, const std::vector<float>& r, const std::vector<std::uint8_t>& d) {
    const auto t = static_cast<std::int64_t>(r.size());
    actions.insert(actions.end(), a.begin(), a.end());
    rewards.insert(rewards.end(), r.begin(), r.end());
    dones.insert(dones.end(), d.begin(), d.end());
    starts.push_back(steps() + t);
  }
};

}  // namespace anvil
