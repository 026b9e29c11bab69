#pragma once
/// @file
/// Forward and backward passes of an `Mlp` written out by hand, for float32 on the CPU.
///
/// RL networks are small: a 64-wide MLP layer on a batch of 256 is a 16-microsecond matrix
/// product, while autograd spends about as long again per op on bookkeeping (graph nodes,
/// saved tensors, a fresh output allocation). `MlpTape` runs the same arithmetic as
/// `Mlp::forward` plus autograd (one `addmm` per layer, the activation in place) into
/// buffers it keeps between calls (the products straight through BLAS, the rest as plain loops),
/// and its backward computes exactly the gradients asked
/// for: weight gradients straight into the caller's buffers (e.g. views of a `FlatAdam`'s
/// flat gradient), the input gradient only when wanted. Algorithms use it as a fast path
/// for their default networks and keep autograd for everything else.

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <anvil/core/blas.hpp>
#include <anvil/core/kept_copy.hpp>
#include <anvil/core/simd.hpp>
#include <anvil/nn/activation.hpp>
#include <anvil/nn/mlp.hpp>

namespace anvil::nn {

/// Activations whose derivative `MlpTape` can take from the activation's output alone.
constexpr bool has_manual_backward(Activation a) noexcept {
  return a == Activation::relu || a == Activation::tanh || a == Activation::leaky_relu ||
         a == Activation::elu;
}

/// Why an algorithm's networks take autograd instead of its hand-written passes, or "" when
/// the passes run: `SECTION.manual_backward` off, a device other than the CPU, or the first
/// network a tape cannot run (`networks`: whose, and `MlpTape::unsupported`'s answer).
inline std::string why_autograd(bool manual_backward, const std::string& section, const c10::Device& device,
                                std::initializer_list<std::pair<std::string_view, std::string>> networks) {
  if (!manual_backward) return section + ".manual_backward=false";
  if (!device.is_cpu()) return "device " + device.str() + " (the hand-written passes are for the CPU)";
  for (const auto& [whose, why] : networks)
    if (!why.empty()) return std::string(whose) + " " + why;
  return {};
}

namespace detail {

// In-place activation of n floats (same definitions as `activate`).
inline void activate_inplace(float* x, std::int64_t n, Activation a) {
  switch (a) {
    case Activation::relu:
      return simd::relu(x, n);
    case Activation::leaky_relu:
      for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.01f * x[i];
      return;
    case Activation::tanh:
      return simd::tanh(x, n);
    case Activation::elu:
      for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : std::expm1(x[i]);
      return;
    default: return;  // not reached: callers check has_manual_backward
  }
}

// g *= activation'(pre-activation), with the derivative written in terms of the output y.
inline void activation_backward_inplace(float* g, const float* y, std::int64_t n, Activation a) {
  switch (a) {
    case Activation::relu:
      return simd::relu_backward(g, y, n);
    case Activation::leaky_relu:
      for (std::int64_t i = 0; i < n; ++i) g[i] = y[i] > 0.f ? g[i] : 0.01f * g[i];
      return;
    case Activation::tanh:
      for (std::int64_t i = 0; i < n; ++i) g[i] *= 1.f - y[i] * y[i];
      return;
    case Activation::elu:
      for (std::int64_t i = 0; i < n; ++i) g[i] = y[i] > 0.f ? g[i] : g[i] * (y[i] + 1.f);
      return;
    default: return;
  }
}

// Row-major C = alpha op(A) op(B) + beta C through LibTorch (`addmm_` on the buffers as
// they are): the products of a process where no BLAS library can be found (`blas::sgemm`
// is null, e.g. a LibTorch with its BLAS linked in privately).
inline void torch_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc) {
  const auto f = at::TensorOptions().dtype(at::kFloat);
  const auto A = at::from_blob(const_cast<float*>(a), {trans_a ? k : m, trans_a ? m : k}, {lda, 1}, f);
  const auto B = at::from_blob(const_cast<float*>(b), {trans_b ? n : k, trans_b ? k : n}, {ldb, 1}, f);
  auto C = at::from_blob(c, {m, n}, {ldc, 1}, f);
  C.addmm_(trans_a ? A.t() : A, trans_b ? B.t() : B, beta, alpha);  // beta 0: C's old values ignored
}

// The tapes' matrix products: anvil's AVX-512 products or BLAS directly (`blas::gemm`)
// when one applies, else LibTorch.
// Then `after`'s steps (simd::Epilogue: fused into anvil's product, passes after the others).
inline void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc, const simd::Epilogue& after = {}) {
  if (blas::sgemm() || blas::own_kernel_takes(m, n, k, after) ||
      blas::own_rows_kernel_takes(trans_a, trans_b, m, n, k, beta, after))
    return blas::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, after);
  torch_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (!after.empty()) simd::apply_epilogue(after, trans_a, m, n, k, a, lda, c, ldc);
}

// Which head each row of `x` [B, in] takes: the one positive number of its one-hot (a
// one-hot normalised per column keeps its 1 the only positive number), checked: a row with
// none or several is named.
inline void head_of_rows(const float* x, std::int64_t batch, std::int64_t in, const MlpHeads& heads,
                         std::vector<std::int64_t>& out) {
  out.resize(static_cast<std::size_t>(batch));
  for (std::int64_t i = 0; i < batch; ++i) {
    const float* h = x + i * in + heads.at;
    std::int64_t k = -1, ones = 0;
    for (std::int64_t j = 0; j < heads.count; ++j)
      if (h[j] > 0.f) k = j, ++ones;
    if (ones != 1)
      throw Error("Mlp with " + std::to_string(heads.count) + " heads: input row " + std::to_string(i) + "'s columns " +
                  std::to_string(heads.at) + " to " + std::to_string(heads.at + heads.count - 1) +
                  " are not a one-hot: " + std::to_string(ones) + " positive numbers, not 1 (the observation must end in its task's one-hot)");
    out[static_cast<std::size_t>(i)] = k;
  }
}

// Spreads each of `rows` rows of output gradients `dy` [rows, out] onto its head's outputs in
// `wide` [rows, out * heads.count], zeros elsewhere: row j takes head `head(j)`.
template <class HeadOf>
void spread_to_heads(const float* dy, std::int64_t rows, std::int64_t out, const MlpHeads& heads, HeadOf head,
                     float* wide) {
  const std::int64_t w = out * heads.count;
  std::fill_n(wide, rows * w, 0.f);
  for (std::int64_t j = 0; j < rows; ++j) std::copy_n(dy + j * out, out, wide + j * w + head(j) * out);
}

}  // namespace detail

/// One hand-written forward pass of an `Mlp` and what its backward needs (see file comment).
/// Inputs and gradients are contiguous float32 CPU tensors; run it under `torch::NoGradGuard`.
/// Matrix products call BLAS directly (`blas::gemm`) and everything else is a plain loop:
/// no LibTorch op runs in a forward or backward once the buffers exist.
/// A tape belongs to one pass at a time: use one per concurrent forward.
class MlpTape {
 public:
  /// Why `m` cannot run on a tape, or "" when it can (float32 CPU parameters and an
  /// activation with a hand-written derivative).
  static std::string unsupported(const MlpImpl& m) {
    if (!has_manual_backward(m.activation()))
      return "activation " + std::string(enum_names(Activation{})[static_cast<std::size_t>(m.activation())]) +
             " has no hand-written derivative";
    for (const auto& l : m.layers()) {
      if (!l->weight.device().is_cpu()) return "parameters on " + l->weight.device().str();
      if (l->weight.scalar_type() != at::kFloat)
        return std::string("parameters in ") + c10::toString(l->weight.scalar_type());
    }
    return {};
  }
  /// Whether `m` can run on a tape (see `unsupported`).
  static bool supports(const MlpImpl& m) { return unsupported(m).empty(); }

  /// m(x) for x [B, in]. The result is a buffer of this tape, valid until its next forward.
  const at::Tensor& forward(const MlpImpl& m, const at::Tensor& x) {
    const auto& layers = m.layers();
    const std::int64_t batch = x.size(0);
    if (h_.size() != layers.size() || h_.front().size(0) != batch) {
      h_.clear();
      g_.clear();
      for (const auto& l : layers) {
        h_.push_back(at::empty({batch, l->weight.size(0)}, x.options()));
        g_.push_back(at::empty({batch, l->weight.size(0)}, x.options()));
      }
    }
    x_ = x.contiguous();
    const float* in = x_.data_ptr<float>();
    std::int64_t in_dim = x_.size(1);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::int64_t out_dim = layers[i]->weight.size(0);
      float* h = h_[i].data_ptr<float>();
      const float* bias = layers[i]->bias.data_ptr<float>();
      const float* w = layers[i]->weight.data_ptr<float>();
      const bool hidden = i + 1 < layers.size();
      // the bias, and ReLU, as the product stores its result; other activations after it
      const simd::Epilogue after{.bias = bias, .relu = hidden && m.activation() == Activation::relu};
      // a few rows (acting): x (W^T) from the kept transpose, made again when W is written
      const float* kept = nullptr;
#if ANVIL_SIMD_X86
      if (blas::own_rows_kernel_takes_copy(batch, out_dim, in_dim, 0.f, after)) {
        if (kept_.size() < layers.size()) kept_.resize(layers.size());
        kept = kept_[i].of(layers[i]->weight);
      }
      if (kept) {
        simd::sgemm_rows_b_avx512(batch, out_dim, in_dim, 1.f, in, in_dim, kept, out_dim, h, out_dim, after);
      } else
#endif
      if (blas::transposed_copy_pays(batch, out_dim, in_dim) && !blas::own_kernel_takes(batch, out_dim, in_dim, after)) {
        // x (W^T) on a copy of W^T
        wt_.resize(static_cast<std::size_t>(out_dim * in_dim));
        simd::transpose(wt_.data(), w, out_dim, in_dim);
        detail::gemm(false, false, batch, out_dim, in_dim, 1.f, in, in_dim, wt_.data(), out_dim, 0.f, h, out_dim,
                     after);
      } else {
        detail::gemm(false, true, batch, out_dim, in_dim, 1.f, in, in_dim, w, in_dim, 0.f, h, out_dim, after);
      }
      if (hidden && m.activation() != Activation::relu) detail::activate_inplace(h, batch * out_dim, m.activation());
      in = h;
      in_dim = out_dim;
    }
    const auto& heads = m.heads();
    if (heads.count == 1) return h_.back();
    // Several heads: each row's own head, picked from the whole output layer's.
    const std::int64_t out = m.out_features();
    detail::head_of_rows(x_.data_ptr<float>(), batch, x_.size(1), heads, head_);
    if (!y_.defined() || y_.size(0) != batch || y_.size(1) != out) y_ = at::empty({batch, out}, x.options());
    const float* full = h_.back().data_ptr<float>();
    float* y = y_.data_ptr<float>();
    for (std::int64_t i = 0; i < batch; ++i)
      std::copy_n(full + (i * heads.count + head_[static_cast<std::size_t>(i)]) * out, out, y + i * out);
    return y_;
  }

  /// Backpropagates `dy` [B, out] through the last `forward`. When `grads` is given it
  /// receives the parameter gradients, overwritten, in `MlpImpl::parameters()` order
  /// (fc0.weight, fc0.bias, fc1.weight, ...). When `dx` is given it receives the input
  /// gradient [B, in]. Nothing else is computed.
  void backward(const MlpImpl& m, const at::Tensor& dy, std::vector<at::Tensor>* grads,
                at::Tensor* dx) {
    const auto& layers = m.layers();
    const std::int64_t batch = x_.size(0);
    const float* d = dy.data_ptr<float>();
    if (const auto& heads = m.heads(); heads.count > 1) {
      // Several heads: each row's gradient goes to its head's outputs, zero to the others'.
      float* f = g_.back().data_ptr<float>();  // the output layer's gradient buffer, unused otherwise
      detail::spread_to_heads(d, batch, m.out_features(), heads, [&](std::int64_t i) { return head_[static_cast<std::size_t>(i)]; }, f);
      d = f;
    }
    for (std::size_t k = layers.size(); k-- > 0;) {
      const std::int64_t out_dim = layers[k]->weight.size(0), in_dim = layers[k]->weight.size(1);
      const float* in = k ? h_[k - 1].data_ptr<float>() : x_.data_ptr<float>();
      const float* w = layers[k]->weight.data_ptr<float>();
      if (grads) {
        // dW = d^T in; db = the column sums of d (op(A)'s row sums, read as d^T is packed)
        detail::gemm(true, false, out_dim, in_dim, batch, 1.f, d, out_dim, in, in_dim, 0.f,
                     (*grads)[2 * k].data_ptr<float>(), in_dim,
                     simd::Epilogue{.row_sums = (*grads)[2 * k + 1].data_ptr<float>()});
      }
      if (k > 0) {
        float* g = g_[k - 1].data_ptr<float>();
        const float* y = h_[k - 1].data_ptr<float>();
        if (m.activation() == Activation::relu) {  // ReLU's backward as the product stores g
          detail::gemm(false, false, batch, in_dim, out_dim, 1.f, d, out_dim, w, in_dim, 0.f, g, in_dim,
                       simd::Epilogue{.keep = y, .ldkeep = in_dim});
        } else {
          detail::gemm(false, false, batch, in_dim, out_dim, 1.f, d, out_dim, w, in_dim, 0.f, g, in_dim);
          detail::activation_backward_inplace(g, y, batch * in_dim, m.activation());
        }
        d = g;
      } else if (dx) {
        detail::gemm(false, false, batch, in_dim, out_dim, 1.f, d, out_dim, w, in_dim, 0.f, dx->data_ptr<float>(),
                   in_dim);
      }
    }
  }

  /// The input gradient of some rows of the last `forward` alone, for a loss whose other
  /// rows have a zero output gradient (so a zero input gradient: nothing is computed for
  /// them). `dy` [R, out] holds the output gradients of the rows `rows` (indices into the
  /// forward's batch), in that order; `dx` [R, cols] receives columns [first_col,
  /// first_col + cols) of their input gradients, in the same order. No parameter gradients.
  /// Each row's result is `backward`'s for that row: only the rows and columns asked are
  /// multiplied. SAC's actor loss takes min(Q1, Q2), whose gradient reaches one critic per
  /// row, and needs only the action's columns: this halves its products through the critics.
  /// A row outside the last forward's batch or columns outside the input are refused.
  void backward_input_rows(const MlpImpl& m, const float* dy, const std::vector<std::int64_t>& rows, float* dx,
                           std::int64_t first_col, std::int64_t cols) {
    const auto& layers = m.layers();
    const auto r = static_cast<std::int64_t>(rows.size());
    const std::int64_t batch = x_.defined() ? x_.size(0) : 0, in = layers.front()->weight.size(1);
    if (first_col < 0 || cols < 0 || first_col + cols > in)
      throw Error("MlpTape::backward_input_rows: columns [" + std::to_string(first_col) + ", " +
                  std::to_string(first_col + cols) + ") are not inside the input's " + std::to_string(in));
    for (const auto i : rows)
      if (i < 0 || i >= batch)
        throw Error("MlpTape::backward_input_rows: row " + std::to_string(i) + " is not one of the last forward's " +
                    std::to_string(batch) + " rows");
    if (r == 0) return;
    const float* d = dy;
    if (const auto& heads = m.heads(); heads.count > 1) {
      // Several heads: each row's gradient goes to its head's outputs, zero to the others'.
      rows_d_.resize(static_cast<std::size_t>(r * m.out_features() * heads.count));
      detail::spread_to_heads(dy, r, m.out_features(), heads,
                              [&](std::int64_t j) { return head_[static_cast<std::size_t>(rows[static_cast<std::size_t>(j)])]; },
                              rows_d_.data());
      d = rows_d_.data();
    }
    rows_g_.resize(layers.size());
    for (std::size_t k = layers.size(); k-- > 0;) {
      const std::int64_t out_dim = layers[k]->weight.size(0), in_dim = layers[k]->weight.size(1);
      const float* w = layers[k]->weight.data_ptr<float>();
      if (k == 0) {
        detail::gemm(false, false, r, cols, out_dim, 1.f, d, out_dim, w + first_col, in_dim, 0.f, dx, cols);
        break;
      }
      // g = d W for these rows, then the activation's derivative from their outputs
      auto& g = rows_g_[k - 1];
      g.resize(static_cast<std::size_t>(r * in_dim));
      rows_y_.resize(g.size());
      const float* y = h_[k - 1].data_ptr<float>();
      for (std::int64_t j = 0; j < r; ++j)
        std::copy_n(y + rows[static_cast<std::size_t>(j)] * in_dim, in_dim, rows_y_.data() + j * in_dim);
      if (m.activation() == Activation::relu) {
        detail::gemm(false, false, r, in_dim, out_dim, 1.f, d, out_dim, w, in_dim, 0.f, g.data(), in_dim,
                     simd::Epilogue{.keep = rows_y_.data(), .ldkeep = in_dim});
      } else {
        detail::gemm(false, false, r, in_dim, out_dim, 1.f, d, out_dim, w, in_dim, 0.f, g.data(), in_dim);
        detail::activation_backward_inplace(g.data(), rows_y_.data(), r * in_dim, m.activation());
      }
      d = g.data();
    }
  }

  /// The weight transposes made so far for forwards of a few rows (each kept while its
  /// weight is not written; core/kept_copy.hpp).
  [[nodiscard]] std::int64_t kept_transposes() const noexcept {
    std::int64_t n = 0;
    for (const auto& k : kept_) n += k.copies();
    return n;
  }

  /// Output of hidden layer `i` (after its activation) from the last forward.
  [[nodiscard]] const at::Tensor& hidden(std::size_t i) const { return h_.at(i); }

 private:
  at::Tensor x_;
  std::vector<at::Tensor> h_;  // each layer's output (activated for hidden layers)
  std::vector<at::Tensor> g_;  // gradient buffers, one per layer
  std::vector<float> wt_;      // a layer's weight transposed, when that is faster (blas::transposed_copy_pays)
  std::vector<KeptTranspose> kept_;  // each layer's weight transposed for a few rows, while it stays the same
  at::Tensor y_;                     // with several heads: each row's head's outputs
  std::vector<std::int64_t> head_;  // with several heads: each row's head
  // backward_input_rows: the rows' gradients per layer, their outputs, the heads' spread
  std::vector<std::vector<float>> rows_g_;
  std::vector<float> rows_y_, rows_d_;
};

}  // namespace anvil::nn
