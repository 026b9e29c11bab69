// Reading the world a launcher describes in the environment (light header: no torch).
#include <anvil/parallel/world.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>


using namespace anvil;

namespace {
// Sets the launcher variables for one test and clears them after.
struct Env {
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* k : kAll) ::unsetenv(k);
    for (auto [k, v] : vars) ::setenv(k, v, 1);
  }
  ~Env() {
    for (const char* k : kAll) ::unsetenv(k);
  }
  static constexpr const char* kAll[] = {"RANK",        "WORLD_SIZE", "LOCAL_RANK",        "LOCAL_WORLD_SIZE",
                                         "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",       "NODE_RANK",
                                         "NNODES",      "ANVIL_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE",
                                         "TORCHELASTIC_RESTART_COUNT",
                                         // what srun sets (and sbatch, salloc some of it)
                                         "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_STEPID",
                                         "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",
                                         "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                         "SLURM_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                         "SLURM_JOB_ID", "SLURM_JOBID"};
};
// The rank's place in `w` is `expected`'s (rank, world, local rank, ranks on the node, node).
void check_place(const dist::World& w, const dist::World& expected) {
  CHECK(w.rank == expected.rank);
  CHECK(w.world_size == expected.world_size);
  CHECK(w.local_rank == expected.local_rank);
  CHECK(w.local_world_size == expected.local_world_size);
  CHECK(w.node_rank == expected.node_rank);
}
std::string error_of(auto f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("World: a plain start has no world in the environment") {
  Env env{};
  CHECK_FALSE(dist::world_from_env().has_value());
}

TEST_CASE("World: torchrun's variables, with its agent store and attempt prefix") {
  Env env{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29400"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "2"}};
  const auto w = dist::world_from_env();
  REQUIRE(w.has_value());
  check_place(*w, {.rank = 3, .world_size = 4, .local_rank = 1, .local_world_size = 2, .node_rank = 1});
  CHECK(w->rendezvous() == "10.0.0.5:29400");
  CHECK(w->agent_store);
  CHECK(w->store_prefix == "/worker/attempt_2");
}

TEST_CASE("World: a SLURM-style world without an agent store has rank 0 serve it") {
  Env env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "1234"}};
  const auto w = dist::world_from_env();
  REQUIRE(w.has_value());
  CHECK_FALSE(w->agent_store);
  CHECK(w->local_world_size == 2);
}

TEST_CASE("World: a missing or malformed variable is named") {
  {
    Env env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }).find("MASTER_PORT is not") != std::string::npos);
  }
  {
    Env env{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }) == "environment variable RANK=2 is out of range [0, 1]");
  }
  {
    Env env{{"RANK", "0"}, {"WORLD_SIZE", "two"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }) == "environment variable WORLD_SIZE='two' is not an integer");
  }
  {
    Env env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }) ==
          "environment variable MASTER_PORT=70000 is out of range [1, 65535]");
  }
}

TEST_CASE("World: SLURM host lists expand as scontrol show hostnames writes them") {
  using V = std::vector<std::string>;
  CHECK(dist::expand_hostlist("gpu[03-05,09],login1") == V{"gpu03", "gpu04", "gpu05", "gpu09", "login1"});
  CHECK(dist::expand_hostlist("tux[8-10]") == V{"tux8", "tux9", "tux10"});
  CHECK(dist::expand_hostlist("tux[08-10]") == V{"tux08", "tux09", "tux10"});
  CHECK(dist::expand_hostlist("r[1-2]n[1-2]") == V{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(dist::expand_hostlist("node1") == V{"node1"});
  CHECK(dist::expand_hostlist("a[1],b[2-3]-ib") == V{"a1", "b2-ib", "b3-ib"});
  CHECK(error_of([] { (void)dist::expand_hostlist("gpu[5-3]", "SLURM_NODELIST"); }) ==
        "SLURM_NODELIST='gpu[5-3]' is not a SLURM host list: the range 5-3 runs backwards");
  CHECK(error_of([] { (void)dist::expand_hostlist("gpu[03", "SLURM_NODELIST"); }).find("'[' without ']'") != std::string::npos);
  CHECK(error_of([] { (void)dist::expand_hostlist("gpu]1", "SLURM_NODELIST"); }).find("']' without '['") != std::string::npos);
  CHECK(error_of([] { (void)dist::expand_hostlist("gpu[a-b]", "SLURM_NODELIST"); }).find("not N or N-M") != std::string::npos);
  CHECK(error_of([] { (void)dist::expand_hostlist("n[0-99999]x[0-99999]", "SLURM_NODELIST"); }).find("more than") !=
        std::string::npos);
}

TEST_CASE("World: SLURM task counts per node expand") {
  CHECK(dist::expand_tasks_per_node("2(x3),1", "V") == std::vector<int>{2, 2, 2, 1});
  CHECK(dist::expand_tasks_per_node("4", "V") == std::vector<int>{4});
  CHECK(error_of([] { (void)dist::expand_tasks_per_node("2(x),1", "SLURM_TASKS_PER_NODE"); }) ==
        "SLURM_TASKS_PER_NODE='2(x),1' is not a SLURM task count list (e.g. 2(x3),1)");
}

TEST_CASE("World: a task srun started is a rank: rank, world, node, rendezvous from SLURM's variables") {
  // srun -N2 --ntasks-per-node=2: the task with global id 3 on the second node.
  Env env{{"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"}, {"SLURM_STEP_ID", "0"},
          {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NODELIST", "gpu[03-04]"}, {"SLURM_NODELIST", "gpu[01-04]"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_JOB_ID", "123456"}};
  const auto w = dist::world_from_env();
  REQUIRE(w.has_value());
  check_place(*w, {.rank = 3, .world_size = 4, .local_rank = 1, .local_world_size = 2, .node_rank = 1});
  CHECK(w->nnodes == 2);
  CHECK(w->master_addr == "gpu03");  // the step's first node, where task 0 runs
  CHECK(w->master_port == dist::slurm_port(123456, 0));
  CHECK(w->master_port == 10000 + 456 * 20);
  CHECK_FALSE(w->agent_store);
  CHECK(w->source == "SLURM step 123456.0");
}

TEST_CASE("World: under srun, MASTER_ADDR and MASTER_PORT win where set, and torchrun's variables win over SLURM's") {
  {
    Env env{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "2"}, {"SLURM_NTASKS", "2"},
            {"SLURM_NODELIST", "node7"}, {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "99"},
            {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29555"}};
    const auto w = dist::world_from_env();
    REQUIRE(w.has_value());
    CHECK(w->rendezvous() == "10.1.2.3:29555");
    CHECK(w->local_world_size == 2);
    CHECK(w->nnodes == 1);  // counted from the host list
  }
  {
    // torchrun started under srun, one agent per node: its RANK is what this rank is.
    Env env{{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"},
            {"SLURM_NODELIST", "n[1-2]"}, {"SLURM_JOB_ID", "5"}, {"RANK", "6"}, {"WORLD_SIZE", "8"},
            {"LOCAL_RANK", "2"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29400"}};
    const auto w = dist::world_from_env();
    REQUIRE(w.has_value());
    CHECK(w->rank == 6);
    CHECK(w->world_size == 8);
    CHECK(w->local_rank == 2);
    CHECK(w->source == "RANK/WORLD_SIZE");
  }
}

TEST_CASE("World: a batch script, an salloc shell or SLURM's own steps are plain starts") {
  {
    // sbatch --ntasks=4 runs the script once, with SLURM_PROCID=0 but no step of its own.
    Env env{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODELIST", "n1"},
            {"SLURM_JOB_ID", "7"}};
    CHECK_FALSE(dist::world_from_env().has_value());
  }
  {
    Env env{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "4294967294"}, {"SLURM_NTASKS", "4"},
            {"SLURM_NODELIST", "n1"}, {"SLURM_JOB_ID", "7"}};
    CHECK_FALSE(dist::world_from_env().has_value());
  }
}

TEST_CASE("World: a SLURM variable that is missing or malformed is named") {
  {
    Env env{{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n1"},
            {"SLURM_JOB_ID", "7"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }).find("SLURM_LOCALID is not") != std::string::npos);
  }
  {
    Env env{{"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"},
            {"SLURM_NODELIST", "n1"}, {"SLURM_JOB_ID", "7"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }) == "environment variable SLURM_PROCID=2 is out of range [0, 1]");
  }
  {
    Env env{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"},
            {"SLURM_NODELIST", "n[1-"}, {"SLURM_JOB_ID", "7"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }).find("SLURM_NODELIST='n[1-'") != std::string::npos);
  }
  {
    Env env{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"},
            {"SLURM_NODELIST", "n1"}};
    CHECK(error_of([] { (void)dist::world_from_env(); }).find("neither MASTER_PORT nor SLURM_JOB_ID") != std::string::npos);
  }
}

TEST_CASE("World: a rank's GPU is taken among those it sees (per-task binding: its own, cuda:0)") {
  CHECK(dist::visible_device(3, 8) == 3);  // every rank of the node sees every GPU
  CHECK(dist::visible_device(3, 1) == 0);  // srun --gpus-per-task=1: each rank sees its own
  CHECK(dist::visible_device(3, 2) == 1);  // two GPUs a task
  CHECK(dist::visible_device(2, 0) == 2);  // no GPU: the index is not used
}
