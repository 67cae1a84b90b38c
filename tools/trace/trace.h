// A memory trace of one training job, loaded and validated (docs/trace-format.md).
//
// Block ids from the file are renumbered densely (0..blocks.size()-1) so
// replayers can index arrays by block. Events keep file order; times never
// decrease along them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zico::trace {

enum class Category : uint8_t { kParam, kGrad, kOptim, kActivation, kTemp, kInput, kOther, kCount };

[[nodiscard]] const char* to_string(Category category);

inline constexpr uint64_t kNever = UINT64_MAX;

struct Block {
  uint64_t bytes = 0;
  uint64_t alloc_time = 0;
  uint64_t free_time = kNever;  // kNever: still live at the end of the trace
  uint32_t alloc_iteration = 0;
  uint32_t free_iteration = UINT32_MAX;
  int64_t op = -1;  // the op that produced it, or -1
  Category category = Category::kOther;
  // Lives from one iteration into another (weights, optimizer state, and the
  // like); the rest are transient: born and dead within one iteration.
  [[nodiscard]] bool persistent() const { return free_iteration != alloc_iteration; }
};

struct Op {
  uint64_t start = 0;
  uint64_t duration = 0;
  uint32_t name = 0;  // index into Trace::op_names
  std::vector<uint32_t> reads;
  std::vector<uint32_t> writes;
};

struct Event {
  enum class Kind : uint8_t { kAllocate, kFree, kOp, kIteration };
  Kind kind = Kind::kAllocate;
  uint32_t index = 0;  // block, op or iteration number
  uint64_t time = 0;
};

struct Trace {
  std::string name;  // file name, for messages
  std::map<std::string, std::string> meta;
  std::vector<Block> blocks;
  std::vector<Op> ops;
  std::vector<std::string> op_names;
  std::vector<Event> events;
  std::vector<size_t> iteration_starts;  // index into events of each `i` record
};

}  // namespace zico::trace
