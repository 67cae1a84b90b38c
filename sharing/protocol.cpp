// Encoding and decoding of the node protocol (protocol.h, docs/protocol.md).
//
// Each message's layout is written once, as `fields(codec, message)`, and
// drives both directions: the Writer checks each value and appends it, the
// Reader takes it from the datagram and checks it. One list per message is
// what keeps the two sides from drifting: the encoder never emits what the
// decoder refuses, and every accepted datagram re-encodes to the same bytes
// (tests/fuzz/protocol_fuzz.cpp checks exactly that).
//
// The decoder reads untrusted bytes from any local process, so it never
// reinterprets the buffer: integers are assembled byte by byte (endianness-
// and alignment-free), and every read checks the bytes left first.
#include "protocol.h"

#include <concepts>
#include <cstdio>
#include <string_view>
#include <type_traits>
#include <utility>

namespace zico::proto {
namespace {

// --- per-message metadata -----------------------------------------------------

template <class T>
struct Traits;
#define ZICO_PROTO_TRAITS(Struct, Enumerator, Name) \
  template <>                                      \
  struct Traits<Struct> {                          \
    static constexpr Type kType = Type::Enumerator; \
    static constexpr const char* kName = Name;     \
  }
ZICO_PROTO_TRAITS(Hello, kHello, "Hello");
ZICO_PROTO_TRAITS(OpenGpu, kOpenGpu, "OpenGpu");
ZICO_PROTO_TRAITS(Request, kRequest, "Request");
ZICO_PROTO_TRAITS(Cancel, kCancel, "Cancel");
ZICO_PROTO_TRAITS(Return, kReturn, "Return");
ZICO_PROTO_TRAITS(Report, kReport, "Report");
ZICO_PROTO_TRAITS(JobState, kJobState, "JobState");
ZICO_PROTO_TRAITS(Welcome, kWelcome, "Welcome");
ZICO_PROTO_TRAITS(GpuOpened, kGpuOpened, "GpuOpened");
ZICO_PROTO_TRAITS(Grant, kGrant, "Grant");
ZICO_PROTO_TRAITS(Deny, kDeny, "Deny");
ZICO_PROTO_TRAITS(Reclaim, kReclaim, "Reclaim");
ZICO_PROTO_TRAITS(Yield, kYield, "Yield");
ZICO_PROTO_TRAITS(Limits, kLimits, "Limits");
ZICO_PROTO_TRAITS(Suspend, kSuspend, "Suspend");
ZICO_PROTO_TRAITS(Resume, kResume, "Resume");
ZICO_PROTO_TRAITS(StatusQuery, kStatusQuery, "StatusQuery");
ZICO_PROTO_TRAITS(StatusReply, kStatus, "Status");
ZICO_PROTO_TRAITS(SetBudget, kSetBudget, "SetBudget");
ZICO_PROTO_TRAITS(Result, kResult, "Result");
ZICO_PROTO_TRAITS(JobControl, kJobControl, "JobControl");
ZICO_PROTO_TRAITS(Goodbye, kGoodbye, "Goodbye");
ZICO_PROTO_TRAITS(IterationMark, kIterationMark, "IterationMark");
ZICO_PROTO_TRAITS(Curve, kCurve, "Curve");
ZICO_PROTO_TRAITS(Proceed, kProceed, "Proceed");
ZICO_PROTO_TRAITS(ResidentGrant, kResidentGrant, "ResidentGrant");
ZICO_PROTO_TRAITS(MemoryWanted, kMemoryWanted, "MemoryWanted");
#undef ZICO_PROTO_TRAITS

// Type of each variant alternative, by index: type_of() is one lookup, and a
// message added to the variant without Traits fails to compile here.
template <size_t... I>
constexpr std::array<Type, sizeof...(I)> make_type_table(std::index_sequence<I...>) {
  return {Traits<std::variant_alternative_t<I, Message>>::kType...};
}
constexpr auto kTypeTable = make_type_table(std::make_index_sequence<std::variant_size_v<Message>>());

bool is_known_type(uint16_t raw) {
  for (Type type : kTypeTable) {
    if (static_cast<uint16_t>(type) == raw) return true;
  }
  return false;
}

std::string hex(uint32_t value, int digits) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%0*X", digits, value);
  return text;
}

// Empty when `text` may travel as a protocol string, else what is wrong with it.
std::string string_problem(std::string_view field, std::string_view text) {
  if (text.size() > kMaxString) {
    return std::string(field) + " is " + std::to_string(text.size()) + " bytes long (at most " +
           std::to_string(kMaxString) + ")";
  }
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    if (byte < 0x20 || byte > 0x7e) {
      return std::string(field) + " has byte " + hex(byte, 2) + " at offset " + std::to_string(i) +
             " (only printable ASCII 0x20..0x7e)";
    }
  }
  return {};
}

std::string count_problem(std::string_view field, size_t count, size_t min, size_t max) {
  return std::string(field) + " has " + std::to_string(count) + " entries (must be " + std::to_string(min) +
         ".." + std::to_string(max) + ")";
}

// --- the two codecs --------------------------------------------------------------

// What both directions share: the first failure wins and names the field.
class Codec {
 public:
  explicit Codec(std::string* why) : why_(why) {}

  bool fail(std::string reason) {
    if (why_ != nullptr) *why_ = std::move(reason);
    return false;
  }
  // `describe` builds the message only when the check fails.
  template <class Describe>
  bool require(bool condition, Describe&& describe) {
    return condition || fail(describe());
  }
  bool nonzero(const char* field, uint64_t value) {
    return require(value != 0, [&] { return std::string(field) + " is 0 (must be != 0)"; });
  }

 private:
  std::string* why_;
};

class Writer : public Codec {
 public:
  Writer(std::vector<uint8_t>* out, std::string* why) : Codec(why), out_(out) {}

  bool u8(const char*, uint8_t value) {
    out_->push_back(value);
    return true;
  }
  bool u16(const char*, uint16_t value) { return put(value, 2); }
  bool u32(const char*, uint32_t value) { return put(value, 4); }
  bool u64(const char*, uint64_t value) { return put(value, 8); }
  bool boolean(const char*, bool value) {
    out_->push_back(value ? 1 : 0);
    return true;
  }
  template <class E>
  bool enumeration(const char* field, E value, uint8_t max) {
    const auto raw = static_cast<uint8_t>(value);
    return require(raw <= max, [&] { return enum_problem(field, raw, max); }) && u8(field, raw);
  }
  bool uuid(const char*, const GpuUuid& value) {
    out_->insert(out_->end(), value.begin(), value.end());
    return true;
  }
  bool string(const char* field, const std::string& value) {
    // Not moved: GCC 12 at -O3 takes the moved-from local for a dangling pointer.
    if (const std::string problem = string_problem(field, value); !problem.empty()) return fail(problem);
    put(value.size(), 2);
    out_->insert(out_->end(), value.begin(), value.end());
    return true;
  }
  template <class T>
  bool count(const char* field, const std::vector<T>& values, size_t min, size_t max) {
    return require(values.size() >= min && values.size() <= max,
                   [&] { return count_problem(field, values.size(), min, max); }) &&
           put(values.size(), 4);
  }

  static std::string enum_problem(const char* field, uint8_t raw, uint8_t max) {
    return std::string(field) + " is " + std::to_string(raw) + " (must be 0.." + std::to_string(max) + ")";
  }

 private:
  bool put(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_->push_back(static_cast<uint8_t>(value >> (8 * i)));
    return true;
  }

  std::vector<uint8_t>* out_;
};

class Reader : public Codec {
 public:
  Reader(std::span<const uint8_t> bytes, std::string* why) : Codec(why), bytes_(bytes) {}

  size_t left() const { return bytes_.size() - offset_; }

  bool u8(const char* field, uint8_t& value) {
    uint64_t raw = 0;
    if (!take(field, 1, &raw)) return false;
    value = static_cast<uint8_t>(raw);
    return true;
  }
  bool u16(const char* field, uint16_t& value) {
    uint64_t raw = 0;
    if (!take(field, 2, &raw)) return false;
    value = static_cast<uint16_t>(raw);
    return true;
  }
  bool u32(const char* field, uint32_t& value) {
    uint64_t raw = 0;
    if (!take(field, 4, &raw)) return false;
    value = static_cast<uint32_t>(raw);
    return true;
  }
  bool u64(const char* field, uint64_t& value) { return take(field, 8, &value); }
  bool boolean(const char* field, bool& value) {
    uint8_t raw = 0;
    if (!u8(field, raw)) return false;
    // Only 0 and 1, so that a decoded message re-encodes to the same bytes.
    if (raw > 1) return fail(std::string(field) + " is " + std::to_string(raw) + " (a bool must be 0 or 1)");
    value = raw == 1;
    return true;
  }
  template <class E>
  bool enumeration(const char* field, E& value, uint8_t max) {
    uint8_t raw = 0;
    if (!u8(field, raw)) return false;
    if (raw > max) return fail(Writer::enum_problem(field, raw, max));
    value = static_cast<E>(raw);
    return true;
  }
  bool uuid(const char* field, GpuUuid& value) {
    if (!have(field, value.size())) return false;
    for (uint8_t& byte : value) byte = bytes_[offset_++];
    return true;
  }
  bool string(const char* field, std::string& value) {
    uint16_t length = 0;
    if (!u16(field, length)) return false;
    // Length first: a huge length must be refused before anything is copied.
    if (length > kMaxString) {
      return fail(std::string(field) + " is " + std::to_string(length) + " bytes long (at most " +
                  std::to_string(kMaxString) + ")");
    }
    if (!have(field, length)) return false;
    value.assign(reinterpret_cast<const char*>(bytes_.data() + offset_), length);
    offset_ += length;
    std::string problem = string_problem(field, value);
    return problem.empty() || fail(std::move(problem));
  }
  template <class T>
  bool count(const char* field, std::vector<T>& values, size_t min, size_t max) {
    uint32_t n = 0;
    if (!u32(field, n)) return false;
    if (n < min || n > max) return fail(count_problem(field, n, min, max));
    values.resize(n);
    return true;
  }

 private:
  bool have(const char* field, size_t bytes) {
    return require(left() >= bytes, [&] {
      return "truncated: " + std::string(field) + " needs " + std::to_string(bytes) + " bytes, " +
             std::to_string(left()) + " left";
    });
  }
  bool take(const char* field, int bytes, uint64_t* value) {
    if (!have(field, static_cast<size_t>(bytes))) return false;
    uint64_t result = 0;
    for (int i = 0; i < bytes; ++i) result |= static_cast<uint64_t>(bytes_[offset_++]) << (8 * i);
    *value = result;
    return true;
  }

  std::span<const uint8_t> bytes_;
  size_t offset_ = 0;
};

// --- message layouts, in declaration order ---------------------------------------
// M is the message, const when encoding.

template <class M, class T>
concept Is = std::same_as<std::remove_const_t<M>, T>;

// Largest value of each enum that travels; the codec refuses anything above.
constexpr auto kMaxJobRunState = static_cast<uint8_t>(JobRunState::kFailed);
constexpr auto kMaxStoreKind = static_cast<uint8_t>(StoreKind::kNvme);
constexpr auto kMaxBudgetTarget = static_cast<uint8_t>(BudgetTarget::kJobMax);
constexpr auto kMaxJobAction = static_cast<uint8_t>(JobAction::kResume);

template <class C, Is<Hello> M>
bool fields(C& c, M& m) {
  return c.u64("Hello.resume_job_id", m.resume_job_id) && c.string("Hello.name", m.name);
}

template <class C, Is<OpenGpu> M>
bool fields(C& c, M& m) {
  return c.uuid("OpenGpu.uuid", m.uuid) && c.u64("OpenGpu.held_chunks", m.held_chunks) &&
         c.boolean("OpenGpu.pageable", m.pageable);
}

template <class C, Is<Request> M>
bool fields(C& c, M& m) {
  return c.u64("Request.request_id", m.request_id) && c.nonzero("Request.request_id", m.request_id) &&
         c.u32("Request.gpu", m.gpu) && c.u32("Request.chunks", m.chunks) &&
         c.require(m.chunks >= 1, [] { return std::string("Request.chunks is 0 (must be >= 1)"); }) &&
         c.u32("Request.claim_peak_chunks", m.claim_peak_chunks) &&
         c.u32("Request.claim_settle_chunks", m.claim_settle_chunks) &&
         // Peak 0 means no claim: a settle then would be a claim half made.
         c.require(m.claim_peak_chunks != 0 || m.claim_settle_chunks == 0, [&] {
           return "Request.claim_settle_chunks is " + std::to_string(m.claim_settle_chunks) +
                  " without a claim (Request.claim_peak_chunks is 0; both must be 0)";
         }) &&
         c.require(m.claim_settle_chunks <= m.claim_peak_chunks, [&] {
           return "Request.claim_settle_chunks is " + std::to_string(m.claim_settle_chunks) +
                  " (must be <= Request.claim_peak_chunks, " + std::to_string(m.claim_peak_chunks) + ")";
         });
}

template <class C, Is<Cancel> M>
bool fields(C& c, M& m) {
  return c.u64("Cancel.request_id", m.request_id) && c.nonzero("Cancel.request_id", m.request_id);
}

// Chunk id lists of kGrant and kReturn: 0 is never a chunk id.
template <class C, class V>
bool chunk_ids(C& c, const char* field, V& ids, size_t min) {
  if (!c.count(field, ids, min, kMaxChunksPerMessage)) return false;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!c.u32(field, ids[i])) return false;
    if (ids[i] == 0) return c.fail(std::string(field) + "[" + std::to_string(i) + "] is 0 (must be != 0)");
  }
  return true;
}

template <class C, Is<Return> M>
bool fields(C& c, M& m) {
  return c.u32("Return.gpu", m.gpu) && c.boolean("Return.reclaim_reply", m.reclaim_reply) &&
         c.u32("Return.unowned", m.unowned) && chunk_ids(c, "Return.ids", m.ids, 0);
}

template <class C, Is<Report> M>
bool fields(C& c, M& m) {
  return c.u32("Report.gpu", m.gpu) && c.u64("Report.allocated_bytes", m.allocated_bytes) &&
         c.u64("Report.persistent_bytes", m.persistent_bytes) && c.u64("Report.iterations", m.iterations) &&
         c.u64("Report.floor_bytes", m.floor_bytes) && c.u64("Report.link_bytes_per_second", m.link_bytes_per_second) &&
         c.require(m.link_bytes_per_second <= kMaxLinkBytesPerSecond, [&] {
           return "Report.link_bytes_per_second is " + std::to_string(m.link_bytes_per_second) + " (must be <= " +
                  std::to_string(kMaxLinkBytesPerSecond) + ")";
         });
}

template <class C, Is<JobState> M>
bool fields(C& c, M& m) {
  return c.enumeration("JobState.state", m.state, kMaxJobRunState);
}

// The rules of Request's claim, per entry, and each GPU at most once.
template <class C, class V>
bool gate_claims(C& c, V& claims) {
  if (!c.count("IterationMark.claims", claims, 0, kMaxGpus)) return false;
  const auto name = [](size_t k) { return "IterationMark.claims[" + std::to_string(k) + "]"; };
  for (size_t i = 0; i < claims.size(); ++i) {
    auto& claim = claims[i];
    if (!c.u32("IterationMark.claims.gpu", claim.gpu) ||
        !c.u32("IterationMark.claims.peak_chunks", claim.peak_chunks) ||
        !c.u32("IterationMark.claims.settle_chunks", claim.settle_chunks)) {
      return false;
    }
    for (size_t j = 0; j < i; ++j) {
      if (claims[j].gpu == claim.gpu) {
        return c.fail(name(i) + ".gpu is " + std::to_string(claim.gpu) + ", as is " + name(j) +
                      ".gpu (one claim per GPU)");
      }
    }
    if (claim.peak_chunks == 0 && claim.settle_chunks != 0) {
      return c.fail(name(i) + ".settle_chunks is " + std::to_string(claim.settle_chunks) + " without a claim (" +
                    name(i) + ".peak_chunks is 0; both must be 0)");
    }
    if (claim.settle_chunks > claim.peak_chunks) {
      return c.fail(name(i) + ".settle_chunks is " + std::to_string(claim.settle_chunks) + " (must be <= " +
                    name(i) + ".peak_chunks, " + std::to_string(claim.peak_chunks) + ")");
    }
  }
  return true;
}

template <class C, Is<IterationMark> M>
bool fields(C& c, M& m) {
  return c.u64("IterationMark.sequence", m.sequence) && c.nonzero("IterationMark.sequence", m.sequence) &&
         gate_claims(c, m.claims);
}

template <class C, Is<Curve> M>
bool fields(C& c, M& m) {
  auto& curve = m.curve;
  if (!c.u32("Curve.gpu", m.gpu) || !c.u64("Curve.period_ns", curve.period_ns)) return false;
  if (!c.require(curve.period_ns <= kMaxCurvePeriodNs, [&] {
        return "Curve.period_ns is " + std::to_string(curve.period_ns) + " (at most " +
               std::to_string(kMaxCurvePeriodNs) + ")";
      })) {
    return false;
  }
  if (!c.u64("Curve.persistent_bytes", curve.persistent_bytes) ||
      !c.u64("Curve.transient_bytes", curve.transient_bytes) ||
      !c.u64("Curve.workspace_bytes", curve.workspace_bytes) || !c.u64("Curve.end_bytes", curve.end_bytes)) {
    return false;
  }
  for (auto& bin : curve.bins) {
    if (!c.u64("Curve.bins", bin)) return false;
  }
  return true;
}

template <class C, Is<Proceed> M>
bool fields(C& c, M& m) {
  return c.u64("Proceed.sequence", m.sequence) && c.nonzero("Proceed.sequence", m.sequence) &&
         c.u32("Proceed.sharers", m.sharers);
}

template <class C, Is<Welcome> M>
bool fields(C& c, M& m) {
  return c.u64("Welcome.job_id", m.job_id);
}

template <class C, Is<GpuOpened> M>
bool fields(C& c, M& m) {
  return c.u32("GpuOpened.gpu", m.gpu) && c.u64("GpuOpened.chunk_bytes", m.chunk_bytes) &&
         c.u64("GpuOpened.min_bytes", m.min_bytes) && c.u64("GpuOpened.max_bytes", m.max_bytes) &&
         c.u64("GpuOpened.node_budget_bytes", m.node_budget_bytes);
}

template <class C, Is<Grant> M>
bool fields(C& c, M& m) {
  return c.u64("Grant.request_id", m.request_id) && c.nonzero("Grant.request_id", m.request_id) &&
         c.u32("Grant.gpu", m.gpu) && c.boolean("Grant.last", m.last) && chunk_ids(c, "Grant.ids", m.ids, 1);
}

template <class C, Is<ResidentGrant> M>
bool fields(C& c, M& m) {
  return c.u64("ResidentGrant.request_id", m.request_id) && c.nonzero("ResidentGrant.request_id", m.request_id) &&
         c.u32("ResidentGrant.gpu", m.gpu) && c.u64("ResidentGrant.chunks", m.chunks) &&
         c.nonzero("ResidentGrant.chunks", m.chunks);
}

template <class C, Is<Deny> M>
bool fields(C& c, M& m) {
  return c.u64("Deny.request_id", m.request_id) && c.nonzero("Deny.request_id", m.request_id) &&
         c.u32("Deny.errc", m.errc) && c.string("Deny.reason", m.reason);
}

template <class C, Is<Reclaim> M>
bool fields(C& c, M& m) {
  return c.u32("Reclaim.gpu", m.gpu) && c.u64("Reclaim.chunks", m.chunks);
}

template <class C, Is<MemoryWanted> M>
bool fields(C& c, M& m) {
  return c.u32("MemoryWanted.gpu", m.gpu);
}

template <class C, Is<Yield> M>
bool fields(C& c, M& m) {
  return c.u64("Yield.request_id", m.request_id) && c.nonzero("Yield.request_id", m.request_id) &&
         c.u32("Yield.gpu", m.gpu);
}

template <class C, Is<Limits> M>
bool fields(C& c, M& m) {
  return c.u32("Limits.gpu", m.gpu) && c.u64("Limits.min_bytes", m.min_bytes) &&
         c.u64("Limits.max_bytes", m.max_bytes) && c.u64("Limits.node_budget_bytes", m.node_budget_bytes);
}

template <class C, Is<Suspend> M>
bool fields(C& c, M& m) {
  return c.enumeration("Suspend.to", m.to, kMaxStoreKind);
}

template <class C, Is<Resume> M>
bool fields(C&, M&) {
  return true;
}

template <class C, Is<StatusQuery> M>
bool fields(C&, M&) {
  return true;
}

template <class C, Is<GpuStatus> M>
bool fields(C& c, M& m) {
  return c.u32("GpuStatus.index", m.index) && c.uuid("GpuStatus.uuid", m.uuid) &&
         c.u64("GpuStatus.chunk_bytes", m.chunk_bytes) && c.u64("GpuStatus.budget_bytes", m.budget_bytes) &&
         c.u64("GpuStatus.granted_bytes", m.granted_bytes) && c.u64("GpuStatus.pool_bytes", m.pool_bytes) &&
         c.u64("GpuStatus.waiting_bytes", m.waiting_bytes) && c.u64("GpuStatus.grants", m.grants) &&
         c.u64("GpuStatus.reclaims", m.reclaims) && c.u64("GpuStatus.deadlocks", m.deadlocks) &&
         c.u64("GpuStatus.parks", m.parks) && c.u64("GpuStatus.denials", m.denials) &&
         c.u64("GpuStatus.timeouts", m.timeouts) && c.u64("GpuStatus.device_total_bytes", m.device_total_bytes) &&
         c.u64("GpuStatus.device_used_bytes", m.device_used_bytes);
}

template <class C, Is<JobStatus> M>
bool fields(C& c, M& m) {
  return c.u64("JobStatus.id", m.id) && c.u32("JobStatus.pid", m.pid) && c.u32("JobStatus.uid", m.uid) &&
         c.u32("JobStatus.gpu", m.gpu) && c.string("JobStatus.name", m.name) &&
         c.u64("JobStatus.granted_bytes", m.granted_bytes) && c.u64("JobStatus.min_bytes", m.min_bytes) &&
         c.u64("JobStatus.max_bytes", m.max_bytes) && c.u64("JobStatus.allocated_bytes", m.allocated_bytes) &&
         c.u64("JobStatus.persistent_bytes", m.persistent_bytes) &&
         c.u64("JobStatus.waiting_bytes", m.waiting_bytes) && c.u64("JobStatus.wait_ns", m.wait_ns) &&
         c.u64("JobStatus.iterations", m.iterations) && c.enumeration("JobStatus.state", m.state, kMaxJobRunState) &&
         c.boolean("JobStatus.pageable", m.pageable);
}

template <class C, Is<StatusReply> M>
bool fields(C& c, M& m) {
  if (!c.u64("Status.daemon_pid", m.daemon_pid) || !c.u64("Status.uptime_ns", m.uptime_ns)) return false;
  if (!c.count("Status.gpus", m.gpus, 0, kMaxStatusGpus)) return false;
  for (auto& gpu : m.gpus) {
    if (!fields(c, gpu)) return false;
  }
  if (!c.count("Status.jobs", m.jobs, 0, kMaxStatusJobs)) return false;
  for (auto& job : m.jobs) {
    if (!fields(c, job)) return false;
  }
  return c.u64("Status.job_count", m.job_count) && c.u64("Status.job_rows", m.job_rows);
}

template <class C, Is<SetBudget> M>
bool fields(C& c, M& m) {
  return c.enumeration("SetBudget.target", m.target, kMaxBudgetTarget) &&
         c.u32("SetBudget.gpu", m.gpu) && c.u64("SetBudget.job_id", m.job_id) &&
         c.u64("SetBudget.bytes", m.bytes);
}

template <class C, Is<JobControl> M>
bool fields(C& c, M& m) {
  return c.enumeration("JobControl.action", m.action, kMaxJobAction) && c.u64("JobControl.job_id", m.job_id) &&
         c.enumeration("JobControl.to", m.to, kMaxStoreKind);
}

template <class C, Is<Result> M>
bool fields(C& c, M& m) {
  return c.u32("Result.errc", m.errc) && c.string("Result.message", m.message);
}

template <class C, Is<Goodbye> M>
bool fields(C& c, M& m) {
  return c.string("Goodbye.reason", m.reason);
}

// --- header and dispatch -----------------------------------------------------------

// Descriptors a message must arrive with: one per granted chunk, else none.
size_t descriptors_expected(const Message& message) {
  if (const auto* grant = std::get_if<Grant>(&message)) return grant->ids.size();
  return 0;
}

template <class T>
bool decode_as(std::span<const uint8_t> payload, size_t fd_count, Message* out, std::string* why) {
  Reader reader(payload, why);
  T message;
  if (!fields(reader, message)) return false;
  if (reader.left() != 0) {
    return reader.fail(std::string(Traits<T>::kName) + ": " + std::to_string(reader.left()) +
                       " trailing bytes after the last field");
  }
  Message decoded(std::move(message));
  if (const size_t expected = descriptors_expected(decoded); fd_count != expected) {
    if constexpr (std::is_same_v<T, Grant>) {
      return reader.fail("Grant: " + std::to_string(fd_count) + " descriptors for " + std::to_string(expected) +
                         " chunk ids");
    } else {
      return reader.fail(std::string(Traits<T>::kName) + ": " + std::to_string(fd_count) +
                         " descriptors attached (only Grant carries descriptors)");
    }
  }
  *out = std::move(decoded);
  return true;
}

template <size_t... I>
bool decode_payload(Type type, std::span<const uint8_t> payload, size_t fd_count, Message* out,
                    std::string* why, std::index_sequence<I...>) {
  bool ok = false;
  // Exactly one alternative matches: is_known_type() was checked first.
  (void)((Traits<std::variant_alternative_t<I, Message>>::kType == type
              ? (ok = decode_as<std::variant_alternative_t<I, Message>>(payload, fd_count, out, why), true)
              : false) ||
         ...);
  return ok;
}

}  // namespace

Type type_of(const Message& message) { return kTypeTable[message.index()]; }

const char* to_string(Type type) {
  switch (type) {
    case Type::kHello: return "Hello";
    case Type::kOpenGpu: return "OpenGpu";
    case Type::kRequest: return "Request";
    case Type::kCancel: return "Cancel";
    case Type::kReturn: return "Return";
    case Type::kReport: return "Report";
    case Type::kJobState: return "JobState";
    case Type::kWelcome: return "Welcome";
    case Type::kGpuOpened: return "GpuOpened";
    case Type::kGrant: return "Grant";
    case Type::kDeny: return "Deny";
    case Type::kReclaim: return "Reclaim";
    case Type::kYield: return "Yield";
    case Type::kLimits: return "Limits";
    case Type::kSuspend: return "Suspend";
    case Type::kResume: return "Resume";
    case Type::kStatusQuery: return "StatusQuery";
    case Type::kStatus: return "Status";
    case Type::kSetBudget: return "SetBudget";
    case Type::kResult: return "Result";
    case Type::kJobControl: return "JobControl";
    case Type::kGoodbye: return "Goodbye";
    case Type::kIterationMark: return "IterationMark";
    case Type::kCurve: return "Curve";
    case Type::kProceed: return "Proceed";
    case Type::kResidentGrant: return "ResidentGrant";
    case Type::kMemoryWanted: return "MemoryWanted";
  }
  return "unknown";
}

bool encode(const Message& message, std::vector<uint8_t>* out, std::string* why) {
  const size_t start = out->size();
  Writer writer(out, why);
  writer.u32("magic", kMagic);
  writer.u16("version", kVersion);
  writer.u16("type", static_cast<uint16_t>(type_of(message)));
  writer.u32("payload_bytes", 0);  // patched below, once the payload is known
  writer.u32("reserved", 0);
  const bool ok = std::visit([&](const auto& m) { return fields(writer, m); }, message);
  if (!ok) {
    out->resize(start);  // leave *out as it was: no half message
    return false;
  }
  const size_t payload = out->size() - start - kHeaderBytes;
  if (payload > kMaxPayload) {
    out->resize(start);
    return writer.fail(std::string(to_string(type_of(message))) + ": payload of " + std::to_string(payload) +
                       " bytes exceeds kMaxPayload (" + std::to_string(kMaxPayload) + ")");
  }
  for (size_t i = 0; i < 4; ++i) (*out)[start + 8 + i] = static_cast<uint8_t>(payload >> (8 * i));
  return true;
}

bool decode(std::span<const uint8_t> datagram, size_t fd_count, Message* out, std::string* why) {
  Reader header(datagram, why);
  if (datagram.size() < kHeaderBytes) {
    return header.fail("datagram of " + std::to_string(datagram.size()) + " bytes is shorter than the " +
                       std::to_string(kHeaderBytes) + "-byte header");
  }
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t type = 0;
  uint32_t payload_bytes = 0;
  uint32_t reserved = 0;
  // Cannot fail: the size was checked above.
  (void)(header.u32("magic", magic) && header.u16("version", version) && header.u16("type", type) &&
         header.u32("payload_bytes", payload_bytes) && header.u32("reserved", reserved));
  if (magic != kMagic) return header.fail("magic is " + hex(magic, 8) + " (expected " + hex(kMagic, 8) + ")");
  if (version != kVersion) {
    return header.fail("protocol version " + std::to_string(version) + " (this side speaks version " +
                       std::to_string(kVersion) + ")");
  }
  if (reserved != 0) return header.fail("header reserved field is " + hex(reserved, 8) + " (must be 0)");
  const size_t carried = datagram.size() - kHeaderBytes;
  if (payload_bytes > kMaxPayload) {
    return header.fail("payload_bytes is " + std::to_string(payload_bytes) + " (at most kMaxPayload, " +
                       std::to_string(kMaxPayload) + ")");
  }
  if (payload_bytes != carried) {
    return header.fail("payload_bytes is " + std::to_string(payload_bytes) + " but the datagram carries " +
                       std::to_string(carried) + " payload bytes");
  }
  if (!is_known_type(type)) return header.fail("unknown message type " + std::to_string(type));
  return decode_payload(static_cast<Type>(type), datagram.subspan(kHeaderBytes), fd_count, out, why,
                        std::make_index_sequence<std::variant_size_v<Message>>());
}

std::string to_hex(const GpuUuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  for (const uint8_t byte : uuid) {
    text += kHex[byte >> 4];
    text += kHex[byte & 15];
  }
  return text;
}

}  // namespace zico::proto
