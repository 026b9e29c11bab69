// Collective distillation on the MuJoCo manipulation suite, in the modes of one program
// (--experiment.mode=...; every other argument is the Trainer's, and every mode resumes
// with --resume=auto):
//
//   train_worker   a SAC expert on one task that also fills the collective dataset: every
//                  collective.sampling_interval env steps after collective.start it copies
//                  the newest collective.samples transitions aside; at the end they are
//                  labelled with the expert's mean, log-std and Q-target and appended to the
//                  dataset (experiment.dataset) as the task's:
//                    build/examples/collective --experiment.mode=train_worker --env.tasks=reach
//   distill_collective_transformer
//                  the collective Transformer on that dataset (the clock counts gradient
//                  steps), evaluated as a policy on every task it was distilled from;
//                  --experiment.precision=bf16, --nproc_per_node=N (DDP), --train.grad_accumulation:
//                    build/examples/collective --experiment.mode=distill_collective_transformer
//   train_student  an online SAC on one task whose reward is shaped by the collective's
//                  likelihood of its actions (student.shaping.*; weight 0: plain SAC):
//                    build/examples/collective --experiment.mode=train_student --env.tasks=window-open
//                        --student.shaping.collective=runs/<distill run>/policy.bin
//   staged         distill, then the student shaped by what was just distilled, as one
//                  resumable run (Staged<OfflineLoop, OffPolicyLoop>).
//   merge          appends datasets (--experiment.merge=a.hdf5,b.hdf5) to experiment.dataset:
//                  workers that ran at once, each into a file of its own.
//
// `--smoke` with no mode runs the stages in order for seconds each, as a first try: a worker
// on one task (reach, unless --env.tasks names one) fills a dataset in its run directory, the
// collective is distilled from it, and a student is shaped by that collective.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <anvil/algorithms/collective_distillation.hpp>
#include <anvil/algorithms/collective_student.hpp>
#include <anvil/algorithms/collective_worker.hpp>
#include <anvil/algorithms/sac.hpp>
#include <anvil/buffers/collective_dataset.hpp>
#include <anvil/buffers/collective_replay.hpp>
#include <anvil/buffers/uniform_buffer.hpp>
#include <anvil/envs/history.hpp>
#include <anvil/envs/mujoco/manipulation.hpp>
#include <anvil/parallel/ddp.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/train/loops/staged.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/trainer.hpp>

namespace {

using anvil::envs::mujoco::Manipulation;
using HistoryEnv = anvil::envs::History<Manipulation>;

struct Experiment {
  anvil::Param<std::string, "mode",
               "train_worker, distill_collective_transformer, train_student, staged or merge (none: train_worker; with "
               "--smoke, the stages in order)">
      mode{""};
  anvil::Param<std::string, "dataset",
               "the collective dataset (HDF5) workers append to and distillation reads (empty: collective.hdf5 in the "
               "worker's run directory)">
      dataset{"data/collective.hdf5"};
  anvil::Param<std::string, "precision", "fp32 or bf16 (distill_collective_transformer)"> precision{"fp32"};
  anvil::Param<std::vector<std::string>, "merge", "collective datasets to append to experiment.dataset (merge)"> merge{};
};
struct ExperimentConfig {
  anvil::Section<"experiment", Experiment> experiment;
};

// The settings of configs/reach_cpu.yaml (benchmarks/RESULTS.md): small networks, gamma 0.95,
// a small initial temperature, learning rates 1e-3.
void worker_defaults(anvil::SAC::Config& s) {
  s.gamma = 0.95;
  s.init_alpha = 0.1;
  s.actor_lr = 1e-3;
  s.critic_lr = 1e-3;
  s.alpha_lr = 1e-3;
  s.actor->hidden = {128, 128};
  s.critic->hidden = {128, 128};
}

template <class Cfg>
void run_defaults(Cfg& c) {
  if constexpr (requires { c.parallel->nproc_per_node; }) c.parallel->nproc_per_node = 1;
  c.run->threads = 1;
}

// A worker's or a student's run: 60K env steps on 4 envs, evaluated every 5K.
template <class Cfg>
void online_defaults(Cfg& c, anvil::SAC::Config& sac) {
  run_defaults(c);
  c.env->num_envs = 4;
  c.train->steps = 60'000;
  c.train->learning_starts = 2'000;
  c.train->eval_interval = 5'000;
  c.run->checkpoint_interval = 10'000;
  worker_defaults(sac);
}

// The only task of a worker or student run (its name tags the dataset's rows).
std::string one_task(const std::vector<std::string>& tasks, const char* mode) {
  if (tasks.size() != 1)
    throw anvil::ConfigError(std::string("env.tasks: ") + mode + " trains on one task; name it (e.g. --env.tasks=reach)");
  return tasks.front();
}

// Returns the dataset it appended to (rank 0; empty on the others).
std::filesystem::path train_worker(const anvil::Args& args, const Experiment& e) {
  using Trainer = anvil::Trainer<anvil::SAC, anvil::CollectiveTap<>, anvil::DDPAuto>;
  Trainer::Config d;
  online_defaults(d, *d.algorithm);
  d.run->checkpoint_buffer = true;  // the copies are buffer state
  auto cfg = anvil::start<Trainer>(args, d);
  const auto task = one_task(*cfg.env->tasks, "train_worker");
  Trainer trainer(Manipulation{}, cfg, "collective");
  trainer.fit();
  if (trainer.context().rank != 0) return {};
  const auto dataset = e.dataset->empty() ? trainer.run_dir() / "collective.hdf5" : std::filesystem::path(*e.dataset);
  const auto rows = anvil::finish_worker(trainer.algorithm(), trainer.buffer(), dataset.string(), task, cfg.run->seed);
  std::printf("collective: %lld transitions of %s labelled by the expert and appended to %s\n", static_cast<long long>(rows), task.c_str(),
              dataset.c_str());
  return dataset;
}

// The tasks a dataset holds (the distillation's envs).
std::vector<std::string> dataset_tasks(const std::string& file) { return anvil::CollectiveFile(file).tasks(); }

// Returns the run directory (its policy.bin is the collective).
template <class X>
std::filesystem::path distill(const anvil::Args& args, const Experiment& e) {
  using Trainer = anvil::Trainer<anvil::CollectiveDistillation, anvil::CollectiveDataset, anvil::DDPAuto, X>;
  typename Trainer::Config d;
  run_defaults(d);
  // On 2 cores: batches of 256 at 1e-3 (per sample, small batches learned faster here than
  // our users' 2048; on a GPU server, --distill.batch_size=2048 with --train.lr_scaling).
  d.train->dataset = *e.dataset;
  d.train->steps = 6'000;
  d.train->eval_interval = 2'000;
  d.train->eval_episodes = 30;
  d.train->update->ema_decay = 0.99;
  d.run->checkpoint_interval = 1'000;
  d.run->log_interval = 100;
  d.env->num_envs = 3;
  d.algorithm->history = 4;
  d.algorithm->batch_size = 256;
  d.algorithm->lr = 1e-3;
  auto cfg = anvil::start<Trainer>(args, d);
  if (cfg.env->tasks->empty() && cfg.env->suite->empty()) cfg.env->tasks = dataset_tasks(*cfg.train->dataset);
  Trainer trainer(HistoryEnv(Manipulation{}, cfg.algorithm->history, anvil::envs::mujoco::kObsDim), cfg, "collective");
  trainer.fit();
  return trainer.run_dir();
}

int train_student(const anvil::Args& args) {
  using Trainer = anvil::Trainer<anvil::CollectiveStudent, anvil::UniformBuffer>;
  Trainer::Config d;
  online_defaults(d, *d.algorithm->sac);
  d.algorithm->distill->history = 4;
  auto cfg = anvil::start<Trainer>(args, d);
  one_task(*cfg.env->tasks, "train_student");
  Trainer trainer(HistoryEnv(Manipulation{}, cfg.algorithm->distill->history, anvil::envs::mujoco::kObsDim), cfg, "collective");
  trainer.fit();
  return 0;
}

int staged(const anvil::Args& args, const Experiment& e) {
  using Trainer = anvil::Trainer<anvil::CollectiveStudent, anvil::CollectiveReplay, anvil::SingleDevice, anvil::FP32,
                                 anvil::Staged<anvil::OfflineLoop, anvil::OffPolicyLoop>>;
  Trainer::Config d;
  d.run->threads = 1;
  d.env->num_envs = 4;
  d.train->first->dataset = *e.dataset;
  d.train->first->steps = 6'000;
  d.train->first->eval_interval = 0;
  d.train->second->steps = 60'000;
  d.train->second->learning_starts = 2'000;
  d.train->second->eval_interval = 5'000;
  d.run->checkpoint_interval = 1'000;
  worker_defaults(*d.algorithm->sac);
  d.algorithm->distill->history = 4;
  d.algorithm->distill->batch_size = 256;
  d.algorithm->distill->lr = 1e-3;
  auto cfg = anvil::start<Trainer>(args, d);
  one_task(*cfg.env->tasks, "staged");
  Trainer trainer(HistoryEnv(Manipulation{}, cfg.algorithm->distill->history, anvil::envs::mujoco::kObsDim), cfg, "collective");
  trainer.fit();
  return 0;
}

// `args` with `key=value` set: over the user's settings (`over`) or under them.
anvil::Args with(anvil::Args args, const std::string& key, const std::string& value, bool over) {
  anvil::Setting s;
  s.key = key;
  s.values = {value};
  s.origin = "collective --smoke's stages";
  if (over) args.settings.push_back(std::move(s));
  else args.settings.insert(args.settings.begin(), std::move(s));
  return args;
}

// --smoke with no mode: the stages in order, each a run of seconds (see file comment). The
// user's settings go to every stage; its --run_dir, if any, holds the three runs.
int smoke_stages(const anvil::Args& args, Experiment e) {
  using Worker = anvil::Trainer<anvil::SAC, anvil::CollectiveTap<>, anvil::DDPAuto>;
  Worker::Config probe;
  try {
    probe = anvil::configure<Worker::Config>(args);
  } catch (const anvil::ConfigError&) {
  }
  const std::string root = probe.run->run_dir;
  const auto in_root = [&](anvil::Args a, const char* stage) {
    return root.empty() ? a : with(std::move(a), "run.run_dir", (std::filesystem::path(root) / stage).string(), true);
  };
  if (probe.env->tasks->empty()) std::printf("collective --smoke: no task named (--env.tasks); the worker and the student train on reach\n");
  const auto worker_args = in_root(with(args, "env.tasks", "reach", /*over=*/false), "worker");
  e.dataset = "";  // in the worker's run directory
  e.dataset = train_worker(worker_args, e).string();
  const auto collective = distill<anvil::FP32>(in_root(args, "distill"), e) / "policy.bin";
  train_student(in_root(with(with(args, "env.tasks", "reach", false), "student.shaping.collective", collective.string(), true), "student"));
  std::printf("collective --smoke: a worker filled %s, the collective distilled from it is %s, and a student trained with it\n",
              e.dataset->c_str(), collective.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --experiment.* are this program's; the rest go to the Trainer.
  const auto [args, own] = anvil::start_with_section<ExperimentConfig>(argc, argv, "experiment");
  const Experiment& e = *own.experiment;
  try {
    if (e.mode->empty() && anvil::asks_smoke(args)) return smoke_stages(args, e);
    if (e.mode->empty() || *e.mode == "train_worker") {
      train_worker(args, e);
      return 0;
    }
    if (*e.mode == "distill_collective_transformer" || *e.mode == "distill") {
      if (*e.precision == "bf16") distill<anvil::BF16>(args, e);
      else if (*e.precision == "fp32") distill<anvil::FP32>(args, e);
      else throw anvil::ConfigError("experiment.precision: '" + *e.precision + "' is neither fp32 nor bf16");
      return 0;
    }
    if (*e.mode == "train_student") return train_student(args);
    if (*e.mode == "staged") return staged(args, e);
    if (*e.mode == "merge") {  // workers that ran at once, each into its own file
      anvil::exit_if_print_config(args, own);  // no Trainer: --print-config prints the experiment section
      for (const auto& f : *e.merge) anvil::merge_collective(*e.dataset, f);
      std::printf("collective: %lld rows of %zu tasks in %s\n", static_cast<long long>(anvil::CollectiveFile(*e.dataset).rows()),
                  anvil::CollectiveFile(*e.dataset).tasks().size(), e.dataset->c_str());
      return 0;
    }
    throw anvil::ConfigError("experiment.mode: '" + *e.mode + "' is not one of train_worker, distill_collective_transformer, train_student, staged, merge");
  } catch (const anvil::Error& err) {
    std::fprintf(stderr, "error: %s\n", err.what());
    return 2;
  }
}
