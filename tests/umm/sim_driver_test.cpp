// What only the simulation has: fault injection, held streams, fence checks,
// capacity accounting, and fds that really cross a fork.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "driver_contract_test.h"
#include "fake_host.h"
#include "managed_arena_driver.h"
#include "sim_driver.h"

namespace zico::testing {
namespace {

constexpr size_t kGran = size_t{2} << 20;

class SimDriverTest : public ::testing::Test {
 protected:
  SimDriverTest() : driver_(make_options()) {}
  static SimOptions make_options() {
    SimOptions options;
    options.capacity = 4 * kGran;
    return options;
  }
  // A reservation of `chunks` chunks with the first one mapped and accessible.
  VaRange mapped_chunk(size_t chunks = 1) {
    VaRange reservation;
    EXPECT_TRUE(driver_.reserve(DeviceId{0}, chunks * kGran, 0, &reservation).is_ok());
    PhysHandle handle;
    EXPECT_TRUE(driver_.create(DeviceId{0}, kGran, &handle).is_ok());
    const VaRange chunk{reservation.base, kGran};
    EXPECT_TRUE(driver_.map(chunk, handle).is_ok());
    EXPECT_TRUE(driver_.set_access(DeviceId{0}, chunk).is_ok());
    EXPECT_TRUE(driver_.release(handle).is_ok());
    return chunk;
  }
  SimDriver driver_;
};

TEST_F(SimDriverTest, CreateBeyondCapacityIsOutOfMemory) {
  std::vector<PhysHandle> handles(4);
  for (PhysHandle& h : handles) ZICO_ASSERT_OK(driver_.create(DeviceId{0}, kGran, &h));
  PhysHandle extra;
  EXPECT_EQ(driver_.create(DeviceId{0}, kGran, &extra).code(), Errc::kOutOfMemory);
  size_t free_bytes = 1, total = 0;
  ZICO_ASSERT_OK(driver_.memory_info(DeviceId{0}, &free_bytes, &total));
  EXPECT_EQ(free_bytes, 0u);
  ZICO_ASSERT_OK(driver_.release(handles[0]));
  ZICO_ASSERT_OK(driver_.create(DeviceId{0}, kGran, &extra));
  for (size_t i = 1; i < handles.size(); ++i) ZICO_ASSERT_OK(driver_.release(handles[i]));
  ZICO_ASSERT_OK(driver_.release(extra));
  EXPECT_EQ(driver_.counters().live_chunks, 0u);
}

TEST_F(SimDriverTest, MemoryIsFreedOnlyWhenReleasedAndUnmapped) {
  const VaRange chunk = mapped_chunk();  // handle already released
  size_t free_bytes = 0, total = 0;
  ZICO_ASSERT_OK(driver_.memory_info(DeviceId{0}, &free_bytes, &total));
  EXPECT_EQ(free_bytes, total - kGran) << "a mapped chunk holds memory after its handle is released";
  ZICO_ASSERT_OK(driver_.unmap(chunk));
  ZICO_ASSERT_OK(driver_.memory_info(DeviceId{0}, &free_bytes, &total));
  EXPECT_EQ(free_bytes, total);
}

TEST_F(SimDriverTest, InjectedFailuresFireOnTheNthCallOnce) {
  driver_.inject_failure(SimOp::kCreate, 2);
  PhysHandle a, b, c;
  ZICO_ASSERT_OK(driver_.create(DeviceId{0}, kGran, &a));
  EXPECT_EQ(driver_.create(DeviceId{0}, kGran, &b).code(), Errc::kInjectedFault);
  ZICO_ASSERT_OK(driver_.create(DeviceId{0}, kGran, &c));

  VaRange reservation;
  ZICO_ASSERT_OK(driver_.reserve(DeviceId{0}, kGran, 0, &reservation));
  driver_.inject_failure(SimOp::kMap, 1, Errc::kOutOfMemory);
  EXPECT_EQ(driver_.map(reservation, a).code(), Errc::kOutOfMemory);
  ZICO_ASSERT_OK(driver_.map(reservation, a));

  int fd = -1;
  ZICO_ASSERT_OK(driver_.export_fd(c, &fd));
  driver_.inject_failure(SimOp::kImport, 1);
  PhysHandle imported;
  EXPECT_EQ(driver_.import_fd(fd, &imported).code(), Errc::kInjectedFault);
  ZICO_ASSERT_OK(driver_.import_fd(fd, &imported));
  close(fd);
  ZICO_ASSERT_OK(driver_.release(imported));
  ZICO_ASSERT_OK(driver_.unmap(reservation));
  ZICO_ASSERT_OK(driver_.release(a));
  ZICO_ASSERT_OK(driver_.release(c));
}

TEST_F(SimDriverTest, HeldStreamDefersWorkAndEvents) {
  const VaRange chunk = mapped_chunk();
  StreamHandle stream;
  EventHandle event;
  ZICO_ASSERT_OK(driver_.stream_create(DeviceId{0}, &stream));
  ZICO_ASSERT_OK(driver_.event_create(DeviceId{0}, &event));
  driver_.hold_stream(stream);
  ZICO_ASSERT_OK(driver_.memset_async(chunk.ptr(), 0x42, chunk.bytes, stream));
  ZICO_ASSERT_OK(driver_.event_record(event, stream));
  bool done = true;
  ZICO_ASSERT_OK(driver_.event_query(event, &done));
  EXPECT_FALSE(done);
  EXPECT_EQ(static_cast<uint8_t*>(chunk.ptr())[0], 0) << "held work must not run yet";
  ZICO_ASSERT_OK(driver_.release_stream(stream));
  ZICO_ASSERT_OK(driver_.event_query(event, &done));
  EXPECT_TRUE(done);
  EXPECT_EQ(static_cast<uint8_t*>(chunk.ptr())[0], 0x42);
  ZICO_ASSERT_OK(driver_.unmap(chunk));
}

// Work behind a wait starts after what the event captured, however busy the
// stream that recorded it: the simulated device runs that work first.
TEST_F(SimDriverTest, AWaitOnABusyStreamsEventRunsItsWorkFirst) {
  const VaRange chunk = mapped_chunk();
  StreamHandle busy, waiting;
  EventHandle event;
  ZICO_ASSERT_OK(driver_.stream_create(DeviceId{0}, &busy));
  ZICO_ASSERT_OK(driver_.stream_create(DeviceId{0}, &waiting));
  ZICO_ASSERT_OK(driver_.event_create(DeviceId{0}, &event));
  driver_.hold_stream(busy);
  ZICO_ASSERT_OK(driver_.memset_async(chunk.ptr(), 0x42, chunk.bytes, busy));
  ZICO_ASSERT_OK(driver_.event_record(event, busy));
  ZICO_ASSERT_OK(driver_.stream_wait_event(waiting, event));
  uint8_t out = 0;
  ZICO_ASSERT_OK(driver_.copy_async(&out, chunk.ptr(), 1, CopyKind::kDeviceToHost, waiting));
  ZICO_ASSERT_OK(driver_.stream_synchronize(waiting));
  EXPECT_EQ(out, 0x42) << "the copy ran before the work it waits for";
  EXPECT_EQ(driver_.counters().stream_waits, 1u);
  ZICO_ASSERT_OK(driver_.release_stream(busy));
  ZICO_ASSERT_OK(driver_.unmap(chunk));
}

TEST_F(SimDriverTest, UnmapUnderInFlightWorkIsAFenceViolation) {
  const VaRange chunk = mapped_chunk();
  StreamHandle stream;
  ZICO_ASSERT_OK(driver_.stream_create(DeviceId{0}, &stream));
  driver_.hold_stream(stream);
  ZICO_ASSERT_OK(driver_.memset_async(chunk.ptr(), 1, 64, stream));
  EXPECT_EQ(driver_.unmap(chunk).code(), Errc::kFenceViolation);
  ZICO_ASSERT_OK(driver_.device_synchronize(DeviceId{0}));
  ZICO_ASSERT_OK(driver_.unmap(chunk));
}

TEST_F(SimDriverTest, CopiesToUnmappedMemoryFailInsteadOfFaulting) {
  VaRange reservation;
  ZICO_ASSERT_OK(driver_.reserve(DeviceId{0}, 2 * kGran, 0, &reservation));
  std::vector<uint8_t> host(4096, 1);
  EXPECT_EQ(driver_.copy_async(reservation.ptr(), host.data(), host.size(), CopyKind::kHostToDevice, StreamHandle{})
                .code(),
            Errc::kInvalidArgument);
  const VaRange chunk = mapped_chunk();
  // Runs off the end of the mapping into unmapped VA.
  EXPECT_EQ(driver_.memset_async(static_cast<uint8_t*>(chunk.ptr()) + kGran - 16, 0, 32, StreamHandle{}).code(),
            Errc::kInvalidArgument);
  ZICO_ASSERT_OK(driver_.unmap(chunk));
}

TEST_F(SimDriverTest, ExportedFdCrossesAProcessBoundary) {
  PhysHandle handle;
  ZICO_ASSERT_OK(driver_.create(DeviceId{0}, kGran, &handle));
  int fd = -1;
  ZICO_ASSERT_OK(driver_.export_fd(handle, &fd));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child has its own driver: it sees the chunk only through the fd.
    SimDriver other;
    PhysHandle imported;
    VaRange reservation;
    if (!other.import_fd(fd, &imported).is_ok() || !other.reserve(DeviceId{0}, kGran, 0, &reservation).is_ok() ||
        !other.map(reservation, imported).is_ok() || !other.set_access(DeviceId{0}, reservation).is_ok()) {
      _exit(2);
    }
    std::memset(reservation.ptr(), 0x99, kGran);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  VaRange reservation;
  ZICO_ASSERT_OK(driver_.reserve(DeviceId{0}, kGran, 0, &reservation));
  ZICO_ASSERT_OK(driver_.map(reservation, handle));
  ZICO_ASSERT_OK(driver_.set_access(DeviceId{0}, reservation));
  EXPECT_EQ(static_cast<uint8_t*>(reservation.ptr())[kGran - 1], 0x99) << "the child's writes are visible here";
  close(fd);
  ZICO_ASSERT_OK(driver_.unmap(reservation));
  ZICO_ASSERT_OK(driver_.release(handle));
}

TEST_F(SimDriverTest, UnknownStreamsBehaveAsIdleStreams) {
  const VaRange chunk = mapped_chunk();
  const StreamHandle users_stream{0x1234};  // a cudaStream_t the driver never created
  EventHandle event;
  ZICO_ASSERT_OK(driver_.event_create(DeviceId{0}, &event));
  ZICO_ASSERT_OK(driver_.memset_async(chunk.ptr(), 7, 16, users_stream));
  ZICO_ASSERT_OK(driver_.event_record(event, users_stream));
  bool done = false;
  ZICO_ASSERT_OK(driver_.event_query(event, &done));
  EXPECT_TRUE(done);
  EXPECT_EQ(static_cast<uint8_t*>(chunk.ptr())[15], 7);
  ZICO_ASSERT_OK(driver_.unmap(chunk));
}

TEST(SimDriverHost, RefusesChunksTheHostCouldNotHold) {
  // A reserve larger than the host: every chunk would leave it short.
  SimOptions o;
  o.host_reserve_bytes = uint64_t{1} << 60;
  SimDriver sim(o);
  PhysHandle handle;
  const Status status = sim.create(DeviceId{0}, o.granularity, &handle);
  EXPECT_EQ(status.code(), Errc::kOutOfMemory);
  EXPECT_EQ(sim.counters().creates, 0u);
  // The default reserve leaves room for a chunk on any machine that runs the tests.
  SimDriver normal;
  ASSERT_TRUE(normal.create(DeviceId{0}, o.granularity, &handle).is_ok());
  ASSERT_TRUE(normal.release(handle).is_ok());
}

TEST(SimDriverHost, MemoryCreatedButNeverWrittenCostsTheHostNothing) {
  // 2000 MiB available, 512 MiB kept free: room for 1488 MiB of written memory.
  FakeHost host;
  host.meminfo(16 << 20, 2000 << 10);
  SimOptions o;
  o.granularity = size_t{512} << 20;
  o.host_reserve_bytes = uint64_t{512} << 20;
  o.host_memory_root = host.root();
  SimDriver sim(o);
  // 4 GiB of chunks nobody writes (an allocator's idle chunks, a replay's),
  // created faster than the host is read: the readings, taken as the
  // estimate nears the reserve, never find them used, so none is refused.
  std::vector<PhysHandle> chunks(8);
  for (PhysHandle& chunk : chunks) ASSERT_TRUE(sim.create(DeviceId{0}, o.granularity, &chunk).is_ok());
  // Once written, the host says so at its next reading (every 10 ms), and
  // the next chunk is refused.
  host.meminfo(16 << 20, 600 << 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  PhysHandle refused;
  EXPECT_EQ(sim.create(DeviceId{0}, o.granularity, &refused).code(), Errc::kOutOfMemory);
  for (PhysHandle chunk : chunks) ASSERT_TRUE(sim.release(chunk).is_ok());
}

TEST(SimDriverHost, UnifiedMemoryIsRefusedWhereTheHostCouldNotHoldIt) {
  // UM mode's arena is as large as the device (80 GiB), and its chunks are
  // bookkeeping over managed memory, which is host memory here.
  FakeHost host;
  host.meminfo(16 << 20, 2 << 20);
  SimOptions o;
  o.host_reserve_bytes = uint64_t{512} << 20;
  o.host_memory_root = host.root();
  SimDriver sim(o);
  ManagedArenaDriver driver(sim);
  PhysHandle chunk;
  EXPECT_EQ(driver.create(DeviceId{0}, size_t{1600} << 20, &chunk).code(), Errc::kOutOfMemory)
      << "a chunk that leaves the host less than its reserve";
  ASSERT_TRUE(driver.create(DeviceId{0}, size_t{1024} << 20, &chunk).is_ok());
  ASSERT_TRUE(driver.release(chunk).is_ok());
}

}  // namespace
}  // namespace zico::testing
