#pragma once
/// @file
/// The definitions of `anvil::compiled::Trainer` (train/compiled_trainer.hpp): included by
/// the `anvil::compiled` library's sources, by `<anvil/compiled.hpp>` in a header-only
/// build, and by a program's own translation unit that builds a combination the library
/// does not hold (any env goes through `envs::AnyEnv`: nothing is built per env):
///
///     #include <anvil/train/compiled_trainer_impl.hpp>
///     ANVIL_COMPILED_TRAINER(anvil::SAC, anvil::UniformBuffer, anvil::SingleDevice, anvil::TF32)
///
/// It includes the classes of the algorithms whose loop `compiled::loop_of` names (SAC,
/// MultiTaskSAC, DiscreteSAC, PPO, RecurrentPPO) and their buffers; a combination with other
/// policies includes theirs too.

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <anvil/algorithms/discrete_sac.hpp>
#include <anvil/algorithms/ppo.hpp>
#include <anvil/algorithms/recurrent_ppo.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/prioritized_buffer.hpp>
#include <anvil/buffers/rollout_buffer.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/train/compiled_trainer.hpp>
#include <anvil/train/loops/off_policy.hpp>
#include <anvil/train/loops/on_policy.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/trainer.hpp>

namespace anvil::compiled {

template <class A, class B, class P, class X, class L>
auto Trainer<A, B, P, X, L>::start_config(const Args& args, Config defaults) -> Config {
  return anvil::start<Full>(args, std::move(defaults));
}

template <class A, class B, class P, class X, class L>
auto Trainer<A, B, P, X, L>::configure(const Args& args, Config defaults) -> Config {
  return anvil::configure<Config>(detail::with_resumed_run(args, defaults), std::move(defaults));
}

template <class A, class B, class P, class X, class L>
std::string Trainer<A, B, P, X, L>::help(const std::string& program, const Config& defaults) {
  return help_text<Config>(program, defaults);
}

template <class A, class B, class P, class X, class L>
Trainer<A, B, P, X, L>::Trainer(const envs::AnyEnv& env, Config cfg, std::string program)
    : impl_(std::make_unique<Full>(env, std::move(cfg), std::move(program))) {}

template <class A, class B, class P, class X, class L>
Trainer<A, B, P, X, L>::Trainer(Trainer&&) noexcept = default;

template <class A, class B, class P, class X, class L>
auto Trainer<A, B, P, X, L>::operator=(Trainer&&) noexcept -> Trainer& = default;

template <class A, class B, class P, class X, class L>
Trainer<A, B, P, X, L>::~Trainer() = default;

template <class A, class B, class P, class X, class L>
FitResult Trainer<A, B, P, X, L>::fit() {
  return impl_->fit();
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::begin() {
  impl_->begin();
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::collect(std::int64_t n) {
  if constexpr (StepwiseLoop<typename Full::Runner>) {
    impl_->collect(n);
  } else {
    (void)n;
    throw Error("collect: the " + std::string(L::name) + " loop does not step a given number of env steps; use fit()");
  }
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::update(int n) {
  if constexpr (StepwiseLoop<typename Full::Runner>) {
    impl_->update(n);
  } else {
    (void)n;
    throw Error("update: the " + std::string(L::name) + " loop does not take a given number of updates; use fit()");
  }
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::log() {
  impl_->log();
}

template <class A, class B, class P, class X, class L>
FitResult Trainer<A, B, P, X, L>::finish() {
  return impl_->finish();
}

template <class A, class B, class P, class X, class L>
EvalResult Trainer<A, B, P, X, L>::evaluate(int episodes) {
  return impl_->evaluate(episodes);
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::record_evaluation(const EvalResult& r) {
  impl_->record_evaluation(r);
}

template <class A, class B, class P, class X, class L>
std::int64_t Trainer<A, B, P, X, L>::env_steps() const noexcept {
  return impl_->env_steps();
}

template <class A, class B, class P, class X, class L>
std::int64_t Trainer<A, B, P, X, L>::updates() const noexcept {
  return impl_->updates();
}

template <class A, class B, class P, class X, class L>
const EvalResult& Trainer<A, B, P, X, L>::last_evaluation() const noexcept {
  return impl_->last_evaluation();
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::save_checkpoint(const std::filesystem::path& file) {
  impl_->save_checkpoint(file);
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::load_checkpoint(const std::filesystem::path& file) {
  impl_->load_checkpoint(file);
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::save_policy(const std::filesystem::path& file) const {
  if constexpr (ExportsPolicy<A>) {
    impl_->save_policy(file);
  } else {
    throw Error("save_policy: " + std::string(A::config_section.view()) +
                " writes no policy file of its own (anvil::ExportsPolicy); its checkpoints hold it");
  }
}

template <class A, class B, class P, class X, class L>
void Trainer<A, B, P, X, L>::export_policy(const std::filesystem::path& dir) const {
  if constexpr (ExportsPolicy<A> || ExportsTensors<A>) {
    impl_->export_policy(dir);
  } else {
    throw Error("export_policy: " + std::string(A::config_section.view()) + " writes no policy file; its checkpoints hold it");
  }
}

template <class A, class B, class P, class X, class L>
const PhaseTimes& Trainer<A, B, P, X, L>::times() const noexcept {
  return impl_->times();
}

template <class A, class B, class P, class X, class L>
std::string Trainer<A, B, P, X, L>::device() const {
  return impl_->context().device.str();
}

template <class A, class B, class P, class X, class L>
auto Trainer<A, B, P, X, L>::config() const noexcept -> const Config& {
  return impl_->config();
}

template <class A, class B, class P, class X, class L>
const std::filesystem::path& Trainer<A, B, P, X, L>::run_dir() const noexcept {
  return impl_->run_dir();
}

}  // namespace anvil::compiled

/// Builds `compiled::Trainer<A, B, P, X>` in this translation unit (every env goes through
/// `envs::AnyEnv`, so nothing is built per env).
#define ANVIL_COMPILED_TRAINER(A, B, P, X) template class ::anvil::compiled::Trainer<A, B, P, X>;
