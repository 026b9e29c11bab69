#pragma once
/// @file
/// `Unet1d`: the 1-D temporal U-Net denoiser of Diffusion Policy (Chi et al. 2023, section
/// III-B and its appendix): an action sequence [B, T, A] is convolved along time; every
/// residual block is conditioned by FiLM (Perez et al. 2018) on the diffusion step's
/// sinusoidal embedding and the observations, a per-channel scale and bias predicted from
/// them. The structure follows the paper's description:
///
///  - step embedding: sinusoidal (dim d) -> Linear(d, 4d) -> Mish -> Linear(4d, d); the
///    condition is [embedding, observation features];
///  - a residual block: Conv1d(k) -> GroupNorm -> Mish, FiLM (scale * h + bias, from
///    Mish -> Linear(cond, 2 C)), Conv1d(k) -> GroupNorm -> Mish, plus the input through a 1x1
///    convolution when the widths differ;
///  - down path: per level two residual blocks, then a stride-2 convolution (not after the
///    last level); middle: two residual blocks at the last width; up path: per level the skip
///    concatenated, two residual blocks, then a stride-2 transposed convolution (not after
///    the last); out: Conv1d(k) block and a 1x1 convolution to A channels.
///
/// The sequence length must be divisible by 2^(levels - 1) (16 with three levels).

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <anvil/core/error.hpp>

namespace anvil::nn {

/// Sinusoidal embedding of (possibly fractional) steps `k` [B] into `dim` features (half
/// sines, half cosines, frequencies 10000^(-i / (dim/2 - 1))).
inline at::Tensor sinusoidal_embedding(const at::Tensor& k, std::int64_t dim) {
  const std::int64_t half = dim / 2;
  const double scale = std::log(10000.0) / static_cast<double>(std::max<std::int64_t>(half - 1, 1));
  const auto freq = at::exp(at::arange(half, k.options().dtype(at::kFloat)) * -scale);
  const auto arg = k.to(at::kFloat).unsqueeze(-1) * freq.unsqueeze(0);
  return at::cat({arg.sin(), arg.cos()}, -1);
}

/// Mish, x tanh(softplus(x)) (Misra 2019); in float32 on the CPU for reduced dtypes, which
/// LibTorch 1.13's CPU kernel does not take.
inline at::Tensor mish_activation(const at::Tensor& x) {
  if (x.is_cpu() && x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) return at::mish(x.to(at::kFloat)).to(x.scalar_type());
  return at::mish(x);
}

/// Conv1d(k, same padding) -> GroupNorm -> Mish.
class ConvBlock1dImpl : public torch::nn::Cloneable<ConvBlock1dImpl> {
 public:
  ConvBlock1dImpl(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t groups)
      : in_(in), out_(out), kernel_(kernel), groups_(groups) {
    reset();
  }
  void reset() override {
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(in_, out_, kernel_).padding(kernel_ / 2)));
    norm = register_module("norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups_, out_)));
  }
  /// Under autocast the convolution runs in the reduced dtype and the normalisation in
  /// float32 (its statistics need it, and LibTorch 1.13's CPU GroupNorm takes one dtype).
  at::Tensor forward(const at::Tensor& x) {
    const auto h = conv->forward(x);
    return mish_activation(norm->forward(h.scalar_type() == at::kFloat || h.scalar_type() == at::kDouble ? h : h.to(at::kFloat)));
  }
  torch::nn::Conv1d conv{nullptr};
  torch::nn::GroupNorm norm{nullptr};

 private:
  std::int64_t in_, out_, kernel_, groups_;
};
TORCH_MODULE(ConvBlock1d);

/// A residual block with FiLM conditioning (see file comment).
class FilmResBlockImpl : public torch::nn::Cloneable<FilmResBlockImpl> {
 public:
  FilmResBlockImpl(std::int64_t in, std::int64_t out, std::int64_t cond, std::int64_t kernel, std::int64_t groups)
      : in_(in), out_(out), cond_(cond), kernel_(kernel), groups_(groups) {
    reset();
  }
  void reset() override {
    block0 = register_module("block0", ConvBlock1d(in_, out_, kernel_, groups_));
    block1 = register_module("block1", ConvBlock1d(out_, out_, kernel_, groups_));
    film = register_module("film", torch::nn::Linear(cond_, 2 * out_));
    if (in_ != out_) residual = register_module("residual", torch::nn::Conv1d(torch::nn::Conv1dOptions(in_, out_, 1)));
  }
  /// x [B, in, T], cond [B, cond] -> [B, out, T].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cond) {
    auto h = block0->forward(x);
    const auto sb = film->forward(mish_activation(cond)).view({-1, 2, out_, 1});
    h = sb.select(1, 0) * h + sb.select(1, 1);
    h = block1->forward(h);
    return h + (residual ? residual->forward(x) : x);
  }
  ConvBlock1d block0{nullptr}, block1{nullptr};
  torch::nn::Linear film{nullptr};
  torch::nn::Conv1d residual{nullptr};

 private:
  std::int64_t in_, out_, cond_, kernel_, groups_;
};
TORCH_MODULE(FilmResBlock);

/// The U-Net denoiser (see file comment): `forward(x [B, T, A], k [B], obs_features [B, F])`
/// returns [B, T, A].
class Unet1dImpl : public torch::nn::Cloneable<Unet1dImpl> {
 public:
  struct Options {
    std::int64_t action_dim = 2;
    std::int64_t cond_dim = 0;            ///< observation features (obs horizon x obs dim)
    std::vector<std::int64_t> widths{256, 512, 1024};
    std::int64_t step_embed = 256;
    std::int64_t kernel = 5;
    std::int64_t groups = 8;
  };

  explicit Unet1dImpl(Options o) : o_(std::move(o)) {
    if (o_.widths.empty()) throw ConfigError("Unet1d: needs at least one level width");
    for (auto w : o_.widths)
      if (w % o_.groups != 0)
        throw ConfigError("Unet1d: width " + std::to_string(w) + " is not a multiple of the " + std::to_string(o_.groups) + " norm groups");
    reset();
  }

  void reset() override {
    const auto d = o_.step_embed;
    step0 = register_module("step0", torch::nn::Linear(d, 4 * d));
    step1 = register_module("step1", torch::nn::Linear(4 * d, d));
    const auto cond = d + o_.cond_dim;
    down = register_module("down", torch::nn::ModuleList());
    up = register_module("up", torch::nn::ModuleList());
    mid = register_module("mid", torch::nn::ModuleList());
    down_res.clear(), up_res.clear(), mid_res.clear(), downsample.clear(), upsample.clear();
    const auto& w = o_.widths;
    const std::size_t levels = w.size();
    std::int64_t in = o_.action_dim;
    for (std::size_t i = 0; i < levels; ++i) {
      down_res.push_back(FilmResBlock(in, w[i], cond, o_.kernel, o_.groups));
      down_res.push_back(FilmResBlock(w[i], w[i], cond, o_.kernel, o_.groups));
      down->push_back(down_res[down_res.size() - 2]);
      down->push_back(down_res.back());
      if (i + 1 < levels) {
        downsample.push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(w[i], w[i], 3).stride(2).padding(1)));
        down->push_back(downsample.back());
      }
      in = w[i];
    }
    for (int i = 0; i < 2; ++i) {
      mid_res.push_back(FilmResBlock(w.back(), w.back(), cond, o_.kernel, o_.groups));
      mid->push_back(mid_res.back());
    }
    for (std::size_t j = levels - 1; j >= 1; --j) {
      // From level j's width (with level j's skip) back to level j - 1's.
      up_res.push_back(FilmResBlock(2 * w[j], w[j - 1], cond, o_.kernel, o_.groups));
      up_res.push_back(FilmResBlock(w[j - 1], w[j - 1], cond, o_.kernel, o_.groups));
      up->push_back(up_res[up_res.size() - 2]);
      up->push_back(up_res.back());
      upsample.push_back(torch::nn::ConvTranspose1d(torch::nn::ConvTranspose1dOptions(w[j - 1], w[j - 1], 4).stride(2).padding(1)));
      up->push_back(upsample.back());
    }
    out_block = register_module("out_block", ConvBlock1d(w.front(), w.front(), o_.kernel, o_.groups));
    out_conv = register_module("out_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(w.front(), o_.action_dim, 1)));
  }

  /// Noise (or actions) predicted for the noisy sequence `x` [B, T, A] at steps `k` [B]
  /// given observation features `obs` [B, cond_dim] (undefined when cond_dim is 0).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& k, const at::Tensor& obs) {
    const std::int64_t t = x.size(1);
    const std::int64_t stride = std::int64_t{1} << (o_.widths.size() - 1);
    if (t % stride != 0)
      throw ConfigError("Unet1d: a sequence of " + std::to_string(t) + " steps; with " + std::to_string(o_.widths.size()) +
                        " levels it must be a multiple of " + std::to_string(stride));
    auto e = step1->forward(mish_activation(step0->forward(sinusoidal_embedding(k, o_.step_embed).to(x.dtype()))));
    const auto cond = o_.cond_dim > 0 ? at::cat({e, obs.to(e.dtype())}, -1) : e;
    auto h = x.transpose(1, 2);  // [B, A, T]
    std::vector<at::Tensor> skips;
    const std::size_t levels = o_.widths.size();
    for (std::size_t i = 0; i < levels; ++i) {
      h = down_res[2 * i]->forward(h, cond);
      h = down_res[2 * i + 1]->forward(h, cond);
      skips.push_back(h);
      if (i + 1 < levels) h = downsample[i]->forward(h);
    }
    for (auto& m : mid_res) h = m->forward(h, cond);
    for (std::size_t u = 0; u + 1 < levels; ++u) {
      h = at::cat({h, skips[levels - 1 - u]}, 1);
      h = up_res[2 * u]->forward(h, cond);
      h = up_res[2 * u + 1]->forward(h, cond);
      h = upsample[u]->forward(h);
    }
    h = out_conv->forward(out_block->forward(h));
    return h.transpose(1, 2);
  }

  [[nodiscard]] const Options& options() const noexcept { return o_; }

  torch::nn::Linear step0{nullptr}, step1{nullptr};
  torch::nn::ModuleList down{nullptr}, up{nullptr}, mid{nullptr};
  std::vector<FilmResBlock> down_res, up_res, mid_res;
  std::vector<torch::nn::Conv1d> downsample;
  std::vector<torch::nn::ConvTranspose1d> upsample;
  ConvBlock1d out_block{nullptr};
  torch::nn::Conv1d out_conv{nullptr};

 private:
  Options o_;
};
TORCH_MODULE(Unet1d);

}  // namespace anvil::nn
