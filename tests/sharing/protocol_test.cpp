// The node protocol: every message round-trips, every validation rule of
// protocol.h rejects what it should with a reason naming the field, and the
// socket layer moves messages and descriptors without losing or leaking one.
#include "protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "wire.h"

// Field-by-field equality, so a round trip can be compared as a whole
// message. Test-only: the protocol itself never compares messages.
namespace zico::proto {
namespace {
auto tie(const Hello& m) { return std::tie(m.resume_job_id, m.name); }
auto tie(const OpenGpu& m) { return std::tie(m.uuid, m.held_chunks); }
auto tie(const Request& m) {
  return std::tie(m.request_id, m.gpu, m.chunks, m.claim_peak_chunks, m.claim_settle_chunks);
}
auto tie(const Cancel& m) { return std::tie(m.request_id); }
auto tie(const Return& m) { return std::tie(m.gpu, m.reclaim_reply, m.unowned, m.ids); }
auto tie(const Report& m) { return std::tie(m.gpu, m.allocated_bytes, m.persistent_bytes, m.iterations); }
auto tie(const JobState& m) { return std::tie(m.state); }
auto tie(const Welcome& m) { return std::tie(m.job_id); }
auto tie(const GpuOpened& m) { return std::tie(m.gpu, m.chunk_bytes, m.min_bytes, m.max_bytes); }
auto tie(const Grant& m) { return std::tie(m.request_id, m.gpu, m.last, m.ids); }
auto tie(const Deny& m) { return std::tie(m.request_id, m.errc, m.reason); }
auto tie(const Reclaim& m) { return std::tie(m.gpu, m.chunks); }
auto tie(const Yield& m) { return std::tie(m.request_id, m.gpu); }
auto tie(const Limits& m) { return std::tie(m.gpu, m.min_bytes, m.max_bytes); }
auto tie(const Suspend& m) { return std::tie(m.to); }
auto tie(const Resume&) { return std::tie(); }
auto tie(const StatusQuery&) { return std::tie(); }
auto tie(const GpuStatus& m) {
  return std::tie(m.index, m.uuid, m.chunk_bytes, m.budget_bytes, m.granted_bytes, m.pool_bytes, m.waiting_bytes,
                  m.grants, m.reclaims, m.deadlocks);
}
auto tie(const JobStatus& m) {
  return std::tie(m.id, m.pid, m.uid, m.gpu, m.name, m.granted_bytes, m.min_bytes, m.max_bytes,
                  m.allocated_bytes, m.persistent_bytes, m.waiting_bytes, m.wait_ns, m.iterations, m.state);
}
auto tie(const StatusReply& m) { return std::tie(m.daemon_pid, m.uptime_ns, m.gpus, m.jobs, m.job_count, m.job_rows); }
auto tie(const SetBudget& m) { return std::tie(m.target, m.gpu, m.job_id, m.bytes); }
auto tie(const JobControl& m) { return std::tie(m.action, m.job_id, m.to); }
auto tie(const Result& m) { return std::tie(m.errc, m.message); }
auto tie(const Goodbye& m) { return std::tie(m.reason); }
auto tie(const GateClaim& m) { return std::tie(m.gpu, m.peak_chunks, m.settle_chunks); }
auto tie(const IterationMark& m) { return std::tie(m.sequence, m.claims); }
auto tie(const Curve& m) {
  const auto& c = m.curve;
  return std::tie(m.gpu, c.period_ns, c.bins, c.persistent_bytes, c.transient_bytes, c.workspace_bytes,
                  c.end_bytes);
}
auto tie(const Proceed& m) { return std::tie(m.sequence); }
}  // namespace

#define ZICO_TEST_EQUALITY(T) \
  static bool operator==(const T& a, const T& b) { return tie(a) == tie(b); }
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
#undef ZICO_TEST_EQUALITY
}  // namespace zico::proto

namespace zico::testing {
namespace {

using namespace zico::proto;

GpuUuid uuid_from(uint8_t seed) {
  GpuUuid uuid;
  for (size_t i = 0; i < uuid.size(); ++i) uuid[i] = static_cast<uint8_t>(seed + i * 17);
  return uuid;
}

// One message of every type, every field away from its default.
std::vector<Message> samples() {
  Curve curve{2, {}};
  curve.curve.period_ns = 53'100'000;
  for (size_t b = 0; b < curve.curve.bins.size(); ++b) curve.curve.bins[b] = (1ull << 30) + b * 12345;
  curve.curve.persistent_bytes = 1ull << 30;
  curve.curve.transient_bytes = 3ull << 30;
  curve.curve.workspace_bytes = 1ull << 20;
  curve.curve.end_bytes = (1ull << 30) + 7;
  GpuStatus gpu{3, uuid_from(7), 2 << 20, 40ull << 30, 12ull << 30, 16ull << 30, 1ull << 30, 900, 40, 2};
  JobStatus job{42, 1234, 1000, 3, "train.py", 8ull << 30, 2ull << 30, 20ull << 30, 7ull << 30, 5ull << 30,
                1ull << 30, 123456789, 77, JobRunState::kSuspendRequested};
  return {
      Hello{0x0102030405060708ull, "python3 train.py --lr 0.1"},
      OpenGpu{uuid_from(1), 17},
      Request{0xFFFFFFFFFFFFFFFFull, 2, 300, 0xFFFFFFFFu, 700},
      Cancel{99},
      Return{1, true, 5, {7, 8, 0xFFFFFFFFu}},
      Report{1, 1ull << 40, 1ull << 39, 12345},
      JobState{JobRunState::kSuspended},
      JobState{JobRunState::kFailed},
      Welcome{0xDEADBEEFull},
      GpuOpened{4, 2 << 20, 1ull << 30, 60ull << 30},
      Grant{77, 6, false, {10, 11, 12}},
      Deny{78, 1, "request beyond every limit: 5000 chunks > 4096"},
      Reclaim{2, 64},
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
  };
}

size_t fds_for(const Message& m) {
  const auto* grant = std::get_if<Grant>(&m);
  return grant != nullptr ? grant->ids.size() : 0;
}

std::vector<uint8_t> encoded(const Message& m) {
  std::vector<uint8_t> bytes;
  std::string why;
  EXPECT_TRUE(encode(m, &bytes, &why)) << to_string(type_of(m)) << ": " << why;
  return bytes;
}

uint32_t get_u32(const std::vector<uint8_t>& bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= static_cast<uint32_t>(bytes[at + i]) << (8 * i);
  return v;
}

void put_u32(std::vector<uint8_t>* bytes, size_t at, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) (*bytes)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Makes the header's payload_bytes agree with the datagram again after an edit.
void fix_length(std::vector<uint8_t>* bytes) {
  put_u32(bytes, 8, static_cast<uint32_t>(bytes->size() - kHeaderBytes));
}

// Decoding must fail, say why, and leave *out alone.
std::string rejection(const std::vector<uint8_t>& bytes, size_t fd_count = 0) {
  Message out = Welcome{12345};
  std::string why;
  EXPECT_FALSE(decode(bytes, fd_count, &out, &why));
  EXPECT_FALSE(why.empty());
  const auto* untouched = std::get_if<Welcome>(&out);
  EXPECT_TRUE(untouched != nullptr && untouched->job_id == 12345);
  return why;
}

// Encoding must fail, say why, and leave the buffer as it was.
std::string refusal(const Message& m) {
  std::vector<uint8_t> bytes = {1, 2, 3};
  std::string why;
  EXPECT_FALSE(encode(m, &bytes, &why));
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_FALSE(why.empty());
  return why;
}

// --- round trips -------------------------------------------------------------------

TEST(ProtocolTest, SamplesCoverEveryType) {
  std::set<Type> types;
  for (const Message& m : samples()) types.insert(type_of(m));
  EXPECT_EQ(types.size(), std::variant_size_v<Message>);
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  for (const Message& original : samples()) {
    SCOPED_TRACE(to_string(type_of(original)));
    const std::vector<uint8_t> bytes = encoded(original);
    ASSERT_GE(bytes.size(), kHeaderBytes);
    EXPECT_EQ(get_u32(bytes, 0), kMagic);
    EXPECT_EQ(bytes[4] | bytes[5] << 8, kVersion);
    EXPECT_EQ(bytes[6] | bytes[7] << 8, static_cast<int>(type_of(original)));
    EXPECT_EQ(get_u32(bytes, 8), bytes.size() - kHeaderBytes);
    EXPECT_EQ(get_u32(bytes, 12), 0u);

    Message decoded;
    std::string why;
    ASSERT_TRUE(decode(bytes, fds_for(original), &decoded, &why)) << why;
    EXPECT_EQ(decoded.index(), original.index());
    EXPECT_TRUE(decoded == original);
    EXPECT_EQ(encoded(decoded), bytes);
  }
}

TEST(ProtocolTest, LayoutIsLittleEndianInDeclarationOrder) {
  const std::vector<uint8_t> bytes = encoded(Request{0x0102030405060708ull, 0x0A0B0C0D, 3, 0x01020304, 5});
  const std::vector<uint8_t> payload(bytes.begin() + kHeaderBytes, bytes.end());
  EXPECT_EQ(payload, (std::vector<uint8_t>{8, 7, 6, 5, 4, 3, 2, 1, 0x0D, 0x0C, 0x0B, 0x0A, 3, 0, 0, 0, 4, 3, 2, 1,
                                           5, 0, 0, 0}));
  EXPECT_EQ(encoded(Hello{0, "ab"}).size(), kHeaderBytes + 8 + 2 + 2);
}

TEST(ProtocolTest, EncodeAppends) {
  std::vector<uint8_t> bytes = {9};
  std::string why;
  ASSERT_TRUE(encode(Cancel{1}, &bytes, &why)) << why;
  EXPECT_EQ(bytes.size(), 1 + kHeaderBytes + 8);
  EXPECT_EQ(bytes[0], 9);
}

TEST(ProtocolTest, LimitsAreAccepted) {
  Grant grant{1, 0, true, std::vector<uint32_t>(kMaxChunksPerMessage, 5)};
  Message decoded;
  std::string why;
  EXPECT_TRUE(decode(encoded(grant), kMaxChunksPerMessage, &decoded, &why)) << why;
  EXPECT_TRUE(decode(encoded(Return{}), 0, &decoded, &why)) << why;  // an empty reclaim reply
  EXPECT_TRUE(decode(encoded(Hello{1, std::string(kMaxString, '~')}), 0, &decoded, &why)) << why;
  EXPECT_TRUE(decode(encoded(Goodbye{" !~"}), 0, &decoded, &why)) << why;
  StatusReply status;
  status.gpus.resize(kMaxStatusGpus);
  status.jobs.resize(100);
  EXPECT_TRUE(decode(encoded(status), 0, &decoded, &why)) << why;
}

TEST(ProtocolTest, TypeNames) {
  EXPECT_STREQ(to_string(Type::kHello), "Hello");
  EXPECT_STREQ(to_string(Type::kGrant), "Grant");
  EXPECT_STREQ(to_string(Type::kStatus), "Status");
  EXPECT_STREQ(to_string(Type::kGoodbye), "Goodbye");
  EXPECT_STREQ(to_string(Type::kJobState), "JobState");
  EXPECT_STREQ(to_string(Type::kSuspend), "Suspend");
  EXPECT_STREQ(to_string(Type::kResume), "Resume");
  EXPECT_STREQ(to_string(Type::kJobControl), "JobControl");
  EXPECT_STREQ(to_string(Type::kIterationMark), "IterationMark");
  EXPECT_STREQ(to_string(Type::kCurve), "Curve");
  EXPECT_STREQ(to_string(Type::kProceed), "Proceed");
  EXPECT_STREQ(to_string(static_cast<Type>(10)), "unknown");
  EXPECT_EQ(static_cast<int>(type_of(Message{IterationMark{}})), 8);
  EXPECT_EQ(static_cast<int>(type_of(Message{Curve{}})), 9);
  EXPECT_EQ(static_cast<int>(type_of(Message{Proceed{}})), 41);
  EXPECT_EQ(type_of(Message{SetBudget{}}), Type::kSetBudget);
  EXPECT_EQ(type_of(Message{JobState{}}), Type::kJobState);
  EXPECT_EQ(static_cast<int>(type_of(Message{JobState{}})), 7);
  EXPECT_EQ(static_cast<int>(type_of(Message{Suspend{}})), 39);
  EXPECT_EQ(static_cast<int>(type_of(Message{Resume{}})), 40);
  EXPECT_EQ(static_cast<int>(type_of(Message{JobControl{}})), 68);
}

// --- header ------------------------------------------------------------------------

TEST(ProtocolRejectTest, ShorterThanHeader) {
  std::vector<uint8_t> bytes = encoded(Welcome{1});
  bytes.resize(10);
  EXPECT_EQ(rejection(bytes), "datagram of 10 bytes is shorter than the 16-byte header");
  EXPECT_NE(rejection({}).find("datagram of 0 bytes"), std::string::npos);
}

TEST(ProtocolRejectTest, WrongMagic) {
  std::vector<uint8_t> bytes = encoded(Welcome{1});
  put_u32(&bytes, 0, 0x12345678);
  EXPECT_EQ(rejection(bytes), "magic is 0x12345678 (expected 0x4F43495A)");
}

TEST(ProtocolRejectTest, WrongVersionNamesBoth) {
  std::vector<uint8_t> bytes = encoded(Welcome{1});
  bytes[4] = 4;
  EXPECT_EQ(rejection(bytes), "protocol version 4 (this side speaks version 5)");
  bytes[4] = 3;
  EXPECT_EQ(rejection(bytes), "protocol version 3 (this side speaks version 5)");
  bytes[4] = 1;
  EXPECT_EQ(rejection(bytes), "protocol version 1 (this side speaks version 5)");
}

TEST(ProtocolRejectTest, UnknownType) {
  std::vector<uint8_t> bytes = encoded(Welcome{1});
  bytes[6] = 10;
  bytes[7] = 0;
  EXPECT_EQ(rejection(bytes), "unknown message type 10");
  bytes[6] = 0xFF;
  bytes[7] = 0xFF;
  EXPECT_EQ(rejection(bytes), "unknown message type 65535");
}

TEST(ProtocolRejectTest, ReservedNotZero) {
  std::vector<uint8_t> bytes = encoded(Welcome{1});
  bytes[12] = 1;
  EXPECT_EQ(rejection(bytes), "header reserved field is 0x00000001 (must be 0)");
}

TEST(ProtocolRejectTest, LengthMismatch) {
  std::vector<uint8_t> bytes = encoded(Welcome{1});
  put_u32(&bytes, 8, 9);
  EXPECT_EQ(rejection(bytes), "payload_bytes is 9 but the datagram carries 8 payload bytes");
  put_u32(&bytes, 8, 7);
  EXPECT_EQ(rejection(bytes), "payload_bytes is 7 but the datagram carries 8 payload bytes");
}

TEST(ProtocolRejectTest, OversizePayload) {
  std::vector<uint8_t> bytes = encoded(Goodbye{"x"});
  bytes.resize(kHeaderBytes + kMaxPayload + 1);
  fix_length(&bytes);
  EXPECT_EQ(rejection(bytes), "payload_bytes is 61441 (at most kMaxPayload, 61440)");
  // A header that claims more than the limit is refused on the claim alone.
  bytes.resize(kHeaderBytes);
  put_u32(&bytes, 8, 0xFFFFFFFF);
  EXPECT_NE(rejection(bytes).find("payload_bytes is 4294967295"), std::string::npos);
}

TEST(ProtocolRejectTest, EncoderRefusesOversizePayload) {
  StatusReply status;
  status.jobs.resize(kMaxStatusJobs);
  for (JobStatus& job : status.jobs) job.name = std::string(kMaxString, 'j');
  EXPECT_NE(refusal(status).find("exceeds kMaxPayload (61440)"), std::string::npos);
}

// --- payload framing ------------------------------------------------------------------

TEST(ProtocolRejectTest, TrailingByte) {
  std::vector<uint8_t> bytes = encoded(Cancel{5});
  bytes.push_back(0);
  fix_length(&bytes);
  EXPECT_EQ(rejection(bytes), "Cancel: 1 trailing bytes after the last field");
  std::vector<uint8_t> query = encoded(StatusQuery{});
  query.push_back(0);
  fix_length(&query);
  EXPECT_EQ(rejection(query), "StatusQuery: 1 trailing bytes after the last field");
}

TEST(ProtocolRejectTest, TruncatedPayload) {
  std::vector<uint8_t> bytes = encoded(Request{1, 2, 3});
  bytes.pop_back();
  fix_length(&bytes);
  EXPECT_EQ(rejection(bytes), "truncated: Request.claim_settle_chunks needs 4 bytes, 3 left");
  // A version 2 Request (no claim) is refused by length, not misread.
  bytes = encoded(Request{1, 2, 3});
  bytes.resize(bytes.size() - 8);
  fix_length(&bytes);
  EXPECT_EQ(rejection(bytes), "truncated: Request.claim_peak_chunks needs 4 bytes, 0 left");
  // Every shorter cut of every sample is refused too.
  for (const Message& m : samples()) {
    const std::vector<uint8_t> whole = encoded(m);
    for (size_t size = kHeaderBytes; size < whole.size(); ++size) {
      std::vector<uint8_t> cut(whole.begin(), whole.begin() + static_cast<ptrdiff_t>(size));
      fix_length(&cut);
      Message out;
      std::string why;
      EXPECT_FALSE(decode(cut, fds_for(m), &out, &why)) << to_string(type_of(m)) << " cut to " << size;
    }
  }
}

TEST(ProtocolRejectTest, StringLongerThanItsBytes) {
  std::vector<uint8_t> bytes = encoded(Goodbye{"abc"});
  bytes[16] = 4;
  EXPECT_EQ(rejection(bytes), "truncated: Goodbye.reason needs 4 bytes, 3 left");
}

// --- strings and bools ----------------------------------------------------------------

TEST(ProtocolRejectTest, NonPrintableString) {
  EXPECT_EQ(refusal(Hello{1, "tab\there"}),
            "Hello.name has byte 0x09 at offset 3 (only printable ASCII 0x20..0x7e)");
  EXPECT_EQ(refusal(Deny{1, 2, std::string("caf\xC3\xA9")}),
            "Deny.reason has byte 0xC3 at offset 3 (only printable ASCII 0x20..0x7e)");
  std::vector<uint8_t> bytes = encoded(Hello{1, "abc"});
  bytes.back() = 0x7F;
  EXPECT_EQ(rejection(bytes), "Hello.name has byte 0x7F at offset 2 (only printable ASCII 0x20..0x7e)");
  bytes.back() = 0;
  EXPECT_EQ(rejection(bytes), "Hello.name has byte 0x00 at offset 2 (only printable ASCII 0x20..0x7e)");
}

TEST(ProtocolRejectTest, StringTooLong) {
  EXPECT_EQ(refusal(Result{0, std::string(kMaxString + 1, 'a')}), "Result.message is 256 bytes long (at most 255)");
  std::vector<uint8_t> bytes = encoded(Goodbye{std::string(kMaxString, 'a')});
  bytes.push_back('a');
  bytes[16] = 0;  // length 256, little-endian
  bytes[17] = 1;
  fix_length(&bytes);
  EXPECT_EQ(rejection(bytes), "Goodbye.reason is 256 bytes long (at most 255)");
}

TEST(ProtocolRejectTest, BoolMustBeZeroOrOne) {
  std::vector<uint8_t> bytes = encoded(Grant{1, 2, true, {3}});
  const size_t last = kHeaderBytes + 8 + 4;
  ASSERT_EQ(bytes[last], 1);
  bytes[last] = 2;
  EXPECT_EQ(rejection(bytes, 1), "Grant.last is 2 (a bool must be 0 or 1)");
  std::vector<uint8_t> reply = encoded(Return{1, false, 0, {}});
  reply[kHeaderBytes + 4] = 0xFF;
  EXPECT_EQ(rejection(reply), "Return.reclaim_reply is 255 (a bool must be 0 or 1)");
}

// Small fixed layouts, byte for byte: an enum is one byte, Resume is empty.
TEST(ProtocolTest, JobControlLayouts) {
  const auto payload = [](const Message& m) {
    const std::vector<uint8_t> bytes = encoded(m);
    return std::vector<uint8_t>(bytes.begin() + kHeaderBytes, bytes.end());
  };
  EXPECT_EQ(payload(JobState{JobRunState::kSuspended}), (std::vector<uint8_t>{2}));
  EXPECT_EQ(payload(Suspend{StoreKind::kNvme}), (std::vector<uint8_t>{1}));
  EXPECT_EQ(payload(Resume{}), (std::vector<uint8_t>{}));
  EXPECT_EQ(payload(JobControl{JobAction::kSuspend, 0x0102030405060708ull, StoreKind::kHost}),
            (std::vector<uint8_t>{0, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  // JobStatus.state is the last byte of its entry, before the two counts.
  StatusReply status;
  status.jobs.push_back(JobStatus{});
  status.jobs.back().state = JobRunState::kSuspended;
  const std::vector<uint8_t> bytes = payload(status);
  EXPECT_EQ(bytes[bytes.size() - 17], 2);
}

TEST(ProtocolRejectTest, IterationGateFields) {
  EXPECT_EQ(refusal(IterationMark{0}), "IterationMark.sequence is 0 (must be != 0)");
  EXPECT_EQ(refusal(Proceed{0}), "Proceed.sequence is 0 (must be != 0)");
  Curve curve;
  curve.curve.period_ns = kMaxCurvePeriodNs + 1;
  EXPECT_EQ(refusal(curve), "Curve.period_ns is 3600000000001 (at most 3600000000000)");
  curve.curve.period_ns = kMaxCurvePeriodNs;
  std::vector<uint8_t> bytes = encoded(curve);
  // 4 bytes of gpu, 8 of period, 4 x 8 of class sizes, 128 x 8 of bins.
  EXPECT_EQ(bytes.size(), kHeaderBytes + 4 + 8 + 32 + 8 * sharing::kDemandBins);
  bytes[kHeaderBytes + 4] = 0x01;  // the period's low byte: one ns over the limit
  EXPECT_EQ(rejection(bytes), "Curve.period_ns is 3600000000001 (at most 3600000000000)");
  bytes.pop_back();
  EXPECT_NE(rejection(bytes), "");
}

TEST(ProtocolRejectTest, BudgetTargetRange) {
  EXPECT_EQ(refusal(SetBudget{static_cast<BudgetTarget>(3), 0, 0, 0}), "SetBudget.target is 3 (must be 0..2)");
  std::vector<uint8_t> bytes = encoded(SetBudget{BudgetTarget::kNode, 0, 0, 1});
  bytes[kHeaderBytes] = 3;
  EXPECT_EQ(rejection(bytes), "SetBudget.target is 3 (must be 0..2)");
}

TEST(ProtocolRejectTest, JobRunStateRange) {
  EXPECT_EQ(refusal(JobState{static_cast<JobRunState>(4)}), "JobState.state is 4 (must be 0..3)");
  std::vector<uint8_t> bytes = encoded(JobState{JobRunState::kRunning});
  bytes[kHeaderBytes] = 4;
  EXPECT_EQ(rejection(bytes), "JobState.state is 4 (must be 0..3)");
  bytes[kHeaderBytes] = 0xFF;
  EXPECT_EQ(rejection(bytes), "JobState.state is 255 (must be 0..3)");

  StatusReply status;
  status.jobs.resize(2);
  status.jobs[1].state = static_cast<JobRunState>(7);
  EXPECT_EQ(refusal(status), "JobStatus.state is 7 (must be 0..3)");
  status.jobs[1].state = JobRunState::kSuspended;
  bytes = encoded(status);
  const size_t state_at = bytes.size() - 17;  // before job_count and job_rows
  ASSERT_EQ(bytes[state_at], 2);
  bytes[state_at] = 4;
  EXPECT_EQ(rejection(bytes), "JobStatus.state is 4 (must be 0..3)");
}

TEST(ProtocolRejectTest, StoreKindRange) {
  EXPECT_EQ(refusal(Suspend{static_cast<StoreKind>(2)}), "Suspend.to is 2 (must be 0..1)");
  EXPECT_EQ(refusal(JobControl{JobAction::kSuspend, 1, static_cast<StoreKind>(2)}),
            "JobControl.to is 2 (must be 0..1)");
  std::vector<uint8_t> bytes = encoded(Suspend{StoreKind::kHost});
  bytes[kHeaderBytes] = 2;
  EXPECT_EQ(rejection(bytes), "Suspend.to is 2 (must be 0..1)");
  bytes = encoded(JobControl{JobAction::kSuspend, 1, StoreKind::kNvme});
  bytes.back() = 2;
  EXPECT_EQ(rejection(bytes), "JobControl.to is 2 (must be 0..1)");
}

TEST(ProtocolRejectTest, JobActionRange) {
  EXPECT_EQ(refusal(JobControl{static_cast<JobAction>(2), 1, StoreKind::kHost}),
            "JobControl.action is 2 (must be 0..1)");
  std::vector<uint8_t> bytes = encoded(JobControl{JobAction::kResume, 1, StoreKind::kHost});
  bytes[kHeaderBytes] = 2;
  EXPECT_EQ(rejection(bytes), "JobControl.action is 2 (must be 0..1)");
}

TEST(ProtocolRejectTest, JobControlFraming) {
  std::vector<uint8_t> resume = encoded(Resume{});
  resume.push_back(0);
  fix_length(&resume);
  EXPECT_EQ(rejection(resume), "Resume: 1 trailing bytes after the last field");
  std::vector<uint8_t> control = encoded(JobControl{JobAction::kSuspend, 9, StoreKind::kHost});
  control.pop_back();
  fix_length(&control);
  EXPECT_EQ(rejection(control), "truncated: JobControl.to needs 1 bytes, 0 left");
  EXPECT_EQ(rejection(encoded(Suspend{}), 1), "Suspend: 1 descriptors attached (only Grant carries descriptors)");
}

// --- chunk ids and counts ---------------------------------------------------------------

TEST(ProtocolRejectTest, TooManyIds) {
  EXPECT_EQ(refusal(Grant{1, 0, true, std::vector<uint32_t>(kMaxChunksPerMessage + 1, 1)}),
            "Grant.ids has 129 entries (must be 1..128)");
  EXPECT_EQ(refusal(Return{0, false, 0, std::vector<uint32_t>(kMaxChunksPerMessage + 1, 1)}),
            "Return.ids has 129 entries (must be 0..128)");
  // By hand: a maximal Return with one more id and its count raised.
  std::vector<uint8_t> bytes = encoded(Return{0, false, 0, std::vector<uint32_t>(kMaxChunksPerMessage, 1)});
  const size_t count_at = kHeaderBytes + 4 + 1 + 4;
  ASSERT_EQ(get_u32(bytes, count_at), kMaxChunksPerMessage);
  put_u32(&bytes, count_at, kMaxChunksPerMessage + 1);
  bytes.insert(bytes.end(), {1, 0, 0, 0});
  fix_length(&bytes);
  EXPECT_EQ(rejection(bytes), "Return.ids has 129 entries (must be 0..128)");
  // A huge count is refused before anything is allocated.
  put_u32(&bytes, count_at, 0xFFFFFFFF);
  EXPECT_EQ(rejection(bytes), "Return.ids has 4294967295 entries (must be 0..128)");
}

TEST(ProtocolRejectTest, GrantWithoutIds) {
  EXPECT_EQ(refusal(Grant{1, 0, true, {}}), "Grant.ids has 0 entries (must be 1..128)");
  std::vector<uint8_t> bytes = encoded(Grant{1, 0, true, {4}});
  put_u32(&bytes, kHeaderBytes + 8 + 4 + 1, 0);
  bytes.resize(bytes.size() - 4);
  fix_length(&bytes);
  EXPECT_EQ(rejection(bytes), "Grant.ids has 0 entries (must be 1..128)");
}

TEST(ProtocolRejectTest, ChunkIdZero) {
  EXPECT_EQ(refusal(Grant{1, 0, true, {5, 0}}), "Grant.ids[1] is 0 (must be != 0)");
  EXPECT_EQ(refusal(Return{0, false, 0, {0}}), "Return.ids[0] is 0 (must be != 0)");
  std::vector<uint8_t> bytes = encoded(Grant{1, 0, true, {5, 6, 7}});
  put_u32(&bytes, bytes.size() - 4, 0);
  EXPECT_EQ(rejection(bytes, 3), "Grant.ids[2] is 0 (must be != 0)");
}

TEST(ProtocolRejectTest, StatusCounts) {
  StatusReply gpus;
  gpus.gpus.resize(kMaxStatusGpus + 1);
  EXPECT_EQ(refusal(gpus), "Status.gpus has 65 entries (must be 0..64)");
  StatusReply jobs;
  jobs.jobs.resize(kMaxStatusJobs + 1);
  EXPECT_EQ(refusal(jobs), "Status.jobs has 257 entries (must be 0..256)");
  std::vector<uint8_t> bytes = encoded(StatusReply{});
  put_u32(&bytes, kHeaderBytes + 16, kMaxStatusGpus + 1);
  EXPECT_EQ(rejection(bytes), "Status.gpus has 65 entries (must be 0..64)");
  bytes = encoded(StatusReply{});
  put_u32(&bytes, kHeaderBytes + 20, kMaxStatusJobs + 1);
  EXPECT_EQ(rejection(bytes), "Status.jobs has 257 entries (must be 0..256)");
}

// --- field values -----------------------------------------------------------------------

TEST(ProtocolRejectTest, RequestIdsAndChunks) {
  EXPECT_EQ(refusal(Request{1, 0, 0}), "Request.chunks is 0 (must be >= 1)");
  EXPECT_EQ(refusal(Request{0, 0, 1}), "Request.request_id is 0 (must be != 0)");
  EXPECT_EQ(refusal(Grant{0, 0, true, {1}}), "Grant.request_id is 0 (must be != 0)");
  EXPECT_EQ(refusal(Cancel{0}), "Cancel.request_id is 0 (must be != 0)");
  EXPECT_EQ(refusal(Yield{0, 1}), "Yield.request_id is 0 (must be != 0)");
  EXPECT_EQ(refusal(Deny{0, 1, "no"}), "Deny.request_id is 0 (must be != 0)");

  std::vector<uint8_t> bytes = encoded(Request{1, 0, 1});
  put_u32(&bytes, kHeaderBytes + 12, 0);
  EXPECT_EQ(rejection(bytes), "Request.chunks is 0 (must be >= 1)");
  bytes = encoded(Yield{1, 1});
  put_u32(&bytes, kHeaderBytes, 0);
  EXPECT_EQ(rejection(bytes), "Yield.request_id is 0 (must be != 0)");
}

TEST(ProtocolTest, RequestClaimRoundTrips) {
  for (const Request& original : {Request{7, 1, 4, 40, 12}, Request{8, 0, 1, 1, 1}, Request{9, 0, 2, 6, 0},
                                  Request{10, 0, 2}}) {
    Message decoded;
    std::string why;
    ASSERT_TRUE(decode(encoded(original), 0, &decoded, &why)) << why;
    const auto* request = std::get_if<Request>(&decoded);
    ASSERT_NE(request, nullptr);
    EXPECT_EQ(request->claim_peak_chunks, original.claim_peak_chunks);
    EXPECT_EQ(request->claim_settle_chunks, original.claim_settle_chunks);
    EXPECT_TRUE(*request == original);
  }
}

TEST(ProtocolRejectTest, RequestClaims) {
  EXPECT_EQ(refusal(Request{1, 0, 1, 4, 5}),
            "Request.claim_settle_chunks is 5 (must be <= Request.claim_peak_chunks, 4)");
  EXPECT_EQ(refusal(Request{1, 0, 1, 0, 3}),
            "Request.claim_settle_chunks is 3 without a claim (Request.claim_peak_chunks is 0; both must be 0)");

  // The decoder applies the same rules to bytes the encoder would not produce.
  std::vector<uint8_t> bytes = encoded(Request{1, 0, 1, 4, 2});
  put_u32(&bytes, bytes.size() - 4, 9);
  EXPECT_EQ(rejection(bytes), "Request.claim_settle_chunks is 9 (must be <= Request.claim_peak_chunks, 4)");
  put_u32(&bytes, bytes.size() - 8, 0);
  EXPECT_EQ(rejection(bytes),
            "Request.claim_settle_chunks is 9 without a claim (Request.claim_peak_chunks is 0; both must be 0)");
  put_u32(&bytes, bytes.size() - 4, 0xFFFFFFFFu);
  EXPECT_NE(rejection(bytes).find("Request.claim_settle_chunks is 4294967295"), std::string::npos);
}

TEST(ProtocolTest, IterationMarkClaimsRoundTrip) {
  std::vector<GateClaim> all;
  for (uint32_t g = 0; g < kMaxGpus; ++g) {
    all.push_back(GateClaim{static_cast<uint32_t>(kMaxGpus) - 1 - g, g + 1, g / 2});
  }
  for (const IterationMark& original :
       {IterationMark{1, {}}, IterationMark{2, {{3, 40, 12}}}, IterationMark{3, {{1, 0, 0}, {0, 9, 9}}},
        IterationMark{4, all}}) {
    const std::vector<uint8_t> bytes = encoded(original);
    // sequence, count, then gpu, peak and settle per claim.
    EXPECT_EQ(bytes.size(), kHeaderBytes + 8 + 4 + 12 * original.claims.size());
    Message decoded;
    std::string why;
    ASSERT_TRUE(decode(bytes, 0, &decoded, &why)) << why;
    const auto* mark = std::get_if<IterationMark>(&decoded);
    ASSERT_NE(mark, nullptr);
    EXPECT_TRUE(*mark == original);
  }
}

TEST(ProtocolRejectTest, IterationMarkClaims) {
  EXPECT_EQ(refusal(IterationMark{1, {{0, 4, 4}, {2, 4, 5}}}),
            "IterationMark.claims[1].settle_chunks is 5 (must be <= IterationMark.claims[1].peak_chunks, 4)");
  EXPECT_EQ(refusal(IterationMark{1, {{0, 0, 3}}}),
            "IterationMark.claims[0].settle_chunks is 3 without a claim (IterationMark.claims[0].peak_chunks is 0; "
            "both must be 0)");
  EXPECT_EQ(refusal(IterationMark{1, {{1, 4, 2}, {0, 4, 2}, {1, 6, 2}}}),
            "IterationMark.claims[2].gpu is 1, as is IterationMark.claims[0].gpu (one claim per GPU)");
  IterationMark many{1, {}};
  for (uint32_t g = 0; g <= kMaxGpus; ++g) many.claims.push_back(GateClaim{g, 1, 0});
  EXPECT_EQ(refusal(many), "IterationMark.claims has 65 entries (must be 0..64)");

  // The decoder applies the same rules to bytes the encoder would not produce.
  const size_t first = kHeaderBytes + 8 + 4;  // claims[0].gpu; peak and settle follow
  std::vector<uint8_t> bytes = encoded(IterationMark{1, {{0, 4, 2}, {3, 4, 2}}});
  put_u32(&bytes, first + 8, 9);
  EXPECT_EQ(rejection(bytes),
            "IterationMark.claims[0].settle_chunks is 9 (must be <= IterationMark.claims[0].peak_chunks, 4)");
  put_u32(&bytes, first + 4, 0);
  EXPECT_EQ(rejection(bytes),
            "IterationMark.claims[0].settle_chunks is 9 without a claim (IterationMark.claims[0].peak_chunks is 0; "
            "both must be 0)");
  bytes = encoded(IterationMark{1, {{0, 4, 2}, {3, 4, 2}}});
  put_u32(&bytes, first + 12, 0);
  EXPECT_EQ(rejection(bytes),
            "IterationMark.claims[1].gpu is 0, as is IterationMark.claims[0].gpu (one claim per GPU)");
  bytes = encoded(IterationMark{1, {}});
  put_u32(&bytes, kHeaderBytes + 8, kMaxGpus + 1);
  EXPECT_EQ(rejection(bytes), "IterationMark.claims has 65 entries (must be 0..64)");
  bytes = encoded(IterationMark{1, {}});
  put_u32(&bytes, kHeaderBytes + 8, 1);  // one claim announced, none there
  EXPECT_EQ(rejection(bytes), "truncated: IterationMark.claims.gpu needs 4 bytes, 0 left");
}

TEST(ProtocolRejectTest, DescriptorCount) {
  const std::vector<uint8_t> grant = encoded(Grant{1, 0, true, {1, 2}});
  EXPECT_EQ(rejection(grant, 3), "Grant: 3 descriptors for 2 chunk ids");
  EXPECT_EQ(rejection(grant, 0), "Grant: 0 descriptors for 2 chunk ids");
  EXPECT_EQ(rejection(encoded(Hello{1, "x"}), 1), "Hello: 1 descriptors attached (only Grant carries descriptors)");
  EXPECT_EQ(rejection(encoded(Return{0, false, 0, {1}}), 1),
            "Return: 1 descriptors attached (only Grant carries descriptors)");
}

// --- the socket layer ------------------------------------------------------------------

size_t open_fd_count() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

int make_memfd(const char* name, size_t bytes) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  EXPECT_GE(fd, 0) << strerror(errno);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  return fd;
}

// Sends raw bytes with `fds` attached, bypassing the encoder.
void send_raw(int socket, const std::vector<uint8_t>& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr header{};
  header.msg_iov = &iov;
  header.msg_iovlen = 1;
  std::vector<unsigned char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    header.msg_control = control.data();
    header.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&header);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ASSERT_EQ(sendmsg(socket, &header, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size())) << strerror(errno);
}

class WireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair_), 0) << strerror(errno);
    const int flags = fcntl(pair_[0], F_GETFL);
    ASSERT_EQ(fcntl(pair_[0], F_SETFL, flags | O_NONBLOCK), 0);
  }
  void TearDown() override {
    for (int& fd : pair_) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }

  // Receives on the non-blocking end; the message must be there already.
  wire::Received receive(Message* out, std::vector<int>* fds, std::string* why) {
    return wire::receive_message(pair_[0], out, fds, why);
  }

  int pair_[2] = {-1, -1};  // [0]: non-blocking receiver, [1]: blocking sender
};

TEST_F(WireTest, GrantCarriesItsDescriptors) {
  const size_t before = open_fd_count();
  std::vector<int> sent;
  for (int i = 0; i < 3; ++i) sent.push_back(make_memfd("zico-grant", 4096 * static_cast<size_t>(i + 1)));
  std::string why;
  ASSERT_TRUE(wire::send_message(pair_[1], Grant{9, 1, true, {101, 102, 103}}, sent, &why)) << why;

  Message message;
  std::vector<int> received = {-5};  // stale content is replaced
  ASSERT_EQ(receive(&message, &received, &why), wire::Received::kMessage) << why;
  const auto* grant = std::get_if<Grant>(&message);
  ASSERT_NE(grant, nullptr);
  EXPECT_EQ(grant->ids, (std::vector<uint32_t>{101, 102, 103}));
  ASSERT_EQ(received.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    struct stat a;
    struct stat b;
    ASSERT_EQ(fstat(sent[i], &a), 0);
    ASSERT_EQ(fstat(received[i], &b), 0);
    EXPECT_NE(sent[i], received[i]);
    EXPECT_EQ(a.st_ino, b.st_ino);
    EXPECT_EQ(a.st_dev, b.st_dev);
    EXPECT_EQ(b.st_size, static_cast<off_t>(4096 * (i + 1)));
    EXPECT_EQ(fcntl(received[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  }
  for (int fd : sent) close(fd);
  for (int fd : received) close(fd);
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, EveryMessageCrossesTheSocket) {
  for (const Message& original : samples()) {
    SCOPED_TRACE(to_string(type_of(original)));
    std::vector<int> fds;
    for (size_t i = 0; i < fds_for(original); ++i) fds.push_back(make_memfd("zico-sample", 0));
    std::string why;
    ASSERT_TRUE(wire::send_message(pair_[1], original, fds, &why)) << why;
    Message message;
    std::vector<int> received;
    ASSERT_EQ(receive(&message, &received, &why), wire::Received::kMessage) << why;
    EXPECT_TRUE(message == original);
    EXPECT_EQ(received.size(), fds.size());
    for (int fd : fds) close(fd);
    for (int fd : received) close(fd);
  }
}

TEST_F(WireTest, SendRefusesDescriptorsTheDecoderWould) {
  const int fd = make_memfd("zico-extra", 0);
  const int fds[2] = {fd, fd};
  std::string why;
  EXPECT_FALSE(wire::send_message(pair_[1], Hello{1, "x"}, std::span<const int>(fds, 1), &why));
  EXPECT_EQ(why, "Hello: 1 descriptors attached (only Grant carries descriptors)");
  EXPECT_FALSE(wire::send_message(pair_[1], Grant{1, 0, true, {1}}, fds, &why));
  EXPECT_EQ(why, "Grant: 2 descriptors for 1 chunk ids");
  EXPECT_FALSE(wire::send_message(pair_[1], Request{0, 0, 1}, {}, &why));
  EXPECT_EQ(why, "Request.request_id is 0 (must be != 0)");
  close(fd);
  Message message;
  std::vector<int> received;
  EXPECT_EQ(receive(&message, &received, &why), wire::Received::kWouldBlock);  // nothing went out
}

TEST_F(WireTest, ClosedPeer) {
  close(pair_[1]);
  pair_[1] = -1;
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kClosed);
  EXPECT_TRUE(fds.empty());
}

TEST_F(WireTest, NothingQueued) {
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kWouldBlock);
}

TEST_F(WireTest, BadFileDescriptorIsAnError) {
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(wire::receive_message(-1, &message, &fds, &why), wire::Received::kError);
  EXPECT_NE(why.find("recvmsg"), std::string::npos);
  EXPECT_FALSE(wire::send_message(-1, Welcome{1}, {}, &why));
}

TEST_F(WireTest, GarbageIsMalformedAndLeaksNothing) {
  const size_t before = open_fd_count();
  const int memfd = make_memfd("zico-garbage", 0);
  send_raw(pair_[1], {'g', 'a', 'r', 'b', 'a', 'g', 'e'}, {memfd, memfd});
  close(memfd);
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_EQ(why, "datagram of 7 bytes is shorter than the 16-byte header");
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, DescriptorsOnTheWrongMessageAreClosed) {
  const size_t before = open_fd_count();
  const int memfd = make_memfd("zico-wrong", 0);
  send_raw(pair_[1], encoded(Welcome{3}), {memfd});
  send_raw(pair_[1], encoded(Grant{1, 0, true, {1, 2}}), {memfd});
  close(memfd);
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_EQ(why, "Welcome: 1 descriptors attached (only Grant carries descriptors)");
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_EQ(why, "Grant: 1 descriptors for 2 chunk ids");
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, TooManyDescriptorsAreTruncatedAndClosed) {
  const size_t before = open_fd_count();
  const int memfd = make_memfd("zico-many", 0);
  send_raw(pair_[1], encoded(Grant{1, 0, true, {1}}), std::vector<int>(kMaxChunksPerMessage + 10, memfd));
  close(memfd);
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_NE(why.find("control data truncated"), std::string::npos) << why;
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(WireTest, OversizeDatagramIsTruncatedAndRefused) {
  std::vector<uint8_t> bytes = encoded(Goodbye{"x"});
  bytes.resize(kHeaderBytes + kMaxPayload + 100);
  fix_length(&bytes);
  send_raw(pair_[1], bytes, {});
  Message message;
  std::vector<int> fds;
  std::string why;
  EXPECT_EQ(receive(&message, &fds, &why), wire::Received::kMalformed);
  EXPECT_NE(why.find("datagram larger than"), std::string::npos) << why;
}

TEST_F(WireTest, PeerCredentialsOfSocketPair) {
  wire::PeerCredentials peer;
  std::string why;
  ASSERT_TRUE(wire::peer_credentials(pair_[0], &peer, &why)) << why;
  EXPECT_EQ(peer.pid, getpid());
  EXPECT_EQ(peer.uid, getuid());
  EXPECT_EQ(peer.gid, getgid());
  EXPECT_FALSE(wire::peer_credentials(-1, &peer, &why));
  EXPECT_NE(why.find("SO_PEERCRED"), std::string::npos);
}

// --- listening sockets ---------------------------------------------------------------------

class ListenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "zico-listen-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/umd.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string path_;
};

TEST_F(ListenTest, ServesConnectionsWithModeAndGroup) {
  std::string why;
  const int listener = wire::listen_unix(path_, 0660, getgid(), &why);
  ASSERT_GE(listener, 0) << why;
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, getgid());
  EXPECT_EQ(fcntl(listener, F_GETFL) & O_NONBLOCK, O_NONBLOCK);

  const int client = wire::connect_unix(path_, &why);
  ASSERT_GE(client, 0) << why;
  EXPECT_EQ(fcntl(client, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  const int server = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(server, 0) << strerror(errno);

  wire::PeerCredentials peer;
  ASSERT_TRUE(wire::peer_credentials(server, &peer, &why)) << why;
  EXPECT_EQ(peer.pid, getpid());
  EXPECT_EQ(peer.uid, getuid());

  ASSERT_TRUE(wire::send_message(client, Hello{0, "listen-test"}, {}, &why)) << why;
  Message message;
  std::vector<int> fds;
  ASSERT_EQ(wire::receive_message(server, &message, &fds, &why), wire::Received::kMessage) << why;
  ASSERT_TRUE(std::holds_alternative<Hello>(message));
  EXPECT_EQ(std::get<Hello>(message).name, "listen-test");

  close(server);
  close(client);
  close(listener);
}

TEST_F(ListenTest, RefusesLiveSocketAndReplacesStaleOne) {
  std::string why;
  const int first = wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why);
  ASSERT_GE(first, 0) << why;
  EXPECT_EQ(wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why), -1);
  EXPECT_EQ(why, "another zico-umd is listening on " + path_);

  close(first);  // the file stays behind, with nobody listening
  ASSERT_TRUE(std::filesystem::exists(path_));
  const int second = wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why);
  ASSERT_GE(second, 0) << why;
  const int client = wire::connect_unix(path_, &why);
  EXPECT_GE(client, 0) << why;
  if (client >= 0) close(client);
  close(second);
}

TEST_F(ListenTest, NeverReplacesARegularFile) {
  const int file = open(path_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  close(file);
  std::string why;
  EXPECT_EQ(wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why), -1);
  EXPECT_EQ(why, path_ + " exists and is not a socket; refusing to replace it");
  EXPECT_TRUE(std::filesystem::is_regular_file(path_));
}

TEST_F(ListenTest, PathTooLong) {
  const std::string path = dir_ + "/" + std::string(sizeof(sockaddr_un::sun_path), 'p');
  std::string why;
  EXPECT_EQ(wire::listen_unix(path, 0600, static_cast<gid_t>(-1), &why), -1);
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_NE(why.find("(at most 107)"), std::string::npos) << why;
  EXPECT_EQ(wire::connect_unix(path, &why), -1);
  EXPECT_NE(why.find("(at most 107)"), std::string::npos) << why;
}

TEST_F(ListenTest, ConnectWithoutDaemonKeepsErrno) {
  std::string why;
  errno = 0;
  EXPECT_EQ(wire::connect_unix(path_, &why), -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_NE(why.find(path_), std::string::npos) << why;

  // A stale socket file: the connection is refused.
  const int first = wire::listen_unix(path_, 0600, static_cast<gid_t>(-1), &why);
  ASSERT_GE(first, 0) << why;
  close(first);
  errno = 0;
  EXPECT_EQ(wire::connect_unix(path_, &why), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
}

}  // namespace
}  // namespace zico::testing
