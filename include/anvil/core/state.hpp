#pragma once
/// @file
/// The state protocol: how every part of a run that must survive a restart, or be the same
/// on every rank, writes and reads itself; and `StateSections`, the named list of those
/// parts that checkpoints, the replay buffer's file, DDP's start-up broadcast and the
/// ranks' in-sync check all walk. Light header.
///
/// A part is `Stateful` when it has three members:
///
///     void save(BinaryWriter& w) const;   // writes its state
///     Saved read(BinaryReader& r);        // reads what save wrote and checks it against
///                                         // this object (sizes, names); changes NOTHING
///     void restore(Saved s);              // applies what read returned; cannot fail
///
/// Splitting read from restore is what makes a load all-or-nothing: a checkpoint reads
/// every section, then checks the file's checksum, and only then restores any of them, so
/// a bad file leaves the run exactly as it was.
///
/// A file (or a message between ranks) holds sections as a table: their count, then for
/// each its name, its bytes and their length. Reading names the section that is unknown,
/// missing, given twice or of the wrong length, and every message from inside a section
/// says which section it was.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/error.hpp>

namespace anvil {

/// The state protocol (see file comment): `save`, a `read` that changes nothing, `restore`.
template <class T>
concept Stateful = requires(const T& c, T& m, BinaryWriter& w, BinaryReader& r) {
  { c.save(w) };
  { m.restore(m.read(r)) };
};

/// Where a section goes besides checkpoints (which hold every section).
enum class Scope : unsigned {
  /// In checkpoints only: state of this rank (its envs, random streams, episode returns).
  checkpoint = 0,
  /// The same on every rank: rank 0's is sent to the others when a run starts and after it
  /// resumes (the networks, the optimizers, the clock, the schedule's position).
  shared = 1,
  /// Shared, and compared bitwise across ranks at each checkpoint and at the end: the
  /// learned state, which ranks that average the same gradients must hold identically.
  checked = 2,
};

/// The named parts of a run's state (see file comment).
class StateSections {
 public:
  /// What applies a section once every section of a file has been read and checked.
  using Apply = std::function<void()>;

  /// One section: how it writes itself and how it reads itself (changing nothing until the
  /// returned `Apply` runs).
  struct Section {
    std::string name;
    Scope scope = Scope::checkpoint;
    std::function<void(BinaryWriter&)> save;
    std::function<Apply(BinaryReader&)> read;
  };

  /// Adds `part` (which must outlive this list) as section `name`.
  template <Stateful T>
  void add(std::string name, T& part, Scope scope = Scope::checkpoint) {
    T* p = &part;
    add(Section{std::move(name), scope, [p](BinaryWriter& w) { p->save(w); },
                [p](BinaryReader& r) -> Apply {
                  using Saved = std::remove_cvref_t<decltype(p->read(r))>;
                  auto s = std::make_shared<Saved>(p->read(r));
                  return [p, s] { p->restore(std::move(*s)); };
                }});
  }
  /// Adds a section given by its functions.
  void add(Section s) {
    if (s.name.empty()) throw Error("StateSections: a section needs a name");
    for (const auto& x : sections_)
      if (x.name == s.name) throw Error("StateSections: section '" + s.name + "' is added twice");
    sections_.push_back(std::move(s));
  }

  /// The names of the sections that go where `scope` says, in the order they were added
  /// (`Scope::checkpoint`: all of them).
  [[nodiscard]] std::vector<std::string> names(Scope scope = Scope::checkpoint) const {
    std::vector<std::string> out;
    for (const auto& s : sections_)
      if (in(s, scope)) out.push_back(s.name);
    return out;
  }

  /// Writes the sections of `scope` as a table (see file comment).
  [[gnu::cold, gnu::noinline]] void write(BinaryWriter& w, Scope scope = Scope::checkpoint) const {
    w.value(static_cast<std::uint64_t>(names(scope).size()));
    for (const auto& s : sections_) {
      if (!in(s, scope)) continue;
      w.string(s.name);
      const auto start = w.written();
      s.save(w);
      w.value(static_cast<std::uint64_t>(w.written() - start));
    }
  }

  /// Reads a table written by `write(w, scope)`: every section of `scope` exactly once, no
  /// other. Changes nothing; the returned function applies them all. Throws naming the
  /// section at fault.
  [[gnu::cold, gnu::noinline]] [[nodiscard]] Apply read(BinaryReader& r, Scope scope = Scope::checkpoint) const {
    const auto count = r.value<std::uint64_t>("section count");
    if (count > 10'000) r.fail("section count", "is implausible (" + std::to_string(count) + ")");
    const auto expected = names(scope);
    std::vector<std::string> seen;  // in the file's order
    std::vector<Apply> applies;
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto name = r.string("section name");
      const Section* s = find(name, scope);
      if (!s) r.fail("section '" + name + "'", "is not a section of this run (it has: " + list(expected) + ")");
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) r.fail("section '" + name + "'", "appears twice");
      seen.push_back(name);
      r.set_context("section '" + name + "'");
      const auto start = r.consumed();
      auto apply = s->read(r);
      const auto length = r.consumed() - start;
      const auto stored = r.value<std::uint64_t>("section length");
      if (stored != length)
        r.fail("its end", "was not where reading it ended (after " + std::to_string(length) +
                              " bytes): the section was written by another version of the program");
      r.set_context("");
      if (apply) applies.push_back(std::move(apply));
    }
    for (const auto& n : expected)
      if (std::find(seen.begin(), seen.end(), n) == seen.end())
        r.fail("section '" + n + "'", "is missing (the file holds: " + list(seen) + ")");
    return [applies = std::move(applies)] {
      for (const auto& a : applies) a();
    };
  }

  [[nodiscard]] bool empty() const noexcept { return sections_.empty(); }

 private:
  static bool in(const Section& s, Scope scope) { return static_cast<unsigned>(s.scope) >= static_cast<unsigned>(scope); }
  const Section* find(const std::string& name, Scope scope) const {
    for (const auto& s : sections_)
      if (s.name == name && in(s, scope)) return &s;
    return nullptr;
  }
  static std::string list(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& n : v) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? "none" : out;
  }

  std::vector<Section> sections_;
};

/// The format tag of a buffer file beside a checkpoint (`run.checkpoint_buffer`), which the
/// offline loop also reads as a dataset: a table (see file comment) holding one section
/// named after the buffer's config section ("buffer", "rollout").
inline constexpr const char* kBufferFileFormat = "anvil Buffer v1";

/// Writes `part` alone to `path` under the format tag `format`, atomically (a crash
/// mid-save leaves the previous file intact).
template <Stateful T>
void save_file(const T& part, const std::filesystem::path& path, const std::string& format) {
  BinaryWriter w(path, format);
  part.save(w);
  w.commit();
}

/// Reads a file `save_file` wrote into `part`'s state, checking all of it (the checksum
/// too); changes nothing until the returned function runs.
template <Stateful T>
[[nodiscard]] StateSections::Apply read_file(T& part, const std::filesystem::path& path, const std::string& format) {
  BinaryReader r(path, format);
  using Saved = std::remove_cvref_t<decltype(part.read(r))>;
  auto s = std::make_shared<Saved>(part.read(r));
  r.finish();
  return [p = &part, s] { p->restore(std::move(*s)); };
}

}  // namespace anvil
