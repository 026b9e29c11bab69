// The state protocol: named sections written as a table and read back all or nothing,
// naming the section at fault.
#include <anvil/core/state.hpp>  // first: the header under test compiles on its own here
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>


#include "../damaged_files.hpp"
#include "../temp_run_dir.hpp"

namespace {

// A part of a run: a counter and a name.
struct Counter {
  std::int64_t n = 0;
  std::string label = "c";
  void save(anvil::BinaryWriter& w) const {
    w.value(n);
    w.string(label);
  }
  struct Saved {
    std::int64_t n;
    std::string label;
  };
  Saved read(anvil::BinaryReader& r) const {
    Saved s{r.value<std::int64_t>("count"), r.string("label")};
    if (s.n < 0) r.fail("count", "is negative");
    return s;
  }
  void restore(const Saved& s) {
    n = s.n;
    label = s.label;
  }
};
static_assert(anvil::Stateful<Counter>);

// A part that reads less than it wrote (as a newer program's state would look to an older one).
struct Short {
  std::int64_t a = 1, b = 2;
  void save(anvil::BinaryWriter& w) const {
    w.value(a);
    w.value(b);
  }
  std::int64_t read(anvil::BinaryReader& r) const { return r.value<std::int64_t>("a"); }
  void restore(std::int64_t v) { a = v; }
};

std::vector<std::uint8_t> table(const anvil::StateSections& s, anvil::Scope scope = anvil::Scope::checkpoint) {
  auto w = anvil::BinaryWriter::in_memory("test state");
  s.write(w, scope);
  return w.take_bytes();
}

}  // namespace

TEST_CASE("StateSections: sections round-trip, and nothing changes until every one is read and checked") {
  Counter a{3, "alpha"}, b{5, "beta"};
  anvil::StateSections s;
  s.add("a", a);
  s.add("b", b, anvil::Scope::shared);
  const auto bytes = table(s);
  a = {0, "x"};
  b = {0, "y"};
  anvil::BinaryReader r(bytes, "memory", "test state");
  auto apply = s.read(r);
  r.finish();
  CHECK(a.n == 0);  // read changes nothing
  apply();
  CHECK(a.n == 3);
  CHECK(a.label == "alpha");
  CHECK(b.n == 5);
  CHECK(s.names() == std::vector<std::string>{"a", "b"});
}

TEST_CASE("StateSections: a scope writes only its sections (shared includes checked, checked only checked)") {
  Counter local{1}, shared{2}, checked{3};
  anvil::StateSections s;
  s.add("local", local);
  s.add("shared", shared, anvil::Scope::shared);
  s.add("checked", checked, anvil::Scope::checked);
  CHECK(s.names(anvil::Scope::shared) == std::vector<std::string>{"shared", "checked"});
  CHECK(s.names(anvil::Scope::checked) == std::vector<std::string>{"checked"});
  const auto bytes = table(s, anvil::Scope::shared);
  local.n = shared.n = checked.n = 0;
  anvil::BinaryReader r(bytes, "memory", "test state");
  s.read(r, anvil::Scope::shared)();
  CHECK(local.n == 0);
  CHECK(shared.n == 2);
  CHECK(checked.n == 3);
  // The shared table read as a checkpoint lacks the local section: named.
  anvil::BinaryReader r2(bytes, "memory", "test state");
  CHECK_THROWS_WITH_AS((void)s.read(r2), doctest::Contains("section 'local' is missing (the file holds: shared, checked)"),
                       anvil::Error);
}

TEST_CASE("StateSections: an unknown, a missing, a repeated or a misread section is refused by name, changing nothing") {
  Counter a{3}, b{5};
  anvil::StateSections written;
  written.add("a", a);
  written.add("extra", b);
  const auto bytes = table(written);

  anvil::StateSections only_a;  // this run has no section "extra"
  only_a.add("a", a);
  anvil::BinaryReader r(bytes, "ckpt", "test state");
  a.n = 7;
  CHECK_THROWS_WITH_AS((void)only_a.read(r), doctest::Contains("'ckpt': section 'extra' is not a section of this run (it has: a)"),
                       anvil::Error);
  CHECK(a.n == 7);

  anvil::StateSections a_and_c;  // this run also has "c", which the file lacks
  Counter c;
  a_and_c.add("a", a);
  a_and_c.add("extra", b);
  a_and_c.add("c", c);
  anvil::BinaryReader r2(bytes, "ckpt", "test state");
  CHECK_THROWS_WITH_AS((void)a_and_c.read(r2), doctest::Contains("section 'c' is missing"), anvil::Error);

  // A section read as fewer bytes than it holds: named, with both lengths.
  Short sh;
  anvil::StateSections shorter;
  shorter.add("short", sh);
  const auto sbytes = table(shorter);
  anvil::BinaryReader r3(sbytes, "ckpt", "test state");
  CHECK_THROWS_WITH_AS((void)shorter.read(r3), doctest::Contains("(section 'short'): its end was not where reading it ended (after 8 bytes)"),
                       anvil::Error);

  // An error inside a section says which section.
  Counter bad{-4};
  anvil::StateSections neg;
  neg.add("neg", bad);
  const auto nbytes = table(neg);
  anvil::BinaryReader r4(nbytes, "ckpt", "test state");
  CHECK_THROWS_WITH_AS((void)neg.read(r4), doctest::Contains("'ckpt' (section 'neg'): count is negative"), anvil::Error);

  // Adding a section twice is a programming error, named.
  CHECK_THROWS_WITH_AS(written.add("a", a), doctest::Contains("section 'a' is added twice"), anvil::Error);
}

TEST_CASE("save_file / read_file: a part alone in a file, a damaged file is refused before anything changes") {
  const auto dir = std::filesystem::path(temp_run_dir("state_file"));
  std::filesystem::create_directories(dir);
  Counter a{42, "answer"};
  anvil::save_file(a, dir / "a.bin", "anvil Counter v1");
  Counter b;
  anvil::read_file(b, dir / "a.bin", "anvil Counter v1")();
  CHECK(b.n == 42);
  CHECK(b.label == "answer");
  Counter c{1};
  CHECK_THROWS_WITH_AS((void)anvil::read_file(c, anvil::test::copy_with_flipped_bit(dir / "a.bin", dir / "flipped.bin", -6),
                                              "anvil Counter v1"),
                       doctest::Contains("(corrupted file?)"), anvil::Error);
  CHECK(c.n == 1);
  CHECK_THROWS_WITH_AS((void)anvil::read_file(c, dir / "a.bin", "anvil Other v1"),
                       doctest::Contains("is not an anvil Other v1 file"), anvil::Error);
  std::filesystem::remove_all(dir);
}
