#pragma once
/// @file
/// How the replay store (buffers/detail/transition_store.hpp) copies rows on the host:
/// `copy_into_ring`, a step's staged rows into a ring; `gather_on_host`, a batch of random
/// transitions out of the rings, prefetching ahead of the copies; `host_as`, a tensor's
/// values readable on the host; and `ObsLink`, a transition's links to its observation rows.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include <anvil/buffers/detail/frame_chains.hpp>
#include <anvil/core/detail/huge_pages.hpp>
#include <anvil/core/reused_tensor.hpp>

namespace anvil::detail {

/// `t`'s values as a contiguous host tensor of `dtype`, for reading its data: `t` itself when
/// it is one already, so the per-step calls of the buffers, which usually get such tensors,
/// run no LibTorch op; else a converted copy (no autograd history).
inline at::Tensor host_as(const at::Tensor& t, at::ScalarType dtype) {
  if (t.is_cpu() && t.scalar_type() == dtype && t.is_contiguous()) return t;
  return t.detach().to(at::kCPU, dtype).contiguous();
}

/// Copies `stage` (rows of `w` elements of `dtype`: float32, or the bytes of observation
/// rows; `stage_bytes` in all) into `ring` from row `first` on, wrapping (at most two
/// pieces); only the last `ring.size(0)` rows survive when more were staged.
inline void copy_into_ring(at::Tensor& ring, std::int64_t first, void* stage_data, std::int64_t stage_bytes, std::int64_t w,
                           at::ScalarType dtype) {
  const std::int64_t es = dtype == at::kByte ? 1 : 4;
  auto* stage = static_cast<std::uint8_t*>(stage_data);
  const auto k = stage_bytes / (w * es);
  const std::int64_t cap = ring.size(0);
  if (k == 0) return;
  const std::int64_t skip = std::max<std::int64_t>(0, k - cap);
  // A ring on the host in the stage's dtype (the usual case, once per env step) takes a
  // memcpy per piece; other dtypes and devices go through LibTorch's copy.
  const bool raw = ring.is_cpu() && ring.scalar_type() == dtype && ring.is_contiguous();
  const auto src = raw ? at::Tensor() : at::from_blob(stage + skip * w * es, {k - skip, w}, dtype);
  std::int64_t done = 0;
  while (done < k - skip) {
    const std::int64_t slot = (first + skip + done) % cap;
    const std::int64_t len = std::min(k - skip - done, cap - slot);
    if (raw)
      std::memcpy(static_cast<std::uint8_t*>(ring.data_ptr()) + slot * w * es, stage + (skip + done) * w * es,
                  static_cast<std::size_t>(len * w * es));
    else
      ring.narrow(0, slot, len).copy_(src.narrow(0, done, len));
    done += len;
  }
}

/// The observation rows of a transition's obs and next_obs; -1 when the row holds none.
struct ObsLink {
  std::int32_t obs = -1, next = -1;
};

/// What a batch is gathered from (the rings) and into (the batch's columns) on the host.
struct HostGather {
  const float* rows;          ///< transition rows: action, reward, terminated (, discount) (, task)
  std::int64_t width;         ///< floats a transition row
  const ObsLink* links;       ///< per transition row
  std::int64_t ad;            ///< action width
  std::int64_t task_col;      ///< the task's column, or -1
  bool discount;              ///< a discount column after terminated
  std::int64_t od, sd;        ///< an observation's width in the batch, and stored (elements)
  const FrameChains* frames;  ///< frame stacks to rebuild (bytes), or null: rows stored whole
  float *action, *reward, *terminated, *discount_out;
  std::int64_t* task;  ///< null without tasks
};

/// Copies the transitions in rows `slots` into `g`'s columns and their obs and next_obs into
/// `o` and `no` (`g.od` elements each, converted from the ring's `Src`).
///
/// Rows of random transitions miss every cache. They are read in two passes over each chunk
/// of the batch, each fetching its lines kAhead transitions ahead into the L2
/// (`prefetch_l2`): the links and action rows, then the two observation rows that the links
/// name. The prefetches are written out in the loops, not in helper lambdas: GCC 12 counts a
/// lambda that only reads and prefetches as free of side effects and drops its calls, which
/// left the observation rows unfetched before (a uniform sample took 2.6x as long;
/// benchmarks/RESULTS.md, "The gather in two passes").
template <class Src, class Out>
void gather_on_host(const HostGather& g, std::span<const std::int64_t> slots, const Src* obs_src, Out* o, Out* no) {
  constexpr std::int64_t kChunk = 256, kAhead = 24;
  const auto n = static_cast<std::int64_t>(slots.size());
  const float* src = g.rows;
  const ObsLink* link = g.links;
  const std::int64_t width = g.width, ad = g.ad, od = g.od, sd = g.sd;
  std::int32_t rows[2 * kChunk];  // the chunk's observation rows: obs, next_obs of each transition
  for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const std::int64_t m = std::min(kChunk, n - c0);
    const std::int64_t* sl = slots.data() + c0;
    // pass 1: the links and action rows
    for (std::int64_t i = 0; i < std::min(kAhead, m); ++i) {
      prefetch_l2(link + sl[i]);
      prefetch_l2(src + sl[i] * width);
    }
    for (std::int64_t i = 0; i < m; ++i) {
      if (i + kAhead < m) {
        prefetch_l2(link + sl[i + kAhead]);
        prefetch_l2(src + sl[i + kAhead] * width);
      }
      const ObsLink l = link[sl[i]];
      rows[2 * i] = l.obs;
      rows[2 * i + 1] = l.next;
      const float* row = src + sl[i] * width;
      const std::int64_t k = c0 + i;
      std::memcpy(g.action + k * ad, row, static_cast<std::size_t>(ad) * sizeof(float));
      g.reward[k] = row[ad];
      g.terminated[k] = row[ad + 1];
      if (g.discount) g.discount_out[k] = row[ad + 2];
      if (g.task) g.task[k] = static_cast<std::int64_t>(row[g.task_col]);
    }
    // pass 2: the observation rows, each fetched by its first and last elements (its at most
    // two lines), 2 * kAhead rows ahead
    const std::int64_t count = 2 * m, ahead = 2 * kAhead;
    for (std::int64_t e = 0; e < std::min(ahead, count); ++e) {
      prefetch_l2(obs_src + rows[e] * sd);
      prefetch_l2(obs_src + rows[e] * sd + sd - 1);
    }
    for (std::int64_t e = 0; e < count; e += 2) {  // a transition's obs and next_obs
      if (e + ahead < count) {
        prefetch_l2(obs_src + rows[e + ahead] * sd);
        prefetch_l2(obs_src + rows[e + ahead] * sd + sd - 1);
        prefetch_l2(obs_src + rows[e + ahead + 1] * sd);
        prefetch_l2(obs_src + rows[e + ahead + 1] * sd + sd - 1);
      }
      const Src* ro = obs_src + rows[e] * sd;
      const Src* rn = obs_src + rows[e + 1] * sd;
      Out* oi = o + (c0 + e / 2) * od;
      Out* ni = no + (c0 + e / 2) * od;
      if constexpr (std::is_same_v<Src, std::uint8_t> && std::is_same_v<Out, std::uint8_t>) {
        if (g.frames != nullptr) {  // stacks rebuilt from their rows
          g.frames->rebuild(obs_src, rows[e], oi);
          g.frames->rebuild(obs_src, rows[e + 1], ni);
          continue;
        }
      }
      if constexpr (std::is_same_v<Src, Out>) {  // (a call of memcpy's own vector kernels)
        std::memcpy(oi, ro, static_cast<std::size_t>(od) * sizeof(Out));
        std::memcpy(ni, rn, static_cast<std::size_t>(od) * sizeof(Out));
      } else {
        for (std::int64_t j = 0; j < od; ++j) oi[j] = static_cast<Out>(ro[j]);
        for (std::int64_t j = 0; j < od; ++j) ni[j] = static_cast<Out>(rn[j]);
      }
    }
  }
}

}  // namespace anvil::detail
