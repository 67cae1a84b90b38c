// libFuzzer target for the protocol decoder: any datagram must either decode
// or be refused with a reason, and a datagram that decodes must re-encode to
// exactly the same bytes (one encoding per message: the daemon can never be
// handed two readings of the same bytes). Build and run:
//   tests/fuzz/run_protocol_fuzz.sh 60
//
// Input: first byte = descriptors that came with the datagram (mod 4), the
// rest = the datagram. Built with -DZICO_PROTOCOL_SEEDS instead, the file is
// a program that writes one valid input per message type into a directory.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "protocol.h"

using namespace zico::proto;

#ifndef ZICO_PROTOCOL_SEEDS

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t fd_count = data[0] % 4;
  const std::span<const uint8_t> datagram(data + 1, size - 1);
  Message message;
  std::string why;
  if (!decode(datagram, fd_count, &message, &why)) {
    if (why.empty()) std::abort();  // every rejection must say why
    return 0;
  }
  std::vector<uint8_t> again;
  if (!encode(message, &again, &why)) std::abort();  // accepted but not encodable
  if (again.size() != datagram.size() || !std::equal(again.begin(), again.end(), datagram.begin())) {
    std::abort();  // two encodings of one message
  }
  return 0;
}

#else

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  GpuUuid uuid{};
  for (size_t i = 0; i < uuid.size(); ++i) uuid[i] = static_cast<uint8_t>(i * 13 + 1);
  const std::vector<Message> seeds = {
      Hello{7, "seed"},
      OpenGpu{uuid, 3},
      Request{1, 0, 4},
      Cancel{1},
      Return{0, true, 1, {5, 6}},
      Report{0, 1 << 20, 1 << 19, 10},
      JobState{JobRunState::kSuspended},
      Welcome{42},
      GpuOpened{0, 2 << 20, 1 << 30, 4u << 30},
      Grant{1, 0, true, {5, 6, 7}},
      Deny{2, 1, "out of memory"},
      Reclaim{0, 8},
      Yield{3, 0},
      Limits{0, 1 << 30, 2u << 30},
      Suspend{StoreKind::kNvme},
      Resume{},
      StatusQuery{},
      StatusReply{100, 5000, {GpuStatus{0, uuid, 2 << 20, 8u << 30, 1 << 30, 1 << 30, 0, 5, 1, 0}},
                  {JobStatus{42, 1000, 1000, 0, "train", 1 << 30, 0, 4u << 30, 1 << 29, 1 << 28, 0, 9, 3,
                             JobRunState::kSuspendRequested}}},
      SetBudget{BudgetTarget::kJobMin, 0, 42, 1 << 30},
      JobControl{JobAction::kSuspend, 42, StoreKind::kHost},
      Result{0, "ok"},
      Goodbye{"bye"},
      IterationMark{3, {{0, 12, 4}, {1, 0, 0}}},
      Proceed{3},
      ResidentGrant{4, 0, 16},
      OpenGpu{uuid, 0, true},
  };
  for (const Message& message : seeds) {
    std::vector<uint8_t> input;
    const auto* grant = std::get_if<Grant>(&message);
    input.push_back(static_cast<uint8_t>(grant != nullptr ? grant->ids.size() : 0));
    std::string why;
    if (!encode(message, &input, &why)) {
      std::fprintf(stderr, "seed %s: %s\n", to_string(type_of(message)), why.c_str());
      return 1;
    }
    const std::string path = std::string(argv[1]) + "/seed-" + to_string(type_of(message));
    std::FILE* file = std::fopen(path.c_str(), "wb");
    if (file == nullptr || std::fwrite(input.data(), 1, input.size(), file) != input.size() ||
        std::fclose(file) != 0) {
      std::perror(path.c_str());
      return 1;
    }
  }
  return 0;
}

#endif
