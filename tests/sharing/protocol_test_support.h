// What the protocol's tests share: field-by-field equality of messages, one
// sample of every message type, and ways to take encoded bytes apart.
#pragma once

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "protocol.h"

// Field-by-field equality, so a round trip can be compared as a whole
// message. Test-only: the protocol itself never compares messages.
namespace zico::proto {
inline auto tie(const Hello& m) { return std::tie(m.resume_job_id, m.name); }
inline auto tie(const OpenGpu& m) { return std::tie(m.uuid, m.held_chunks, m.pageable); }
inline auto tie(const Request& m) {
  return std::tie(m.request_id, m.gpu, m.chunks, m.claim_peak_chunks, m.claim_settle_chunks);
}
inline auto tie(const Cancel& m) { return std::tie(m.request_id); }
inline auto tie(const Return& m) { return std::tie(m.gpu, m.reclaim_reply, m.unowned, m.ids); }
inline auto tie(const Report& m) {
  return std::tie(m.gpu, m.allocated_bytes, m.persistent_bytes, m.iterations, m.floor_bytes, m.link_bytes_per_second);
}
inline auto tie(const JobState& m) { return std::tie(m.state); }
inline auto tie(const Welcome& m) { return std::tie(m.job_id); }
inline auto tie(const GpuOpened& m) { return std::tie(m.gpu, m.chunk_bytes, m.min_bytes, m.max_bytes); }
inline auto tie(const Grant& m) { return std::tie(m.request_id, m.gpu, m.last, m.ids); }
inline auto tie(const Deny& m) { return std::tie(m.request_id, m.errc, m.reason); }
inline auto tie(const Reclaim& m) { return std::tie(m.gpu, m.chunks); }
inline auto tie(const MemoryWanted& m) { return std::tie(m.gpu); }
inline auto tie(const Yield& m) { return std::tie(m.request_id, m.gpu); }
inline auto tie(const Limits& m) { return std::tie(m.gpu, m.min_bytes, m.max_bytes); }
inline auto tie(const Suspend& m) { return std::tie(m.to); }
inline auto tie(const Resume&) { return std::tie(); }
inline auto tie(const StatusQuery&) { return std::tie(); }
inline auto tie(const GpuStatus& m) {
  return std::tie(m.index, m.uuid, m.chunk_bytes, m.budget_bytes, m.granted_bytes, m.pool_bytes, m.waiting_bytes,
                  m.grants, m.reclaims, m.deadlocks, m.parks, m.denials, m.timeouts);
}
inline auto tie(const JobStatus& m) {
  return std::tie(m.id, m.pid, m.uid, m.gpu, m.name, m.granted_bytes, m.min_bytes, m.max_bytes,
                  m.allocated_bytes, m.persistent_bytes, m.waiting_bytes, m.wait_ns, m.iterations, m.state,
                  m.pageable);
}
inline auto tie(const StatusReply& m) { return std::tie(m.daemon_pid, m.uptime_ns, m.gpus, m.jobs, m.job_count, m.job_rows); }
inline auto tie(const SetBudget& m) { return std::tie(m.target, m.gpu, m.job_id, m.bytes); }
inline auto tie(const JobControl& m) { return std::tie(m.action, m.job_id, m.to); }
inline auto tie(const Result& m) { return std::tie(m.errc, m.message); }
inline auto tie(const Goodbye& m) { return std::tie(m.reason); }
inline auto tie(const GateClaim& m) { return std::tie(m.gpu, m.peak_chunks, m.settle_chunks); }
inline auto tie(const IterationMark& m) { return std::tie(m.sequence, m.claims); }
inline auto tie(const Curve& m) {
  const auto& c = m.curve;
  return std::tie(m.gpu, c.period_ns, c.bins, c.persistent_bytes, c.transient_bytes, c.workspace_bytes,
                  c.end_bytes);
}
inline auto tie(const Proceed& m) { return std::tie(m.sequence); }
inline auto tie(const ResidentGrant& m) { return std::tie(m.request_id, m.gpu, m.chunks); }

#define ZICO_TEST_EQUALITY(T) \
  inline bool operator==(const T& a, const T& b) { return tie(a) == tie(b); }
ZICO_TEST_EQUALITY(Hello)
ZICO_TEST_EQUALITY(OpenGpu)
ZICO_TEST_EQUALITY(Request)
ZICO_TEST_EQUALITY(Cancel)
ZICO_TEST_EQUALITY(Return)
ZICO_TEST_EQUALITY(Report)
ZICO_TEST_EQUALITY(JobState)
ZICO_TEST_EQUALITY(Welcome)
ZICO_TEST_EQUALITY(GpuOpened)
ZICO_TEST_EQUALITY(Grant)
ZICO_TEST_EQUALITY(Deny)
ZICO_TEST_EQUALITY(Reclaim)
ZICO_TEST_EQUALITY(MemoryWanted)
ZICO_TEST_EQUALITY(Yield)
ZICO_TEST_EQUALITY(Limits)
ZICO_TEST_EQUALITY(Suspend)
ZICO_TEST_EQUALITY(Resume)
ZICO_TEST_EQUALITY(StatusQuery)
ZICO_TEST_EQUALITY(GpuStatus)
ZICO_TEST_EQUALITY(JobStatus)
ZICO_TEST_EQUALITY(StatusReply)
ZICO_TEST_EQUALITY(SetBudget)
ZICO_TEST_EQUALITY(JobControl)
ZICO_TEST_EQUALITY(Result)
ZICO_TEST_EQUALITY(Goodbye)
ZICO_TEST_EQUALITY(GateClaim)
ZICO_TEST_EQUALITY(IterationMark)
ZICO_TEST_EQUALITY(Curve)
ZICO_TEST_EQUALITY(Proceed)
ZICO_TEST_EQUALITY(ResidentGrant)
#undef ZICO_TEST_EQUALITY
}  // namespace zico::proto

namespace zico::testing {

using namespace zico::proto;  // the messages are these tests' vocabulary

inline GpuUuid uuid_from(uint8_t seed) {
  GpuUuid uuid;
  for (size_t i = 0; i < uuid.size(); ++i) uuid[i] = static_cast<uint8_t>(seed + i * 17);
  return uuid;
}

// One message of every type, every field away from its default.
inline std::vector<Message> samples() {
  Curve curve{2, {}};
  curve.curve.period_ns = 53'100'000;
  for (size_t b = 0; b < curve.curve.bins.size(); ++b) curve.curve.bins[b] = (1ull << 30) + b * 12345;
  curve.curve.persistent_bytes = 1ull << 30;
  curve.curve.transient_bytes = 3ull << 30;
  curve.curve.workspace_bytes = 1ull << 20;
  curve.curve.end_bytes = (1ull << 30) + 7;
  GpuStatus gpu{3, uuid_from(7), 2 << 20, 40ull << 30, 12ull << 30, 16ull << 30, 1ull << 30, 900, 40, 2, 5, 6, 7};
  JobStatus job{42, 1234, 1000, 3, "train.py", 8ull << 30, 2ull << 30, 20ull << 30, 7ull << 30, 5ull << 30,
                1ull << 30, 123456789, 77, JobRunState::kSuspendRequested, true};
  return {
      Hello{0x0102030405060708ull, "python3 train.py --lr 0.1"},
      OpenGpu{uuid_from(1), 17, false},
      OpenGpu{uuid_from(2), 0, true},
      Request{0xFFFFFFFFFFFFFFFFull, 2, 300, 0xFFFFFFFFu, 700},
      Cancel{99},
      Return{1, true, 5, {7, 8, 0xFFFFFFFFu}},
      Report{1, 1ull << 40, 1ull << 39, 12345, 3ull << 30, 55'000'000'000},
      JobState{JobRunState::kSuspended},
      JobState{JobRunState::kFailed},
      Welcome{0xDEADBEEFull},
      GpuOpened{4, 2 << 20, 1ull << 30, 60ull << 30},
      Grant{77, 6, false, {10, 11, 12}},
      Deny{78, 1, "request beyond every limit: 5000 chunks > 4096"},
      Reclaim{2, 64},
      MemoryWanted{3},
      Yield{79, 3},
      Limits{5, 4ull << 30, 32ull << 30},
      Suspend{StoreKind::kNvme},
      Resume{},
      StatusQuery{},
      StatusReply{4321, 987654321, {gpu, gpu}, {job}, 300, 301},
      SetBudget{BudgetTarget::kJobMax, 7, 42, 24ull << 30},
      JobControl{JobAction::kResume, 0x0102030405060708ull, StoreKind::kNvme},
      Result{2, "no such job 43"},
      Goodbye{"protocol version 4 (this side speaks version 5)"},
      IterationMark{0x0102030405060708ull, {{2, 0xFFFFFFFFu, 700}, {0, 5, 5}, {7, 0, 0}}},
      curve,
      Proceed{0x0807060504030201ull},
      ResidentGrant{0x0102030405060708ull, 3, 0xFFFFFFFFFFull},
  };
}

inline size_t fds_for(const Message& m) {
  const auto* grant = std::get_if<Grant>(&m);
  return grant != nullptr ? grant->ids.size() : 0;
}

inline std::vector<uint8_t> encoded(const Message& m) {
  std::vector<uint8_t> bytes;
  std::string why;
  EXPECT_TRUE(encode(m, &bytes, &why)) << to_string(type_of(m)) << ": " << why;
  return bytes;
}

inline uint32_t get_u32(const std::vector<uint8_t>& bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= static_cast<uint32_t>(bytes[at + i]) << (8 * i);
  return v;
}

inline void put_u32(std::vector<uint8_t>* bytes, size_t at, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) (*bytes)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Makes the header's payload_bytes agree with the datagram again after an edit.
inline void fix_length(std::vector<uint8_t>* bytes) {
  put_u32(bytes, 8, static_cast<uint32_t>(bytes->size() - kHeaderBytes));
}

// Decoding must fail, say why, and leave *out alone.
inline std::string rejection(const std::vector<uint8_t>& bytes, size_t fd_count = 0) {
  Message out = Welcome{12345};
  std::string why;
  EXPECT_FALSE(decode(bytes, fd_count, &out, &why));
  EXPECT_FALSE(why.empty());
  const auto* untouched = std::get_if<Welcome>(&out);
  EXPECT_TRUE(untouched != nullptr && untouched->job_id == 12345);
  return why;
}

// Encoding must fail, say why, and leave the buffer as it was.
inline std::string refusal(const Message& m) {
  std::vector<uint8_t> bytes = {1, 2, 3};
  std::string why;
  EXPECT_FALSE(encode(m, &bytes, &why));
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_FALSE(why.empty());
  return why;
}

}  // namespace zico::testing
