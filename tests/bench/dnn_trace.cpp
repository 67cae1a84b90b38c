#include "dnn_trace.h"

#include <algorithm>

namespace zico::bench {
namespace {

constexpr uint32_t kNoBlock = UINT32_MAX;

// splitmix64: tiny, and its output is fixed by the algorithm rather than by a
// standard library's choice of distribution.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); the modulo bias is irrelevant at these ranges.
  uint64_t below(uint64_t n) { return next() % n; }
  bool one_in(uint64_t n) { return below(n) == 0; }

  // Log-uniform by octave: a random power-of-two octave of [lo, hi), then
  // uniform inside it. Tensor sizes are whole fp32 elements.
  size_t size_between(size_t lo, size_t hi) {
    size_t octaves = 1;
    while ((lo << octaves) < hi) ++octaves;
    const size_t base = lo << below(octaves);
    const size_t bytes = std::min(base + below(base), hi - 1);
    return std::max<size_t>(bytes / 4 * 4, 4);
  }

 private:
  uint64_t state_;
};

class TraceBuilder {
 public:
  uint32_t allocate(size_t bytes) {
    trace_.ops.push_back({TraceOp::Kind::kAllocate, trace_.ids, bytes});
    return trace_.ids++;
  }
  void free(uint32_t id) { trace_.ops.push_back({TraceOp::Kind::kFree, id, 0}); }
  // Frees `id` unless it is kNoBlock, and forgets it.
  void free_if_any(uint32_t& id) {
    if (id != kNoBlock) free(id);
    id = kNoBlock;
  }
  DnnTrace take() { return std::move(trace_); }

 private:
  DnnTrace trace_;
};

struct Model {
  std::vector<size_t> weight_bytes;
  std::vector<size_t> activation_bytes;  // per layer
  std::vector<size_t> small_bytes;       // per layer; 0: none
  std::vector<bool> transient;           // per layer
  std::vector<int> weight_of_layer;
};

Model draw_model(const DnnTraceOptions& o, Rng& rng) {
  Model m;
  for (int w = 0; w < o.weights; ++w) m.weight_bytes.push_back(rng.size_between(o.min_weight_bytes, o.max_weight_bytes));
  for (int layer = 0; layer < o.layers; ++layer) {
    m.activation_bytes.push_back(rng.size_between(o.min_activation_bytes, o.max_activation_bytes));
    m.small_bytes.push_back(rng.one_in(2) ? rng.size_between(size_t{1} << 10, size_t{512} << 10) : 0);
    m.transient.push_back(rng.one_in(4));
    m.weight_of_layer.push_back(layer * o.weights / o.layers);
  }
  return m;
}

void training_step(const DnnTraceOptions& o, const Model& m, Rng& rng, TraceBuilder& t) {
  const auto layers = static_cast<size_t>(o.layers);
  auto workspace = [&] { return rng.size_between(o.min_workspace_bytes, o.max_workspace_bytes); };

  const uint32_t input = t.allocate(m.activation_bytes[0]);
  std::vector<uint32_t> saved(layers);
  std::vector<uint32_t> small(layers, kNoBlock);
  uint32_t transient = kNoBlock;
  for (size_t layer = 0; layer < layers; ++layer) {
    const uint32_t scratch = t.allocate(workspace());
    saved[layer] = t.allocate(m.activation_bytes[layer]);
    t.free(scratch);
    t.free_if_any(transient);
    if (m.small_bytes[layer] != 0) small[layer] = t.allocate(m.small_bytes[layer]);
    if (m.transient[layer]) transient = t.allocate(m.activation_bytes[layer]);
  }
  t.free_if_any(transient);

  std::vector<uint32_t> weight_grad(m.weight_bytes.size(), kNoBlock);
  uint32_t grad_out = t.allocate(m.activation_bytes[layers - 1]);  // dLoss/dOutput
  for (size_t layer = layers; layer-- > 0;) {
    // The first layer needs no gradient for the input batch.
    const uint32_t grad_in = layer > 0 ? t.allocate(m.activation_bytes[layer - 1]) : kNoBlock;
    const uint32_t scratch = t.allocate(workspace());
    const auto w = static_cast<size_t>(m.weight_of_layer[layer]);
    if (weight_grad[w] == kNoBlock) weight_grad[w] = t.allocate(m.weight_bytes[w]);
    t.free(scratch);
    t.free(saved[layer]);
    t.free_if_any(small[layer]);
    t.free(grad_out);
    grad_out = grad_in;
  }
  t.free(input);

  for (size_t w = 0; w < m.weight_bytes.size(); ++w) t.free(t.allocate(m.weight_bytes[w]));
  for (uint32_t& grad : weight_grad) t.free_if_any(grad);
}

}  // namespace

DnnTrace make_dnn_trace(const DnnTraceOptions& options) {
  Rng rng(options.seed);
  const Model model = draw_model(options, rng);
  TraceBuilder t;
  std::vector<uint32_t> persistent;
  for (size_t bytes : model.weight_bytes) {
    for (int copy = 0; copy < 3; ++copy) persistent.push_back(t.allocate(bytes));  // weight, Adam m and v
  }
  for (int step = 0; step < options.iterations; ++step) training_step(options, model, rng, t);
  for (auto it = persistent.rbegin(); it != persistent.rend(); ++it) t.free(*it);
  return t.take();
}

}  // namespace zico::bench
