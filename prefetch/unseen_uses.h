// UnseenUses: the pages a kernel used that its launch did not name, learnt
// from the driver's fault reports, and named for it from the next iteration
// on.
//
// A kernel can reach memory its parameters do not point to (pointer arrays
// on the device; cuBLAS's batched products take them): told only what the
// parameters show, the pager neither fetches those pages ahead nor counts
// them on the GPU when the kernel faults them in. The driver's fault reports
// (CUPTI's unified-memory records on CUDA, SimDriver's own) say which page
// arrived under which op's tag. Iterations repeat, so the op at the same place
// of the next iteration with the same execution ID uses the same pages: a use
// is learnt for a place in the iteration, not for the execution ID alone, as
// one kernel runs at many places (a GEMM, once per layer).
//
// An op's tag is the pager's stamp for it (unique, rising). Reports arrive
// late (CUPTI hands them over in buffers when the pager reads them), so the
// ops announced since the last read and those of the read before are
// remembered, no more: memory stays bounded in a job that never marks an
// iteration. Places past kMaxPlaces learn nothing (such a job's places never
// come round again).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "access_stream.h"

namespace zico::prefetch {

class UnseenUses {
 public:
  static constexpr uint32_t kMaxPlaces = uint32_t{1} << 18;

  // The op at `index` of the current iteration, tagged `stamp` (greater than
  // every stamp announced before), was announced naming `named` (sorted).
  void announce(uint64_t stamp, uint32_t index, uint64_t exec_id, std::span<const PageId> named);
  // `page` arrived under the op tagged `stamp`. True when the op did not name
  // it: then it is learnt for the op's place. False for a page the op named,
  // or an op announced before the read before the last.
  bool on_fault(uint64_t stamp, PageId page);
  // Appends the learnt pages of the op at `index` with `exec_id` to *pages
  // (none when the place learnt them for another execution ID: an
  // iteration with an op more or less shifts the places after it; what a
  // place learnt is replaced when a fault there teaches it anew).
  void learnt_for(uint32_t index, uint64_t exec_id, std::vector<PageId>* pages);
  // The reports were read: the ops announced since the read before are forgotten.
  void reports_read();
  // Pages learnt, over every place.
  [[nodiscard]] uint64_t learnt_pages() const { return learnt_pages_; }

 private:
  struct Announced {
    uint64_t stamp = 0;
    uint32_t index = 0;
    uint64_t exec_id = 0;
    uint32_t first = 0;  // into Generation::named
    uint32_t count = 0;
  };
  struct Generation {
    std::vector<Announced> ops;  // by rising stamp
    std::vector<PageId> named;
    void clear() {
      ops.clear();
      named.clear();
    }
  };
  struct Learnt {
    uint64_t exec_id = 0;
    std::vector<PageId> pages;  // sorted
  };

  // The op tagged `stamp` in *named_in's generation; null if neither holds it.
  const Announced* find(uint64_t stamp, const Generation** named_in) const;

  Generation current_;   // announced since the last read
  Generation previous_;  // between the two reads before
  std::unordered_map<uint32_t, Learnt> learnt_;  // by place in the iteration
  uint64_t learnt_pages_ = 0;
};

}  // namespace zico::prefetch
