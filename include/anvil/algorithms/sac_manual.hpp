#pragma once
/// @file
/// SAC's CPU backend (`sac.manual_backward`): the critic part and the actor part of
/// algorithms/sac_parts.hpp with hand-written gradients over the default networks'
/// tapes (nn/manual_mlp.hpp, nn/gaussian_actor.hpp): the same arithmetic as autograd,
/// without its graph, into the flat gradients the optimizers read. Float32 on the CPU.

#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <thread>
#include <vector>

#include <anvil/algorithms/sac_parts.hpp>
#include <anvil/core/batch.hpp>
#include <anvil/core/error.hpp>
#include <anvil/nn/gaussian_actor.hpp>
#include <anvil/nn/manual_mlp.hpp>
#include <anvil/nn/twin_q.hpp>
#include <anvil/optim/flat_adam.hpp>

namespace anvil::detail {

/// Buffers of SAC's hand-written fast path (`manual_backward`): one set per part of the
/// update, so the critic part and the actor part can run at once (see nn/manual_mlp.hpp).
struct SacManual {
  SacManual(const FlatParameters& critic, const nn::TwinQ& q, const FlatParameters& actor,
            const nn::GaussianActor& pi)
      : critic_grad(critic.new_gradient()),
        q1_grads(critic.views_of(critic_grad, q->q1()->parameters())),
        q2_grads(critic.views_of(critic_grad, q->q2()->parameters())),
        actor_grad(actor.new_gradient()),
        actor_grads(actor.views_of(actor_grad, pi->net()->parameters())),
        alpha_grad(at::empty({1}, actor.flat().options())) {}
  at::Tensor critic_grad;
  std::vector<at::Tensor> q1_grads, q2_grads;
  at::Tensor actor_grad;
  std::vector<at::Tensor> actor_grads;
  at::Tensor alpha_grad;
  // critic part
  nn::GaussianActorTape next_tape;
  nn::MlpTape tq1, tq2, q1, q2;
  // the target critics on the first `head_rows` next observations, when the actor part's
  // thread computes them (manual_next_actions)
  nn::MlpTape head_tq1, head_tq2;
  std::int64_t head_rows = 0;
  const float *head_q1 = nullptr, *head_q2 = nullptr;  // their outputs [head_rows]
  at::Tensor x_next, x, dq1, dq2;
  // actor part
  nn::GaussianActorTape actor_tape;
  nn::MlpTape aq1, aq2;
  at::Tensor xa, da, dlp;
  std::vector<std::int64_t> rows1, rows2;  // the rows whose min(q1, q2) is each critic's
  std::vector<float> dqa1, dqa2, dxa1, dxa2;  // those rows' output and action gradients
  // act()
  nn::GaussianActorTape act_tape;
};

// Rows of [obs | action] for the critics: copies `obs` [B, od] into the first od columns of
// `x` [B, od + ad], (re)allocating x for the batch size.
inline void obs_into(at::Tensor& x, const at::Tensor& obs, std::int64_t ad) {
  const std::int64_t batch = obs.size(0), od = obs.size(1), w = od + ad;
  if (!x.defined() || x.size(0) != batch) x = at::empty({batch, w}, obs.options());
  const float* o = obs.data_ptr<float>();
  float* p = x.data_ptr<float>();
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t j = 0; j < od; ++j) p[i * w + j] = o[i * od + j];
}
inline void ensure(at::Tensor& t, std::initializer_list<std::int64_t> sizes, const at::Tensor& like) {
  if (!t.defined() || t.sizes() != at::IntArrayRef(sizes)) t = at::empty(sizes, like.options());
}
inline const float* opt_ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// The actor's actions and log-densities at the next observations, for the target (into
// m.next_tape and m.x_next's action columns). When the critic part and the actor part run
// at once (`run.update_threads` 2), the actor part's thread samples them first and hands
// them over: the critic part is the longer one (two target forwards, two forwards, two
// backward passes against the actor's forward, the critics' forwards at its actions and
// their input gradients for half the rows each), and the move evens the two out. The same
// arithmetic either way.
class SacNextHandoff {
 public:
  // On the actor part's thread, first: samples, then tells the critic part (also when the
  // sampling throws: the critic part then stops instead of waiting).
  template <class Sample>
  void provide(Sample&& sample) {
    try {
      sample();
    } catch (...) {
      state_.store(kFailed, std::memory_order_release);
      throw;
    }
    state_.store(kReady, std::memory_order_release);
  }
  // On the critic part's thread: waits for `provide` (long done by then: the critic part's
  // own forwards come first).
  void wait() const {
    int s;
    while ((s = state_.load(std::memory_order_acquire)) == kPending) std::this_thread::yield();
    if (s == kFailed)
      throw Error("sac: the actor part failed while sampling the next observations' actions for the critic part");
  }

 private:
  static constexpr int kPending = 0, kReady = 1, kFailed = 2;
  std::atomic<int> state_{kPending};
};

// Rows of the target critics' forwards that the actor part's thread takes when it hands the
// next actions over: a quarter of the batch (a multiple of 8, a tile's rows), which evens the
// two parts out at the main job's sizes (the critic part was ~10% longer at 256 x 256,
// batch 256). Each row's result is the same bits wherever it is computed. Only with two
// update threads: on one, the split would only pack the target's weights twice.
inline std::int64_t sac_head_rows(std::int64_t batch) { return batch / 4 / 8 * 8; }

// With `target`, then the target critics' forwards on the first `head_rows` rows (into
// m.head_tq1, m.head_tq2; m.head_rows says how many).
inline void manual_next_actions(SacManual& m, const nn::GaussianActorImpl& actor, const ReplayBatch& batch,
                                const at::Tensor& noise_next, const nn::TwinQImpl* target = nullptr,
                                std::int64_t head_rows = 0) {
  torch::NoGradGuard no_grad;
  const auto next_obs = batch.next_obs.contiguous();
  const std::int64_t od = next_obs.size(1), ad = actor.action_dim();
  obs_into(m.x_next, next_obs, ad);
  m.next_tape.sample(actor, next_obs, noise_next, m.x_next.data_ptr<float>() + od, od + ad);
  m.head_rows = target ? std::clamp<std::int64_t>(head_rows, 0, next_obs.size(0)) : 0;
  if (m.head_rows == 0) return;
  const auto head = m.x_next.narrow(0, 0, m.head_rows);
  m.head_q1 = m.head_tq1.forward(*target->q1(), head).data_ptr<float>();
  m.head_q2 = m.head_tq2.forward(*target->q2(), head).data_ptr<float>();
}

// SAC's critic part with hand-written gradients: the same arithmetic as autograd_critic.
// With `next`, the next observations' actions come from the actor part's thread
// (SacNextHandoff); without, this part samples them.
inline SacCriticResult manual_critic(SacManual& m, const nn::GaussianActorImpl& actor,
                                   const nn::TwinQImpl& critic, const nn::TwinQImpl& target,
                                   const ReplayBatch& batch, double alpha, double gamma_,
                                   const at::Tensor& noise_next, const at::Tensor& alpha_row = {},
                                   const SacNextHandoff* next = nullptr) {
  torch::NoGradGuard no_grad;
  const auto obs = batch.obs.contiguous();
  const auto action = batch.action.contiguous(), reward = batch.reward.contiguous();
  const auto terminated = batch.terminated.contiguous();
  const auto discount = batch.discount.defined() ? batch.discount.contiguous() : at::Tensor();
  const auto weight = batch.weight.defined() ? batch.weight.contiguous() : at::Tensor();
  const std::int64_t n = obs.size(0), od = obs.size(1), ad = actor.action_dim(), w = od + ad;

  // The critics at the stored actions first: they need nothing from the actor.
  obs_into(m.x, obs, ad);
  {
    const float* a = action.data_ptr<float>();
    float* x = m.x.data_ptr<float>();
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < ad; ++j) x[i * w + od + j] = a[i * ad + j];
  }
  const float* q1 = m.q1.forward(*critic.q1(), m.x).data_ptr<float>();
  const float* q2 = m.q2.forward(*critic.q2(), m.x).data_ptr<float>();

  if (next) next->wait();
  else manual_next_actions(m, actor, batch, noise_next);
  const float* lp = m.next_tape.log_prob().data_ptr<float>();
  // The target critics: the rows the actor part's thread did not take (all, without it).
  const std::int64_t h = next ? m.head_rows : 0;
  const float *tq1 = nullptr, *tq2 = nullptr;  // rows h.. of the batch
  if (h < n) {
    const auto tail = m.x_next.narrow(0, h, n - h);
    tq1 = m.tq1.forward(*target.q1(), tail).data_ptr<float>();
    tq2 = m.tq2.forward(*target.q2(), tail).data_ptr<float>();
  }
  const float *hq1 = m.head_q1, *hq2 = m.head_q2;

  ensure(m.dq1, {n, 1}, obs);
  ensure(m.dq2, {n, 1}, obs);
  SacCriticResult r;
  r.td = at::empty({n}, obs.options());
  const float *rw = reward.data_ptr<float>(), *term = terminated.data_ptr<float>();
  const float *disc = opt_ptr(discount), *wt = opt_ptr(weight);
  const auto alpha_rows = alpha_row.defined() ? alpha_row.contiguous() : at::Tensor();
  const float* ar = opt_ptr(alpha_rows);  // per-transition temperatures (one per task), or none
  float *d1 = m.dq1.data_ptr<float>(), *d2 = m.dq2.data_ptr<float>(), *td = r.td.data_ptr<float>();
  const float gamma = static_cast<float>(gamma_), fa = static_cast<float>(alpha);
  const float inv_n = 1.0f / static_cast<float>(n);
  double loss = 0, q_sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = (i < h ? std::min(hq1[i], hq2[i]) : std::min(tq1[i - h], tq2[i - h])) - (ar ? ar[i] : fa) * lp[i];
    const float y = rw[i] + (disc ? disc[i] : gamma) * (1.0f - term[i]) * v;
    const float e1 = q1[i] - y, e2 = q2[i] - y, wi = wt ? wt[i] : 1.0f;
    loss += static_cast<double>(wi * 0.5f * (e1 * e1 + e2 * e2));
    q_sum += q1[i];
    d1[i] = wi * e1 * inv_n;
    d2[i] = wi * e2 * inv_n;
    td[i] = 0.5f * (std::abs(e1) + std::abs(e2));
  }
  m.q1.backward(*critic.q1(), m.dq1, &m.q1_grads, nullptr);
  m.q2.backward(*critic.q2(), m.dq2, &m.q2_grads, nullptr);
  r.grad = m.critic_grad;
  r.loss = loss / static_cast<double>(n);
  r.q_mean = q_sum / static_cast<double>(n);
  return r;
}

// SAC's actor and temperature part with hand-written gradients (as autograd_actor). With
// `alpha_row` (per-transition temperatures) or `weight_row` (per-transition loss weights),
// the temperature's gradient is left to the caller (`log_prob` comes back).
inline SacActorResult manual_actor(SacManual& m, const nn::GaussianActorImpl& actor,
                                 const nn::TwinQImpl& critic, const ReplayBatch& batch,
                                 double alpha, bool auto_alpha, double target_entropy,
                                 const at::Tensor& noise, const at::Tensor& alpha_row = {},
                                 const at::Tensor& weight_row = {}) {
  torch::NoGradGuard no_grad;
  const auto obs = batch.obs.contiguous();
  const auto alpha_rows = alpha_row.defined() ? alpha_row.contiguous() : at::Tensor();
  const auto weight = weight_row.defined() ? weight_row.contiguous() : at::Tensor();
  const float *ar = opt_ptr(alpha_rows), *wt = opt_ptr(weight);
  const bool per_row = ar || wt;
  const std::int64_t n = obs.size(0), od = obs.size(1), ad = actor.action_dim(), w = od + ad;

  obs_into(m.xa, obs, ad);
  m.actor_tape.sample(actor, obs, noise, m.xa.data_ptr<float>() + od, w);
  const float* lp = m.actor_tape.log_prob().data_ptr<float>();
  const float* q1 = m.aq1.forward(*critic.q1(), m.xa).data_ptr<float>();
  const float* q2 = m.aq2.forward(*critic.q2(), m.xa).data_ptr<float>();

  const float fa = static_cast<float>(alpha), inv_n = 1.0f / static_cast<float>(n);
  if (per_row) ensure(m.dlp, {n}, obs);
  float* dlp = per_row ? m.dlp.data_ptr<float>() : nullptr;
  m.rows1.clear();
  m.rows2.clear();
  m.dqa1.clear();
  m.dqa2.clear();
  double loss = 0, lp_sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    // d min(q1, q2) goes to the smaller one (ties: to both halves, as torch's minimum), so
    // each critic backpropagates only its own rows
    const float qmin = std::min(q1[i], q2[i]);
    const float ai = ar ? ar[i] : fa, wi = wt ? wt[i] : 1.0f;
    loss += static_cast<double>(wi * (ai * lp[i] - qmin));
    lp_sum += lp[i];
    const float g1 = q1[i] < q2[i] ? 1.0f : q1[i] > q2[i] ? 0.0f : 0.5f;
    if (g1 > 0.0f) m.rows1.push_back(i), m.dqa1.push_back(-g1 * wi * inv_n);
    if (g1 < 1.0f) m.rows2.push_back(i), m.dqa2.push_back(-(1.0f - g1) * wi * inv_n);
    if (dlp) dlp[i] = ai * wi * inv_n;
  }
  // the critics' input gradients in the action's columns, for their rows only
  m.dxa1.resize(m.rows1.size() * static_cast<std::size_t>(ad));
  m.dxa2.resize(m.rows2.size() * static_cast<std::size_t>(ad));
  m.aq1.backward_input_rows(*critic.q1(), m.dqa1.data(), m.rows1, m.dxa1.data(), od, ad);
  m.aq2.backward_input_rows(*critic.q2(), m.dqa2.data(), m.rows2, m.dxa2.data(), od, ad);
  ensure(m.da, {n, ad}, obs);
  {
    float* da = m.da.data_ptr<float>();
    std::fill_n(da, n * ad, 0.0f);
    for (std::size_t j = 0; j < m.rows1.size(); ++j)
      for (std::int64_t c = 0; c < ad; ++c) da[m.rows1[j] * ad + c] = m.dxa1[j * static_cast<std::size_t>(ad) + static_cast<std::size_t>(c)];
    for (std::size_t j = 0; j < m.rows2.size(); ++j)
      for (std::int64_t c = 0; c < ad; ++c) da[m.rows2[j] * ad + c] += m.dxa2[j * static_cast<std::size_t>(ad) + static_cast<std::size_t>(c)];
  }
  m.actor_tape.backward(actor, m.da, fa * inv_n, m.actor_grads, dlp);

  SacActorResult r;
  r.grad = m.actor_grad;
  const double mean_lp = lp_sum / static_cast<double>(n);
  r.loss = loss / static_cast<double>(n);
  r.entropy = -mean_lp;
  if (per_row) {
    r.log_prob = m.actor_tape.log_prob().clone();
  } else if (auto_alpha) {
    // d/dlog_alpha of -(log_alpha (log_prob + target_entropy)).mean()
    r.alpha_grad = m.alpha_grad;
    r.alpha_grad.data_ptr<float>()[0] = static_cast<float>(-(mean_lp + target_entropy));
    r.alpha_loss = -std::log(alpha) * (mean_lp + target_entropy);
  }
  return r;
}

}  // namespace anvil::detail
