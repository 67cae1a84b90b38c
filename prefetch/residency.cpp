#include "residency.h"

#include <algorithm>
#include <cassert>

namespace zico::prefetch {

const char* to_string(PageState state) {
  switch (state) {
    case PageState::kAbsent: return "absent";
    case PageState::kQueued: return "queued";
    case PageState::kArriving: return "arriving";
    case PageState::kResident: return "resident";
    case PageState::kLeaving: return "leaving";
  }
  return "?";
}

Residency::Residency(uint64_t page_bytes, uint32_t page_count, uint64_t budget_bytes)
    : page_bytes_(page_bytes),
      budget_pages_(static_cast<uint32_t>(std::min<uint64_t>(budget_bytes / page_bytes, UINT32_MAX))),
      pages_(page_count) {}

bool Residency::remove_live(PageId page, uint64_t bytes) {
  Page& p = pages_[page];
  assert(p.live_bytes >= bytes);
  p.live_bytes -= bytes;
  return p.live_bytes == 0;
}

void Residency::set_budget_pages(uint32_t pages) {
  assert(occupied_ <= pages);
  budget_pages_ = pages;
}

void Residency::queue(PageId page) {
  assert(pages_[page].state == PageState::kAbsent);
  pages_[page].state = PageState::kQueued;
  ++queued_;
}

void Residency::unqueue(PageId page) {
  assert(pages_[page].state == PageState::kQueued);
  pages_[page].state = PageState::kAbsent;
  --queued_;
}

void Residency::start_arrival(PageId page) {
  Page& p = pages_[page];
  assert(p.state == PageState::kAbsent || p.state == PageState::kQueued);
  assert(occupied_ < budget_pages_);
  if (p.state == PageState::kQueued) --queued_;
  p.state = PageState::kArriving;
  ++occupied_;
  ++arriving_;
}

void Residency::arrive(PageId page, uint64_t now_ns) {
  Page& p = pages_[page];
  assert(p.state == PageState::kArriving);
  p.state = PageState::kResident;
  --arriving_;
  p.migrated_at = now_ns;
  by_migration_.emplace(now_ns, page);
}

void Residency::leave_resident(PageId page) {
  Page& p = pages_[page];
  assert(p.state == PageState::kResident);
  by_migration_.erase({p.migrated_at, page});
}

void Residency::start_leaving(PageId page) {
  leave_resident(page);
  pages_[page].state = PageState::kLeaving;
  ++leaving_;
}

void Residency::leave(PageId page) {
  assert(pages_[page].state == PageState::kLeaving);
  pages_[page].state = PageState::kAbsent;
  --leaving_;
  --occupied_;
}

void Residency::drop(PageId page) {
  leave_resident(page);
  pages_[page].state = PageState::kAbsent;
  --occupied_;
}

}  // namespace zico::prefetch
