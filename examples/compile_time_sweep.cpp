// A sweep over Trainer types, unrolled at compile time: each combination of policies is its
// own type, trained briefly on Pendulum with the same settings, then a table of env steps/s
// and final evaluation return. Add a type to the list to add a row. The Trainers are the
// prebuilt ones (anvil::compiled): three types cost no more compile time than one. A type
// the library does not hold is built by including <anvil/train/compiled_trainer_impl.hpp>
// and saying ANVIL_COMPILED_TRAINER(...) for it (train/compiled_trainer.hpp).
#include <anvil/compiled.hpp>
#include <anvil/observe/progress.hpp>

#include <cstdio>
#include <string>
#include <tuple>

using namespace anvil;

template <class T>
struct Named {
  using Trainer = T;
  const char* name;
};

int main(int argc, char** argv) {
  const auto args = start(argc, argv);  // BLAS kernels, error handler, the command line (e.g. --smoke)
  const auto sweep =
      std::make_tuple(Named<compiled::Trainer<SAC, UniformBuffer>>{"SAC + UniformBuffer + FP32"},
                      Named<compiled::Trainer<SAC, PrioritizedBuffer>>{"SAC + PrioritizedBuffer + FP32"},
                      Named<compiled::Trainer<SAC, UniformBuffer, SingleDevice, BF16>>{"SAC + UniformBuffer + BF16"});
  std::string table;
  int row_index = 0;
  std::apply(
      [&](const auto&... entry) {
        auto run = [&](const auto& e) {
          using T = typename std::remove_cvref_t<decltype(e)>::Trainer;
          typename T::Config defaults;  // the same short run for every row
          defaults.train->steps = 6'000;
          defaults.train->eval_interval = 0;
          defaults.run->progress = ProgressMode::off;
          defaults.run->checkpoint_interval = 0;
          defaults.algorithm->actor->hidden = {64, 64};
          defaults.algorithm->critic->hidden = {64, 64};
          defaults.algorithm->actor_lr = 1e-3;
          defaults.algorithm->critic_lr = 1e-3;
          defaults.algorithm->alpha_lr = 1e-3;
          auto cfg = start<T>(args, defaults);  // --help and bad input answered for the first type
          // Each row is a run of its own: the first in --run_dir, the others in directories in it.
          if (!cfg.run->run_dir->empty() && row_index > 0)
            cfg.run->run_dir = *cfg.run->run_dir + "/row-" + std::to_string(row_index);
          ++row_index;
          T trainer(envs::Pendulum{}, cfg, "compile_time_sweep");
          const auto r = trainer.fit();
          char row[128];
          std::snprintf(row, sizeof row, "%-32s %12.0f %12s\n", e.name,
                        static_cast<double>(r.env_steps) / r.wall_seconds, metric_text(r.final_eval_return).c_str());
          table += row;
        };
        (run(entry), ...);
      },
      sweep);
  std::printf("\n%-32s %12s %12s\n%s", "trainer", "env steps/s", "eval return", table.c_str());
}
