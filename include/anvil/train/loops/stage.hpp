#pragma once
/// @file
/// The skeleton every loop shares, written once: `loops::LoopTag` declares a loop policy
/// (its kind, name, `train` section and clock unit), and `loops::Stage` is the part of a
/// runner that is the same in every loop: its config and parts, where its stage began on
/// the clock, the stage's settings and end, its start and resume (`begin`, `resumed`: the
/// origin, the clock's unit, then the runner's own `prepare()`), the normalisers merged
/// over ranks at a log row, and the origin as the loop's state. A runner derives from `Stage<Runner, Loop, A, B>` and adds
/// what is its own: `prepare()` (at the stage's start and after a resume), `iterate()`,
/// `advice()`, and any other state (then it hides `save`, `read` and `restore`).

#include <cstdint>
#include <string_view>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/concepts.hpp>
#include <anvil/core/param.hpp>
#include <anvil/train/clock.hpp>
#include <anvil/train/loops/loop.hpp>

namespace anvil::loops {

/// A loop policy's declaration: `struct OnPolicyLoop : loops::LoopTag<"on-policy",
/// "on_policy", loops::OnPolicyConfig, ClockUnit::env_steps> { ... rules, Runner ... };`.
template <FixedString Name, FixedString StageName, class Cfg, ClockUnit Unit>
struct LoopTag {
  using policy_kind = LoopKind;
  static constexpr std::string_view name = Name.view();
  static constexpr FixedString config_section = "train";
  /// The stage's name in a `Staged` run's sections (`train.<stage_name>`).
  static constexpr FixedString stage_name = StageName;
  /// What the stage's length and the hooks' intervals count.
  static constexpr ClockUnit unit = Unit;
  using Config = Cfg;

  [[nodiscard]] static LoopSettings settings(const Config& c) { return common_settings(c, Unit); }
};

/// The runner's shared part (see file comment); `Runner` is the derived runner (CRTP).
template <class Runner, class Loop, class A, class B>
class Stage {
 public:
  using Config = typename Loop::Config;

  Stage(const Config& cfg, LoopParts<A, B> parts) : cfg_(cfg), p_(parts) { check_ema<A>(cfg.update->ema_decay); }

  /// The stage's settings, with where it began.
  [[nodiscard]] LoopSettings settings() const {
    auto s = Loop::settings(cfg_);
    s.origin = origin_;
    return s;
  }
  [[nodiscard]] int stage() const noexcept { return 0; }

  /// The stage starts: its length counts from the clock as it stands; then it is set up as
  /// after a resume.
  void begin() {
    origin_ = p_.clock.in(Loop::unit);
    resumed();
  }
  /// At the stage's start and after a resume restored the run (this loop's state included):
  /// the clock counts in the loop's unit, and the runner does its own `prepare()` (the
  /// buffer's plan, ...).
  void resumed() {
    p_.clock.unit = Loop::unit;
    static_cast<Runner&>(*this).prepare();
  }
  [[nodiscard]] bool done() const noexcept { return elapsed() >= cfg_.steps; }

  /// At a log row with several ranks: every rank's new normaliser statistics are merged.
  void at_log_row() {
    if (p_.ranks.world_size() > 1) p_.collector.envs().sync_statistics([this](at::Tensor& t) { p_.ranks.sum(t); });
  }

  /// State protocol: where the stage began.
  void save(BinaryWriter& w) const { w.value(origin_); }
  [[nodiscard]] std::int64_t read(BinaryReader& r) const { return r.value<std::int64_t>("stage origin"); }
  void restore(std::int64_t origin) noexcept { origin_ = origin; }

 protected:
  /// The stage's progress, in the loop's unit.
  [[nodiscard]] std::int64_t elapsed() const noexcept { return p_.clock.in(Loop::unit) - origin_; }

  Config cfg_;
  LoopParts<A, B> p_;
  std::int64_t origin_ = 0;  ///< the clock, in the loop's unit, when the stage began
};

}  // namespace anvil::loops
