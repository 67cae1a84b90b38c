// zico-umctl's side of the node protocol: one connection to zico-umd on which
// each request gets one answer (docs/protocol.md, "zico-umctl <-> daemon").
// The first message is not a Hello, so the daemon treats the connection as an
// administrator's: StatusQuery is answered by Status, SetBudget and JobControl
// by Result.
//
// Every failure is printed to stderr here, prefixed "zico-umctl COMMAND:", and
// turned into the exit status the command returns (exit_status.h), so the
// commands only decide what to ask and how to show the answer.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "exit_status.h"
#include "protocol.h"

namespace zico::umctl {

// The --socket option's usage line, the same for every command.
inline constexpr const char* kSocketOptionHelp =
    "  --socket PATH   zico-umd's socket (default $ZICO_SOCKET, else /run/zicoum/zicoum.sock)\n";

// `option` (the --socket value) if given, else $ZICO_SOCKET, else the default path.
[[nodiscard]] std::string socket_path(const std::string& option);

class NodeConnection {
 public:
  // How long an answer may take: the daemon answers at once unless it is stuck.
  static constexpr int kAnswerTimeoutMs = 5000;

  explicit NodeConnection(std::string command) : command_(std::move(command)) {}
  ~NodeConnection();
  NodeConnection(const NodeConnection&) = delete;
  NodeConnection& operator=(const NodeConnection&) = delete;

  // kExitOk, or kExitNoDaemon when nobody listens at `path` (no file, or a
  // stale one), or kExitFailed (permission denied...).
  [[nodiscard]] int connect(const std::string& path);

  // Sends `request` and waits for the answer, which must be a T. A Goodbye
  // (the daemon refuses the request and closes) prints its reason.
  template <class T>
  [[nodiscard]] int ask(const proto::Message& request, T* answer) {
    proto::Message message;
    if (const int status = exchange(request, &message); status != kExitOk) return status;
    if (auto* typed = std::get_if<T>(&message)) {
      *answer = std::move(*typed);
      return kExitOk;
    }
    return unexpected(request, message);
  }

  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  [[nodiscard]] int exchange(const proto::Message& request, proto::Message* answer);
  [[nodiscard]] int unexpected(const proto::Message& request, const proto::Message& answer) const;
  [[nodiscard]] int fail(int status, const std::string& message) const;

  std::string command_;
  std::string path_;
  int fd_ = -1;
};

// The whole of a read-only command that shows the daemon's status one way
// (status, jobs): --help, --json, --socket, then one StatusQuery.
int run_status_query(const char* command, const char* usage, int argc, char** argv,
                     void (*print_text)(const proto::StatusReply&), void (*print_json)(const proto::StatusReply&));

}  // namespace zico::umctl
