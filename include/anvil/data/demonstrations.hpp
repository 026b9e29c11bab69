#pragma once
/// @file
/// Demonstrations on disk in robomimic's HDF5 layout (Mandlekar et al. 2021, "What Matters in
/// Learning from Offline Human Demonstrations for Robot Manipulation"; the layout of its
/// dataset files, which LIBERO's files share), so that anvil's recordings open in Python
/// tools and a user's own robomimic or LIBERO files train the same way (needs `anvil::hdf5`):
///
///     data                      group; attributes total (int: steps in all demos) and
///                               env_args (JSON string: {"env_name": ..., "type": ..., "env_kwargs": {}})
///     data/demo_<k>             group per demonstration, k = 0, 1, ...; attribute num_samples
///     data/demo_<k>/obs/<key>   float32 [T, d_key] per observation part (or [T]), or
///                               uint8 [T, H, W, C] camera frames (agentview_rgb, ...)
///     data/demo_<k>/actions     float32 [T, A]
///     data/demo_<k>/rewards     float32 [T]        (optional when reading: zeros)
///     data/demo_<k>/dones       int64 [T]          (optional when reading: 1 at the end)
///
/// On reading, the observation is the chosen keys' parts side by side (all keys of the
/// first demo in name order when none are chosen); `obs` may also be one [T, d] dataset.
/// Without images the observations are float rows; with images, rows of parts (images
/// channels first, resized when asked, beside the float parts: data/demo_reader.hpp), read
/// by as many threads as asked. Images are written gzip-compressed, one frame per chunk.
/// Every shape, count and attribute is checked, and a file that does not fit is refused
/// with an Error that names the file and the dataset or attribute at fault. Light header: no
/// torch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/data/demo_reader.hpp>
#include <anvil/data/demonstration_set.hpp>
#include <anvil/data/frames.hpp>
#include <anvil/data/hdf5.hpp>

namespace anvil {

/// How `write_demonstrations` stores images: gzip `level` 1..9 in chunks of one frame (0:
/// raw and contiguous).
struct DemoWriteOptions {
  int image_gzip = 4;
};

/// Writes `demos` to `path` in robomimic's layout, atomically. Images (a `layout` with
/// image parts) are written [T, H, W, C], as robomimic and LIBERO store camera frames.
inline void write_demonstrations(const std::filesystem::path& path, const Demonstrations& demos, DemoWriteOptions o = {}) {
  auto parts = demos.obs_parts;
  if (!demos.byte_rows() && parts.empty()) parts = {{"low_dim", demos.obs_dim}};
  std::int64_t width = 0;
  for (const auto& [key, d] : parts) width += d;
  if (!demos.byte_rows() && width != demos.obs_dim)
    throw Error(path.string() + ": the observation parts' widths sum to " + std::to_string(width) + ", not obs_dim " + std::to_string(demos.obs_dim));
  if (demos.byte_rows() && demos.obs_dim != demos.layout.row_bytes())
    throw Error(path.string() + ": rows of parts (" + demos.layout.describe() + ") are " + std::to_string(demos.layout.row_bytes()) +
                " bytes, not obs_dim " + std::to_string(demos.obs_dim));
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
    if (demos.byte_rows()) {
      const std::int64_t rb = demos.obs_dim;
      for (const auto& part : demos.layout.parts) {
        const std::string ds = g + "/obs/" + part.name;
        if (part.image()) {
          const auto c = part.shape[0], h = part.shape[1], wd = part.shape[2];
          std::vector<std::uint8_t> v(static_cast<std::size_t>(t * part.numel()));
          for (std::int64_t i = 0; i < t; ++i)
            frame_to_hwc(demos.rows.data() + (t0 + i) * rb + part.offset, static_cast<int>(c), static_cast<int>(h), static_cast<int>(wd),
                         v.data() + i * part.numel());
          if (o.image_gzip > 0) w.compressed_dataset(ds, {t, h, wd, c}, v, 1, o.image_gzip);
          else w.dataset(ds, {t, h, wd, c}, v);
        } else if (part.dtype == PartDtype::float32) {
          std::vector<float> v(static_cast<std::size_t>(t * part.numel()));
          for (std::int64_t i = 0; i < t; ++i)
            std::memcpy(v.data() + i * part.numel(), demos.rows.data() + (t0 + i) * rb + part.offset, static_cast<std::size_t>(part.bytes()));
          w.dataset(ds, {t, part.numel()}, v);
        } else {
          throw Error(path.string() + ": part '" + part.name + "' is bytes but not an image [C, H, W]; demonstrations store images and float numbers");
        }
      }
    } else {
      std::int64_t col = 0;
      for (const auto& [key, d] : parts) {
        std::vector<float> v(static_cast<std::size_t>(t * d));
        for (std::int64_t i = 0; i < t; ++i)
          for (std::int64_t j = 0; j < d; ++j)
            v[static_cast<std::size_t>(i * d + j)] = demos.obs[static_cast<std::size_t>((t0 + i) * demos.obs_dim + col + j)];
        w.dataset(g + "/obs/" + key, {t, d}, v);
        col += d;
      }
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

/// Reads demonstrations in robomimic's layout (see file comment): the keys, image size and
/// threads of `o`.
[[nodiscard]] inline Demonstrations read_demonstrations(const std::filesystem::path& path, const DemoReadOptions& o) {
  const DemoReader reader(path, o);
  const h5::File& f = reader.file();
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
  for (std::size_t e = 0; e < reader.demos().size(); ++e) {
    const std::string g = "data/" + reader.demos()[e];
    const auto act = f.read<float>(g + "/actions");
    const std::int64_t t = act.rows();
    if (e == 0) demos.act_dim = act.row_size();
    else if (act.row_size() != demos.act_dim)
      f.fail(g + "/actions", "is " + std::to_string(act.row_size()) + " wide; earlier demos' actions are " + std::to_string(demos.act_dim));
    if (f.has_attribute(g, "num_samples")) {
      const auto n = f.int_attribute(g, "num_samples");
      if (n != t) f.fail(g + "@num_samples", "says " + std::to_string(n) + " but the demo has " + std::to_string(t) + " steps");
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
    for (float v : act.values)
      if (!std::isfinite(v)) f.fail(g + "/actions", "holds a non-finite value");
    demos.actions.insert(demos.actions.end(), act.values.begin(), act.values.end());
    demos.rewards.insert(demos.rewards.end(), rewards.begin(), rewards.end());
    demos.dones.insert(demos.dones.end(), dones.begin(), dones.end());
  }
  demos.starts = reader.starts();
  auto rows = reader.read_all(o.threads);
  if (reader.layout().has_images()) {
    demos.layout = reader.layout();
    demos.obs_dim = reader.row_bytes();
    demos.rows = std::move(rows);
  } else {
    // Float parts only: the row is their numbers side by side.
    demos.obs_dim = reader.row_bytes() / 4;
    for (const auto& p : reader.layout().parts) demos.obs_parts.emplace_back(p.name, p.numel());
    demos.obs.resize(rows.size() / 4);
    std::memcpy(demos.obs.data(), rows.data(), rows.size());
  }
  if (f.has_attribute("data", "total")) {
    const auto total = f.int_attribute("data", "total");
    if (total != demos.steps())
      f.fail("data@total", "says " + std::to_string(total) + " steps but the demos hold " + std::to_string(demos.steps()));
  }
  return demos;
}

/// Reads demonstrations in robomimic's layout; `obs_keys` picks and orders the observation
/// parts (empty: all, by name).
[[nodiscard]] inline Demonstrations read_demonstrations(const std::filesystem::path& path, std::vector<std::string> obs_keys = {}) {
  return read_demonstrations(path, DemoReadOptions{std::move(obs_keys)});
}

}  // namespace anvil
