// Tests of the config system: Param fields walked with Boost.PFR, the command line in both
// styles, YAML files, help, printing, hashing and every kind of bad input.
#include <anvil/core/config.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>


#include <array>
#include <filesystem>
#include <fstream>

namespace {

using anvil::Param;
using anvil::Section;

enum class Scaling { none, sqrt, linear };
constexpr auto enum_names(Scaling) { return std::array<std::string_view, 3>{"none", "sqrt", "linear"}; }

struct RunCfg {
  Param<std::uint64_t, "seed", "seed of every random stream"> seed{0};
  Param<std::string, "device", "cpu, cuda, cuda:N or auto"> device{"auto"};
  Param<bool, "smoke", "run for seconds only"> smoke{false};
};
struct AlgoCfg {
  Param<int, "batch_size", "samples per gradient step", anvil::at_least(1)> batch_size{256};
  Param<double, "gamma", "discount factor", anvil::in_range(0, 1)> gamma{0.99};
  Param<double, "lr", "learning rate", anvil::positive> lr{3e-4};
  Param<std::int64_t, "steps", "env steps", anvil::at_least(0)> steps{20000};
  Param<std::vector<int>, "hidden", "hidden layer widths", anvil::at_least(1)> hidden{256, 256};
  Param<Scaling, "lr_scaling", "how learning rates scale with the batch"> lr_scaling{Scaling::none};
  Param<int, "min_batch", "smallest batch", anvil::at_least(1)> min_batch{1};

  void validate() const {
    if (min_batch > batch_size)
      throw anvil::ConfigError("algo.min_batch (" + std::to_string(*min_batch) +
                               ") must not exceed algo.batch_size (" +
                               std::to_string(*batch_size) + ")");
  }
};
struct Cfg {
  Section<"run", RunCfg> run;
  Section<"algo", AlgoCfg> algo;
};

anvil::Args args(std::initializer_list<std::string> a) {
  std::vector<std::string> v{"prog"};
  v.insert(v.end(), a.begin(), a.end());
  return anvil::parse_args(v);
}

Cfg resolve(std::initializer_list<std::string> a) {
  Cfg c;
  anvil::apply_settings(c, args(a).settings);
  return c;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const anvil::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& text, const std::string& name = "run.yaml") {
    path = std::filesystem::temp_directory_path() /
           ("anvil_cfg_" + std::to_string(::getpid()) + "_" + name);
    std::ofstream(path) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("Config: designated initializers set fields and fields read as their values") {
  AlgoCfg c{.batch_size = 512, .lr = 1e-3, .hidden = {64, 64}};
  int b = c.batch_size;
  CHECK(b == 512);
  CHECK(*c.lr == doctest::Approx(1e-3));
  CHECK(c.hidden->size() == 2);
  CHECK(c.gamma == 0.99);
  static_assert(boost::pfr::tuple_size_v<AlgoCfg> == 7, "PFR sees every Param field");
}

TEST_CASE("Config: --help lists every field with its type, default, help and range") {
  const std::string h = anvil::help_text<Cfg>("prog");
  for (const char* key : {"run.seed", "run.device", "run.smoke", "algo.batch_size", "algo.gamma",
                          "algo.lr", "algo.steps", "algo.hidden", "algo.lr_scaling"})
    CHECK_MESSAGE(h.find(key) != std::string::npos, key);
  CHECK(h.find("samples per gradient step (>= 1)") != std::string::npos);
  CHECK(h.find("[256, 256]") != std::string::npos);
  CHECK(h.find("none|sqrt|linear") != std::string::npos);
  CHECK(h.find("discount factor ([0, 1])") != std::string::npos);
  CHECK(h.find("0.0003") != std::string::npos);
}

TEST_CASE("Config: overrides work as --key=value, --key value, key=value and bare --flag") {
  Cfg c = resolve({"--algo.batch_size=2048", "algo.gamma=0.9", "--algo.lr", "0.001", "--smoke",
                   "--seed", "7", "algo.lr_scaling=sqrt", "--algo.hidden=64,32"});
  CHECK(c.algo->batch_size == 2048);
  CHECK(c.algo->gamma == doctest::Approx(0.9));
  CHECK(c.algo->lr == doctest::Approx(0.001));
  CHECK(c.run->smoke == true);
  CHECK(c.run->seed == 7u);
  CHECK(*c.algo->lr_scaling == Scaling::sqrt);
  CHECK(*c.algo->hidden == std::vector<int>{64, 32});
}

TEST_CASE("Config: keys without a section mean the run section and dashes read as underscores") {
  Cfg c = resolve({"seed=3", "--device=cpu", "algo.batch-size=64"});
  CHECK(c.run->seed == 3u);
  CHECK(*c.run->device == "cpu");
  CHECK(c.algo->batch_size == 64);
}

TEST_CASE("Config: integers accept underscores and whole numbers in exponent form") {
  CHECK(resolve({"algo.steps=1_000_000"}).algo->steps == 1000000);
  CHECK(resolve({"algo.steps=2e5"}).algo->steps == 200000);
  CHECK(error_of([] { resolve({"algo.steps=2.5"}); }).find("expected an integer, got '2.5'") !=
        std::string::npos);
}

TEST_CASE("Config: a YAML file nested by section sets fields and the command line overrides it") {
  TempFile f(
      "# a run\n"
      "run:\n"
      "  seed: 11\n"
      "algo:\n"
      "  batch_size: 1024\n"
      "  gamma: 0.95\n"
      "  hidden: [128, 128, 64]\n"
      "  lr_scaling: linear\n");
  Cfg c = resolve({"--config", f.path.string(), "algo.batch_size=4096"});
  CHECK(c.run->seed == 11u);
  CHECK(c.algo->batch_size == 4096);  // command line wins
  CHECK(c.algo->gamma == doctest::Approx(0.95));
  CHECK(*c.algo->hidden == std::vector<int>{128, 128, 64});
  CHECK(*c.algo->lr_scaling == Scaling::linear);
}

TEST_CASE("Config: an unknown key is an error that suggests the nearest key") {
  CHECK(error_of([] { resolve({"algo.batch_sise=3"}); }) ==
        "command line 'algo.batch_sise=3': unknown key 'algo.batch_sise'; did you mean "
        "'algo.batch_size'?");
  CHECK(error_of([] { resolve({"--batch_size=3"}); }).find("did you mean 'algo.batch_size'?") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"--zzzzzzzzzz=1"}); }).find("run with --help") != std::string::npos);
  CHECK(error_of([] { resolve({"algo.gamma.x=1"}); }).find("'algo.gamma' is a field, not a section") !=
        std::string::npos);
}

TEST_CASE("Config: an unknown key in a YAML file is reported with file, line and column") {
  TempFile f("algo:\n  batch_size: 3\n  gamma_: 0.5\n");
  const std::string e = error_of([&] { resolve({"--config=" + f.path.string()}); });
  CHECK(e.find(f.path.string() + ":3:3: unknown key 'algo.gamma_'; did you mean 'algo.gamma'?") !=
        std::string::npos);
}

TEST_CASE("Config: a value of the wrong type names the field and the value") {
  CHECK(error_of([] { resolve({"algo.batch_size=big"}); }) ==
        "command line 'algo.batch_size=big': algo.batch_size: expected an integer, got 'big'");
  CHECK(error_of([] { resolve({"algo.gamma=abc"}); }).find("algo.gamma: expected a number, got 'abc'") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"smoke=maybe"}); }).find("run.smoke: expected a bool") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"algo.lr_scaling=sqr"}); })
            .find("expected one of none|sqrt|linear, got 'sqr'; did you mean 'sqrt'?") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"seed=-1"}); }).find("run.seed: expected a non-negative integer") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"algo.batch_size=99999999999"}); }).find("does not fit in int") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"algo.hidden=64,x"}); }).find("algo.hidden: element 1: expected an integer") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"--algo.batch_size"}); }).find("algo.batch_size: needs a value") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"algo.lr=nan"}); }).find("expected a finite number") != std::string::npos);
}

TEST_CASE("Config: a list given to a scalar field in YAML is a type error") {
  TempFile f("algo:\n  batch_size: [1, 2]\n");
  CHECK(error_of([&] { resolve({"--config", f.path.string()}); })
            .find("algo.batch_size: expected a single int, got a list") != std::string::npos);
}

TEST_CASE("Config: a value out of range names the field and the allowed range") {
  CHECK(error_of([] { resolve({"algo.batch_size=0"}); }) ==
        "command line 'algo.batch_size=0': algo.batch_size = 0 is out of range: must be >= 1");
  CHECK(error_of([] { resolve({"algo.gamma=1.5"}); }).find("algo.gamma = 1.5 is out of range: must be [0, 1]") !=
        std::string::npos);
  CHECK(error_of([] { resolve({"algo.lr=0"}); }).find("must be > 0") != std::string::npos);
  CHECK(error_of([] { resolve({"algo.hidden=64,0"}); }).find("element 1 (0) must be >= 1") !=
        std::string::npos);
}

TEST_CASE("Config: values set in code are validated too, and a config's own validate() runs") {
  Cfg c;
  c.algo->gamma = 2.0;
  CHECK(error_of([&] { anvil::validate(c); }) == "algo.gamma = 2.0 is out of range: must be [0, 1]");
  Cfg d;
  d.algo->min_batch = 512;
  CHECK(error_of([&] { anvil::validate(d); }).find("algo.min_batch (512) must not exceed") !=
        std::string::npos);
}

TEST_CASE("Config: malformed YAML is reported with its line number") {
  TempFile f("algo:\n  batch_size: 3\n  gamma: [0.5\nrun:\n  seed: 1\n");
  const std::string e = error_of([&] { resolve({"--config", f.path.string()}); });
  CHECK(e.find(f.path.string() + ":") == 0);
  CHECK(e.find("malformed YAML") != std::string::npos);
  TempFile g("algo:\n  batch_size: 3\n bad indentation: 1\n", "bad.yaml");
  const std::string e2 = error_of([&] { resolve({"--config", g.path.string()}); });
  CHECK(e2.find(g.path.string() + ":3:") == 0);
}

TEST_CASE("Config: a duplicate key is an error, in a file and on the command line") {
  TempFile f("algo:\n  batch_size: 3\n  gamma: 0.9\n  batch_size: 4\n");
  CHECK(error_of([&] { resolve({"--config", f.path.string()}); }) ==
        f.path.string() + ":4:3: duplicate key 'algo.batch_size' (first given at line 2)");
  CHECK(error_of([] { resolve({"algo.gamma=0.9", "--algo.gamma=0.8"}); })
            .find("'algo.gamma' is given twice on the command line") != std::string::npos);
}

TEST_CASE("Config: a missing file, a stray argument and a valueless key are clear errors") {
  CHECK(error_of([] { resolve({"--config", "no/such/file.yaml"}); })
            .find("config file 'no/such/file.yaml' cannot be opened") != std::string::npos);
  CHECK(error_of([] { resolve({"oops"}); }).find("unexpected argument") != std::string::npos);
  TempFile f("algo:\n  batch_size:\n");
  CHECK(error_of([&] { resolve({"--config", f.path.string()}); }).find("'algo.batch_size' has no value") !=
        std::string::npos);
  TempFile g("- 1\n- 2\n", "list.yaml");
  CHECK(error_of([&] { resolve({"--config", g.path.string()}); }).find("expected a mapping of sections") !=
        std::string::npos);
}

TEST_CASE("Config: the printed YAML reads back to the same config") {
  Cfg c = resolve({"algo.batch_size=77", "algo.gamma=0.123456789", "device=cuda:1", "algo.hidden=5,6",
                   "algo.lr_scaling=linear"});
  const std::string yaml = anvil::to_yaml(c);
  CHECK(yaml.find("algo:\n  batch_size: 77\n") != std::string::npos);
  Cfg d;
  anvil::apply_settings(d, anvil::parse_yaml(yaml, "printed"));
  CHECK(anvil::flatten(c) == anvil::flatten(d));
  CHECK(anvil::config_hash(c) == anvil::config_hash(d));
}

TEST_CASE("Config: the hash is stable and changes with any value") {
  Cfg a, b;
  CHECK(anvil::config_hash(a) == anvil::config_hash(b));
  // Pinned: the hash is part of checkpoints, so it must not change between builds.
  CHECK(anvil::config_hash_hex(a) == "32e8c80269869561");
  CHECK(anvil::config_hash_hex(a).size() == 16);
  b.algo->gamma = 0.98;
  CHECK(anvil::config_hash(a) != anvil::config_hash(b));
  Cfg c;
  c.run->seed = 1;
  CHECK(anvil::config_hash(a) != anvil::config_hash(c));
}

TEST_CASE("Config: an empty YAML file sets nothing") {
  TempFile f("# nothing here\n");
  Cfg c = resolve({"--config", f.path.string()});
  CHECK(anvil::flatten(c) == anvil::flatten(Cfg{}));
}

namespace {
struct LoopCfg {
  Param<std::int64_t, "steps", "env steps", anvil::at_least(1)> steps{20000};
  Param<std::int64_t, "learning_starts", "warm-up steps", anvil::at_least(0)> learning_starts{1000};
  void validate() const {
    if (learning_starts >= steps) throw anvil::ConfigError("train.learning_starts is not below train.steps");
  }
  void shrink() {
    steps = std::min<std::int64_t>(steps, 600);
    learning_starts = std::min<std::int64_t>(learning_starts, 200);
  }
};
struct SmokeCfg {
  Section<"run", RunCfg> run;
  Section<"train", LoopCfg> train;
};
SmokeCfg smoke_configure(anvil::Args a) { return anvil::configure<SmokeCfg>(a); }
}  // namespace

TEST_CASE("Config: --smoke is a layer of defaults under the user's settings, applied before validation") {
  // Alone: the small run.
  auto c = smoke_configure(args({"--smoke"}));
  CHECK(c.train->steps == 600);
  CHECK(c.train->learning_starts == 200);
  // With the steps a user types: their steps, smoke's short warm-up, and no refusal.
  c = smoke_configure(args({"--smoke", "--train.steps=600"}));
  CHECK(c.train->steps == 600);
  CHECK(c.train->learning_starts == 200);
  c = smoke_configure(args({"--train.steps=5000", "--smoke"}));
  CHECK(c.train->steps == 5000);
  CHECK(c.train->learning_starts == 200);
  // A config file is the user's too; a later --smoke=false turns it off.
  TempFile f("train:\n  steps: 3000\nrun:\n  smoke: true\n", "smoke.yaml");
  c = smoke_configure(args({"--config", f.path.string()}));
  CHECK(c.train->steps == 3000);
  CHECK(c.train->learning_starts == 200);
  c = smoke_configure(args({"--config", f.path.string(), "--smoke=false"}));
  CHECK(c.train->steps == 3000);
  CHECK(c.train->learning_starts == 1000);
  // Without --smoke the same steps are refused by validation.
  CHECK(error_of([] { smoke_configure(args({"--train.steps=600"})); }).find("learning_starts is not below") !=
        std::string::npos);
  // A program's own defaults (a hyperparameter file's block) sit under the smoke layer.
  auto a = args({"--smoke"});
  anvil::Setting program{.key = "train.steps", .values = {"50000"}, .origin = "hyperparams.yaml", .program_default = true};
  a.settings.insert(a.settings.begin(), program);
  c = smoke_configure(a);
  CHECK(c.train->steps == 600);
  // The printed config is what runs, and reads back to the same config and hash.
  c = smoke_configure(args({"--smoke", "--train.steps=900"}));
  const auto again = smoke_configure(args({"--config", TempFile(anvil::to_yaml(c), "again.yaml").path.string()}));
  CHECK(anvil::flatten(again) == anvil::flatten(c));
}

namespace {
struct TypedCfg {
  Section<"run", RunCfg> run;
  Section<"algo", AlgoCfg> algo;
  static constexpr std::array<std::string_view, 2> hashed_types() { return {"anvil::BasicSAC<>", "anvil::FP32"}; }
};
struct OtherTypedCfg {
  Section<"run", RunCfg> run;
  Section<"algo", AlgoCfg> algo;
  static constexpr std::array<std::string_view, 2> hashed_types() { return {"anvil::BasicSAC<>", "anvil::TF32"}; }
};
}  // namespace

TEST_CASE("Config: the hash covers the types a config names, the same wherever it is computed") {
  // Same fields, different policy types: different hashes; the fields alone hash as before.
  TypedCfg t;
  OtherTypedCfg o;
  CHECK(anvil::flatten(t) == anvil::flatten(Cfg{}));
  CHECK(anvil::config_hash(t) != anvil::config_hash(Cfg{}));
  CHECK(anvil::config_hash(t) != anvil::config_hash(o));
  CHECK(anvil::config_hash_hex(Cfg{}) == "32e8c80269869561");
  // Read back from its own YAML, a typed config hashes as it did.
  TypedCfg back;
  anvil::apply_settings(back, anvil::parse_yaml(anvil::to_yaml(t), "printed"));
  CHECK(anvil::config_hash_hex(back) == anvil::config_hash_hex(t));
}
