// A deterministic allocation trace shaped like one DNN training run.
//
// What a training step looks like to a caching allocator (PyTorch's order of
// events, one stream):
//   forward    the input batch arrives; each layer saves an activation for
//              backward (0.5-64 MiB, irregular sizes) and about half save a
//              small tensor too (< 512 KiB: norm statistics, dropout masks).
//              A workspace (cuDNN/cuBLAS scratch) is allocated before each
//              layer's output and freed right after it, so it leaves a hole
//              next to a block that lives on; a quarter of the layers also
//              make a transient intermediate that dies one layer later.
//   backward   layers in reverse: the gradient for the layer's input is
//              allocated, a workspace churns, the weight gradient is allocated
//              when its weight is first reached, then the saved activation and
//              the gradient flowing in are freed.
//   optimizer  a temporary the size of each weight, then every weight
//              gradient is freed (zero_grad(set_to_none=True)).
// Weights and two optimizer moments per weight are allocated once, before the
// first step, and freed after the last.
//
// The model (weight and activation sizes, which layers keep small tensors or
// make transients) is drawn once from the seed, so every step repeats the same
// tensor sizes as real training does; workspace sizes are drawn afresh for
// every use, as algorithm choice varies them. The generator uses integer
// arithmetic only: the same options give the same trace on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zico::bench {

struct DnnTraceOptions {
  uint64_t seed = 0x2545f4914f6cdd1d;
  int weights = 6;  // each with two optimizer moments of its size
  int layers = 24;  // consecutive layers share a weight block
  int iterations = 5;
  size_t min_weight_bytes = size_t{2} << 20;
  size_t max_weight_bytes = size_t{32} << 20;
  size_t min_activation_bytes = size_t{512} << 10;
  size_t max_activation_bytes = size_t{64} << 20;
  size_t min_workspace_bytes = size_t{256} << 10;
  size_t max_workspace_bytes = size_t{32} << 20;
};

// One step of a trace: allocate `bytes` under `id`, or free the block of `id`.
// Every id is allocated exactly once and freed exactly once, in that order.
struct TraceOp {
  enum class Kind : uint8_t { kAllocate, kFree };
  Kind kind = Kind::kAllocate;
  uint32_t id = 0;
  size_t bytes = 0;  // kAllocate only
};

struct DnnTrace {
  std::vector<TraceOp> ops;
  uint32_t ids = 0;  // every op's id is below this
};

[[nodiscard]] DnnTrace make_dnn_trace(const DnnTraceOptions& options = {});

}  // namespace zico::bench
