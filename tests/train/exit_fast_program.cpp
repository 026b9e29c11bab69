// exit_fast_program RUN_DIR: begins a run, collects, updates, writes a row, then records an
// evaluation (training.log and TensorBoard lines that nothing flushes yet) and ends with
// anvil::exit_fast without finishing the run. tests/examples/exit_fast_check.py then reads
// the run's files: exit_fast must have flushed everything anvil wrote.
#include <anvil/compiled.hpp>

#include <string>

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::SAC, anvil::UniformBuffer>;
  Trainer::Config c;
  c.run->run_dir = argc > 1 ? argv[1] : "runs/exit_fast";
  c.run->progress = anvil::ProgressMode::off;
  c.train->steps = 1000;
  c.train->learning_starts = 200;
  c.algorithm->actor->hidden = {16, 16};
  c.algorithm->critic->hidden = {16, 16};
  Trainer t(anvil::envs::Pendulum{}, c);
  t.begin();
  t.collect(400);
  t.update(50);
  t.log();
  t.record_evaluation(t.evaluate(2));  // its lines are the last written
  anvil::exit_fast(0);
}
