// The node protocol's codec: every message round-trips, and every validation
// rule of protocol.h rejects what it should with a reason naming the field.
#include "protocol.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "protocol_test_support.h"

namespace zico::testing {
namespace {

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
  EXPECT_STREQ(to_string(Type::kResidentGrant), "ResidentGrant");
  EXPECT_STREQ(to_string(Type::kMemoryWanted), "MemoryWanted");
  EXPECT_STREQ(to_string(static_cast<Type>(10)), "unknown");
  EXPECT_EQ(static_cast<int>(type_of(Message{IterationMark{}})), 8);
  EXPECT_EQ(static_cast<int>(type_of(Message{Curve{}})), 9);
  EXPECT_EQ(static_cast<int>(type_of(Message{Proceed{}})), 41);
  EXPECT_EQ(static_cast<int>(type_of(Message{ResidentGrant{}})), 42);
  EXPECT_EQ(static_cast<int>(type_of(Message{MemoryWanted{}})), 43);
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
  bytes[4] = 5;
  EXPECT_EQ(rejection(bytes), "protocol version 5 (this side speaks version 10)");
  bytes[4] = 3;
  EXPECT_EQ(rejection(bytes), "protocol version 3 (this side speaks version 10)");
  bytes[4] = 1;
  EXPECT_EQ(rejection(bytes), "protocol version 1 (this side speaks version 10)");
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

TEST(ProtocolRoundTripTest, TheDaemonsLargestStatusFitsOneMessage) {
  // zico-umd lists at most 128 job rows (daemon_impl.h, kStatusJobs), every GPU.
  StatusReply status;
  status.gpus.resize(kMaxStatusGpus);
  status.jobs.resize(128);
  for (JobStatus& job : status.jobs) job.name = std::string(kMaxString, 'j');
  std::vector<uint8_t> bytes;
  std::string why;
  EXPECT_TRUE(encode(status, &bytes, &why)) << why;
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

TEST(ProtocolRejectTest, ALinkFasterThanAnyIsRefused) {
  EXPECT_EQ(refusal(Report{0, 0, 0, 0, 0, kMaxLinkBytesPerSecond + 1}),
            "Report.link_bytes_per_second is 10000000000001 (must be <= 10000000000000)");
  std::vector<uint8_t> bytes;
  std::string why;
  EXPECT_TRUE(encode(Report{0, 0, 0, 0, 0, kMaxLinkBytesPerSecond}, &bytes, &why)) << why;
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
  // JobStatus.state and .pageable are the last bytes of its entry, before the two counts.
  StatusReply status;
  status.jobs.push_back(JobStatus{});
  status.jobs.back().state = JobRunState::kSuspended;
  status.jobs.back().pageable = true;
  const std::vector<uint8_t> bytes = payload(status);
  EXPECT_EQ(bytes[bytes.size() - 18], 2);
  EXPECT_EQ(bytes[bytes.size() - 17], 1);
}

TEST(ProtocolRejectTest, IterationGateFields) {
  EXPECT_EQ(refusal(IterationMark{0}), "IterationMark.sequence is 0 (must be != 0)");
  EXPECT_EQ(refusal(Proceed{0}), "Proceed.sequence is 0 (must be != 0)");
  EXPECT_EQ(refusal(ResidentGrant{0, 0, 1}), "ResidentGrant.request_id is 0 (must be != 0)");
  EXPECT_EQ(refusal(ResidentGrant{1, 0, 0}), "ResidentGrant.chunks is 0 (must be != 0)");
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
  const size_t state_at = bytes.size() - 18;  // before pageable, job_count and job_rows
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

}  // namespace
}  // namespace zico::testing
