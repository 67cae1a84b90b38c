// zico-umd and its jobs when things go wrong, on SimDriver with real
// processes: a swap folder the job cannot write, a swap file corrupted while
// the job is suspended, a daemon restart while it is suspended, a daemon out
// of descriptors, budgets beyond the machine, more jobs than a status lists.
// Each must say what happened (zico-umctl fails with the reason, the job gets
// an error), never report success, never retry without end, and never lose
// data a job still holds.
//
//   node_faults_test ZICO_UMD NODE_JOB ZICO_UMCTL
#include "node_harness.h"

namespace {

using namespace zico_test;

class NodeFaults : public NodeManager {
 protected:
  // zico-umctl ARGS... --socket S; its success and its output.
  std::pair<bool, std::string> umctl(std::vector<std::string> args) {
    args.insert(args.begin(), g_umctl);
    args.insert(args.end(), {"--socket", socket_});
    Child run = spawn(args, {}, (dir_ / ("umctl" + std::to_string(++calls_) + ".log")).string());
    const bool ok = run.succeeded();
    return {ok, run.output()};
  }

  // The id and state of the one job the daemon lists.
  std::optional<zico::proto::JobStatus> only_job() {
    zico::proto::StatusReply status;
    if (!query_status(socket_, &status) || status.jobs.size() != 1) return std::nullopt;
    return status.jobs[0];
  }

  int calls_ = 0;
};

TEST_F(NodeFaults, ASuspensionThatCannotSaveTheMemorySaysSoAndTheJobKeepsIt) {
  start_daemon(64 * kMiB);
  // ZICO_SWAP_DIR under a regular file: no swap file can be made there, root or not.
  std::ofstream(dir_ / "not-a-folder") << "x";
  Child& job = start_job(1, 400, 16 * kMiB, 8 * kMiB, 5, {"ZICO_SWAP_DIR=" + (dir_ / "not-a-folder" / "swap").string()});
  ASSERT_TRUE(wait_for_job(job.pid, 8 * kMiB, 5000ms)) << job.output();
  const auto before = only_job();
  ASSERT_TRUE(before.has_value());
  const std::string id = std::to_string(before->id);
  auto [ok, text] = umctl({"suspend", id, "--to", "nvme"});
  EXPECT_FALSE(ok) << "a suspension that saved nothing was reported as done: " << text;
  EXPECT_NE(text.find("could not save its memory"), std::string::npos) << text;
  const auto after = only_job();
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->state, zico::proto::JobRunState::kFailed);
  EXPECT_GT(after->granted_bytes, 0u) << "it kept its memory, so the books must keep it too";
  // It may be asked again, to a store that works, and comes back intact.
  std::tie(ok, text) = umctl({"suspend", id, "--to", "host"});
  EXPECT_TRUE(ok) << text;
  std::tie(ok, text) = umctl({"resume", id});
  EXPECT_TRUE(ok) << text;
  EXPECT_TRUE(job.succeeded()) << job.output();
}

TEST_F(NodeFaults, ACorruptSwapFileFailsTheResumeOnceAndTheJobGetsTheError) {
  start_daemon(64 * kMiB);
  const std::filesystem::path swap = dir_ / "swap";
  Child& job = start_job(1, 1'000'000, 16 * kMiB, 8 * kMiB, 5, {"ZICO_SWAP_DIR=" + swap.string()});
  ASSERT_TRUE(wait_for_job(job.pid, 8 * kMiB, 5000ms)) << job.output();
  const std::string id = std::to_string(only_job()->id);
  auto [ok, text] = umctl({"suspend", id, "--to", "nvme"});
  ASSERT_TRUE(ok) << text;
  // Flip a byte of every 4 KiB of what it wrote.
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(swap)) {
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(std::filesystem::file_size(entry.path()));
    for (std::streamoff at = 0; at < size; at += 4096) {
      file.seekg(at);
      const int byte = file.get();
      file.seekp(at);
      file.put(static_cast<char>(byte ^ 0x5a));
    }
    ++files;
  }
  ASSERT_EQ(files, 1u);
  std::tie(ok, text) = umctl({"resume", id});
  // zico-umctl says it failed: the job reported it, or it had already ended
  // (it gets the error at its next allocation, which node_job does not survive).
  EXPECT_FALSE(ok) << "a resume that restored nothing was reported as done: " << text;
  EXPECT_TRUE(text.find("could not restore its memory") != std::string::npos ||
              text.find("is gone") != std::string::npos)
      << text;
  // The job gets the error (its allocations fail) and ends, rather than
  // retrying for ever.
  int status = 0;
  pid_t waited = 0;
  for (auto deadline = Clock::now() + 20s; waited == 0 && Clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    waited = ::waitpid(job.pid, &status, WNOHANG);
  }
  ASSERT_EQ(waited, job.pid) << "the job still runs:\n" << job.output();
  job.status = status;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << job.output();  // node_job: 2 = OOM
  const std::string output = job.output();
  EXPECT_NE(output.find("could not be restored"), std::string::npos) << output;
  EXPECT_EQ(output.find("MISMATCH"), std::string::npos) << output;
  const std::string log = daemon_.output();
  EXPECT_NE(log.find("could not restore its memory"), std::string::npos) << log;
}

TEST_F(NodeFaults, AJobSuspendedBeforeADaemonRestartRunsOnUnderTheNewDaemon) {
  start_daemon(64 * kMiB);
  Child& job = start_job(1, 300, 16 * kMiB, 8 * kMiB, 5);
  ASSERT_TRUE(wait_for_job(job.pid, 8 * kMiB, 5000ms)) << job.output();
  auto [ok, text] = umctl({"suspend", std::to_string(only_job()->id)});
  ASSERT_TRUE(ok) << text;
  daemon_.kill(SIGKILL);
  daemon_.wait();
  start_daemon(64 * kMiB);
  // The new daemon knows of no suspension: the job resumes by itself, and
  // the daemon keeps serving it to its end.
  EXPECT_TRUE(job.succeeded()) << job.output();
  const std::string log = daemon_.output();
  EXPECT_EQ(log.find("was not asked for"), std::string::npos) << log;
  EXPECT_EQ(job.output().find("says goodbye"), std::string::npos) << job.output();
}

TEST_F(NodeFaults, ADaemonOutOfDescriptorsRefusesOneHugeRequestAndServesTheNext) {
  // SimDriver keeps a descriptor per chunk: 4 GiB is 2048 of them, past a
  // limit of 1024 that the daemon cannot raise.
  daemon_ = spawn({"/bin/sh", "-c", "ulimit -n 1024 && exec \"$0\" \"$@\"", g_umd, "--socket", socket_, "--budget",
                   "8GiB"},
                  {"ZICO_BACKEND=sim"}, (dir_ / "umd.log").string());
  for (auto deadline = Clock::now() + 5s; Clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    zico::proto::StatusReply status;
    if (query_status(socket_, &status)) break;
  }
  Child& huge = start_job(1, 1, 4096 * kMiB, 0, 0, {"ZICO_WAIT_TIMEOUT=10s"}, {"--block", "4GiB"});
  EXPECT_TRUE(WIFEXITED(huge.wait()) && WEXITSTATUS(huge.status) == 2) << huge.output();  // node_job: 2 = OOM
  EXPECT_NE(huge.output().find("out of file descriptors"), std::string::npos) << huge.output();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_LE(status.gpus.at(0).pool_bytes, 64 * kMiB) << "the pool kept what the failed grant created";
  Child& small = start_job(2, 2, 2 * kMiB, 0, 0, {"ZICO_WAIT_TIMEOUT=10s"}, {"--block", "2MiB"});
  EXPECT_TRUE(small.succeeded()) << small.output();
}

TEST_F(NodeFaults, BudgetsAboveTheDevicesMemoryAreRefusedWithTheNumbers) {
  Child refused = spawn({g_umd, "--socket", socket_, "--budget", "100GiB"}, {"ZICO_BACKEND=sim"},
                        (dir_ / "refused.log").string());
  EXPECT_TRUE(WIFEXITED(refused.wait()) && WEXITSTATUS(refused.status) == 1) << refused.output();
  EXPECT_NE(refused.output().find("is more than its 80 GiB of memory"), std::string::npos) << refused.output();
  start_daemon(64 * kMiB);
  auto [ok, text] = umctl({"budget", "set", "18446744073709551615B"});
  EXPECT_FALSE(ok) << text;
  EXPECT_NE(text.find("of memory"), std::string::npos) << text;
}

TEST_F(NodeFaults, ABudgetCutGivesThePoolsIdleMemoryBack) {
  start_daemon(64 * kMiB);
  Child& job = start_job(1, 2, 48 * kMiB, 0, 0, {}, {"--block", "2MiB"});
  ASSERT_TRUE(job.succeeded()) << job.output();
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_GE(status.gpus.at(0).pool_bytes, 48 * kMiB);
  auto [ok, text] = umctl({"budget", "set", "16MiB"});
  ASSERT_TRUE(ok) << text;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_LE(status.gpus.at(0).pool_bytes, 16 * kMiB);
}

// Two jobs that meet mid-iteration, each waiting for memory the other holds,
// beside a job that holds memory it uses and never waits: the jam is broken
// (one of the two yields) once the holder had nothing to give back, rather
// than both waiting until their allocations time out.
TEST_F(NodeFaults, TwoJobsJammedBesideAnIdleHolderRunToTheEnd) {
  start_daemon(64 * kMiB);
  Child& holder = start_job(1, 100000, 16 * kMiB, 16 * kMiB, 20, {}, {"--block", "2MiB"});
  ASSERT_TRUE(wait_for_job(holder.pid, 16 * kMiB, 10s)) << holder.output();
  const std::vector<std::string> patience = {"ZICO_WAIT_TIMEOUT=10s"};
  Child& first = start_job(2, 4, 40 * kMiB, 0, 100, patience, {"--block", "2MiB"});
  Child& second = start_job(3, 4, 40 * kMiB, 0, 100, patience, {"--block", "2MiB"});
  EXPECT_TRUE(first.succeeded()) << first.output();
  EXPECT_TRUE(second.succeeded()) << second.output();
  EXPECT_TRUE(holder.running()) << holder.output();
  // Its stats' budget is the daemon's, not the device's 80 GiB.
  EXPECT_NE(first.output().find("done, budget 67108864\n"), std::string::npos) << first.output();
}

// An allocation that waits out ZICO_WAIT_TIMEOUT says why once (the
// allocator's retry after emptying its caches fails at once, silently), in
// bytes, against what zico-umd could lend the job (not the device's size).
TEST_F(NodeFaults, ATimedOutAllocationSaysWhyOnceInBytes) {
  start_daemon(16 * kMiB);
  Child& holder = start_job(1, 100000, 12 * kMiB, 12 * kMiB, 20, {}, {"--block", "2MiB"});
  ASSERT_TRUE(wait_for_job(holder.pid, 12 * kMiB, 10s)) << holder.output();
  Child& job = start_job(2, 1, 8 * kMiB, 0, 0, {"ZICO_WAIT_TIMEOUT=1s"}, {"--block", "8MiB"});
  job.wait();
  const std::string output = job.output();
  EXPECT_NE(output.find("[exit status 2]"), std::string::npos) << output;
  size_t said = 0;
  for (size_t at = output.find("warning: waited"); at != std::string::npos; at = output.find("warning: waited", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, 1u) << output;
  EXPECT_NE(output.find("0 B allocated of the 16 MiB zico-umd could lend this job"), std::string::npos) << output;
}

TEST_F(NodeFaults, TheJobListSaysWhenItIsCut) {
  start_daemon(64 * kMiB);
  std::deque<RawJob> many;
  for (int i = 0; i < 130; ++i) ASSERT_EQ(many.emplace_back(socket_).open(sim_gpu_uuid(), "many"), 2 * kMiB);
  zico::proto::StatusReply status;
  ASSERT_TRUE(query_status(socket_, &status));
  EXPECT_EQ(status.job_count, 130u);
  EXPECT_EQ(status.job_rows, 130u);
  EXPECT_EQ(status.jobs.size(), 128u);
  auto [ok, text] = umctl({"jobs"});
  EXPECT_TRUE(ok) << text;
  EXPECT_NE(text.find("listing 128 of 130 job rows"), std::string::npos) << text;
  std::tie(ok, text) = umctl({"status"});
  EXPECT_NE(text.find("130 jobs"), std::string::npos) << text;
}

}  // namespace

int main(int argc, char** argv) { return zico_test::run_node_tests(argc, argv); }
