// Demonstrations in robomimic's HDF5 layout (data/demonstrations.hpp, data/hdf5.hpp): what is
// written reads back, Python's h5py opens it, a killed write leaves the old file, and a
// malformed or truncated file is refused naming the file and the dataset at fault.

#include <anvil/data/demonstrations.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <anvil/data/hdf5.hpp>

#include "../skip.hpp"
#include "../temp_run_dir.hpp"

namespace {

using anvil::Demonstrations;
using anvil::Error;

/// Two short episodes of a 3-wide observation (parts "a" of 2 and "b" of 1) and 2-wide actions.
Demonstrations sample_demos() {
  Demonstrations d;
  d.env_name = "PushT";
  d.obs_parts = {{"a", 2}, {"b", 1}};
  d.obs_dim = 3;
  d.act_dim = 2;
  for (int e = 0; e < 2; ++e) {
    const int t = 3 + e;
    std::vector<float> o, a, r;
    std::vector<std::uint8_t> dn;
    for (int i = 0; i < t; ++i) {
      o.insert(o.end(), {static_cast<float>(100 * e + i), static_cast<float>(i) * 0.5f, -1.0f});
      a.insert(a.end(), {static_cast<float>(i), static_cast<float>(e)});
      r.push_back(0.25f * static_cast<float>(i));
      dn.push_back(i == t - 1);
    }
    d.add_episode(o, a, r, dn);
  }
  return d;
}

/// Writes a file with `edit` applied to a valid layout: the hook gets the writer after the
/// first demo's group is made.
template <class F>
void write_custom(const std::filesystem::path& p, F&& edit) {
  anvil::h5::H5Writer w(p);
  w.group("data");
  w.attribute("data", "total", std::int64_t{3});
  w.group("data/demo_0");
  w.group("data/demo_0/obs");
  edit(w);
  w.commit();
}

TEST_CASE("Demonstrations: robomimic's layout round-trips, parts chosen and ordered by key") {
  const std::filesystem::path dir = temp_run_dir("demos_roundtrip");
  std::filesystem::create_directories(dir);
  const auto path = dir / "demos.hdf5";
  const auto d = sample_demos();
  anvil::write_demonstrations(path, d);
  const auto back = anvil::read_demonstrations(path);
  CHECK(back.env_name == "PushT");
  CHECK(back.episodes() == 2);
  CHECK(back.steps() == 7);
  CHECK(back.obs_dim == 3);
  CHECK(back.act_dim == 2);
  CHECK(back.obs == d.obs);
  CHECK(back.actions == d.actions);
  CHECK(back.rewards == d.rewards);
  CHECK(back.dones == d.dones);
  CHECK(back.starts == d.starts);
  // The raw layout, as a Python tool would see it.
  const auto f = anvil::h5::File::open(path);
  CHECK(f.int_attribute("data", "total") == 7);
  CHECK(f.int_attribute("data/demo_1", "num_samples") == 4);
  CHECK(f.shape("data/demo_1/obs/a") == anvil::h5::Shape{4, 2});
  CHECK(f.shape("data/demo_1/actions") == anvil::h5::Shape{4, 2});
  CHECK(f.string_attribute("data", "env_args").find("\"env_name\": \"PushT\"") != std::string::npos);
  // Only part "b", then "b" before "a".
  const auto only_b = anvil::read_demonstrations(path, {"b"});
  CHECK(only_b.obs_dim == 1);
  CHECK(only_b.obs[0] == -1.0f);
  const auto swapped = anvil::read_demonstrations(path, {"b", "a"});
  CHECK(swapped.obs[0] == -1.0f);
  CHECK(swapped.obs[4] == 1.0f);  // row 1: b, then a = (1, 0.5)
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(path, {"c"}), doctest::Contains("data/demo_0/obs/c: missing"), Error);
}

TEST_CASE("Demonstrations: Python's h5py opens what anvil writes") {
  const std::string python = ANVIL_H5PY_PYTHON;
  if (python.empty()) ANVIL_SKIP("no Python with h5py was found when configuring (Debian: python3-h5py)");
  const std::filesystem::path dir = temp_run_dir("demos_h5py");
  std::filesystem::create_directories(dir);
  const auto path = dir / "demos.hdf5";
  anvil::write_demonstrations(path, sample_demos());
  const auto script = dir / "check.py";
  std::ofstream(script) << "import sys, json, h5py\n"
                           "f = h5py.File(sys.argv[1], 'r')\n"
                           "d = f['data']\n"
                           "assert d.attrs['total'] == 7, d.attrs['total']\n"
                           "assert json.loads(d.attrs['env_args'])['env_name'] == 'PushT'\n"
                           "assert sorted(d.keys()) == ['demo_0', 'demo_1']\n"
                           "g = d['demo_1']\n"
                           "assert g.attrs['num_samples'] == 4\n"
                           "assert g['obs/a'].shape == (4, 2) and g['obs/a'][3, 0] == 103.0\n"
                           "assert g['actions'].shape == (4, 2) and g['actions'][2, 1] == 1.0\n"
                           "assert list(g['dones'][:]) == [0, 0, 0, 1]\n"
                           "assert abs(g['rewards'][2] - 0.5) < 1e-7\n";
  const std::string cmd = python + " " + script.string() + " " + path.string();
  CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("Demonstrations: a write that never commits leaves the previous file whole") {
  const std::filesystem::path dir = temp_run_dir("demos_atomic");
  std::filesystem::create_directories(dir);
  const auto path = dir / "demos.hdf5";
  anvil::write_demonstrations(path, sample_demos());
  const auto before = std::filesystem::file_size(path);
  {
    anvil::h5::H5Writer w(path);  // as a run killed before commit()
    w.group("data");
  }
  CHECK(std::filesystem::file_size(path) == before);
  CHECK(anvil::read_demonstrations(path).steps() == 7);
  int leftovers = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) leftovers += e.path().string().find(".tmp-") != std::string::npos;
  CHECK(leftovers == 0);
}

TEST_CASE("Demonstrations: a malformed or truncated file is refused, naming the file and the dataset") {
  const std::filesystem::path dir = temp_run_dir("demos_bad");
  std::filesystem::create_directories(dir);
  const auto p = dir / "bad.hdf5";
  const std::vector<float> obs3x2{1, 2, 3, 4, 5, 6}, act3x2{1, 2, 3, 4, 5, 6};

  // No actions.
  write_custom(p, [&](auto& w) { w.dataset("data/demo_0/obs/x", {3, 2}, obs3x2); });
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), (p.string() + ": data/demo_0/actions: missing (no such dataset)").c_str(), Error);

  // Observations one row short of the actions.
  write_custom(p, [&](auto& w) {
    w.dataset("data/demo_0/obs/x", {2, 2}, std::vector<float>{1, 2, 3, 4});
    w.dataset("data/demo_0/actions", {3, 2}, act3x2);
  });
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains("data/demo_0/obs/x: has 2 rows but data/demo_0/actions has 3"), Error);

  // A count that disagrees with the data.
  write_custom(p, [&](auto& w) {
    w.dataset("data/demo_0/obs/x", {3, 2}, obs3x2);
    w.dataset("data/demo_0/actions", {3, 2}, act3x2);
    w.attribute("data/demo_0", "num_samples", std::int64_t{5});
  });
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains("data/demo_0@num_samples: says 5 but the demo has 3 steps"), Error);

  // Actions as text.
  {
    anvil::h5::H5Writer w(p);
    w.group("data");
    w.group("data/demo_0");
    w.dataset("data/demo_0/obs", {3, 2}, obs3x2);
    w.attribute("data/demo_0", "actions_note", std::string("not data"));
    w.commit();
  }
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains("data/demo_0/actions: missing"), Error);

  // A NaN action.
  write_custom(p, [&](auto& w) {
    w.dataset("data/demo_0/obs/x", {3, 2}, obs3x2);
    w.dataset("data/demo_0/actions", {3, 2}, std::vector<float>{1, 2, 3, std::nanf(""), 5, 6});
  });
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains("data/demo_0/actions: holds a non-finite value"), Error);

  // No 'data' group; not HDF5 at all; a truncated file.
  {
    anvil::h5::H5Writer w(p);
    w.group("other");
    w.commit();
  }
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains((p.string() + ": data: missing").c_str()), Error);
  std::ofstream(p) << "robomimic?";
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), (p.string() + ": not an HDF5 file (or a truncated one)").c_str(), Error);
  const auto good = dir / "good.hdf5";
  anvil::write_demonstrations(good, sample_demos());
  const auto size = std::filesystem::file_size(good);
  std::filesystem::copy_file(good, p, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(p, size / 2);
  CHECK_THROWS_WITH_AS((void)anvil::read_demonstrations(p), doctest::Contains((p.string() + ": ").c_str()), Error);
}

}  // namespace
