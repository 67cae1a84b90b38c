// MinReplacement: Belady's optimal replacement (MIN) for ops that need all
// their pages at once.
//
// Input is a reference string of ops, each a set of items (an item is one
// life of a page: from its first touch until its blocks are all freed; after
// that the page is empty and its next touch starts a new item). An op's items
// must all be resident together; on a miss the resident item used farthest in
// the future, among those the op does not use, is evicted (dead items, never
// used again, first). For pages of one size this is optimal: the exchange
// argument behind Belady's rule holds when the candidates exclude the op's
// own items.
//
// run() reports every miss with its victim and the op after whose use the
// victim was free to go: the planner turns those into prefetches issued as
// early as that, and the lower bound counts the fetches of items that held
// data (not an item's first touch).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

namespace zico::prefetch {

class MinReplacement {
 public:
  static constexpr uint32_t kNoItem = UINT32_MAX;
  static constexpr uint32_t kNoOp = UINT32_MAX;

  // Appends an op; its items (each < item_count) need not be sorted but must
  // not repeat.
  void add_op(std::span<const uint32_t> items);
  // The item's life ended before the next op: its slot is free at once (a
  // dead page is dropped without a copy) and it is never referenced again.
  void add_release(uint32_t item);

  struct Miss {
    uint32_t op = 0;                // the op that needs the item
    uint32_t item = 0;
    bool first_touch = false;       // the item's first reference: nothing to copy
    uint32_t victim = kNoItem;      // kNoItem: a slot was free
    // The op after which the slot the item takes was free: the victim's last
    // use before `op`, or when the free slot was freed (kNoOp: free from the
    // start).
    uint32_t slot_free_after = kNoOp;
  };
  // Runs MIN with `slots` resident items; `on_miss` is called in order.
  void run(uint32_t item_count, uint32_t slots, const std::function<void(const Miss&)>& on_miss) const;

 private:
  std::vector<uint32_t> refs_;
  std::vector<uint32_t> op_first_{0};
  std::vector<std::pair<uint32_t, uint32_t>> releases_;  // (before op, item), in order
};

}  // namespace zico::prefetch
