// A main that runs the loop itself, on an environment written here. The Trainer still owns
// the envs, the buffer, the algorithm and the run directory; this program decides when to
// collect, update, evaluate and save. The Trainer is prebuilt (anvil::compiled) and the env
// goes through its door (envs::AnyEnv) in this file, so it compiles in seconds.
#include <anvil/compiled.hpp>

#include <array>
#include <cmath>
#include <cstdio>

// A point mass on a line, pushed by a bounded force, that must come to rest at the origin.
// Observation: position and velocity; action: force in [-1, 1]; reward: -(x^2 + 0.1 v^2 +
// 0.01 a^2); 200 steps per episode (then truncated). Any struct with these members is an env.
struct PointMass {
  static constexpr std::string_view name = "PointMass";
  static constexpr double kDt = 0.05;

  anvil::envs::Box observation_space() const { return {{-10.0f, -10.0f}, {10.0f, 10.0f}}; }
  anvil::envs::Box action_space() const { return {{-1.0f}, {1.0f}}; }

  std::span<const float> reset(std::uint64_t seed) {
    anvil::Rng rng(seed);
    x_ = rng.uniform(-2.0, 2.0);
    v_ = 0.0;
    t_ = 0;
    return observe();
  }
  anvil::envs::StepResult step(std::span<const float> action) {
    const double a = std::clamp(static_cast<double>(action[0]), -1.0, 1.0);
    const double reward = -(x_ * x_ + 0.1 * v_ * v_ + 0.01 * a * a);
    v_ = std::clamp(v_ + a * kDt, -10.0, 10.0);
    x_ = std::clamp(x_ + v_ * kDt, -10.0, 10.0);
    ++t_;
    return {observe(), reward, /*terminated=*/false, /*truncated=*/t_ >= 200};
  }

 private:
  std::span<const float> observe() {
    obs_ = {static_cast<float>(x_), static_cast<float>(v_)};
    return obs_;
  }
  double x_ = 0, v_ = 0;
  int t_ = 0;
  std::array<float, 2> obs_{};
};
static_assert(anvil::envs::Env<PointMass>);

int main(int argc, char** argv) {
  using Trainer = anvil::compiled::Trainer<anvil::SAC, anvil::UniformBuffer>;
  Trainer::Config defaults;
  defaults.train->steps = 12'000;
  defaults.algorithm->actor->hidden = {64, 64};
  defaults.algorithm->critic->hidden = {64, 64};
  defaults.algorithm->actor_lr = 1e-3;
  defaults.algorithm->critic_lr = 1e-3;
  // anvil::start answers --help and bad input (exit 0 / 2) and, for DDP, launches the ranks.
  Trainer trainer(PointMass{}, anvil::start<Trainer>(argc, argv, defaults));

  const auto& cfg = trainer.config();
  const std::int64_t steps = cfg.train->steps, chunk = 1'000;
  trainer.begin();  // the run directory (and a resume, with --resume)
  trainer.collect(cfg.train->learning_starts);  // random actions first
  std::printf("%8s  %10s  %8s\n", "env step", "eval", "updates");
  while (trainer.env_steps() < steps) {
    const auto before = trainer.env_steps();
    trainer.collect(std::min(chunk, steps - before));
    trainer.update(static_cast<int>(trainer.env_steps() - before));  // one update per env step
    const auto r = trainer.evaluate(cfg.train->eval_episodes);
    trainer.record_evaluation(r);
    trainer.log();  // a row in metrics.csv, training.log and TensorBoard
    std::printf("%8lld  %10.2f  %8lld\n", static_cast<long long>(trainer.env_steps()), r.mean,
                static_cast<long long>(trainer.updates()));
  }
  // A checkpoint of our own (Trainer::load_checkpoint(file) continues from it), then the
  // end of the run: last log row, checkpoint, summary.json.
  trainer.save_checkpoint(trainer.run_dir() / "point_mass.ckpt");
  trainer.finish();
}
