#include "unseen_uses.h"

#include <algorithm>

namespace zico::prefetch {

void UnseenUses::announce(uint64_t stamp, uint32_t index, uint64_t exec_id, std::span<const PageId> named) {
  if (index >= kMaxPlaces) return;
  current_.ops.push_back(Announced{stamp, index, exec_id, static_cast<uint32_t>(current_.named.size()),
                                   static_cast<uint32_t>(named.size())});
  current_.named.insert(current_.named.end(), named.begin(), named.end());
}

const UnseenUses::Announced* UnseenUses::find(uint64_t stamp, const Generation** named_in) const {
  for (const Generation* generation : {&current_, &previous_}) {
    const auto it = std::lower_bound(generation->ops.begin(), generation->ops.end(), stamp,
                                     [](const Announced& op, uint64_t s) { return op.stamp < s; });
    if (it != generation->ops.end() && it->stamp == stamp) {
      *named_in = generation;
      return &*it;
    }
  }
  return nullptr;
}

bool UnseenUses::on_fault(uint64_t stamp, PageId page) {
  const Generation* generation = nullptr;
  const Announced* op = find(stamp, &generation);
  if (op == nullptr) return false;
  const auto named_begin = generation->named.begin() + op->first;
  if (std::binary_search(named_begin, named_begin + op->count, page)) return false;
  Learnt& learnt = learnt_[op->index];
  if (learnt.exec_id != op->exec_id) {
    learnt_pages_ -= learnt.pages.size();
    learnt = Learnt{op->exec_id, {}};
  }
  const auto at = std::lower_bound(learnt.pages.begin(), learnt.pages.end(), page);
  if (at == learnt.pages.end() || *at != page) {
    learnt.pages.insert(at, page);
    ++learnt_pages_;
  }
  return true;
}

void UnseenUses::learnt_for(uint32_t index, uint64_t exec_id, std::vector<PageId>* pages) {
  const auto it = learnt_.find(index);
  if (it == learnt_.end() || it->second.exec_id != exec_id) return;
  pages->insert(pages->end(), it->second.pages.begin(), it->second.pages.end());
}

void UnseenUses::reports_read() {
  std::swap(previous_, current_);
  current_.clear();
}

}  // namespace zico::prefetch
