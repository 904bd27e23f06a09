#include "launcher/internal/output_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton::launcher::internal {
namespace {

// Lines of the in-memory tail kept per worker.
constexpr size_t kTailLines = 200;

void WriteFully(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // Best effort: a closed terminal must not stop us.
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

struct OutputPump::Stream {
  int fds[2] = {-1, -1};   // stdout, stderr read ends; -1 once at EOF
  std::string partial[2];  // bytes after the last newline
  OutputSink sink;
  std::deque<std::string> tail;
};

OutputPump::OutputPump() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_read_ = p[0];
    wake_write_ = p[1];
  }
  thread_ = std::thread([this] { Run(); });
}

OutputPump::~OutputPump() {
  Close();
  ::close(wake_read_);
  ::close(wake_write_);
}

void OutputPump::Wake() {
  char c = 1;
  (void)!::write(wake_write_, &c, 1);
}

int64_t OutputPump::Add(int stdout_fd, int stderr_fd, OutputSink sink) {
  auto s = std::make_unique<Stream>();
  s->fds[0] = stdout_fd;
  s->fds[1] = stderr_fd;
  for (int fd : s->fds) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  s->sink = std::move(sink);
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    streams_[id] = std::move(s);
  }
  Wake();
  return id;
}

void OutputPump::EmitLine(Stream& s, int which, absl::string_view line) {
  // `line` includes its newline, if any.
  if (s.sink.log_fd >= 0) WriteFully(s.sink.log_fd, line);
  if (s.sink.echo) {
    int out = which == 0 ? STDOUT_FILENO : STDERR_FILENO;
    if (s.sink.prefix.empty()) {
      WriteFully(out, line);
    } else {
      std::string text = absl::StrCat(s.sink.prefix, line);
      if (text.back() != '\n') text.push_back('\n');
      WriteFully(out, text);
    }
  }
  absl::string_view body = line;
  if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
  s.tail.emplace_back(body);
  if (s.tail.size() > kTailLines) s.tail.pop_front();
}

void OutputPump::HandleReadable(int64_t id, int which) {
  Stream& s = *streams_[id];
  if (s.fds[which] < 0) return;  // Closed by Close() while polling.
  char buf[16384];
  while (true) {
    ssize_t n = ::read(s.fds[which], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // EOF or error: flush the partial line, close.
      if (!s.partial[which].empty()) {
        EmitLine(s, which, s.partial[which]);
        s.partial[which].clear();
      }
      ::close(s.fds[which]);
      s.fds[which] = -1;
      return;
    }
    std::string& p = s.partial[which];
    p.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = p.find('\n', start)) != std::string::npos; start = nl + 1) {
      EmitLine(s, which, absl::string_view(p).substr(start, nl + 1 - start));
    }
    p.erase(0, start);
    // A very long line without newline is emitted in pieces.
    if (p.size() > sizeof(buf)) {
      EmitLine(s, which, p);
      p.clear();
    }
  }
}

void OutputPump::Run() {
  std::vector<pollfd> fds;
  std::vector<std::pair<int64_t, int>> owners;
  while (true) {
    fds.clear();
    owners.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    {
      absl::MutexLock lock(&mu_);
      bool any_open = false;
      for (const auto& [id, s] : streams_) {
        for (int w = 0; w < 2; ++w) {
          if (s->fds[w] < 0) continue;
          any_open = true;
          fds.push_back({s->fds[w], POLLIN, 0});
          owners.emplace_back(id, w);
        }
      }
      if (closing_ && !any_open) return;
    }
    int n = ::poll(fds.data(), fds.size(), 200);
    if (n < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) {
      char drain[64];
      while (::read(wake_read_, drain, sizeof(drain)) > 0) {
      }
    }
    absl::MutexLock lock(&mu_);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = streams_.find(owners[i - 1].first);
      if (it == streams_.end()) continue;
      HandleReadable(owners[i - 1].first, owners[i - 1].second);
    }
  }
}

bool OutputPump::WaitDrained(int64_t id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto drained = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = streams_.find(id);
    return it == streams_.end() || (it->second->fds[0] < 0 && it->second->fds[1] < 0);
  };
  return mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
}

std::string OutputPump::Tail(int64_t id, int max_lines) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return "";
  const auto& tail = it->second->tail;
  size_t skip = tail.size() > static_cast<size_t>(max_lines)
                    ? tail.size() - static_cast<size_t>(max_lines)
                    : 0;
  return absl::StrJoin(tail.begin() + skip, tail.end(), "\n");
}

void OutputPump::Remove(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  for (int fd : it->second->fds) {
    if (fd >= 0) ::close(fd);
  }
  if (it->second->sink.log_fd >= 0) ::close(it->second->sink.log_fd);
  streams_.erase(it);
  Wake();
}

void OutputPump::Close(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (closing_ && !thread_.joinable()) return;
    closing_ = true;
    auto all_drained = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& [id, s] : streams_) {
        if (s->fds[0] >= 0 || s->fds[1] >= 0) return false;
      }
      return true;
    };
    mu_.AwaitWithTimeout(absl::Condition(&all_drained), grace);
    // Whatever is still open (a grandchild holding a pipe) is cut off.
    for (auto& [id, s] : streams_) {
      for (int& fd : s->fds) {
        if (fd >= 0) ::close(fd);
        fd = -1;
      }
    }
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : streams_) {
    if (s->sink.log_fd >= 0) ::close(s->sink.log_fd);
    s->sink.log_fd = -1;
  }
}

}  // namespace baton::launcher::internal
