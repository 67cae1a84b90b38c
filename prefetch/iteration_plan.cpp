#include "iteration_plan.h"

#include <algorithm>
#include <climits>

#include "min_replacement.h"

namespace zico::prefetch {

void IterationPlan::build(const LearnedIteration& learned, uint32_t slots, uint32_t page_count) {
  clear();
  const uint32_t length = learned.ops();
  if (length == 0) return;
  constexpr uint32_t kCopies = 3;
  constexpr uint32_t kNone = UINT32_MAX;

  // Items are page lives: a death ends one, the next touch starts another.
  MinReplacement min;
  std::vector<uint32_t> life(page_count, kNone);
  // The unrolled op before which the page's last life ended (never: far back).
  std::vector<int64_t> died_at(page_count, -int64_t{kCopies} * length);
  std::vector<PageId> item_page;
  std::vector<int64_t> item_born;  // a new life's page may be brought in only after the old one died
  std::vector<uint32_t> items;
  const auto& deaths = learned.deaths();
  for (uint32_t copy = 0; copy < kCopies; ++copy) {
    size_t death = 0;
    for (uint32_t position = 0; position < length; ++position) {
      for (; death < deaths.size() && deaths[death].first <= position; ++death) {
        const PageId page = deaths[death].second;
        if (life[page] != kNone) min.add_release(life[page]);
        life[page] = kNone;
        died_at[page] = int64_t{copy} * length + position;
      }
      items.clear();
      for (const PageId page : learned.pages(position)) {
        if (life[page] == kNone) {
          life[page] = static_cast<uint32_t>(item_page.size());
          item_page.push_back(page);
          item_born.push_back(died_at[page]);
        }
        items.push_back(life[page]);
      }
      min.add_op(items);
    }
    for (; death < deaths.size(); ++death) {  // after the last op
      const PageId page = deaths[death].second;
      if (life[page] != kNone) min.add_release(life[page]);
      life[page] = kNone;
      died_at[page] = int64_t{copy + 1} * length;
    }
  }

  const int64_t l = length;
  min.run(static_cast<uint32_t>(item_page.size()), slots, [&](const MinReplacement::Miss& miss) {
    if (miss.op < length || miss.op >= 2 * length) return;  // keep the middle copy's
    const int64_t need = int64_t{miss.op} - l;
    PlannedFetch fetch;
    fetch.need = static_cast<uint32_t>(need);
    fetch.page = item_page[miss.item];
    // No earlier than one iteration ahead of the need, than the death of the
    // page's previous life, or than its slot is free (after the victim's last
    // use, or whenever MIN's free slot was freed).
    fetch.issue = std::max(need - l + 1, item_born[miss.item] - l);
    if (miss.slot_free_after != MinReplacement::kNoOp) {
      fetch.issue = std::max(fetch.issue, int64_t{miss.slot_free_after} + 1 - l);
    }
    if (miss.victim != MinReplacement::kNoItem) fetch.victim = item_page[miss.victim];
    fetches_.push_back(fetch);
  });
  std::stable_sort(fetches_.begin(), fetches_.end(),
                   [](const PlannedFetch& a, const PlannedFetch& b) { return a.issue < b.issue; });
  by_need_.resize(fetches_.size());
  for (uint32_t i = 0; i < by_need_.size(); ++i) by_need_[i] = i;
  std::stable_sort(by_need_.begin(), by_need_.end(),
                   [&](uint32_t a, uint32_t b) { return fetches_[a].need < fetches_[b].need; });
}

}  // namespace zico::prefetch
