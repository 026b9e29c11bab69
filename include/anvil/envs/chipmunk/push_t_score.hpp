#pragma once
/// @file
/// Push-T's published evaluation: one episode from each test seed 100000 + i, the score the
/// mean over episodes of the best reward reached (reward = clip(coverage / 0.95, 0, 1)),
/// and the share of episodes that reached 95% coverage. The episodes run side by side, so a
/// policy is asked once per chunk for all of them. The state env (`MultiStep<PushT>`, float
/// rows) and the image variant (`MultiStep<PushTImage>`, rows of bytes) alike. Light header:
/// no torch.

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <anvil/envs/chipmunk/push_t.hpp>
#include <anvil/envs/multi_step.hpp>

namespace anvil::envs::chipmunk {

/// What `score_on_test_seeds` measures.
struct PushTScore {
  double score = 0;        ///< mean best reward (the published score)
  double success = 0;      ///< share of episodes above 95% coverage
  std::int64_t calls = 0;  ///< times the policy was asked (once per chunk, for all episodes)
};

/// Runs `episodes` test episodes of copies of `proto` (see file comment). `policy(obs, n)`
/// gets the n episodes' observations, row-major (a span of the env's elements: floats, or
/// bytes of rows of parts), and returns their actions row-major, in
/// [-1, 1] over the action box (the Trainer's units; values outside are clipped); rows of
/// episodes that have ended are ignored.
template <class E, class Policy>
PushTScore score_on_test_seeds(const MultiStep<E>& proto, int episodes, Policy&& policy) {
  using Element = typename MultiStep<E>::Element;
  const auto n = static_cast<std::size_t>(episodes);
  const std::size_t od = row_elements(proto.observation_space());
  const auto box = proto.action_space();
  std::vector<MultiStep<E>> envs(n, proto);
  std::vector<Element> obs(n * od);
  std::vector<float> a(box.size());
  std::vector<bool> done(n, false), success(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    const auto o = envs[i].reset(100000 + i);
    std::copy(o.begin(), o.end(), obs.begin() + static_cast<std::ptrdiff_t>(i * od));
  }
  PushTScore out;
  for (std::size_t left = n; left > 0;) {
    const std::vector<float> unit = policy(std::span<const Element>(obs), episodes);
    ++out.calls;
    for (std::size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      for (std::size_t j = 0; j < a.size(); ++j)
        a[j] = box.low[j] + (std::clamp(unit[i * a.size() + j], -1.0f, 1.0f) + 1.0f) / 2 * (box.high[j] - box.low[j]);
      const auto s = envs[i].step(a);
      std::copy(s.observation.begin(), s.observation.end(), obs.begin() + static_cast<std::ptrdiff_t>(i * od));
      if (envs[i].success()) success[i] = true;
      if (s.terminated || s.truncated) {
        done[i] = true;
        --left;
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    out.score += envs[i].env().best_reward() / episodes;
    out.success += (success[i] ? 1.0 : 0.0) / episodes;
  }
  return out;
}

}  // namespace anvil::envs::chipmunk
