// The rendezvous store admits only the members of its job and listens on one address: real
// clients on loopback with a wrong secret, with none, and a plain c10d TCPStore client are
// refused and logged, never taken for a rank (tests/e2e/multinode_test.cc does the same across
// a veth pair).
#include "comm/store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <future>
#include <mutex>
#include <thread>

#include "comm/store_client.h"
#include "comm/store_server.h"
#include "tests/comm/stranger.h"

namespace loom::comm {
namespace {

using std::chrono::milliseconds;

struct Logged {
  std::mutex mu;
  std::vector<std::string> lines;
  StoreServer::Log log() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
    };
  }
};

std::shared_ptr<StoreServer> serve(const std::string& host, Logged* logged) {
  auto server = StoreServer::start(host, 0, "the-secret", logged ? logged->log() : nullptr);
  EXPECT_TRUE(server.ok()) << server.error().message;
  return server.ok() ? *server : nullptr;
}

// errno of a plain TCP connect to host:port (0 when it connected).
int connect_errno(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  const int err = rc == 0 ? 0 : errno;
  close(fd);
  return err;
}

TEST(Store, StrangersAreRefusedAndLogged) {
  Logged logged;
  auto server = serve("127.0.0.1", &logged);
  ASSERT_TRUE(server);
  const auto tries = testing::try_as_stranger("127.0.0.1", server->port(), 5);
  ASSERT_EQ(tries.size(), 3u);
  EXPECT_NE(tries[0].find("refused by the store: not a member of this job: it presented a wrong "
                          "secret"),
            std::string::npos)
      << tries[0];
  EXPECT_NE(tries[1].find("it presented no secret"), std::string::npos) << tries[1];
  EXPECT_EQ(tries[2].rfind("refused: c10d TCPStore client", 0), 0u) << tries[2];
  EXPECT_GE(server->refused(), 3);  // c10d's client tries again until its timeout
  // Nothing a stranger sent reached the keys: a member sees no loom/joined/1.
  auto member = StoreClient::connect("127.0.0.1", server->port(), "the-secret", milliseconds(5000));
  EXPECT_FALSE(member->check({"loom/joined/1"}));
  EXPECT_EQ(member->getNumKeys(), 0);
  std::lock_guard<std::mutex> lock(logged.mu);
  ASSERT_GE(logged.lines.size(), 3u);
  EXPECT_NE(logged.lines[0].find("refused a connection from 127.0.0.1:"), std::string::npos)
      << logged.lines[0];
  EXPECT_NE(logged.lines[0].find("wrong secret"), std::string::npos) << logged.lines[0];
  EXPECT_NE(logged.lines[2].find("not a loom rendezvous client"), std::string::npos)
      << logged.lines[2];
}

TEST(Store, ListensOnItsAddressOnly) {
  auto server = serve("127.0.0.1", nullptr);
  ASSERT_TRUE(server);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  EXPECT_EQ(connect_errno("127.0.0.1", server->port()), 0);
  // Another address of this host (all of 127/8 is loopback) finds nothing listening.
  EXPECT_EQ(connect_errno("127.0.0.2", server->port()), ECONNREFUSED);
}

TEST(Store, MembersGetC10dSemantics) {
  auto server = serve("127.0.0.1", nullptr);
  ASSERT_TRUE(server);
  auto a = StoreClient::connect("127.0.0.1", server->port(), "the-secret", milliseconds(5000));
  auto b = a->clone();
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    b->set("k", std::vector<uint8_t>{'v'});
  });
  EXPECT_EQ(a->get("k"), std::vector<uint8_t>{'v'});  // waits for b's set
  later.join();
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 3), 5);
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_FALSE(a->check({"k", "absent"}));
  EXPECT_EQ(a->compareSet("k", {'x'}, {'y'}), std::vector<uint8_t>{'v'});
  EXPECT_EQ(a->compareSet("k", {'v'}, {'w'}), std::vector<uint8_t>{'w'});
  EXPECT_EQ(a->getNumKeys(), 2);
  EXPECT_TRUE(a->deleteKey("k"));
  EXPECT_FALSE(a->deleteKey("k"));
  EXPECT_THROW(a->wait({"never"}, milliseconds(100)), std::runtime_error);
  a->wait({"n"}, milliseconds(100));
}

// A stranger that connects while rank 0 waits for rank 1 is not counted as rank 1: the
// rendezvous still says rank 1 never came.
TEST(Store, AStrangerIsNeverTakenForARank) {
  const int port = [] {
    auto probe = StoreServer::start("127.0.0.1", 0, "x", nullptr);
    return probe.ok() ? (*probe)->port() : 0;
  }();
  std::vector<std::string> tries;
  std::thread stranger([&] { tries = testing::try_as_stranger("127.0.0.1", port, 5); });
  auto rank0 = RendezvousStore::connect(StoreAddress{"127.0.0.1", port, "job-secret", ""}, 0, 2, 2);
  stranger.join();
  ASSERT_FALSE(rank0.ok());
  EXPECT_NE(rank0.error().message.find("rank 1 of 2 did not join"), std::string::npos)
      << rank0.error().message;
  for (const std::string& t : tries) EXPECT_EQ(t.rfind("refused", 0), 0u) << t;
}

TEST(Store, AMemberWithAnotherSecretIsToldWhy) {
  auto rank0 = std::async(std::launch::async, [] {
    return RendezvousStore::connect(StoreAddress{"127.0.0.1", 0, "job-secret", ""}, 0, 1, 5);
  });
  auto store = rank0.get();
  ASSERT_TRUE(store.ok()) << store.error().message;
  auto rank1 = RendezvousStore::connect(
      StoreAddress{"127.0.0.1", (*store)->port(), "other-secret", ""}, 1, 2, 5);
  ASSERT_FALSE(rank1.ok());
  EXPECT_NE(rank1.error().message.find("rank 1 was turned away by the rendezvous store"),
            std::string::npos)
      << rank1.error().message;
  EXPECT_NE(rank1.error().message.find("LOOM_RDZV_TOKEN"), std::string::npos);
}

}  // namespace
}  // namespace loom::comm
