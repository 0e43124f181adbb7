// The wire of loom's rendezvous store (store_server.h, store_client.h): a handshake in which a
// client presents the job's secret, then requests and replies as length-prefixed messages.
// Plain sockets, no LibTorch.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace loom::comm::wire {

using Clock = std::chrono::steady_clock;

// A connection opens with these bytes, then the secret (u32 length, bytes); the server answers
// kAdmitted, or kRefused followed by one message whose field is the reason.
constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'R', 'D', 'V', '1'};
constexpr uint32_t kMaxSecret = 4096;
constexpr uint8_t kAdmitted = 1;
constexpr uint8_t kRefused = 0;

// Requests: the head byte of a message, its fields the arguments.
enum Op : uint8_t {
  kSet = 1,     // key, value
  kGet,         // key, timeout ms: waits for the key
  kAdd,         // key, delta: the new value
  kCheck,       // keys...: "1" when all are set
  kWait,        // timeout ms, keys...
  kDelete,      // key: "1" when it was set
  kCompareSet,  // key, expected, desired: the value afterwards
  kNumKeys,     // the number of keys
};
// Replies: the head byte; fields carry the result, or the reason of kFailed.
enum Reply : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

// Reads exactly n bytes before `deadline` (Clock::time_point::max(): none); false on end of file,
// an error or the deadline, and `why` says which.
bool read_exact(int fd, void* data, size_t n, Clock::time_point deadline, std::string* why);
// Writes all n bytes (no SIGPIPE); false when the peer is gone.
bool write_exact(int fd, const void* data, size_t n);

// A message: the head byte, a u32 field count, each field a u32 length and its bytes (network
// byte order). Reading refuses counts and lengths past sane bounds.
bool send_message(int fd, uint8_t head, const std::vector<std::string>& fields);
bool recv_message(int fd, Clock::time_point deadline, uint8_t* head,
                  std::vector<std::string>* fields, std::string* why);

// One connection attempt that presents `secret`: the admitted socket, or -1 with `why` (and
// `refused` set when the store turned the secret away: fatal, never worth a retry). Both the
// workers' client (store_client.h) and loomrun's agents connect through it.
int connect_admitted(const sockaddr_in& address, const std::string& secret,
                     Clock::time_point deadline, std::string* why, bool* refused);

// host:port as an IPv4 socket address ("0.0.0.0": every interface); the error names the host.
Result<sockaddr_in> resolve(const std::string& host, int port);
// "10.0.0.2:41234".
std::string to_string(const sockaddr_in& address);

}  // namespace loom::comm::wire
