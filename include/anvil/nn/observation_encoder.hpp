#pragma once
/// @file
/// `ObsEncoder`: reads observations that are rows of parts (`EnvSpec::layout`: images, or
/// images beside numbers) into float features for a policy's or a critic's MLP. Each image
/// part goes through its own convolutional encoder (nn/image_encoders.hpp: the small
/// GroupNorm/spatial-softmax one, or DQN's; nn/resnet18_gn.hpp: Diffusion Policy's ResNet-18),
/// which converts the bytes to floats where the
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

#include <ATen/CPUGeneratorImpl.h>
#include <torch/utils.h>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/policy_tensors.hpp>
#include <anvil/core/tensor_io.hpp>
#include <anvil/core/spaces.hpp>
#include <anvil/nn/image_augment.hpp>
#include <anvil/nn/image_encoders.hpp>
#include <anvil/nn/network_config.hpp>
#include <anvil/nn/resnet18_gn.hpp>

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
    small_.clear(), nature_.clear(), resnet_.clear();
    for (const auto& p : layout_.parts) {
      if (!p.image()) continue;
      const ImageShape in{p.shape[0], p.shape[1], p.shape[2]};
      if (kind_ == EncoderKind::small) {
        SmallCnnImpl::Options o;
        o.features = features_;
        o.width = width_;
        small_.push_back(register_module(p.name, SmallCnn(in, o)));
      } else if (kind_ == EncoderKind::resnet18) {
        resnet_.push_back(register_module(p.name, ResNet18Gn(in, /*keypoints=*/32, features_)));
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
      else if (kind_ == EncoderKind::small) out.push_back(small_[k++]->forward(x));
      else if (kind_ == EncoderKind::resnet18) out.push_back(resnet_[k++]->forward(x));
      else out.push_back(nature_[k++]->forward(x));
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
  std::vector<ResNet18Gn> resnet_;
};
TORCH_MODULE(ObsEncoder);

/// Adds `encoder`'s parameters to a policy's tensors as `encoder.<part>.<name>` (detached
/// float32 copies on the CPU) and what rebuilds it to the metadata: `encoder` (small,
/// nature or resnet18), `encoder_features`, `encoder_width`, `layout` (`ObsLayout::describe()`: the
/// parts, in order, from which their offsets in a row follow). anvil.load_policy in Python
/// builds the same encoder from them (python/anvil/policy.py).
inline void add_encoder_tensors(PolicyTensors& p, const ObsEncoderImpl& encoder) {
  add_module_tensors(p, "encoder.", encoder);
  p.meta["encoder"] = std::string(enum_names(EncoderKind{})[static_cast<std::size_t>(encoder.kind())]);
  p.meta["encoder_features"] = std::to_string(encoder.features());
  p.meta["encoder_width"] = std::to_string(encoder.width());
  p.meta["layout"] = encoder.layout().describe();
}

/// An encoder's parameters side by side, one float32 vector on the CPU (policy files).
inline at::Tensor flat_parameters(const ObsEncoderImpl& encoder) {
  std::vector<at::Tensor> v;
  for (const auto& t : encoder.parameters()) v.push_back(t.detach().to(at::kCPU, at::kFloat).reshape(-1));
  return at::cat(v);
}

/// Writes `encoder` to a policy file: its observation's parts, kind, features and width, and
/// its parameters (`read_encoder` rebuilds it).
inline void save_encoder(BinaryWriter& w, const ObsEncoderImpl& encoder) {
  const auto& parts = encoder.layout().parts;
  w.value(static_cast<std::uint64_t>(parts.size()));
  for (const auto& p : parts) {
    w.string(p.name);
    w.value(static_cast<int>(p.dtype));
    w.value(static_cast<std::uint64_t>(p.shape.size()));
    for (auto d : p.shape) w.value(d);
  }
  w.value(static_cast<int>(encoder.kind()));
  w.value(encoder.features());
  w.value(encoder.width());
  write_tensor(w, flat_parameters(encoder), "the encoder's weights");
}

/// Reads what `save_encoder` wrote: every count and size checked before anything is built (a
/// flipped bit must not allocate gigabytes), the error naming the field; the new encoder's
/// random initial weights (overwritten) leave torch's CPU generator as it was.
inline ObsEncoder read_encoder(BinaryReader& r) {
  ObsLayout layout;
  const auto n = r.value<std::uint64_t>("observation part count");
  if (n < 1 || n > 64) r.fail("observation part count", "is out of range (1 to 64)");
  for (std::uint64_t i = 0; i < n; ++i) {
    auto name = r.string("observation part name");
    const int dtype = r.value<int>("observation part dtype");
    const auto rank = r.value<std::uint64_t>("observation part rank");
    if ((dtype != 0 && dtype != 1) || rank < 1 || rank > 3) r.fail("observation part '" + name + "'", "has an unknown dtype or rank");
    std::vector<std::int64_t> shape;
    for (std::uint64_t k = 0; k < rank; ++k) {
      shape.push_back(r.value<std::int64_t>("observation part shape"));
      if (shape.back() < 1 || shape.back() > 65536) r.fail("observation part '" + name + "'", "has a size out of range (1 to 65536)");
    }
    if (dtype == 1 && rank == 3) layout.image(std::move(name), shape[0], shape[1], shape[2]);
    else if (dtype == 0 && rank == 1) layout.vector(std::move(name), shape[0]);
    else r.fail("observation part '" + name + "'", "is neither an image [C, H, W] of bytes nor a vector of floats");
  }
  const int kind = r.value<int>("encoder kind");
  if (kind < 0 || kind > 2) r.fail("encoder kind", "is not small, nature or resnet18");
  const auto features = r.value<std::int64_t>("encoder features");
  const auto width = r.value<std::int64_t>("encoder width");
  if (features < 1 || features > 65536 || width < 1 || width > 4096) r.fail("encoder features or width", "is out of range");
  ObsEncoder e{nullptr};
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    const auto state = gen.get_state();
    e = ObsEncoder(layout, static_cast<EncoderKind>(kind), features, width);
    gen.set_state(state);
  }
  auto params = e->parameters();
  std::int64_t count = 0;
  for (const auto& t : params) count += t.numel();
  const auto flat = read_tensor(r, "encoder parameters", at::empty({count}));
  torch::NoGradGuard no_grad;
  std::int64_t off = 0;
  for (auto& t : params) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
  e->eval();
  return e;
}

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

/// `layout` with each image part cut to `size` x `size` pixels (Diffusion Policy's crop: 84 of
/// Push-T's 96); 0 leaves it as it is. A ConfigError naming `field` when an image is smaller.
inline ObsLayout cropped_layout(const ObsLayout& layout, std::int64_t size, const char* field = "crop") {
  if (size == 0) return layout;
  ObsLayout out;
  for (const auto& p : layout.parts) {
    if (!p.image()) {
      out.vector(p.name, p.numel());
      continue;
    }
    if (size > p.shape[1] || size > p.shape[2])
      throw ConfigError(std::string(field) + "=" + std::to_string(size) + ": larger than the image part '" + p.name + "' (" +
                        std::to_string(p.shape[1]) + "x" + std::to_string(p.shape[2]) + ")");
    out.image(p.name, p.shape[0], size, size);
  }
  return out;
}

/// `rows` of `layout` as rows of `to` (`cropped_layout` of it): each image part cropped, at a
/// random place per image when `random` (training), else the centre (acting); the float
/// parts copied. `rows` itself when nothing is cropped.
inline at::Tensor crop_images(const at::Tensor& rows, const ObsLayout& layout, const ObsLayout& to, bool random) {
  detail::check_rows(rows, layout, "crop_images");
  if (to.row_bytes() == layout.row_bytes()) return rows;
  auto out = at::empty({rows.size(0), to.row_bytes()}, rows.options());
  for (std::size_t i = 0; i < layout.parts.size(); ++i) {
    const auto& p = layout.parts[i];
    const auto& q = to.parts[i];
    const auto in = detail::part_of(rows, p);
    detail::part_of(out, q).copy_(!p.image() ? in : random ? random_crop(in, q.shape[1], q.shape[2]) : center_crop(in, q.shape[1], q.shape[2]));
  }
  return out;
}

}  // namespace anvil::nn
