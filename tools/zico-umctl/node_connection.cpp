#include "node_connection.h"

#include "command_args.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "config.h"
#include "wire.h"

namespace zico::umctl {

std::string socket_path(const std::string& option) {
  if (!option.empty()) return option;
  // "off" tells the library not to use a daemon; this tool has nothing else to talk to.
  const char* env = std::getenv("ZICO_SOCKET");
  if (env != nullptr && *env != '\0' && std::strcmp(env, "off") != 0) return env;
  return kDefaultSocketPath;
}

NodeConnection::~NodeConnection() {
  if (fd_ >= 0) ::close(fd_);
}

int NodeConnection::fail(int status, const std::string& message) const {
  std::fprintf(stderr, "zico-umctl %s: %s\n", command_.c_str(), message.c_str());
  return status;
}

int NodeConnection::connect(const std::string& path) {
  path_ = path;
  std::string why;
  fd_ = wire::connect_unix(path, &why);
  if (fd_ >= 0) return kExitOk;
  if (errno == ENOENT || errno == ECONNREFUSED) {
    return fail(kExitNoDaemon, "no zico-umd is running at " + path + " (start it with zico-umd, or pass --socket)");
  }
  if (errno == EACCES) {
    return fail(kExitFailed, why + " (the socket's group may connect: zico-umd --group)");
  }
  return fail(kExitFailed, why);
}

int NodeConnection::exchange(const proto::Message& request, proto::Message* answer) {
  std::string why;
  if (!wire::send_message(fd_, request, {}, &why)) {
    return fail(kExitFailed, std::string("sending ") + proto::to_string(proto::type_of(request)) + " to zico-umd at " +
                                 path_ + ": " + why);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kAnswerTimeoutMs);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd ready{fd_, POLLIN, 0};
    const int rc = left.count() > 0 ? ::poll(&ready, 1, static_cast<int>(left.count())) : 0;
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return fail(kExitFailed, std::string("waiting for zico-umd: ") + std::strerror(errno));
    if (rc == 0) {
      return fail(kExitFailed, "no answer from zico-umd at " + path_ + " within " +
                                   std::to_string(kAnswerTimeoutMs / 1000) + " s");
    }
    break;
  }
  std::vector<int> fds;
  const wire::Received got = wire::receive_message(fd_, answer, &fds, &why);
  for (const int fd : fds) ::close(fd);  // the decoder accepts them on a Grant only, which we never ask for
  switch (got) {
    case wire::Received::kMessage:
      break;
    case wire::Received::kClosed:
      return fail(kExitFailed, "zico-umd closed the connection without answering");
    case wire::Received::kWouldBlock:
      return fail(kExitFailed, "no answer from zico-umd");
    case wire::Received::kMalformed:
      return fail(kExitFailed, "zico-umd sent a malformed answer: " + why);
    case wire::Received::kError:
      return fail(kExitFailed, "reading zico-umd's answer: " + why);
  }
  if (const auto* goodbye = std::get_if<proto::Goodbye>(answer)) {
    return fail(kExitFailed, "zico-umd closed the connection: " + goodbye->reason);
  }
  return kExitOk;
}

int NodeConnection::unexpected(const proto::Message& request, const proto::Message& answer) const {
  return fail(kExitFailed, std::string("zico-umd answered ") + proto::to_string(proto::type_of(request)) + " with " +
                               proto::to_string(proto::type_of(answer)));
}

int run_status_query(const char* command, const char* usage, int argc, char** argv,
                     void (*print_text)(const proto::StatusReply&), void (*print_json)(const proto::StatusReply&)) {
  bool json = false;
  std::string socket;
  ArgReader args(argc, argv);
  while (args.next()) {
    if (args.flag("--help") || args.flag("-h")) {
      std::printf(usage, kSocketOptionHelp);
      return kExitOk;
    } else if (args.flag("--json")) {
      json = true;
    } else if (args.option("--socket", &socket)) {
      continue;
    } else if (args.unknown_option()) {
      return usage_error(command, "unknown option '" + std::string(args.current()) + "'");
    } else {
      return usage_error(command, "unexpected argument '" + std::string(args.current()) + "'");
    }
  }
  if (!args.error().empty()) return usage_error(command, args.error());

  NodeConnection daemon(command);
  if (const int status = daemon.connect(socket_path(socket)); status != kExitOk) return status;
  proto::StatusReply reply;
  if (const int status = daemon.ask(proto::StatusQuery{}, &reply); status != kExitOk) return status;
  (json ? print_json : print_text)(reply);
  return kExitOk;
}

}  // namespace zico::umctl
