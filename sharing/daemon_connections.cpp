// zico-umd: accepting, reading, writing and closing connections; a job's end.
#include "daemon_impl.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace zico::sharing {

// --- connections ------------------------------------------------------------------

bool Daemon::Impl::send(int fd, const proto::Message& message, std::span<const int> fds) {
  std::string why;
  Outbox& outbox = outboxes[fd];
  const bool was_empty = outbox.empty();
  const auto it = connections.find(fd);
  const bool job = it != connections.end() && it->second.role == Role::kJob;
  if (!outbox.send(fd, message, fds, job ? Outbox::kJobLimits : Outbox::kAdminLimits, &why)) {
    ZICO_LOG(kWarn, "sending %s failed: %s", proto::to_string(proto::type_of(message)), why.c_str());
    return false;
  }
  if (was_empty && !outbox.empty()) set_writable_watch(fd, true);
  return true;
}

void Daemon::Impl::set_writable_watch(int fd, bool want) {
  epoll_event event{};
  event.events = EPOLLIN | (want ? EPOLLOUT : 0u);
  event.data.fd = fd;
  (void)::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &event);
}

void Daemon::Impl::on_writable(int fd) {
  auto it = outboxes.find(fd);
  if (it == outboxes.end()) return;
  std::string why;
  if (!it->second.flush(fd, &why)) {
    close_connection(fd, "sending failed: " + why, false);
    return;
  }
  if (it->second.empty()) set_writable_watch(fd, false);
}

void Daemon::Impl::expire_idle_connections(uint64_t now) {
  if (accept_paused) {
    accept_paused = false;
    watch(listen_fd);
  }
  std::vector<std::pair<int, const char*>> idle;
  for (const auto& [fd, connection] : connections) {
    if (connection.role == Role::kNew && now - connection.last_message_ns > kHelloWithinNs) {
      idle.emplace_back(fd, "said nothing within 5 s");
    } else if (connection.role == Role::kAdmin && now - connection.last_message_ns > kAdminIdleNs) {
      idle.emplace_back(fd, "idle for 60 s");
    }
  }
  for (const auto& [fd, why] : idle) close_connection(fd, why, false);
}

void Daemon::Impl::accept_connections() {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // The listener stays readable while we cannot accept: rest it until
        // the next tick instead of spinning on it.
        ZICO_LOG(kWarn, "out of descriptors (%zu connections): not accepting for a moment", connections.size());
        unwatch(listen_fd);
        accept_paused = true;
      }
      return;
    }
    Connection connection;
    connection.fd = fd;
    connection.last_message_ns = now_ns();
    std::string why;
    if (!wire::peer_credentials(fd, &connection.peer, &why)) {
      ZICO_LOG(kWarn, "refusing a connection: %s", why.c_str());
      ::close(fd);
      continue;
    }
    if (connection.peer.uid != 0) {
      const size_t open = static_cast<size_t>(std::count_if(connections.begin(), connections.end(), [&](const auto& entry) {
        return entry.second.peer.uid == connection.peer.uid;
      }));
      if (open >= kConnectionsPerUid) {
        static uint64_t last_said_ns = 0;
        if (connection.last_message_ns - last_said_ns > 1'000'000'000) {
          ZICO_LOG(kWarn, "uid %u has %zu connections open (at most %zu): refusing more", connection.peer.uid, open,
                   kConnectionsPerUid);
          last_said_ns = connection.last_message_ns;
        }
        ::close(fd);
        continue;
      }
    }
    // Room for large grants: each message is small, but a batch is many.
    const int buffer = 4 << 20;
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    connections[fd] = connection;
    watch(fd);
  }
}

void Daemon::Impl::on_readable(int fd) {
  // Drain what is queued, a bounded number per wake-up so one chatty peer
  // cannot starve the others.
  for (int n = 0; n < 64; ++n) {
    auto it = connections.find(fd);
    if (it == connections.end()) return;
    proto::Message message;
    std::vector<int> fds;
    std::string why;
    const wire::Received got = wire::receive_message(fd, &message, &fds, &why);
    for (int f : fds) ::close(f);  // only grants carry descriptors, and we send those
    switch (got) {
      case wire::Received::kWouldBlock:
        return;
      case wire::Received::kClosed:
        close_connection(fd, "closed by the peer", false);
        return;
      case wire::Received::kError:
        close_connection(fd, why, false);
        return;
      case wire::Received::kMalformed:
        close_connection(fd, "malformed message: " + why, true);
        return;
      case wire::Received::kMessage:
        break;
    }
    if (!fds.empty()) {
      close_connection(fd, "descriptors attached to a " + std::string(proto::to_string(proto::type_of(message))), true);
      return;
    }
    it->second.last_message_ns = now_ns();
    const std::string problem = on_message(it->second, message);
    if (!problem.empty()) {
      close_connection(fd, problem, true);
      return;
    }
    pump();
    // Whatever changed the books may let a gate that may_start held back go.
    if (gates.any_blocked()) open_gates();
  }
}

void Daemon::Impl::close_connection(int fd, const std::string& reason, bool say_goodbye) {
  auto it = connections.find(fd);
  if (it == connections.end()) return;
  const Connection connection = it->second;
  // Said while the connection is still known, so under its own limits; to a
  // peer with messages still queued, none: it would go with them.
  if (say_goodbye && outboxes[fd].empty()) (void)send(fd, proto::Goodbye{reason.substr(0, proto::kMaxString)});
  connections.erase(it);
  outboxes.erase(fd);  // what it did not read goes with it
  unwatch(fd);
  ::close(fd);
  if (connection.role != Role::kJob) {
    if (say_goodbye) ZICO_LOG(kWarn, "closed a connection of pid %d: %s", connection.peer.pid, reason.c_str());
    return;
  }
  auto job_it = jobs.find(connection.job);
  if (job_it == jobs.end()) return;
  Job& job = job_it->second;
  job.fd = -1;
  // Nobody would receive what it asked for, nor answer a reclaim.
  for (const auto& [request, waiting] : job.requests) (void)ledger.cancel(job.id, request, now_ns());
  job.requests.clear();
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    std::string ignored;
    if (job.gpus[g].open) (void)ledger.returned(job.id, static_cast<uint32_t>(g), 0, true, now_ns(), &ignored);
  }
  if (say_goodbye) {
    ZICO_LOG(kWarn, "job %llu (pid %d) disconnected: %s", static_cast<unsigned long long>(job.id), job.peer.pid,
             reason.c_str());
  } else {
    ZICO_LOG(kInfo, "job %llu (pid %d) disconnected: %s", static_cast<unsigned long long>(job.id), job.peer.pid,
             reason.c_str());
  }
  // The process may still have our chunks mapped: they stay its own until
  // it exits, and so does what it kept of those it gave back.
  audit_job(job);
  const bool holds = std::any_of(job.gpus.begin(), job.gpus.end(),
                                 [](const JobGpu& g) {
                                   return !g.lent.empty() || g.unowned != 0 || g.charged != 0 || !g.unchecked.empty();
                                 });
  if (holds && job.pidfd >= 0 && !process_exited(job.pidfd)) {
    freeze(job, true);
    gates.detach(job.id);
    open_gates();
    pidfd_jobs[job.pidfd] = job.id;
    watch(job.pidfd);
    return;
  }
  remove_job(job.id, holds ? "its process exited" : "it held nothing");
}

void Daemon::Impl::freeze(Job& job, bool frozen) { ledger.set_frozen(job.id, frozen); }

void Daemon::Impl::on_process_exit(int pidfd) {
  auto it = pidfd_jobs.find(pidfd);
  if (it == pidfd_jobs.end()) return;
  const uint64_t id = it->second;
  pidfd_jobs.erase(it);
  unwatch(pidfd);
  remove_job(id, "its process exited");
}

void Daemon::Impl::remove_job(uint64_t id, const char* why) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return;
  Job& job = it->second;
  uint64_t freed = 0;
  for (size_t g = 0; g < job.gpus.size(); ++g) {
    for (uint32_t chunk_id : job.gpus[g].lent) to_pool(gpus[g], chunk_id, job.peer.uid);
    for (uint32_t chunk_id : job.gpus[g].kept) to_pool(gpus[g], chunk_id, job.peer.uid);
    for (uint32_t chunk_id : job.gpus[g].unchecked) to_pool(gpus[g], chunk_id, job.peer.uid);
    freed += job.gpus[g].lent.size() + job.gpus[g].kept.size() + job.gpus[g].unchecked.size();
  }
  if (job.pidfd >= 0) {
    pidfd_jobs.erase(job.pidfd);
    ::close(job.pidfd);
  }
  const bool was_charged = std::any_of(job.gpus.begin(), job.gpus.end(), [](const JobGpu& g) { return g.charged != 0; });
  ledger.remove_job(id);
  gates.remove_job(id);
  ZICO_LOG(kInfo, "job %llu (pid %d) removed (%s): %llu chunks back in the pool", static_cast<unsigned long long>(id),
           job.peer.pid, why, static_cast<unsigned long long>(freed));
  state_file.release(job.state_slot);
  jobs.erase(it);
  if (was_charged) {
    for (uint32_t g = 0; g < gpus.size(); ++g) plan_gates_within_budget(g);
  }
  pump();
  open_gates();
}

}  // namespace zico::sharing
