#pragma once
/// @file
/// `NStepWindow`: turns each env's stream of one-step transitions into n-step ones
/// (Sutton 1988; as used with replay by Hessel et al. 2018, "Rainbow"), before they are
/// stored. A stored transition is then self-contained: obs_t, action_t, the discounted sum
/// of up to n rewards, the observation it leads to, whether that one is terminal, and the
/// discount gamma^k of its bootstrap term. So sampling needs no look-ahead and the ring's
/// wraparound cannot split a window.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <vector>

#include <anvil/core/batch.hpp>
#include <anvil/core/binary_io.hpp>

namespace anvil::detail {

class NStepWindow {
 public:
  /// One env's step waiting in its window.
  struct Step {
    std::vector<float> obs, action, next_obs;
    double reward = 0;
    bool terminated = false;
  };

  NStepWindow() = default;
  NStepWindow(int n, double gamma) : n_(n), gamma_(gamma) {}

  [[nodiscard]] int n() const noexcept { return n_; }
  void set_gamma(double gamma) noexcept { gamma_ = gamma; }
  [[nodiscard]] double gamma() const noexcept { return gamma_; }

  /// Takes one step of N envs (row i = env i, every call the same N) and returns the
  /// transitions it completes: for each env, its oldest pending step once n are pending,
  /// and all of its pending steps when this step ended its episode (terminated or
  /// truncated). The result has `discount` set; `obs` is undefined when nothing completed.
  StepBatch push(const StepBatch& s) {
    const std::int64_t envs = s.obs.size(0);
    if (pending_.size() != static_cast<std::size_t>(envs)) pending_.assign(static_cast<std::size_t>(envs), {});
    const auto obs = s.obs.to(at::kFloat).contiguous(), next = s.next_obs.to(at::kFloat).contiguous();
    const auto act = s.action.to(at::kFloat).contiguous().view({envs, -1});
    const auto rew = s.reward.to(at::kDouble).contiguous(), term = s.terminated.to(at::kFloat).contiguous();
    const auto trunc = s.truncated.defined() ? s.truncated.to(at::kFloat).contiguous() : at::zeros({envs});
    od_ = obs.size(1);
    ad_ = act.size(1);
    out_.clear();
    for (std::int64_t i = 0; i < envs; ++i) {
      auto& q = pending_[static_cast<std::size_t>(i)];
      Step st;
      st.obs.assign(obs.data_ptr<float>() + i * od_, obs.data_ptr<float>() + (i + 1) * od_);
      st.action.assign(act.data_ptr<float>() + i * ad_, act.data_ptr<float>() + (i + 1) * ad_);
      st.next_obs.assign(next.data_ptr<float>() + i * od_, next.data_ptr<float>() + (i + 1) * od_);
      st.reward = rew.data_ptr<double>()[i];
      st.terminated = term.data_ptr<float>()[i] > 0.5f;
      const bool ended = st.terminated || trunc.data_ptr<float>()[i] > 0.5f;
      q.push_back(std::move(st));
      if (ended) {
        while (!q.empty()) emit(q);
      } else if (static_cast<int>(q.size()) == n_) {
        emit(q);
      }
    }
    StepBatch b;
    const auto m = static_cast<std::int64_t>(out_.size());
    if (m == 0) return b;
    b.obs = at::empty({m, od_});
    b.next_obs = at::empty({m, od_});
    b.action = at::empty({m, ad_});
    b.reward = at::empty({m});
    b.terminated = at::empty({m});
    b.truncated = at::zeros({m});
    b.discount = at::empty({m});
    for (std::int64_t k = 0; k < m; ++k) {
      const auto& o = out_[static_cast<std::size_t>(k)];
      std::copy(o.obs.begin(), o.obs.end(), b.obs.data_ptr<float>() + k * od_);
      std::copy(o.next_obs.begin(), o.next_obs.end(), b.next_obs.data_ptr<float>() + k * od_);
      std::copy(o.action.begin(), o.action.end(), b.action.data_ptr<float>() + k * ad_);
      b.reward.data_ptr<float>()[k] = static_cast<float>(o.reward);
      b.terminated.data_ptr<float>()[k] = o.terminated ? 1.f : 0.f;
      b.discount.data_ptr<float>()[k] = static_cast<float>(o.discount);
    }
    return b;
  }

  /// Writes the windows still filling, so a restored buffer continues them.
  void save(BinaryWriter& w) const {
    w.value<std::int32_t>(n_);
    w.value(gamma_);
    w.value(od_);
    w.value(ad_);
    w.value<std::uint64_t>(pending_.size());
    for (const auto& q : pending_) {
      w.value<std::uint64_t>(q.size());
      for (const auto& st : q) {
        w.bytes(st.obs.data(), st.obs.size() * sizeof(float));
        w.bytes(st.action.data(), st.action.size() * sizeof(float));
        w.bytes(st.next_obs.data(), st.next_obs.size() * sizeof(float));
        w.value(st.reward);
        w.value<std::uint8_t>(st.terminated);
      }
    }
  }
  /// What `save` wrote, checked and not yet applied.
  struct Saved {
    double gamma = 0;
    std::int64_t od = 0, ad = 0;
    std::vector<std::deque<Step>> pending;
  };
  Saved read(BinaryReader& r) const {
    r.expect<std::int32_t>(n_, "buffer.n_step");
    Saved s;
    s.gamma = r.value<double>("n-step gamma");
    s.od = r.value<std::int64_t>("n-step observation size");
    s.ad = r.value<std::int64_t>("n-step action size");
    const auto envs = r.value<std::uint64_t>("n-step env count");
    if (envs > (1u << 20) || s.od < 0 || s.ad < 0 || s.od > (1 << 24) || s.ad > (1 << 24))
      r.fail("n-step windows", "have implausible sizes");
    s.pending.resize(envs);
    for (auto& q : s.pending) {
      const auto len = r.value<std::uint64_t>("n-step window length");
      if (len >= static_cast<std::uint64_t>(n_)) r.fail("n-step window length", "is not below buffer.n_step");
      for (std::uint64_t k = 0; k < len; ++k) {
        Step st;
        st.obs.resize(static_cast<std::size_t>(s.od));
        st.action.resize(static_cast<std::size_t>(s.ad));
        st.next_obs.resize(static_cast<std::size_t>(s.od));
        r.bytes(st.obs.data(), st.obs.size() * sizeof(float), "n-step observations");
        r.bytes(st.action.data(), st.action.size() * sizeof(float), "n-step actions");
        r.bytes(st.next_obs.data(), st.next_obs.size() * sizeof(float), "n-step next observations");
        st.reward = r.value<double>("n-step rewards");
        st.terminated = r.value<std::uint8_t>("n-step terminal flags") != 0;
        q.push_back(std::move(st));
      }
    }
    return s;
  }
  void restore(Saved&& s) {
    gamma_ = s.gamma;
    od_ = s.od;
    ad_ = s.ad;
    pending_ = std::move(s.pending);
  }

  /// Steps waiting for their window to fill, over all envs.
  [[nodiscard]] std::int64_t pending() const noexcept {
    std::int64_t p = 0;
    for (const auto& q : pending_) p += static_cast<std::int64_t>(q.size());
    return p;
  }

 private:
  struct Done {
    std::vector<float> obs, action, next_obs;
    double reward, discount;
    bool terminated;
  };

  // Emits the oldest pending step of one env as a k-step transition over all k pending.
  void emit(std::deque<Step>& q) {
    double ret = 0, g = 1;
    for (const auto& st : q) {
      ret += g * st.reward;
      g *= gamma_;
    }
    out_.push_back(Done{std::move(q.front().obs), std::move(q.front().action), q.back().next_obs, ret, g,
                        q.back().terminated});
    q.pop_front();
  }

  int n_ = 1;
  double gamma_ = 0.99;
  std::int64_t od_ = 0, ad_ = 0;
  std::vector<std::deque<Step>> pending_;
  std::vector<Done> out_;
};

}  // namespace anvil::detail
