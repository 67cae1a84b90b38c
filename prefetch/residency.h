// Residency: where each page of one job is, and what the budget leaves free.
//
// States of a page:
//   kAbsent   — not on the GPU (on the host, or never populated);
//   kQueued   — a prefetch waits for a slot (an eviction in flight frees one);
//               not on the GPU yet and holds no slot;
//   kArriving — holds a slot, its host-to-device copy is in flight;
//   kResident — on the GPU;
//   kLeaving  — holds its slot until its device-to-host copy completes.
// Slots are pages of the budget: resident + arriving + leaving pages never
// exceed budget_pages() (the one invariant the whole planner exists to keep).
//
// Beside the state, each page has:
//   live bytes — bytes of live blocks on it; a page with none is dead, and
//                discarding it loses nothing;
//   has data   — it holds bytes someone wrote and nobody discarded: moving it
//                costs a transfer; without data it is populated for free;
//   migrated   — when it last became resident: the UVM driver's eviction order
//                (least recently migrated first), which DeepUM pre-evicts by
//                too.
//
// Only the executor (the paging simulator, or the UM runtime) changes a page;
// policies read. Not thread-safe.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "access_stream.h"

namespace zico::prefetch {

enum class PageState : uint8_t { kAbsent, kQueued, kArriving, kResident, kLeaving };
[[nodiscard]] const char* to_string(PageState state);

class Residency {
 public:
  Residency(uint64_t page_bytes, uint32_t page_count, uint64_t budget_bytes);

  [[nodiscard]] uint64_t page_bytes() const { return page_bytes_; }
  [[nodiscard]] uint32_t page_count() const { return static_cast<uint32_t>(pages_.size()); }
  [[nodiscard]] uint32_t budget_pages() const { return budget_pages_; }

  [[nodiscard]] PageState state(PageId page) const { return pages_[page].state; }
  // On the GPU or on its way: no prefetch needed.
  [[nodiscard]] bool present_or_coming(PageId page) const {
    const PageState s = pages_[page].state;
    return s == PageState::kResident || s == PageState::kArriving || s == PageState::kQueued;
  }
  [[nodiscard]] bool has_data(PageId page) const { return pages_[page].has_data; }
  [[nodiscard]] bool live(PageId page) const { return pages_[page].live_bytes > 0; }
  [[nodiscard]] uint64_t live_bytes(PageId page) const { return pages_[page].live_bytes; }

  // Pages holding a slot (resident, arriving, leaving), and the slots left.
  [[nodiscard]] uint32_t occupied_pages() const { return occupied_; }
  [[nodiscard]] uint32_t free_pages() const { return budget_pages_ - occupied_; }
  [[nodiscard]] uint32_t leaving_pages() const { return leaving_; }
  [[nodiscard]] uint32_t arriving_pages() const { return arriving_; }
  [[nodiscard]] uint32_t queued_pages() const { return queued_; }

  // Resident pages, least recently migrated first: (migrated at ns, page).
  [[nodiscard]] const std::set<std::pair<uint64_t, PageId>>& by_migration() const { return by_migration_; }

  // --- the executor's transitions ---------------------------------------
  // Live bytes: a page whose count falls to zero is dead; returns true then.
  void add_live(PageId page, uint64_t bytes) { pages_[page].live_bytes += bytes; }
  [[nodiscard]] bool remove_live(PageId page, uint64_t bytes);
  void set_has_data(PageId page, bool has_data) { pages_[page].has_data = has_data; }
  // Each asserts the state it leaves (debug builds).
  void queue(PageId page);                         // kAbsent -> kQueued
  void start_arrival(PageId page);                 // kAbsent or kQueued -> kArriving (takes a slot)
  void arrive(PageId page, uint64_t now_ns);       // kArriving -> kResident
  void start_leaving(PageId page);                 // kResident -> kLeaving
  void leave(PageId page);                         // kLeaving -> kAbsent (frees the slot)
  void drop(PageId page);                          // kResident -> kAbsent at once (no copy needed)
  void unqueue(PageId page);                       // kQueued -> kAbsent
  // The budget changed (a node manager lends the job more or asks some back).
  // The executor evicts first: occupied pages never exceed the new budget.
  void set_budget_pages(uint32_t pages);

 private:
  struct Page {
    uint64_t live_bytes = 0;
    uint64_t migrated_at = 0;
    PageState state = PageState::kAbsent;
    bool has_data = false;
  };
  void leave_resident(PageId page);

  uint64_t page_bytes_;
  uint32_t budget_pages_;
  uint32_t occupied_ = 0;
  uint32_t leaving_ = 0;
  uint32_t arriving_ = 0;
  uint32_t queued_ = 0;
  std::vector<Page> pages_;
  std::set<std::pair<uint64_t, PageId>> by_migration_;
};

}  // namespace zico::prefetch
