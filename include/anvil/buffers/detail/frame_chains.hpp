#pragma once
/// @file
/// `FrameChains`: how the replay store keeps each frame of a frame stack once. A stored
/// observation row holds its image stacks' newest frames only (and every other part
/// whole), and links to the row of its env's previous observation; a stack is rebuilt by
/// following the links back.

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <anvil/core/binary_io.hpp>
#include <anvil/core/detail/huge_pages.hpp>
#include <anvil/core/error.hpp>
#include <anvil/core/spaces.hpp>

namespace anvil::detail {

/// The frame stacks of an observation layout (image parts with `frames` > 1, oldest frame
/// first on the channels) and, per row of an observation ring, the links between rows
/// that rebuild them.
///
/// A row's stack of k frames is itself (its newest frame) and the rows its env observed
/// 1 to k - 1 steps before, found by `prev` links; where a chain starts (-1: an episode's
/// first observation) its first row stands for the frames before it, as Gymnasium's frame
/// stack repeats the first frame at a reset. The store links a new row to its env's
/// previous row only where the bytes say so (`follows`: the new stack's older frames are
/// that row's newer ones) and starts a chain only where they allow it (`starts`: every frame
/// of each stack the same); any other stack is stored as its own short chain of rows
/// (`stored_row` with `back` > 0), so the rebuilt bytes are always the bytes put in.
///
/// Each row also has a `child` link (the row whose `prev` it is; at most one), so that when
/// the ring overwrites a row, the rows whose stacks read it (its next `depth() - 1` rows down
/// the chain) are found, and their transitions leave.
class FrameChains {
 public:
  static constexpr std::int64_t kMaxFrames = 64;

  FrameChains() = default;
  /// The plan for rows of `layout` (`full` bytes each); `depth()` is 1 when it stacks no frames.
  FrameChains(const ObsLayout& layout, std::int64_t full) : full_(full), stored_(full) {
    std::int64_t to = 0;
    for (std::size_t i = 0; i < layout.parts.size(); ++i) {
      const auto& p = layout.parts[i];
      const std::int64_t end = i + 1 < layout.parts.size() ? layout.parts[i + 1].offset : full;  // padding included
      if (p.image() && p.frames > 1) {
        if (p.frames > kMaxFrames)
          throw ConfigError("observation part " + p.name + " stacks " + std::to_string(p.frames) +
                            " frames; a replay buffer rebuilds stacks of at most " + std::to_string(kMaxFrames));
        const std::int64_t frame = p.bytes() / p.frames;
        stacks_.push_back({p.offset, frame, p.frames, to});
        pieces_.push_back({p.offset + (p.frames - 1) * frame, to, end - p.offset - (p.frames - 1) * frame,
                           static_cast<std::int32_t>(stacks_.size() - 1)});
        depth_ = std::max(depth_, p.frames);
      } else {
        pieces_.push_back({p.offset, to, end - p.offset, -1});
      }
      to += pieces_.back().len;
    }
    if (depth_ > 1) stored_ = (to + 3) / 4 * 4;
  }

  /// The most frames of any stack (1: no stacks; rows are stored whole).
  [[nodiscard]] std::int64_t depth() const noexcept { return depth_; }
  [[nodiscard]] bool on() const noexcept { return depth_ > 1; }
  /// Bytes of a stored row (the full row's when there are no stacks).
  [[nodiscard]] std::int64_t stored_bytes() const noexcept { return stored_; }

  /// Makes room for `rows` rows of links (filled as rows are first written).
  void allocate(std::int64_t rows) {
    prev_ = HugeArray<std::int32_t>(static_cast<std::size_t>(rows), -1, HugeArray<std::int32_t>::Lazy{});
    child_ = HugeArray<std::int32_t>(static_cast<std::size_t>(rows), -1, HugeArray<std::int32_t>::Lazy{});
  }
  [[nodiscard]] std::int64_t link_bytes() const noexcept {
    return static_cast<std::int64_t>((prev_.size() + child_.size()) * sizeof(std::int32_t));
  }

  /// Whether full row `row`'s stacks continue full row `before`'s: each stack's older frames
  /// are `before`'s newer ones.
  [[nodiscard]] bool follows(const std::uint8_t* row, const std::uint8_t* before) const noexcept {
    for (const auto& s : stacks_)
      if (std::memcmp(row + s.offset, before + s.offset + s.frame, static_cast<std::size_t>((s.frames - 1) * s.frame)) != 0)
        return false;
    return true;
  }
  /// Whether full row `row` can start a chain: every frame of each stack is its newest.
  [[nodiscard]] bool starts(const std::uint8_t* row) const noexcept {
    for (const auto& s : stacks_) {
      const std::uint8_t* newest = row + s.offset + (s.frames - 1) * s.frame;
      for (std::int64_t j = 0; j + 1 < s.frames; ++j)
        if (std::memcmp(row + s.offset + j * s.frame, newest, static_cast<std::size_t>(s.frame)) != 0) return false;
    }
    return true;
  }
  /// Appends to `out` the stored row of full row `row` standing `back` steps before it:
  /// each stack's frame `back` places older than its newest (its oldest where the stack is
  /// shorter), every other part as it is.
  void stored_row(const std::uint8_t* row, std::int64_t back, std::vector<std::uint8_t>& out) const {
    const auto at = out.size();
    out.resize(at + static_cast<std::size_t>(stored_), 0);
    for (const auto& p : pieces_) {
      std::int64_t from = p.from;
      if (p.stack >= 0) {
        const auto& s = stacks_[static_cast<std::size_t>(p.stack)];
        from = s.offset + std::max<std::int64_t>(0, s.frames - 1 - back) * s.frame;
        if (back > 0) {  // the frame only (the padding after the part comes from the newest place)
          std::memcpy(out.data() + at + p.to, row + from, static_cast<std::size_t>(s.frame));
          std::memcpy(out.data() + at + p.to + s.frame, row + p.from + s.frame, static_cast<std::size_t>(p.len - s.frame));
          continue;
        }
      }
      std::memcpy(out.data() + at + p.to, row + from, static_cast<std::size_t>(p.len));
    }
  }

  /// Links a new row in `slot` to the row in `parent` (-1: it starts a chain).
  void link(std::int64_t slot, std::int64_t parent) noexcept {
    const auto s = static_cast<std::size_t>(slot);
    prev_.reach(s);
    child_.reach(s);
    prev_[s] = static_cast<std::int32_t>(parent);
    child_[s] = -1;
    if (parent >= 0) child_[static_cast<std::size_t>(parent)] = static_cast<std::int32_t>(slot);
  }
  [[nodiscard]] std::int32_t prev(std::int64_t slot) const noexcept { return prev_[static_cast<std::size_t>(slot)]; }
  [[nodiscard]] std::int32_t child(std::int64_t slot) const noexcept { return child_[static_cast<std::size_t>(slot)]; }

  /// The rows of row `slot`'s stack, newest first: `rows[m]` holds the frame m steps back
  /// (`depth()` of them: the row alone without stacks).
  void chain(std::int32_t slot, std::int32_t* rows) const noexcept {
    rows[0] = slot;
    for (std::int64_t m = 1; m < depth_; ++m) {
      const std::int32_t p = prev_[static_cast<std::size_t>(rows[m - 1])];
      rows[m] = p < 0 ? rows[m - 1] : p;
    }
  }

  /// Rebuilds into `out` (a full row) the observation of stored row `slot` of ring `ring`
  /// (rows of `stored_bytes()`).
  void rebuild(const std::uint8_t* ring, std::int32_t slot, std::uint8_t* out) const noexcept {
    std::array<std::int32_t, kMaxFrames> rows;
    chain(slot, rows.data());
    const std::uint8_t* own = ring + static_cast<std::int64_t>(slot) * stored_;
    for (const auto& p : pieces_) std::memcpy(out + p.from, own + p.to, static_cast<std::size_t>(p.len));
    for (const auto& s : stacks_)
      for (std::int64_t j = 0; j + 1 < s.frames; ++j)
        std::memcpy(out + s.offset + j * s.frame, ring + static_cast<std::int64_t>(rows[static_cast<std::size_t>(s.frames - 1 - j)]) * stored_ + s.to,
                    static_cast<std::size_t>(s.frame));
  }

  /// The same for rows gathered on a device: `picked` is [n, depth(), stored_bytes()], each
  /// row's chain (`chain`) gathered in order; returns [n, full] bytes.
  [[nodiscard]] at::Tensor rebuild(const at::Tensor& picked) const {
    auto out = at::empty({picked.size(0), full_}, picked.options());
    const auto own = picked.select(1, 0);
    for (const auto& p : pieces_) out.narrow(1, p.from, p.len).copy_(own.narrow(1, p.to, p.len));
    for (const auto& s : stacks_)
      for (std::int64_t j = 0; j + 1 < s.frames; ++j)
        out.narrow(1, s.offset + j * s.frame, s.frame).copy_(picked.select(1, s.frames - 1 - j).narrow(1, s.to, s.frame));
    return out;
  }

  /// Writes the links of the first `rows` rows.
  void save(BinaryWriter& w, std::int64_t rows) const {
    w.bytes(prev_.data(), static_cast<std::size_t>(rows) * sizeof(std::int32_t));
    w.bytes(child_.data(), static_cast<std::size_t>(rows) * sizeof(std::int32_t));
  }
  struct Saved {
    std::vector<std::int32_t> prev, child;
  };
  /// Reads what `save` wrote for `rows` rows, checking each link points at one of them.
  Saved read(BinaryReader& r, std::int64_t rows) const {
    Saved s;
    for (auto* v : {&s.prev, &s.child}) {
      v->resize(static_cast<std::size_t>(rows));
      r.bytes(v->data(), v->size() * sizeof(std::int32_t), v == &s.prev ? "frame links" : "frame links forward");
      for (auto l : *v)
        if (l < -1 || l >= rows) r.fail("frame links", "point outside the stored observations");
    }
    return s;
  }
  void restore(Saved&& s) {
    prev_.restart(s.prev.size());
    child_.restart(s.child.size());
    std::copy(s.prev.begin(), s.prev.end(), prev_.begin());
    std::copy(s.child.begin(), s.child.end(), child_.begin());
  }

 private:
  struct Stack {
    std::int64_t offset, frame, frames, to;  // in the full row; bytes a frame; frames; its newest frame's place in a stored row
  };
  struct Piece {
    std::int64_t from, to, len;  // bytes from the full row to the stored row
    std::int32_t stack;          // the stack whose newest frame it is, or -1
  };
  std::int64_t full_ = 0, stored_ = 0, depth_ = 1;
  std::vector<Stack> stacks_;
  std::vector<Piece> pieces_;
  HugeArray<std::int32_t> prev_, child_;  // per stored row
};

}  // namespace anvil::detail
