// The Store contract (store/store.h), one conformance suite run on every
// backend: the in-memory store, the gRPC server/client pair on loopback, and
// etcd (a real etcd process started here, store/etcd_store.h). Then what is
// particular to each: the client's token and reconnection, etcd's lease and
// authentication.
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/tls.h"
#include "proto/store.grpc.pb.h"
#include "store/etcd_store.h"
#include "store/memory_store.h"
#include "store/store_client.h"
#include "store/store_server.h"
#include "testing/etcd_server.h"
#include "testing/eventually.h"
#include "testing/first_connection.h"
#include "testing/slow_link.h"

namespace baton::store {
namespace {

using ::baton::testing::EtcdServer;

// One etcd for the whole binary: each case keeps its keys under its own
// prefix. Null (and the case fails, saying why) if it could not start.
EtcdServer* SharedEtcd() {
  static absl::StatusOr<std::unique_ptr<EtcdServer>>* const etcd =
      new absl::StatusOr<std::unique_ptr<EtcdServer>>(EtcdServer::Start());
  if (!etcd->ok()) {
    ADD_FAILURE() << etcd->status() << " (tools/install_deps.sh installs etcd-server)";
    return nullptr;
  }
  return etcd->value().get();
}

// A prefix of its own for the running case.
std::string CasePrefix() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat("/baton-test/", info->test_suite_name(), "/", info->name(), "/");
}

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "Etcd") {
      EtcdServer* server = SharedEtcd();
      ASSERT_NE(server, nullptr);
      EtcdStoreOptions o;
      o.endpoint = server->endpoint();
      o.prefix = CasePrefix();
      o.call_timeout = absl::Seconds(10);
      auto etcd = EtcdStore::Connect(o);
      ASSERT_TRUE(etcd.ok()) << etcd.status();
      etcd_ = *std::move(etcd);
      store_ = etcd_.get();
      return;
    }
    StoreServerOptions so;
    so.job_token = "secret";
    server_ = *StoreServer::Start(so);
    if (GetParam() == "Grpc") {
      client_ = std::make_unique<StoreClient>(
          StoreClientOptions{server_->address(), "secret", absl::Seconds(5)});
      store_ = client_.get();
    } else {
      store_ = &server_->store();
    }
  }
  // Blocking calls that wait in the backend for keys now.
  int Waiting() { return etcd_ != nullptr ? etcd_->waiting() : server_->store().waiting(); }

  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> client_;
  std::unique_ptr<EtcdStore> etcd_;
  Store* store_ = nullptr;
};

TEST_P(StoreTest, SetGetDeleteNumKeys) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  ASSERT_TRUE(store_->Set("b", std::string("\0x", 2)).ok());
  EXPECT_EQ(*store_->Get("a", absl::Seconds(1)), "1");
  EXPECT_EQ(*store_->Get("b", absl::Seconds(1)), std::string("\0x", 2));
  EXPECT_EQ(*store_->NumKeys(), 2);
  EXPECT_TRUE(*store_->Delete("a"));
  EXPECT_FALSE(*store_->Delete("a"));
  EXPECT_EQ(*store_->NumKeys(), 1);
}

TEST_P(StoreTest, GetBlocksUntilSet) {
  absl::StatusOr<std::string> v = absl::UnknownError("never returned");
  absl::Notification returned;
  std::thread getter([&] {
    v = store_->Get("late", absl::Seconds(10));
    returned.Notify();
  });
  // The Get reached the store, found no key and waits for it; only then is
  // the key set.
  EXPECT_TRUE(baton::testing::Eventually([&] { return Waiting() == 1; }));
  EXPECT_FALSE(returned.HasBeenNotified());
  EXPECT_TRUE(store_->Set("late", "v").ok());
  getter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
}

TEST_P(StoreTest, GetTimesOutNamingKey) {
  const absl::Time t0 = absl::Now();
  auto v = store_->Get("never", absl::Milliseconds(200));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(v.status().message(), "'never'")) << v.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

TEST_P(StoreTest, AddIsAtomic) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) ASSERT_TRUE(store_->Add("ctr", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store_->Add("ctr", 0), 200);
  EXPECT_EQ(*store_->Get("ctr", absl::Seconds(1)), "200");
  ASSERT_TRUE(store_->Set("text", "abc").ok());
  EXPECT_EQ(store_->Add("text", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// Regression (fuzz/store_fuzzer, corpus crash_add_overflows_counter): a
// request's delta was added without an overflow check (undefined behavior;
// the counter wrapped around).
TEST_P(StoreTest, AddThatOverflowsIsOutOfRange) {
  ASSERT_EQ(*store_->Add("ctr", INT64_MAX - 1), INT64_MAX - 1);
  absl::StatusOr<int64_t> v = store_->Add("ctr", 2);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kOutOfRange) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "overflows")) << v.status();
  EXPECT_EQ(*store_->Add("ctr", 1), INT64_MAX);
  ASSERT_TRUE(store_->Set("low", absl::StrCat(INT64_MIN)).ok());
  EXPECT_EQ(store_->Add("low", -1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*store_->Get("low", absl::Seconds(1)), absl::StrCat(INT64_MIN));
}

TEST_P(StoreTest, CompareSet) {
  EXPECT_EQ(*store_->CompareSet("k", "", "first"), "first");
  EXPECT_EQ(*store_->CompareSet("k", "", "second"), "first");
  EXPECT_EQ(*store_->CompareSet("k", "first", "third"), "third");
  EXPECT_EQ(*store_->CompareSet("missing", "x", "y"), "");
  EXPECT_FALSE(store_->Get("missing", absl::ZeroDuration()).ok());
}

TEST_P(StoreTest, WaitNamesMissingKeys) {
  ASSERT_TRUE(store_->Set("x", "1").ok());
  EXPECT_TRUE(store_->Wait({"x"}, absl::Seconds(1)).ok());
  absl::Status s = store_->Wait({"x", "y", "z"}, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(s.message(), "'y', 'z'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "2 of 3 missing")) << s;
}

TEST_P(StoreTest, BarrierNamesMissingRanks) {
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back(
        [&, r] { EXPECT_TRUE(Barrier(*store_, "b1", r, 3, absl::Seconds(5)).ok()); });
  }
  for (auto& t : threads) t.join();
  absl::Status s = Barrier(*store_, "b2", 0, 3, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(s.message(), "missing ranks 1, 2")) << s;
}

TEST_P(StoreTest, MultiGetWaitsForEveryKeyAndAnswersInTheirOrder) {
  ASSERT_TRUE(store_->Set("k1", "one").ok());
  absl::StatusOr<std::vector<std::string>> values = absl::UnknownError("never returned");
  absl::Notification returned;
  std::thread reader([&] {
    values = store_->MultiGet({"k3", "k1", "k2"}, absl::Seconds(10));
    returned.Notify();
  });
  // The read waits in the backend for the two missing keys.
  ASSERT_TRUE(baton::testing::Eventually([&] { return Waiting() == 1; }));
  ASSERT_TRUE(store_->Set("k2", "two").ok());
  EXPECT_FALSE(returned.HasBeenNotified());
  ASSERT_TRUE(store_->Set("k3", std::string("\0three", 6)).ok());
  reader.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre(std::string("\0three", 6), "one", "two"));
  absl::Status late = store_->MultiGet({"k1", "nope"}, absl::Milliseconds(100)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_TRUE(absl::StrContains(late.message(), "nope")) << late;
}

TEST_P(StoreTest, ABarrierThatPassedPassesAgainAtOnceForARankThatCallsAgain) {
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back(
        [&, r] { EXPECT_TRUE(Barrier(*store_, "again", r, 4, absl::Seconds(10)).ok()); });
  }
  for (auto& t : threads) t.join();
  // A restarted rank 2, or a slice of a longer wait, calls it again.
  EXPECT_TRUE(Barrier(*store_, "again", 2, 4, absl::ZeroDuration()).ok());
  EXPECT_TRUE(Barrier(*store_, "again", 0, 4, absl::ZeroDuration()).ok());
}

// Rank 0 arrived and died before it released the barrier (a store that
// outlives it: etcd, or baton-store): the others release it themselves
// once their wait times out with everyone arrived.
TEST_P(StoreTest, ABarrierWhoseRankZeroDiedAfterArrivingIsReleasedByTheOthers) {
  ASSERT_TRUE(store_->Set("orphan/arrived/0", "1").ok());  // and then died
  std::vector<absl::Status> got(3);
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r) {
    threads.emplace_back(
        [&, r] { got[r] = Barrier(*store_, "orphan", r, 3, absl::Milliseconds(300)); });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < 3; ++r) EXPECT_TRUE(got[r].ok()) << r << ": " << got[r];
  EXPECT_TRUE(store_->Get("orphan/released", absl::ZeroDuration()).ok());
}

TEST_P(StoreTest, ABarrierWithoutRankZeroNamesItAsMissing) {
  std::vector<absl::Status> got(3);
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r) {
    threads.emplace_back(
        [&, r] { got[r] = Barrier(*store_, "no_zero", r, 3, absl::Milliseconds(300)); });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(got[r].code(), absl::StatusCode::kDeadlineExceeded) << got[r];
    EXPECT_TRUE(absl::StrContains(got[r].message(), "2 of 3 ranks arrived; missing rank 0"))
        << got[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("Memory", "Grpc", "Etcd"),
                         [](const auto& info) { return info.param; });

// What the rendezvous of a large job rests on: reading every worker's
// registration, and a barrier, cost each worker a constant number of round
// trips to the store whatever the number of keys or ranks.
TEST(StoreClient, AMultiGetOfManyKeysIsOneRequest) {
  auto server = *StoreServer::Start({});
  StoreClient client({server->address(), "", absl::Seconds(5)});
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) {
    keys.push_back(absl::StrCat("worker/", i));
    ASSERT_TRUE(server->store().Set(keys.back(), absl::StrCat("record ", i)).ok());
  }
  const int64_t before = client.RequestsSent();
  auto values = client.MultiGet(keys, absl::Seconds(5));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(client.RequestsSent() - before, 1);
  ASSERT_EQ(values->size(), 300u);
  EXPECT_EQ((*values)[299], "record 299");
}

TEST(StoreClient, ABarrierCostsEveryRankButZeroTwoRequestsWhateverTheWorldSize) {
  auto server = *StoreServer::Start({});
  for (int world : {3, 40}) {
    std::vector<std::unique_ptr<StoreClient>> clients;
    for (int r = 0; r < world; ++r) {
      clients.push_back(std::make_unique<StoreClient>(
          StoreClientOptions{server->address(), "", absl::Seconds(5)}));
      ASSERT_TRUE(clients.back()->WaitForServer(absl::Seconds(5)).ok());
    }
    std::vector<int64_t> before(world);
    for (int r = 0; r < world; ++r) before[r] = clients[r]->RequestsSent();
    const std::string name = absl::StrCat("b", world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back(
          [&, r] { EXPECT_TRUE(Barrier(*clients[r], name, r, world, absl::Seconds(20)).ok()); });
    }
    for (auto& t : threads) t.join();
    // Each says it arrived and waits for the release; rank 0 waits for all
    // of them in one request and releases.
    for (int r = 1; r < world; ++r) EXPECT_EQ(clients[r]->RequestsSent() - before[r], 2) << r;
    EXPECT_EQ(clients[0]->RequestsSent() - before[0], 3);
  }
}

TEST(MemoryStore, AWaitedKeyDeletedBeforeTheLastArrivesIsWaitedForAgain) {
  MemoryStore store;
  absl::StatusOr<std::vector<std::string>> values = absl::UnknownError("never returned");
  std::thread reader([&] { values = store.MultiGet({"a", "b"}, absl::Seconds(10)); });
  ASSERT_TRUE(baton::testing::Eventually([&] { return store.waiting() == 1; }));
  ASSERT_TRUE(store.Set("a", "first").ok());
  ASSERT_TRUE(*store.Delete("a"));
  ASSERT_TRUE(store.Set("b", "b").ok());
  ASSERT_TRUE(store.Set("a", "second").ok());
  reader.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre("second", "b"));
}

TEST(StoreClient, RejectsWrongToken) {
  StoreServerOptions so;
  so.job_token = "secret";
  auto server = *StoreServer::Start(so);
  StoreClient bad({server->address(), "wrong", absl::Seconds(5)});
  absl::Status s = bad.Set("a", "b");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  StoreClient none({server->address(), "", absl::Seconds(5)});
  EXPECT_EQ(none.Set("a", "b").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(*server->store().NumKeys(), 0);
}

TEST(StoreClient, RetriesUntilServerStarts) {
  // Reserve a port, release it, start the server there once the client has
  // tried it and failed.
  auto probe = *StoreServer::Start({});
  const int port = probe->port();
  probe->Shutdown();
  probe.reset();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  absl::Status s = absl::UnknownError("never returned");
  std::thread setter([&] {
    StoreClient client({address, "", absl::Seconds(10)});
    s = client.Set("k", "v");
  });
  // The client's first connection finds no server (the test's listener
  // takes it and drops it); then the server starts.
  EXPECT_TRUE(baton::testing::AcceptAndDropOneConnection(port, absl::Seconds(10)));
  auto late = StoreServer::Start({address, ""});
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(*(*late)->store().Get("k", absl::Seconds(1)), "v");
}

// A connection whose handshake takes longer than the reconnect backoff
// (500 ms at most) still completes: gRPC gives each connection attempt at
// least GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, which baton once set to 50 ms,
// so every attempt over a slow link was cut off and retried forever.
TEST(StoreClient, ConnectsOverALinkSlowerThanTheReconnectBackoff) {
  auto server = *StoreServer::Start({});
  auto link = testing::SlowLink::Start(server->address(), absl::Milliseconds(1500));
  ASSERT_TRUE(link.ok()) << link.status();
  StoreClient client({(*link)->address(), "", absl::Seconds(20)});
  const absl::Time t0 = absl::Now();
  absl::Status s = client.Set("k", "v");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(*server->store().Get("k", absl::Seconds(1)), "v");
  // One connection, held open: no attempt was abandoned and retried.
  EXPECT_EQ((*link)->accepted(), 1);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

TEST(StoreClient, UnreachableServerFailsWithinDeadline) {
  auto probe = *StoreServer::Start({});
  const std::string address = probe->address();
  probe->Shutdown();
  StoreClient client({address, "", absl::Milliseconds(300)});
  const absl::Time t0 = absl::Now();
  absl::Status s = client.Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), address)) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
}

// A leaving worker's TrySet does not wait out the client's call timeout for
// a store that is gone: it fails at once (UNAVAILABLE), or at its own bound.
TEST(StoreClient, TrySetOnAStoppedServerFailsFastNamingIt) {
  auto probe = *StoreServer::Start({});
  const std::string address = probe->address();
  probe->Shutdown();
  StoreClient client({address, "", absl::Seconds(60)});
  const absl::Time t0 = absl::Now();
  absl::Status s = client.TrySet("k", "v", absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), address)) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  // And it sets, where the server is up.
  auto server = *StoreServer::Start({});
  StoreClient live({server->address(), "", absl::Seconds(60)});
  ASSERT_TRUE(live.TrySet("k", "v", absl::Seconds(10)).ok());
  EXPECT_EQ(*live.Get("k", absl::Seconds(1)), "v");
}

// A partition that outlasts the connection: a blocking Get in flight when
// its connection breaks is sent again on a new one, and still returns the
// value set later, within its own timeout.
TEST(StoreClient, ACallWhoseConnectionBreaksIsSentAgainOnANewOne) {
  auto server = *StoreServer::Start({});
  auto link = testing::SlowLink::Start(server->address(), absl::ZeroDuration());
  ASSERT_TRUE(link.ok()) << link.status();
  StoreClient client({(*link)->address(), "", absl::Seconds(20)});
  ASSERT_TRUE(client.Set("ready", "1").ok());
  const int64_t before = (*link)->bytes_to_target();
  absl::StatusOr<std::string> got = absl::UnknownError("not yet");
  std::thread getter([&] { got = client.Get("late", absl::Seconds(20)); });
  // The Get reached the server; then its connection breaks.
  ASSERT_TRUE(baton::testing::Eventually([&] { return (*link)->bytes_to_target() > before; }));
  (*link)->Cut();
  ASSERT_TRUE(baton::testing::Eventually([&] { return (*link)->accepted() >= 2; }));
  ASSERT_TRUE(server->store().Set("late", "value").ok());
  getter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "value");
}

// Add is the one call whose repeat would change the result: each request id
// is applied once, and a repeat gets the first answer.
TEST(StoreServer, AnAddRepeatedWithItsRequestIdCountsOnce) {
  auto server = *StoreServer::Start({});
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = proto::Store::NewStub(channel);
  auto add = [&](const std::string& id) -> int64_t {
    grpc::ClientContext ctx;
    proto::AddRequest req;
    req.set_key("n");
    req.set_delta(5);
    req.set_request_id(id);
    proto::AddResponse resp;
    const grpc::Status s = stub->Add(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.value();
  };
  EXPECT_EQ(add("client-a:1"), 5);
  EXPECT_EQ(add("client-a:1"), 5);  // the repeat
  EXPECT_EQ(add("client-a:2"), 10);
  EXPECT_EQ(add(""), 15);  // no id: applied every time
  EXPECT_EQ(add(""), 20);
  EXPECT_EQ(*server->store().Add("n", 0), 20);
}

// The server's own UNAVAILABLE (its store closed) is an answer: the client
// does not repeat the call until its deadline.
TEST(StoreClient, TheServersOwnUnavailableIsNotRepeated) {
  auto server = *StoreServer::Start({});
  auto link = testing::SlowLink::Start(server->address(), absl::ZeroDuration());
  ASSERT_TRUE(link.ok()) << link.status();
  StoreClient client({(*link)->address(), "", absl::Seconds(30)});
  ASSERT_TRUE(client.Set("k", "v").ok());
  absl::Status s;
  const absl::Time t0 = absl::Now();
  std::thread waiter([&] { s = client.Wait({"never"}, absl::Seconds(20)); });
  // The Wait reached the server's store (not only its socket: a call the
  // server drops unhandled is a lost connection's, and is repeated), and
  // then the server stops.
  ASSERT_TRUE(baton::testing::Eventually([&] { return server->store().waiting() == 1; }));
  server->Shutdown();
  waiter.join();
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10)) << s;
}

EtcdStoreOptions EtcdOptions(const std::string& endpoint) {
  EtcdStoreOptions o;
  o.endpoint = endpoint;
  o.prefix = CasePrefix();
  o.call_timeout = absl::Seconds(10);
  return o;
}

// Every process of a job keeps one lease alive; once none is left, the
// job's keys go with it.
TEST(EtcdStore, KeysExpireWithTheJobsLease) {
  EtcdServer* server = SharedEtcd();
  ASSERT_NE(server, nullptr);
  EtcdStoreOptions o = EtcdOptions(server->endpoint());
  o.lease_ttl = absl::Seconds(2);
  auto first = EtcdStore::Connect(o);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = EtcdStore::Connect(o);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE((*first)->lease_id(), 0);
  EXPECT_EQ((*first)->lease_id(), (*second)->lease_id());
  ASSERT_TRUE((*first)->Set("registration", "w0").ok());
  // The first process leaves; the second keeps the lease alive past its TTL.
  first->reset();
  EtcdStoreOptions reader = o;
  reader.lease_ttl = absl::ZeroDuration();  // reads without keeping the lease alive
  auto observer = EtcdStore::Connect(reader);
  ASSERT_TRUE(observer.ok()) << observer.status();
  const absl::Time kept_until = absl::Now() + absl::Seconds(4);
  while (absl::Now() < kept_until) {
    ASSERT_TRUE((*observer)->Get("registration", absl::ZeroDuration()).ok());
    absl::SleepFor(absl::Milliseconds(200));  // sampling etcd's timer, not synchronizing
  }
  // The last one leaves: the key expires within the TTL (and etcd's tick).
  second->reset();
  EXPECT_TRUE(baton::testing::Eventually(
      [&] { return !(*observer)->Get("registration", absl::ZeroDuration()).ok(); },
      absl::Seconds(10)));
  EXPECT_EQ(*(*observer)->NumKeys(), 0);
  // A process of the job that comes later grants a new lease.
  auto later = EtcdStore::Connect(o);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_TRUE((*later)->Set("again", "1").ok());
}

TEST(EtcdStore, AuthenticatesWithEtcdsUsersAndNamesAFailure) {
  testing::EtcdServerOptions so;
  so.auth = true;
  so.root_password = "correct horse";
  auto etcd = EtcdServer::Start(so);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EtcdStoreOptions o = EtcdOptions((*etcd)->endpoint());
  o.user = "root";
  o.password = "wrong";
  auto bad = EtcdStore::Connect(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("as user 'root'"));
  EtcdStoreOptions anonymous = EtcdOptions((*etcd)->endpoint());
  auto none = EtcdStore::Connect(anonymous);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), ::testing::HasSubstr((*etcd)->endpoint()));
  o.password = "correct horse";
  auto good = EtcdStore::Connect(o);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Set("k", "v").ok());
  EXPECT_EQ(*(*good)->Get("k", absl::Seconds(1)), "v");
}

// TLS to etcd (mutual: etcd asks for a client certificate signed by its CA):
// a client with the job's certificates works; one without is refused, and
// the error names the endpoint.
TEST(EtcdStore, MutualTlsToEtcd) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/etcd-certs");
  ASSERT_EQ(std::system(absl::StrCat("bash tools/make_certs.sh ", dir, " etcd client").c_str()), 0);
  testing::EtcdServerOptions so;
  so.tls_dir = dir;
  auto etcd = EtcdServer::Start(so);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EtcdStoreOptions o = EtcdOptions((*etcd)->endpoint());
  auto tls = LoadTls({dir + "/ca.pem", dir + "/client.pem", dir + "/client.key"});
  ASSERT_TRUE(tls.ok()) << tls.status();
  o.tls = *tls;
  auto store = EtcdStore::Connect(o);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "over TLS").ok());
  EXPECT_EQ(*(*store)->Get("k", absl::Seconds(1)), "over TLS");
  EtcdStoreOptions plain = EtcdOptions((*etcd)->endpoint());
  plain.call_timeout = absl::Seconds(1);
  auto refused = EtcdStore::Connect(plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr((*etcd)->endpoint()));
}

TEST(EtcdStore, UnreachableEtcdFailsWithinDeadlineNamingIt) {
  EtcdStoreOptions o = EtcdOptions("127.0.0.1:1");
  o.call_timeout = absl::Milliseconds(500);
  const absl::Time t0 = absl::Now();
  auto store = EtcdStore::Connect(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDeadlineExceeded) << store.status();
  EXPECT_THAT(std::string(store.status().message()), ::testing::HasSubstr("127.0.0.1:1"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

}  // namespace
}  // namespace baton::store
