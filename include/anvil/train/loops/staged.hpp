#pragma once
/// @file
/// `Staged<First, Second>`: one loop, then another, on the same algorithm and buffer, e.g.
/// `Staged<OfflineLoop, OffPolicyLoop>` learns from a dataset first and then goes on
/// online with what it learned (and with the dataset in its replay buffer). Each stage has
/// its own section under `train` (`train.offline.steps`, `train.off_policy.learning_starts`)
/// and its own unit: the clock counts updates in an offline stage and env steps in an
/// online one, and the hooks' intervals follow the stage that runs. TensorBoard records a
/// staged run by gradient updates, the one count that grows through every stage.
///
/// Checkpoints record the stage (the `loop` section), so a resumed run continues in the
/// stage it stopped in and does not run the first one again. Learning rates are scaled
/// once, when the algorithm is built, so both stages must agree on `lr_scaling` and
/// `base_batch`; micro-batches and the policy average follow each stage's settings.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <anvil/core/concepts.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/param.hpp>
#include <anvil/train/loops/loop.hpp>

namespace anvil {

/// Loop policy: `First`'s loop until its `steps`, then `Second`'s (see file comment).
template <Loop First, Loop Second>
struct Staged {
  static_assert(First::stage_name.view() != Second::stage_name.view(),
                "Staged<First, Second>: both stages are the same loop, whose config sections would clash; "
                "run one loop with more steps instead");

  using policy_kind = LoopKind;
  static constexpr std::string_view name = "staged";
  static constexpr FixedString config_section = "train";

  /// One section per stage, named after its loop (`train.offline`, `train.off_policy`, ...).
  struct Config {
    Section<First::stage_name, typename First::Config> first;
    Section<Second::stage_name, typename Second::Config> second;

    void validate() const {
      const auto a = First::settings(*first), b = Second::settings(*second);
      const std::string f(First::stage_name.view()), s(Second::stage_name.view());
      if (a.lr_scaling != b.lr_scaling)
        throw ConfigError("train." + s + ".lr_scaling differs from train." + f +
                          ".lr_scaling: learning rates are scaled once, when the algorithm is built");
      if (a.base_batch != b.base_batch)
        throw ConfigError("train." + s + ".base_batch differs from train." + f +
                          ".base_batch: learning rates are scaled once, when the algorithm is built");
    }
    void shrink() {
      first->shrink();
      second->shrink();
    }
  };

  /// The settings the run is built with: the first stage's.
  [[nodiscard]] static LoopSettings settings(const Config& c) {
    auto s = First::settings(*c.first);
    s.record_unit = ClockUnit::updates;
    return s;
  }

  /// Both stages' rules (the second's only once the first's hold: one sentence).
  template <class A, class B>
  static constexpr bool rules() {
    if constexpr (First::template rules<A, B>()) return Second::template rules<A, B>();
    else return false;
  }

  /// Runs the stages in turn (see file comment).
  template <class A, class B>
  class Runner {
    using FirstRunner = typename First::template Runner<A, B>;
    using SecondRunner = typename Second::template Runner<A, B>;

   public:
    Runner(const Config& cfg, LoopParts<A, B> parts)
        : first_(*cfg.first, parts), second_(*cfg.second, parts), step_(parts.step) {}

    [[nodiscard]] LoopSettings settings() const {
      auto s = stage_ == 0 ? first_.settings() : second_.settings();
      s.record_unit = ClockUnit::updates;
      return s;
    }
    [[nodiscard]] int stage() const noexcept { return stage_; }

    void begin() {
      stage_ == 0 ? first_.begin() : second_.begin();
      step_.set_micro_batches(settings().grad_accumulation);
    }
    void resumed() {
      stage_ == 0 ? first_.resumed() : second_.resumed();
      step_.set_micro_batches(settings().grad_accumulation);
    }
    [[nodiscard]] bool done() const noexcept { return stage_ == 1 && second_.done(); }

    /// An iteration of the stage that runs; when the first stage ends, the second begins.
    void iterate(std::int64_t quiet_until = INT64_MAX) {
      if (stage_ == 1) return second_.iterate(quiet_until);
      if (!first_.done()) first_.iterate(quiet_until);
      if (first_.done()) {
        stage_ = 1;
        begin();
      }
    }
    void at_log_row() { stage_ == 0 ? first_.at_log_row() : second_.at_log_row(); }
    /// The advice of the stage that runs, in its section's keys (`train.<stage>.*`).
    [[nodiscard]] BottleneckAdvice advice(const AdviceKeys& k) const {
      AdviceKeys in = k;
      in.train = k.train + "." + std::string(stage_ == 0 ? First::stage_name.view() : Second::stage_name.view());
      return stage_ == 0 ? first_.advice(in) : second_.advice(in);
    }

    /// The stages' runners (e.g. for a custom main).
    [[nodiscard]] auto& first() noexcept { return first_; }
    [[nodiscard]] auto& second() noexcept { return second_; }

    /// State protocol: the stage, and each stage's own state.
    void save(BinaryWriter& w) const {
      w.value(stage_);
      first_.save(w);
      second_.save(w);
    }
    struct Saved {
      int stage = 0;
      decltype(std::declval<const FirstRunner&>().read(std::declval<BinaryReader&>())) first;
      decltype(std::declval<const SecondRunner&>().read(std::declval<BinaryReader&>())) second;
    };
    [[nodiscard]] Saved read(BinaryReader& r) const {
      const int stage = r.value<int>("stage");
      if (stage < 0 || stage > 1) r.fail("stage", "is " + std::to_string(stage) + "; a Staged run has stages 0 and 1");
      auto a = first_.read(r);
      auto b = second_.read(r);
      return Saved{stage, std::move(a), std::move(b)};
    }
    void restore(const Saved& s) {
      stage_ = s.stage;
      first_.restore(s.first);
      second_.restore(s.second);
    }

   private:
    FirstRunner first_;
    SecondRunner second_;
    StepContext& step_;
    int stage_ = 0;
  };
};

}  // namespace anvil
