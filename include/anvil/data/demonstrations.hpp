#pragma once
/// @file
/// Demonstrations on disk in robomimic's HDF5 layout (Mandlekar et al. 2021, "What Matters in
/// Learning from Offline Human Demonstrations for Robot Manipulation"; the layout of its
/// dataset files), so that anvil's recordings open in Python tools and a user's own robomimic
/// files train the same way (needs `anvil::hdf5`):
///
///     data                      group; attributes total (int: steps in all demos) and
///                               env_args (JSON string: {"env_name": ..., "type": ..., "env_kwargs": {}})
///     data/demo_<k>             group per demonstration, k = 0, 1, ...; attribute num_samples
///     data/demo_<k>/obs/<key>   float32 [T, d_key] per observation part (or [T])
///     data/demo_<k>/actions     float32 [T, A]
///     data/demo_<k>/rewards     float32 [T]        (optional when reading: zeros)
///     data/demo_<k>/dones       int64 [T]          (optional when reading: 1 at the end)
///
/// On reading, the observation is the chosen keys' parts side by side (all keys of the
/// first demo in name order when none are chosen); `obs` may also be one [T, d] dataset.
/// Every shape, count and attribute is checked, and a file that does not fit is refused
/// with an Error that names the file and the dataset or attribute at fault. Light header: no
/// torch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/data/demonstration_set.hpp>
#include <anvil/data/hdf5.hpp>

namespace anvil {

/// Writes `demos` to `path` in robomimic's layout, atomically.
inline void write_demonstrations(const std::filesystem::path& path, const Demonstrations& demos) {
  auto parts = demos.obs_parts;
  if (parts.empty()) parts = {{"low_dim", demos.obs_dim}};
  std::int64_t width = 0;
  for (const auto& [key, d] : parts) width += d;
  if (width != demos.obs_dim)
    throw Error(path.string() + ": the observation parts' widths sum to " + std::to_string(width) + ", not obs_dim " + std::to_string(demos.obs_dim));
  h5::H5Writer w(path);
  w.group("data");
  w.attribute("data", "total", demos.steps());
  w.attribute("data", "env_args", "{\"env_name\": \"" + demos.env_name + "\", \"type\": 0, \"env_kwargs\": {}}");
  for (std::int64_t e = 0; e < demos.episodes(); ++e) {
    const std::string g = "data/demo_" + std::to_string(e);
    const auto t0 = demos.starts[static_cast<std::size_t>(e)], t = demos.length(e);
    w.group(g);
    w.attribute(g, "num_samples", t);
    w.group(g + "/obs");
    std::int64_t col = 0;
    for (const auto& [key, d] : parts) {
      std::vector<float> v(static_cast<std::size_t>(t * d));
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < d; ++j)
          v[static_cast<std::size_t>(i * d + j)] = demos.obs[static_cast<std::size_t>((t0 + i) * demos.obs_dim + col + j)];
      w.dataset(g + "/obs/" + key, {t, d}, v);
      col += d;
    }
    const auto a0 = demos.actions.begin() + t0 * demos.act_dim;
    w.dataset(g + "/actions", {t, demos.act_dim}, std::vector<float>(a0, a0 + t * demos.act_dim));
    const auto r0 = demos.rewards.begin() + t0;
    w.dataset(g + "/rewards", {t}, std::vector<float>(r0, r0 + t));
    std::vector<std::int64_t> dn(static_cast<std::size_t>(t));
    for (std::int64_t i = 0; i < t; ++i) dn[static_cast<std::size_t>(i)] = demos.dones[static_cast<std::size_t>(t0 + i)];
    w.dataset(g + "/dones", {t}, dn);
  }
  w.commit();
}

namespace detail {
/// demo_<k> names in numeric order (HDF5 lists them by name: demo_10 before demo_2).
inline std::vector<std::string> demo_names(const h5::File& f) {
  std::vector<std::pair<std::int64_t, std::string>> k;
  for (auto& n : f.children("data")) {
    if (n.rfind("demo_", 0) != 0) continue;
    try {
      std::size_t used = 0;
      const auto i = std::stoll(n.substr(5), &used);
      if (used == n.size() - 5) k.emplace_back(i, n);
    } catch (const std::exception&) {
    }
  }
  std::sort(k.begin(), k.end());
  std::vector<std::string> out;
  for (auto& [i, n] : k) out.push_back(n);
  return out;
}
}  // namespace detail

/// Reads demonstrations in robomimic's layout (see file comment); `obs_keys` picks and
/// orders the observation parts (empty: all, by name).
[[nodiscard]] inline Demonstrations read_demonstrations(const std::filesystem::path& path, std::vector<std::string> obs_keys = {}) {
  const auto f = h5::File::open(path);
  if (!f.is_group("data")) f.fail("data", "missing: not a demonstration file in robomimic's layout (no group 'data')");
  Demonstrations demos;
  if (f.has_attribute("data", "env_args")) {
    const std::string args = f.string_attribute("data", "env_args");
    const auto k = args.find("\"env_name\"");
    if (k != std::string::npos) {
      const auto a = args.find('"', args.find(':', k) + 1);
      const auto b = a == std::string::npos ? a : args.find('"', a + 1);
      if (b != std::string::npos) demos.env_name = args.substr(a + 1, b - a - 1);
    }
  }
  const auto names = detail::demo_names(f);
  if (names.empty()) f.fail("data", "holds no demo_<k> groups");
  for (const auto& name : names) {
    const std::string g = "data/" + name;
    // The observation: one dataset, or a group of parts.
    std::vector<std::pair<std::string, h5::Array<float>>> parts;
    if (f.is_group(g + "/obs")) {
      if (obs_keys.empty()) obs_keys = f.children(g + "/obs");
      for (const auto& key : obs_keys) parts.emplace_back(key, f.read<float>(g + "/obs/" + key));
    } else {
      parts.emplace_back("", f.read<float>(g + "/obs"));
    }
    const auto act = f.read<float>(g + "/actions");
    const std::int64_t t = act.rows();
    if (act.shape.size() != 2) f.fail(g + "/actions", "has shape " + h5::shape_string(act.shape) + "; expected [T, action dims]");
    std::int64_t width = 0;
    std::vector<std::pair<std::string, std::int64_t>> layout;
    for (const auto& [key, a] : parts) {
      const std::string ds = g + "/obs" + (key.empty() ? "" : "/" + key);
      if (a.shape.empty() || a.shape.size() > 2) f.fail(ds, "has shape " + h5::shape_string(a.shape) + "; expected [T] or [T, d]");
      if (a.rows() != t)
        f.fail(ds, "has " + std::to_string(a.rows()) + " rows but " + g + "/actions has " + std::to_string(t));
      width += a.row_size();
      layout.emplace_back(key.empty() ? "obs" : key, a.row_size());
    }
    if (demos.episodes() == 0) {
      demos.obs_dim = width;
      demos.act_dim = act.row_size();
      demos.obs_parts = layout;
    } else if (width != demos.obs_dim) {
      f.fail(g + "/obs", "is " + std::to_string(width) + " wide; earlier demos' observations are " + std::to_string(demos.obs_dim));
    } else if (act.row_size() != demos.act_dim) {
      f.fail(g + "/actions", "is " + std::to_string(act.row_size()) + " wide; earlier demos' actions are " + std::to_string(demos.act_dim));
    }
    if (f.has_attribute(g, "num_samples")) {
      const auto n = f.int_attribute(g, "num_samples");
      if (n != t) f.fail(g + "@num_samples", "says " + std::to_string(n) + " but the demo has " + std::to_string(t) + " steps");
    }
    std::vector<float> obs(static_cast<std::size_t>(t * width));
    std::int64_t col = 0;
    for (const auto& [key, a] : parts) {
      const auto d = a.row_size();
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < d; ++j) obs[static_cast<std::size_t>(i * width + col + j)] = a.values[static_cast<std::size_t>(i * d + j)];
      col += d;
    }
    std::vector<float> rewards(static_cast<std::size_t>(t), 0.0f);
    if (f.exists(g + "/rewards")) {
      auto r = f.read<float>(g + "/rewards");
      if (r.rows() != t || r.row_size() != 1) f.fail(g + "/rewards", "has shape " + h5::shape_string(r.shape) + "; expected [" + std::to_string(t) + "]");
      rewards = std::move(r.values);
    }
    std::vector<std::uint8_t> dones(static_cast<std::size_t>(t), 0);
    if (t > 0) dones.back() = 1;
    if (f.exists(g + "/dones")) {
      auto d = f.read<std::uint8_t>(g + "/dones");
      if (d.rows() != t || d.row_size() != 1) f.fail(g + "/dones", "has shape " + h5::shape_string(d.shape) + "; expected [" + std::to_string(t) + "]");
      dones = std::move(d.values);
    }
    for (float v : obs)
      if (!std::isfinite(v)) f.fail(g + "/obs", "holds a non-finite value");
    for (float v : act.values)
      if (!std::isfinite(v)) f.fail(g + "/actions", "holds a non-finite value");
    demos.add_episode(obs, act.values, rewards, dones);
  }
  if (f.has_attribute("data", "total")) {
    const auto total = f.int_attribute("data", "total");
    if (total != demos.steps())
      f.fail("data@total", "says " + std::to_string(total) + " steps but the demos hold " + std::to_string(demos.steps()));
  }
  return demos;
}

}  // namespace anvil
