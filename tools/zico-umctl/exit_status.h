// zico-umctl's exit statuses, the same for every command that talks to zico-umd.
#pragma once

namespace zico::umctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // the daemon refused, timed out or closed the connection
inline constexpr int kExitUsage = 2;     // bad arguments: nothing was sent
inline constexpr int kExitNoDaemon = 3;  // nobody listens on the socket

}  // namespace zico::umctl
