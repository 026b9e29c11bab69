// The main job as benchmarks/vs_rltools.sh times it, whole process included: the same
// Trainer and defaults as examples/train_sac_pendulum.cpp (the benchmark passes RLtools'
// settings on the command line), linked in the fast-start library order
// (cmake/anvil_fast_start.cmake) and ended by anvil::exit_fast, which skips the libraries'
// teardown at exit. Both are opt-in, for programs whose start and exit are timed: about
// 0.1 s of a 2 s run. Its own main, so that benchmark timings stay comparable however the
// examples change.
#include <anvil/compiled.hpp>

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::SAC, anvil::UniformBuffer>;
  Trainer::Config defaults;
  defaults.train->steps = 20'000;
  defaults.train->eval_interval = 2'000;
  defaults.algorithm->actor_lr = 1e-3;
  defaults.algorithm->critic_lr = 1e-3;
  defaults.algorithm->alpha_lr = 1e-3;
  Trainer trainer(anvil::envs::Pendulum{}, anvil::start<Trainer>(argc, argv, defaults));
  trainer.fit();
  anvil::exit_fast();  // the run's files are flushed first (anvil's flush registry)
}
