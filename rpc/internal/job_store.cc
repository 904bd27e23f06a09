#include "rpc/internal/job_store.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "base/host.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "store/etcd_store.h"
#include "store/store_client.h"

namespace baton::rpc::internal {
namespace {

// Where rank 0 of a one-host job without a preset token leaves it for the
// other ranks.
std::string TokenFilePath(int master_port) {
  return absl::StrCat("/tmp/baton-", ::getuid(), "/job-", master_port, ".token");
}

absl::Status EnsurePrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(
        absl::StrCat("cannot create directory ", dir, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() ||
      (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " must be a directory of mode 0700 owned by this user (uid ", ::getuid(),
                     ") to hold the job token; remove it, or set BATON_JOB_TOKEN on every worker"));
  }
  return absl::OkStatus();
}

// Every rank a client of etcd, so none is special.
absl::StatusOr<JobStore> ConnectEtcd(const AgentOptions& options, JobStore job) {
  job.token = options.security.job_token;
  if (job.token.empty()) {
    return absl::FailedPreconditionError(
        "the job's store is on etcd, and the job token never goes through it: set "
        "BATON_JOB_TOKEN (AgentOptions::security.job_token) on every worker (baton-run does)");
  }
  ASSIGN_OR_RETURN(job.tls, LoadTls(options.security.tls));
  auto etcd_tls = LoadTls(options.etcd.tls);
  if (!etcd_tls.ok()) return Annotate(etcd_tls.status(), "etcd's TLS files");
  store::EtcdStoreOptions o;
  o.endpoint = options.etcd.endpoint;
  o.prefix = options.etcd.prefix;
  o.call_timeout = options.timeouts.init;
  o.user = options.etcd.user;
  o.password = options.etcd.password;
  o.tls = *std::move(etcd_tls);
  auto store = store::EtcdStore::Connect(std::move(o));
  if (!store.ok()) return Annotate(store.status(), "connecting to the job's store");
  job.store = std::shared_ptr<store::Store>(*std::move(store));
  return job;
}

// Rank 0: serves the store, with the token given or one it makes and
// leaves in the token file.
absl::StatusOr<JobStore> Serve(const AgentOptions& options, const std::string& master,
                               JobStore job) {
  if (job.token.empty()) {
    // One host: the token goes to the other ranks through a file only
    // this user can read, never through the store.
    job.token = RandomHex(16);
    const std::string path = TokenFilePath(options.master_port);
    RETURN_IF_ERROR(EnsurePrivateDir(path.substr(0, path.rfind('/'))));
    if (absl::Status s = WriteFileAtomically(path, {job.token}, 0600); !s.ok()) {
      return Annotate(s, "rank 0 hands the job token to the other ranks");
    }
    job.token_file = path;
  }
  auto server = store::StoreServer::Start({master, job.token, job.tls});
  if (!server.ok()) {
    return Annotate(server.status(), absl::StrCat("rank 0 serves the rendezvous store at ", master,
                                                  " (MASTER_ADDR:MASTER_PORT)"));
  }
  job.server = *std::move(server);
  // Rank 0 uses the served store directly; its owner keeps the server
  // beyond its own use of the store.
  job.store = std::shared_ptr<store::Store>(std::shared_ptr<void>(), &job.server->store());
  return job;
}

// Another rank of a one-host job without a preset token: rank 0 leaves the
// token in a private file. A file left by an earlier job on the same port
// holds a token the store refuses: read it again until rank 0 has written
// its own.
absl::StatusOr<JobStore> JoinWithTokenFile(const AgentOptions& options, const std::string& master,
                                           JobStore job) {
  const std::string path = TokenFilePath(options.master_port);
  const absl::Time deadline = absl::Now() + options.timeouts.init;
  absl::Status last = absl::NotFoundError(absl::StrCat("rank 0 has not written ", path));
  while (true) {
    RETURN_IF_ERROR(EnsurePrivateDir(path.substr(0, path.rfind('/'))));
    auto token = ReadFile(path);
    if (token.ok() && !token->empty()) {
      auto client = std::make_shared<store::StoreClient>(
          store::StoreClientOptions{master, *token, options.timeouts.init, job.tls});
      absl::Status s =
          client->WaitForServer(std::max(absl::Milliseconds(1), deadline - absl::Now()));
      if (s.ok()) {
        job.token = *token;
        job.store = std::move(client);
        return job;
      }
      if (!absl::IsUnauthenticated(s)) return s;
      last = s;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no job token from rank 0 within ", DurationText(options.timeouts.init),
                       " (", path, ": ", last.message(),
                       "); set BATON_JOB_TOKEN on every worker, or check that no "
                       "other job uses MASTER_PORT ",
                       options.master_port));
    }
    // The file appears when rank 0 writes it: there is nothing to wait on
    // but the file system, so it is read again after a short pause.
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

absl::StatusOr<JobStore> JobStore::Connect(const AgentOptions& options) {
  JobStore job;
  if (!options.etcd.endpoint.empty() && options.store == nullptr) {
    return ConnectEtcd(options, std::move(job));
  }
  // Before anything reaches the store: a worker with a missing file
  // leaves nothing there.
  ASSIGN_OR_RETURN(job.tls, LoadTls(options.security.tls));
  if (options.store != nullptr) {
    // An in-process store nobody else can read: the agent shares a token
    // through it if none is given.
    job.store = options.store;
    job.token = options.security.job_token;
    return job;
  }
  const std::string master = absl::StrCat(options.master_addr, ":", options.master_port);
  job.token = options.security.job_token;
  if (job.token.empty() && !IsLoopbackHost(options.master_addr)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MASTER_ADDR is ", options.master_addr,
        ", so this job may span hosts, and it needs a job token from outside the job: set "
        "BATON_JOB_TOKEN (AgentOptions::security.job_token) to the same secret on every worker, "
        "e.g. from your scheduler's secret store (baton-run passes its own token to its "
        "workers). Without one, anyone who can reach ",
        master, " could read the rendezvous store and call every worker"));
  }
  if (options.rank == 0) return Serve(options, master, std::move(job));
  if (job.token.empty()) return JoinWithTokenFile(options, master, std::move(job));
  auto client = std::make_shared<store::StoreClient>(
      store::StoreClientOptions{master, job.token, options.timeouts.init, job.tls});
  RETURN_IF_ERROR(client->WaitForServer(options.timeouts.init));
  job.store = std::move(client);
  return job;
}

}  // namespace baton::rpc::internal
