// Diffusion Policy on Push-T from demonstrations, in four modes of one program
// (--experiment.mode=...; the other arguments are the Trainer's):
//
//   record  the scripted expert (envs/chipmunk/push_t_expert.hpp) records demonstrations to
//           an HDF5 file in robomimic's layout:
//             build/examples/diffusion_pusht --experiment.mode=record --experiment.file=data/pusht_demos.hdf5
//           --env.observation=image records the paper's image variant instead: the field
//           drawn at 96x96 RGB (--env.image_size; key 'image', [T, 96, 96, 3] uint8, gzip)
//           beside agent_pos.
//   train   Diffusion Policy (or --diffusion.objective=mse, the BC baseline) on a demo file,
//           evaluated with its EMA weights on Push-T by the published protocol (return =
//           the best reward of each episode; success = coverage above 95%):
//             build/examples/diffusion_pusht --config configs/diffusion_pusht_cpu.yaml
//           --experiment.precision=bf16 trains with BF16 autocast; --nproc_per_node=N with DDP.
//           --env.observation=image trains on image demonstrations and acts on the image
//           variant (a small CNN per step's image, random crops):
//             build/examples/diffusion_pusht --config configs/diffusion_pusht_image_cpu.yaml
//   expert  evaluates the expert itself on the test seeds (the demonstrator's own score), and
//           two references: the pusher held still, and a random walk of the commanded point.
//   eval    evaluates a trained run's last checkpoint on the test seeds (--experiment.run),
//           with the run's own settings and precision (the Trainer's keys given here go over
//           them: --device=cpu, say).
//
// `--smoke` alone (with --env.observation=image: of images) records a few demonstrations of its own, trains on them for seconds and
// evaluates the run: every stage in order, as a first try. Test seeds: 100000 + i, as the
// published evaluation (50 of them by default).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

#include <anvil/algorithms/diffusion_policy.hpp>
#include <anvil/buffers/demo_dataset.hpp>
#include <anvil/data/demonstrations.hpp>
#include <anvil/envs/chipmunk/push_t.hpp>
#include <anvil/envs/chipmunk/push_t_expert.hpp>
#include <anvil/envs/chipmunk/push_t_score.hpp>
#include <anvil/envs/chipmunk/push_t_view.hpp>
#include <anvil/envs/multi_step.hpp>
#include <anvil/parallel/ddp.hpp>
#include <anvil/precision/bf16.hpp>
#include <anvil/train/hooks/checkpoint.hpp>
#include <anvil/train/start.hpp>
#include <anvil/train/trainer.hpp>

namespace {

using anvil::envs::chipmunk::PushT;
using anvil::envs::chipmunk::PushTExpert;

struct Experiment {
  anvil::Param<std::string, "mode", "record, train, expert or eval"> mode{"train"};
  anvil::Param<std::string, "precision",
               "fp32 or bf16 (train: fp32, or a resumed run's own; eval: the run's own, when not given)">
      precision{""};
  anvil::Param<int, "demos", "successful demonstrations to record (record)", anvil::at_least(1)> demos{200};
  anvil::Param<std::string, "file", "the demonstration file written (record)"> file{"data/pusht_demos.hdf5"};
  anvil::Param<std::int64_t, "seed", "first seed of the recorded episodes (record)", anvil::at_least(0)> seed{0};
  anvil::Param<double, "expert_detour",
               "chance the expert goes round the block the longer way when the shorter turns over a quarter circle: a "
               "person's either-way choice (record, expert; 0: one choice a state)",
               anvil::in_range(0, 1)>
      expert_detour{0.0};
  anvil::Param<double, "expert_choice",
               "the expert picks at random among pushes whose gain is within this fraction of the best's (record, "
               "expert; 0: always the best)",
               anvil::in_range(0, 1)>
      expert_choice{0.0};
  anvil::Param<int, "test_episodes", "test seeds 100000 .. 100000 + n - 1 (expert, eval)", anvil::at_least(1)> test_episodes{50};
  anvil::Param<std::string, "run", "a training run's directory (eval)"> run{""};
};
struct ExperimentConfig {
  anvil::Section<"experiment", Experiment> experiment;
};

template <class X>
using DpTrainer = anvil::Trainer<anvil::DiffusionPolicy, anvil::DemoDataset, anvil::DDPAuto, X>;

using anvil::envs::ObservationKind;
using anvil::envs::VecEnvConfig;

/// Calls `f` with Push-T in the wrapper the policy acts through: the state env, or the image
/// variant at env.image_size (env.observation=image).
template <class F>
decltype(auto) with_pusht_env(const anvil::DiffusionPolicy::Config& c, const VecEnvConfig& env, F&& f) {
  if (*env.frame_stack > 0 || *env.action_repeat > 0)
    throw anvil::ConfigError("env.frame_stack and env.action_repeat: Push-T takes neither (its frames are the policy's "
                             "diffusion.obs_horizon; each action chunk's steps are diffusion.action_horizon)");
  if (*env.observation == ObservationKind::image)
    return f(anvil::envs::MultiStep<anvil::envs::chipmunk::PushTImage>(
        anvil::envs::chipmunk::PushTImage(env.image_size_or(96), PushT::Reward::best_gain), c.obs_horizon, c.action_horizon));
  return f(anvil::envs::MultiStep<PushT>(PushT(PushT::Reward::best_gain), c.obs_horizon, c.action_horizon));
}

// The env section of the Trainer's keys in `args` (record mode reads env.observation and
// env.image_size from them).
VecEnvConfig env_section(const anvil::Args& args) {
  DpTrainer<anvil::FP32>::Config t;
  anvil::apply_settings(t, args.settings);
  return *t.env;
}

// The expert as the experiment section asks: one choice a state, or a person's variety.
PushTExpert::Options expert_options(const Experiment& e) {
  PushTExpert::Options o;
  o.detour = e.expert_detour;
  o.choice = e.expert_choice;
  return o;
}

int record(const Experiment& e, const VecEnvConfig& env_cfg, bool quiet = false) {
  const bool image = *env_cfg.observation == ObservationKind::image;
  anvil::Demonstrations d;
  d.env_name = std::string(PushT::name);
  d.act_dim = 2;
  if (image) {
    d.layout = anvil::envs::chipmunk::push_t_image_layout(env_cfg.image_size_or(96));
    d.obs_dim = d.layout.row_bytes();
  } else {
    d.obs_parts = {{"keypoints", 2 * PushT::kNumKeypoints}, {"agent_pos", 2}};
    d.obs_dim = PushT::kObsDim;
  }
  const PushTExpert expert(expert_options(e));
  PushT env;
  auto canvas = anvil::envs::chipmunk::push_t_canvas(env_cfg.image_size_or(96));
  int tried = 0;
  for (std::uint64_t seed = static_cast<std::uint64_t>(*e.seed); d.episodes() < e.demos; ++seed, ++tried) {
    std::vector<float> o, a;
    std::vector<std::uint8_t> rows;
    const bool ok = expert.run(env, seed, [&](std::span<const float> obs, std::span<const float> act) {
      if (image) {  // the env as it is now: the expert records before it steps
        rows.resize(rows.size() + static_cast<std::size_t>(d.obs_dim), 0);
        anvil::envs::chipmunk::push_t_image_row(canvas, env, rows.data() + rows.size() - d.obs_dim);
      } else {
        o.insert(o.end(), obs.begin(), obs.end());
      }
      a.insert(a.end(), act.begin(), act.end());
    });
    if (!ok) continue;  // demonstrations of success only, as people record them
    const auto t = static_cast<std::int64_t>(a.size() / 2);
    std::vector<float> r(static_cast<std::size_t>(t), 0.0f);
    std::vector<std::uint8_t> dn(static_cast<std::size_t>(t), 0);
    r.back() = 1.0f;
    dn.back() = 1;
    if (image) d.add_episode_rows(rows, a, r, dn);
    else d.add_episode(o, a, r, dn);
  }
  const std::filesystem::path file(*e.file);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  anvil::write_demonstrations(file, d);
  if (!quiet)
    std::printf("recorded %lld demonstrations (%lld steps; the expert succeeded in %lld of %d episodes) to %s\n",
              static_cast<long long>(d.episodes()), static_cast<long long>(d.steps()), static_cast<long long>(d.episodes()), tried,
              file.c_str());
  return 0;
}

// The expert on the test seeds: mean best reward (the published score) and success rate.
int expert_score(const Experiment& e) {
  const PushTExpert expert(expert_options(e));
  double score = 0, success = 0;
  for (int i = 0; i < e.test_episodes; ++i) {
    PushT env;
    success += expert.run(env, 100000 + static_cast<std::uint64_t>(i), {});
    score += env.best_reward();
  }
  std::printf("{\"policy\": \"expert\", \"test_episodes\": %d, \"score\": %.4f, \"success\": %.4f}\n", *e.test_episodes,
              score / e.test_episodes, success / e.test_episodes);
  // Two references that know nothing: the pusher held still (the start's own coverage), and
  // the commanded point on a random walk of up to 20 pixels a step per axis.
  double still = 0, walk = 0, walk_success = 0;
  anvil::Rng rng(7);
  for (int i = 0; i < e.test_episodes; ++i) {
    PushT a, b;
    a.reset(100000 + static_cast<std::uint64_t>(i));
    b.reset(100000 + static_cast<std::uint64_t>(i));
    const auto st = a.state();
    const std::array<float, 2> hold{static_cast<float>(st.agent_x), static_cast<float>(st.agent_y)};
    for (int t = 0; t < PushT::kMaxEpisodeSteps && !a.step(hold).terminated; ++t) {
    }
    auto target = hold;
    for (int t = 0; t < PushT::kMaxEpisodeSteps; ++t) {
      for (auto& x : target) x = std::clamp(x + static_cast<float>(rng.uniform(-20, 20)), 0.0f, static_cast<float>(PushT::kField));
      if (b.step(target).terminated) {
        walk_success += 1;
        break;
      }
    }
    still += a.best_reward();
    walk += b.best_reward();
  }
  std::printf("{\"policy\": \"still\", \"test_episodes\": %d, \"score\": %.4f, \"success\": 0}\n", *e.test_episodes, still / e.test_episodes);
  std::printf("{\"policy\": \"random_walk\", \"test_episodes\": %d, \"score\": %.4f, \"success\": %.4f}\n", *e.test_episodes,
              walk / e.test_episodes, walk_success / e.test_episodes);
  return 0;
}

// The latest checkpoint in a run directory.
std::filesystem::path latest_checkpoint(const std::filesystem::path& dir) {
  const auto best = anvil::Checkpoints::latest(dir);
  if (best.empty()) throw anvil::ConfigError("experiment.run: '" + dir.string() + "' holds no checkpoint");
  return best;
}

// The precision a run was trained in, from its latest checkpoint ("" when it has none).
std::string run_precision(const std::filesystem::path& dir) {
  const auto ckpt = anvil::Checkpoints::latest(dir);
  return ckpt.empty() ? "" : anvil::Checkpoints::identity(ckpt).precision;
}

// A trained run's policy (its EMA weights when it kept an average) on the test seeds, all
// episodes at once: the mean best reward (the published score) and the success rate. The
// run's config.yaml gives the settings; the Trainer's keys in `args` go over them.
template <class X>
int evaluate_run(const Experiment& e, const anvil::Args& args) {
  using Trainer = DpTrainer<X>;
  typename Trainer::Config t;
  auto settings = anvil::load_yaml_file((std::filesystem::path(*e.run) / "config.yaml").string());
  settings.insert(settings.end(), args.settings.begin(), args.settings.end());
  std::erase_if(settings, [](const anvil::Setting& s) {
    return s.key.starts_with("parallel.") || s.key == "nproc_per_node" || s.key == "smoke" || s.key == "run.smoke";
  });
  anvil::apply_settings(t, settings);
  t.parallel->nproc_per_node = 1;  // the evaluation is one process
  t.run->resume = latest_checkpoint(*e.run).string();
  t.run->run_dir = (std::filesystem::temp_directory_path() / ("anvil_diffusion_eval_" + std::to_string(::getpid()))).string();
  t.run->progress = anvil::ProgressMode::off;
  t.run->tensorboard = false;
  anvil::exit_if_print_config(args, t);  // --print-config: the config the evaluation runs with
  return with_pusht_env(*t.algorithm, *t.env, [&](const auto& env) {
    Trainer trainer(env, t, "diffusion_pusht");
    trainer.begin();
    auto& dp = trainer.algorithm();
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = anvil::envs::chipmunk::score_on_test_seeds(env, e.test_episodes, [&](auto obs, int n) {
      using Element = typename decltype(obs)::element_type;
      const auto rows = at::from_blob(const_cast<std::remove_const_t<Element>*>(obs.data()), {n, static_cast<std::int64_t>(obs.size()) / n},
                                      std::is_same_v<std::remove_const_t<Element>, float> ? at::kFloat : at::kByte);
      const at::Tensor unit = dp.with_ema_weights([&] { return dp.act(rows, anvil::ActMode::deterministic); }).to(at::kCPU).contiguous();
      return std::vector<float>(unit.data_ptr<float>(), unit.data_ptr<float>() + unit.numel());
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"policy\": \"%s\", \"observation\": \"%s\", \"run\": \"%s\", \"updates\": %lld, \"test_episodes\": %d, "
                "\"score\": %.4f, \"success\": %.4f, \"seconds_per_chunk_batch\": %.4f}\n",
                anvil::enum_text(*t.algorithm->objective).c_str(), *t.env->observation == ObservationKind::image ? "image" : "state",
                e.run->c_str(), static_cast<long long>(trainer.updates()), *e.test_episodes, r.score, r.success,
                seconds / static_cast<double>(r.calls));
    std::error_code ec;
    std::filesystem::remove_all(trainer.run_dir(), ec);
    return 0;
  });
}

template <class X>
int train(const anvil::Args& args, Experiment e) {
  using Trainer = DpTrainer<X>;
  typename Trainer::Config defaults;
  defaults.parallel->nproc_per_node = 1;  // one process unless more ranks are asked for
  auto cfg = anvil::start<Trainer>(args, defaults);
  // A smoke run with no demonstrations records a few of its own (in a file of this
  // process's: each rank records its own), trains on them and evaluates the run.
  const bool own_demos = *cfg.run->smoke && cfg.train->dataset->empty();
  if (own_demos) {
    e.demos = 3;
    e.file = (std::filesystem::temp_directory_path() / ("anvil_pusht_smoke_" + std::to_string(::getpid()) + ".hdf5")).string();
    record(e, *cfg.env, /*quiet=*/true);
    cfg.train->dataset = *e.file;
  }
  const auto [rank, run_dir] = with_pusht_env(*cfg.algorithm, *cfg.env, [&](const auto& env) {
    Trainer trainer(env, cfg, "diffusion_pusht");
    trainer.fit();
    return std::pair{trainer.context().rank, trainer.run_dir()};
  });
  if (own_demos) {
    if (rank == 0) {
      std::printf("smoke: trained on 3 demonstrations recorded by the expert; the run on 2 test seeds:\n");
      std::fflush(stdout);
      e.run = run_dir.string();
      e.test_episodes = 2;
      evaluate_run<X>(e, anvil::Args{});
    }
    std::filesystem::remove(*e.file);
  }
  return 0;
}

// The precision of a mode that may continue or evaluate a run: the one given, else the
// run's own (`dir`'s latest checkpoint), else fp32.
std::string precision_for(const Experiment& e, const std::filesystem::path& dir) {
  if (!e.precision->empty()) return *e.precision;
  const auto p = dir.empty() ? std::string() : run_precision(dir);
  return p.empty() ? "fp32" : p;
}



}  // namespace

int main(int argc, char** argv) {
  // --experiment.* are this program's; the rest go to the Trainer.
  const auto [args, own] = anvil::start_with_section<ExperimentConfig>(argc, argv, "experiment");
  const Experiment& e = *own.experiment;
  try {
    if (*e.mode == "record" || *e.mode == "expert") {  // no Trainer: --print-config prints the experiment section
      const auto env = env_section(args);
      anvil::exit_if_print_config(args, own);
      return *e.mode == "record" ? record(e, env) : expert_score(e);
    }
    if (*e.mode == "eval") {
      if (e.run->empty()) throw anvil::ConfigError("experiment.run: name the training run's directory to evaluate (experiment.mode=eval)");
      const auto precision = precision_for(e, *e.run);
      if (precision == "bf16") return evaluate_run<anvil::BF16>(e, args);
      if (precision == "fp32") return evaluate_run<anvil::FP32>(e, args);
      throw anvil::ConfigError("experiment.precision: '" + precision + "' is neither fp32 nor bf16");
    }
    if (*e.mode == "train") {
      const auto precision = precision_for(e, anvil::resumed_run_dir<DpTrainer<anvil::FP32>::Config>(args));
      if (precision == "bf16") return train<anvil::BF16>(args, e);
      if (precision == "fp32") return train<anvil::FP32>(args, e);
      throw anvil::ConfigError("experiment.precision: '" + precision + "' is neither fp32 nor bf16");
    }
    throw anvil::ConfigError("experiment.mode: '" + *e.mode + "' is not one of record, train, expert, eval");
  } catch (const anvil::Error& err) {
    std::fprintf(stderr, "error: %s\n", err.what());
    return 2;
  }
}
