#pragma once
/// @file
/// `ObsEncoder`: reads observations that are rows of parts (`EnvSpec::layout`: images, or
/// images beside numbers) into float features for a policy's or a critic's MLP. Each image
/// part goes through its own convolutional encoder (nn/image_encoders.hpp: the small
/// GroupNorm/spatial-softmax one, or DQN's), which converts the bytes to floats where the
/// row is (the images cross to a GPU as bytes); each float part is read in place from the
/// row's bytes; the features are concatenated in the parts' order.
///
/// `augment_images` applies an image augmentation to each image part of a batch of rows,
/// leaving the other parts as they are; `shift_images` is DrQ's random shift of them, which
/// SAC applies to the sampled obs and next_obs (and PPO, with `ppo.encoder.shift`, to its
/// minibatches).

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/nn/image_augment.hpp>
#include <anvil/nn/image_encoders.hpp>
#include <anvil/nn/network_config.hpp>

namespace anvil::nn {

namespace detail {
/// Part `p` of a batch of rows `rows` [B, row_bytes] (uint8): an image as a [B, C, H, W]
/// uint8 view, a float part as a [B, n] float32 view of the same bytes.
inline at::Tensor part_of(const at::Tensor& rows, const ObsPart& p) {
  const auto b = rows.size(0);
  const auto bytes = rows.narrow(1, p.offset, p.bytes());
  if (p.dtype == PartDtype::float32) return bytes.view(at::kFloat);
  std::vector<std::int64_t> shape{b};
  shape.insert(shape.end(), p.shape.begin(), p.shape.end());
  return bytes.view(shape);
}
inline void check_rows(const at::Tensor& rows, const ObsLayout& layout, const char* who) {
  if (rows.scalar_type() != at::kByte || rows.dim() != 2 || rows.size(1) != layout.row_bytes())
    throw Error(std::string(who) + ": expects rows of parts, uint8 [B, " + std::to_string(layout.row_bytes()) + "] (" +
                layout.describe() + "); got " + std::string(rows.dtype().name()) + " with " + std::to_string(rows.dim()) +
                " dimensions" + (rows.dim() == 2 ? " of width " + std::to_string(rows.size(1)) : std::string()));
}
}  // namespace detail

/// Rows of parts -> [B, output_size()] float features (see file comment). A network that
/// holds one (nn::TwinQ, nn::GaussianActor) encodes what comes as rows of bytes and takes
/// what comes as floats for features already encoded, so an update encodes a batch once
/// and hands the features to every part that reads it (SAC).
class ObsEncoderImpl : public torch::nn::Cloneable<ObsEncoderImpl> {
 public:
  /// `width`: the small encoder's (SmallCnn's) channels.
  ObsEncoderImpl(ObsLayout layout, EncoderKind kind, std::int64_t features, std::int64_t width = 32)
      : layout_(std::move(layout)), kind_(kind), features_(features), width_(width) {
    if (!layout_.has_images())
      throw ConfigError("ObsEncoder: the observation (" + layout_.describe() + ") has no image part to encode");
    reset();
  }
  ObsEncoderImpl(ObsLayout layout, const ObsEncoderConfig& cfg)
      : ObsEncoderImpl(std::move(layout), *cfg.kind, *cfg.features, *cfg.width) {}

  void reset() override {
    // Direct children, one per image part (see SmallCnn on why not a ModuleList).
    small_.clear(), nature_.clear();
    for (const auto& p : layout_.parts) {
      if (!p.image()) continue;
      const ImageShape in{p.shape[0], p.shape[1], p.shape[2]};
      if (kind_ == EncoderKind::small) {
        SmallCnnImpl::Options o;
        o.features = features_;
        o.width = width_;
        small_.push_back(register_module(p.name, SmallCnn(in, o)));
      } else {
        nature_.push_back(register_module(p.name, NatureCnn(in, features_)));
      }
    }
  }

  /// [B, row_bytes] uint8 rows -> [B, output_size()] float32 features.
  at::Tensor forward(const at::Tensor& rows) {
    detail::check_rows(rows, layout_, "ObsEncoder");
    std::vector<at::Tensor> out;
    std::size_t k = 0;
    for (const auto& p : layout_.parts) {
      const auto x = detail::part_of(rows, p);
      if (!p.image()) out.push_back(x.to(at::kFloat));
      else out.push_back(kind_ == EncoderKind::small ? small_[k++]->forward(x) : nature_[k++]->forward(x));
    }
    return out.size() == 1 ? out.front() : at::cat(out, 1);
  }

  /// Features per observation: `features` per image part plus the float parts' numbers.
  [[nodiscard]] std::int64_t output_size() const noexcept {
    std::int64_t n = 0;
    for (const auto& p : layout_.parts) n += p.image() ? features_ : p.dtype == PartDtype::float32 ? p.numel() : 0;
    return n;
  }
  [[nodiscard]] const ObsLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] EncoderKind kind() const noexcept { return kind_; }
  [[nodiscard]] std::int64_t features() const noexcept { return features_; }
  [[nodiscard]] std::int64_t width() const noexcept { return width_; }

 private:
  ObsLayout layout_;
  EncoderKind kind_;
  std::int64_t features_, width_;
  std::vector<SmallCnn> small_;
  std::vector<NatureCnn> nature_;
};
TORCH_MODULE(ObsEncoder);

/// `rows` [B, row_bytes] with each image part replaced by `f(images)` ([B, C, H, W] uint8 in,
/// the same shape out); the other parts as they were. A new tensor; `rows` is unchanged.
template <class F>
at::Tensor augment_images(const at::Tensor& rows, const ObsLayout& layout, F&& f) {
  detail::check_rows(rows, layout, "augment_images");
  auto out = rows.clone(at::MemoryFormat::Contiguous);
  for (const auto& p : layout.parts)
    if (p.image()) detail::part_of(out, p).copy_(f(detail::part_of(rows, p)));
  return out;
}

/// DrQ's random shift (nn/image_augment.hpp) of every image part of `rows`, each image on its
/// own, by up to `pad` pixels; `rows` itself when `pad` is 0.
inline at::Tensor shift_images(const at::Tensor& rows, const ObsLayout& layout, std::int64_t pad) {
  if (pad == 0) return rows;
  return augment_images(rows, layout, [pad](const at::Tensor& images) { return random_shift(images, pad); });
}

}  // namespace anvil::nn
