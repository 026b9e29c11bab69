#pragma once
/// @file
/// Image augmentation for learning from pixels, as the papers do it:
///
///  - `random_shift` (DrQ: Kostrikov, Yarats, Fergus 2020, "Image Augmentation Is All You
///    Need", section 3.1): each image padded by `pad` pixels on every side, repeating its
///    border pixels, then cropped back to its size at a random offset, i.e. shifted by up to
///    +-pad pixels (4 at 84x84). SAC from pixels applies it to the observations and the next
///    observations of every sampled batch, independently.
///  - `random_crop` / `center_crop` (Diffusion Policy, Chi et al. 2023, section IV-B, after
///    robomimic): a random crop of a fixed size when training (84x84 of Push-T's 96x96, 76x76
///    of an 84x84 camera), the center crop of that size when acting.
///
/// Both take uint8 or float batches [B, C, H, W] and give the same dtype, so pixels can be
/// shifted as bytes before they are converted. The offsets come from `generator` (the run's
/// seeded one; a CPU generator, also for images on a GPU), else the global CPU generator.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include <anvil/core/error.hpp>

namespace anvil::nn {

namespace detail {
/// Windows of `h` x `w` of `images` [B, C, H, W] at per-sample offsets `top`, `left` [B] (int64).
/// On the CPU one strided copy per image (memory speed: 128 frames of 9x84x84 in about a
/// millisecond); on a GPU one gather for the whole batch (one kernel, not B).
inline at::Tensor windows(const at::Tensor& images, const at::Tensor& top, const at::Tensor& left, std::int64_t h, std::int64_t w) {
  const auto b = images.size(0);
  if (images.is_cpu()) {
    auto out = at::empty({b, images.size(1), h, w}, images.options());
    const auto t = top.accessor<std::int64_t, 1>(), l = left.accessor<std::int64_t, 1>();
    for (std::int64_t i = 0; i < b; ++i) out[i].copy_(images[i].narrow(1, t[i], h).narrow(2, l[i], w));
    return out;
  }
  const auto o = top.options();
  const auto rows = (top.unsqueeze(1) + at::arange(h, o)).view({b, h, 1});   // [B, h, 1]
  const auto cols = (left.unsqueeze(1) + at::arange(w, o)).view({b, 1, w});  // [B, 1, w]
  const auto batch = at::arange(b, o).view({b, 1, 1});
  // [B, H, W, C] indexed by (batch, rows, cols) -> [B, h, w, C] -> [B, C, h, w].
  return images.permute({0, 2, 3, 1}).index({batch, rows, cols}).permute({0, 3, 1, 2}).contiguous();
}

inline void check_images(const at::Tensor& images, const char* who) {
  if (images.dim() != 4)
    throw Error(std::string(who) + ": expects images [B, C, H, W], got " + std::to_string(images.dim()) + " dimensions");
}
}  // namespace detail

/// DrQ's random shift (see file comment): [B, C, H, W] -> [B, C, H, W], each image moved by
/// up to +-`pad` pixels in each direction, its border repeated into the gap.
inline at::Tensor random_shift(const at::Tensor& images, std::int64_t pad, c10::optional<at::Generator> generator = c10::nullopt) {
  detail::check_images(images, "random_shift");
  if (pad < 0) throw ConfigError("random_shift: the pad must be 0 or more pixels (got " + std::to_string(pad) + ")");
  if (pad == 0) return images;
  const auto b = images.size(0), h = images.size(2), w = images.size(3);
  const auto o = images.options().dtype(at::kLong).device(at::kCPU);
  const auto top = at::randint(2 * pad + 1, {b}, generator, o);
  const auto left = at::randint(2 * pad + 1, {b}, generator, o);
  if (images.is_cpu()) {
    // Each image moved by (top - pad, left - pad) with a few strided copies: the part that
    // stays in view, then its edge columns and rows repeated into the gap (columns first,
    // so the corners take the corner pixel), with no padded copy of the batch.
    auto out = at::empty_like(images, at::MemoryFormat::Contiguous);
    const auto t = top.accessor<std::int64_t, 1>(), l = left.accessor<std::int64_t, 1>();
    for (std::int64_t i = 0; i < b; ++i) {
      const std::int64_t dy = t[i] - pad, dx = l[i] - pad;
      const std::int64_t r0 = std::max<std::int64_t>(0, -dy), r1 = std::min(h, h - dy);
      const std::int64_t c0 = std::max<std::int64_t>(0, -dx), c1 = std::min(w, w - dx);
      auto o_i = out[i];
      o_i.narrow(1, r0, r1 - r0).narrow(2, c0, c1 - c0).copy_(images[i].narrow(1, r0 + dy, r1 - r0).narrow(2, c0 + dx, c1 - c0));
      auto band = o_i.narrow(1, r0, r1 - r0);
      if (c0 > 0) band.narrow(2, 0, c0).copy_(band.narrow(2, c0, 1).expand({-1, -1, c0}));
      if (c1 < w) band.narrow(2, c1, w - c1).copy_(band.narrow(2, c1 - 1, 1).expand({-1, -1, w - c1}));
      if (r0 > 0) o_i.narrow(1, 0, r0).copy_(o_i.narrow(1, r0, 1).expand({-1, r0, -1}));
      if (r1 < h) o_i.narrow(1, r1, h - r1).copy_(o_i.narrow(1, r1 - 1, 1).expand({-1, h - r1, -1}));
    }
    return out;
  }
  // On a GPU: the border-repeated padding by one gather of rows and one of columns, then the
  // windows in one more.
  const auto rows = at::arange(-pad, h + pad, images.options().dtype(at::kLong)).clamp(0, h - 1);
  const auto cols = at::arange(-pad, w + pad, images.options().dtype(at::kLong)).clamp(0, w - 1);
  const auto padded = images.index_select(2, rows).index_select(3, cols);
  return detail::windows(padded, top.to(images.device()), left.to(images.device()), h, w);
}

/// A random `height` x `width` crop of each image (Diffusion Policy's training augmentation).
inline at::Tensor random_crop(const at::Tensor& images, std::int64_t height, std::int64_t width,
                              c10::optional<at::Generator> generator = c10::nullopt) {
  detail::check_images(images, "random_crop");
  const auto h = images.size(2), w = images.size(3);
  if (height < 1 || width < 1 || height > h || width > w)
    throw ConfigError("random_crop: a " + std::to_string(height) + "x" + std::to_string(width) + " crop of " + std::to_string(h) +
                      "x" + std::to_string(w) + " images");
  const auto o = images.options().dtype(at::kLong).device(at::kCPU);
  const auto b = images.size(0);
  const auto top = at::randint(h - height + 1, {b}, generator, o);
  const auto left = at::randint(w - width + 1, {b}, generator, o);
  return images.is_cpu() ? detail::windows(images, top, left, height, width)
                         : detail::windows(images, top.to(images.device()), left.to(images.device()), height, width);
}

/// The centred `height` x `width` crop (acting and evaluation, where training crops at random).
inline at::Tensor center_crop(const at::Tensor& images, std::int64_t height, std::int64_t width) {
  detail::check_images(images, "center_crop");
  const auto h = images.size(2), w = images.size(3);
  if (height < 1 || width < 1 || height > h || width > w)
    throw ConfigError("center_crop: a " + std::to_string(height) + "x" + std::to_string(width) + " crop of " + std::to_string(h) +
                      "x" + std::to_string(w) + " images");
  return images.narrow(2, (h - height) / 2, height).narrow(3, (w - width) / 2, width).contiguous();
}

}  // namespace anvil::nn
