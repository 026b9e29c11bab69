// metrics.csv on its own: one row per logged step, whatever the run before left in the file;
// and metrics on the console at their own scale.
#include <anvil/observe/run_files.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <anvil/observe/progress.hpp>

#include "../skip.hpp"
#include "../temp_run_dir.hpp"

namespace {
namespace fs = std::filesystem;
using Values = anvil::MetricsCsv::Values;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
Values row(double steps, double updates, double loss, double eval = NAN) {
  return {{"env_steps", steps}, {"updates", updates}, {"loss", loss}, {"eval_return", eval}};
}
}  // namespace

TEST_CASE("MetricsCsv: a second row for the last row's step amends it instead of adding one") {
  const fs::path dir = temp_run_dir("csv_amend");
  fs::create_directories(dir);
  anvil::MetricsCsv csv(dir / "metrics.csv");
  csv.row(row(100, 0, NAN), false);  // held back until a row has every column
  csv.row(row(100, 0, NAN, -5), false);
  csv.row(row(200, 10, 0.5), true);
  csv.row(row(300, 20, 0.25), true);
  CHECK(read(dir / "metrics.csv") == "env_steps,updates,loss,eval_return\n100,0,,-5\n200,10,0.5,\n300,20,0.25,\n");
  // The same step again, with only an evaluation: it goes into the row already there.
  csv.row({{"env_steps", 300}, {"updates", 20}, {"eval_return", -1.5}}, true);
  CHECK(read(dir / "metrics.csv") == "env_steps,updates,loss,eval_return\n100,0,,-5\n200,10,0.5,\n300,20,0.25,-1.5\n");
  csv.row(row(400, 30, 0.125), true);
  CHECK(read(dir / "metrics.csv").ends_with("300,20,0.25,-1.5\n400,30,0.125,\n"));
  fs::remove_all(dir);
}

TEST_CASE("MetricsCsv: a resumed file keeps the whole rows up to the checkpoint and drops a torn tail") {
  const fs::path dir = temp_run_dir("csv_resume");
  fs::create_directories(dir);
  const auto file = dir / "metrics.csv";
  const std::string head = "env_steps,updates,loss,eval_return\n300,10,0.5,\n600,20,0.25,\n";
  SUBCASE("rows after the checkpoint are dropped; the checkpoint's row is known to be there") {
    std::ofstream(file) << head << "900,30,0.125,\n";
    auto csv = anvil::MetricsCsv::resume(file, 600, 20);
    CHECK(csv.last_kept() == std::pair<std::int64_t, std::int64_t>{600, 20});
    CHECK(read(file) == head);
    csv.row({{"env_steps", 600}, {"updates", 20}, {"eval_return", -3}}, true);  // amends, no second row
    CHECK(read(file) == "env_steps,updates,loss,eval_return\n300,10,0.5,\n600,20,0.25,-3\n");
  }
  SUBCASE("a line a full disk cut short is dropped, even one that reads as an early step") {
    std::ofstream(file) << head << "2";
    auto csv = anvil::MetricsCsv::resume(file, 1800, 60);
    CHECK(csv.last_kept() == std::pair<std::int64_t, std::int64_t>{600, 20});
    CHECK(read(file) == head);
  }
  SUBCASE("a row with too few cells, or one that does not come after the one before, ends what is kept") {
    std::ofstream(file) << head << "7,0\n" << "900,30,0.125,\n";
    CHECK(anvil::MetricsCsv::resume(file, 1800, 60).last_kept() == std::pair<std::int64_t, std::int64_t>{600, 20});
    CHECK(read(file) == head);
    std::ofstream(file) << head << "600,20,0.25,\n900,30,0.125,\n";
    CHECK(anvil::MetricsCsv::resume(file, 1800, 60).last_kept() == std::pair<std::int64_t, std::int64_t>{600, 20});
    CHECK(read(file) == head);
  }
  fs::remove_all(dir);
}

TEST_CASE("MetricsCsv: a row it cannot write (a full disk) is an error naming the file") {
  if (!fs::exists("/dev/full")) ANVIL_SKIP("no /dev/full on this machine");
  anvil::MetricsCsv csv("/dev/full");
  CHECK_THROWS_WITH_AS(csv.row(row(100, 1, 0.5), true), "writing '/dev/full' failed (disk full?)", anvil::Error);
}

TEST_CASE("metric_text: a metric is shown at its own scale, with three significant digits or more") {
  CHECK(anvil::metric_text(0.0129) == "0.0129");  // a Push-T score, not "0.0"
  CHECK(anvil::metric_text(0.172) == "0.172");
  CHECK(anvil::metric_text(5.3) == "5.30");
  CHECK(anvil::metric_text(-153.27) == "-153.3");
  CHECK(anvil::metric_text(500.0) == "500.0");
  CHECK(anvil::metric_text(0.0) == "0.0");
  CHECK(anvil::metric_text(NAN) == "-");
}
