#pragma once
/// @file
/// `NStepWindow`: turns each env's stream of one-step transitions into n-step ones
/// (Sutton 1988; as used with replay by Hessel et al. 2018, "Rainbow"), before they are
/// stored. A stored transition is then self-contained: obs_t, action_t, the discounted sum
/// of up to n rewards, the observation it leads to, whether that one is terminal, and the
/// discount gamma^k of its bootstrap term. So sampling needs no look-ahead and the ring's
/// wraparound cannot split a window. Observations are named by their ids in the
/// buffer's observation ring (see transition_store.hpp), so a window holds no copies.

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>

namespace anvil::detail {

class NStepWindow {
 public:
  /// One env's step waiting in its window; `obs` and `next` are observation ids.
  struct Step {
    std::int64_t obs = -1, next = -1;
    std::vector<float> action;
    double reward = 0;
    bool terminated = false;
  };
  /// A completed k-step transition, k <= n.
  struct Done {
    std::int64_t obs = -1, next = -1;
    std::vector<float> action;
    double reward = 0, discount = 1;
    bool terminated = false;
  };

  NStepWindow() = default;
  NStepWindow(int n, double gamma) : n_(n), gamma_(gamma) {}

  [[nodiscard]] int n() const noexcept { return n_; }
  void set_gamma(double gamma) noexcept { gamma_ = gamma; }
  [[nodiscard]] double gamma() const noexcept { return gamma_; }

  /// Starts over with `envs` empty windows unless there are that many already.
  void resize(std::size_t envs) {
    if (pending_.size() != envs) pending_.assign(envs, {});
  }

  /// Takes env `env`'s next step and appends what it completes to `out`: the oldest
  /// pending step once n are pending, or every pending step when this one `ended` its
  /// episode (terminated or truncated).
  void push(std::size_t env, Step st, bool ended, std::vector<Done>& out) {
    auto& q = pending_[env];
    q.push_back(std::move(st));
    if (ended) {
      while (!q.empty()) emit(q, out);
    } else if (static_cast<int>(q.size()) == n_) {
      emit(q, out);
    }
  }

  /// Writes the windows still filling, so a restored buffer continues them.
  void save(BinaryWriter& w) const {
    w.value<std::int32_t>(n_);
    w.value(gamma_);
    w.value<std::uint64_t>(pending_.size());
    for (const auto& q : pending_) {
      w.value<std::uint64_t>(q.size());
      for (const auto& st : q) {
        w.value(st.obs);
        w.value(st.next);
        w.value<std::uint64_t>(st.action.size());
        w.bytes(st.action.data(), st.action.size() * sizeof(float));
        w.value(st.reward);
        w.value<std::uint8_t>(st.terminated);
      }
    }
  }
  /// What `save` wrote, checked and not yet applied.
  struct Saved {
    double gamma = 0;
    std::vector<std::deque<Step>> pending;
  };
  Saved read(BinaryReader& r) const {
    r.expect<std::int32_t>(n_, "buffer.n_step");
    Saved s;
    s.gamma = r.value<double>("n-step gamma");
    const auto envs = r.value<std::uint64_t>("n-step env count");
    if (envs > (1u << 20)) r.fail("n-step env count", "is implausibly large");
    s.pending.resize(envs);
    for (auto& q : s.pending) {
      const auto len = r.value<std::uint64_t>("n-step window length");
      if (len >= static_cast<std::uint64_t>(n_)) r.fail("n-step window length", "is not below buffer.n_step");
      for (std::uint64_t k = 0; k < len; ++k) {
        Step st;
        st.obs = r.value<std::int64_t>("n-step observation ids");
        st.next = r.value<std::int64_t>("n-step observation ids");
        const auto ad = r.value<std::uint64_t>("n-step action size");
        if (ad > (1u << 24)) r.fail("n-step action size", "is implausibly large");
        st.action.resize(ad);
        r.bytes(st.action.data(), st.action.size() * sizeof(float), "n-step actions");
        st.reward = r.value<double>("n-step rewards");
        st.terminated = r.value<std::uint8_t>("n-step terminal flags") != 0;
        q.push_back(std::move(st));
      }
    }
    return s;
  }
  void restore(Saved&& s) {
    gamma_ = s.gamma;
    pending_ = std::move(s.pending);
  }

  /// Steps waiting for their window to fill, over all envs.
  [[nodiscard]] std::int64_t pending() const noexcept {
    std::int64_t p = 0;
    for (const auto& q : pending_) p += static_cast<std::int64_t>(q.size());
    return p;
  }

 private:
  // Emits the oldest pending step of one env as a k-step transition over all k pending.
  void emit(std::deque<Step>& q, std::vector<Done>& out) const {
    double ret = 0, g = 1;
    for (const auto& st : q) {
      ret += g * st.reward;
      g *= gamma_;
    }
    out.push_back(Done{q.front().obs, q.back().next, std::move(q.front().action), ret, g, q.back().terminated});
    q.pop_front();
  }

  int n_ = 1;
  double gamma_ = 0.99;
  std::vector<std::deque<Step>> pending_;
};

}  // namespace anvil::detail
