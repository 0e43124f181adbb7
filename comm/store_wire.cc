#include "comm/store_wire.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace loom::comm::wire {
namespace {

// Bounds on what a peer may ask the reader to hold (an admitted member; strangers never get here).
constexpr uint32_t kMaxFields = 1u << 22;
constexpr uint32_t kMaxField = 1u << 28;

bool read_u32(int fd, uint32_t* v, Clock::time_point deadline, std::string* why) {
  uint32_t n = 0;
  if (!read_exact(fd, &n, sizeof n, deadline, why)) return false;
  *v = ntohl(n);
  return true;
}

void append_u32(std::string& out, uint32_t v) {
  const uint32_t n = htonl(v);
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
}

}  // namespace

bool read_exact(int fd, void* data, size_t n, Clock::time_point deadline, std::string* why) {
  auto* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    if (deadline != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        *why = "no answer in time";
        return false;
      }
      pollfd pfd{fd, POLLIN, 0};
      const int ready = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) continue;
      if (ready < 0) {
        *why = std::strerror(errno);
        return false;
      }
    }
    const ssize_t got = recv(fd, p + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) {
      *why = "the connection was closed";
      return false;
    }
    if (got < 0) {
      *why = std::strerror(errno);
      return false;
    }
    done += static_cast<size_t>(got);
  }
  return true;
}

bool write_exact(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t put = send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    done += static_cast<size_t>(put);
  }
  return true;
}

bool send_message(int fd, uint8_t head, const std::vector<std::string>& fields) {
  std::string out(1, static_cast<char>(head));
  append_u32(out, static_cast<uint32_t>(fields.size()));
  for (const std::string& f : fields) {
    append_u32(out, static_cast<uint32_t>(f.size()));
    out += f;
  }
  return write_exact(fd, out.data(), out.size());
}

bool recv_message(int fd, Clock::time_point deadline, uint8_t* head,
                  std::vector<std::string>* fields, std::string* why) {
  uint32_t count = 0;
  if (!read_exact(fd, head, 1, deadline, why) || !read_u32(fd, &count, deadline, why)) return false;
  if (count > kMaxFields) {
    *why = "a malformed message (" + std::to_string(count) + " fields)";
    return false;
  }
  fields->assign(count, std::string());
  for (std::string& f : *fields) {
    uint32_t size = 0;
    if (!read_u32(fd, &size, deadline, why)) return false;
    if (size > kMaxField) {
      *why = "a malformed message (a field of " + std::to_string(size) + " bytes)";
      return false;
    }
    f.resize(size);
    if (size > 0 && !read_exact(fd, f.data(), size, deadline, why)) return false;
  }
  return true;
}

int connect_admitted(const sockaddr_in& address, const std::string& secret,
                     Clock::time_point deadline, std::string* why, bool* refused) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    *why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string hello(kMagic, sizeof kMagic);
  const uint32_t size = htonl(static_cast<uint32_t>(secret.size()));
  hello.append(reinterpret_cast<const char*>(&size), sizeof size);
  hello += secret;
  uint8_t answer = kRefused;
  if (!write_exact(fd, hello.data(), hello.size()) || !read_exact(fd, &answer, 1, deadline, why)) {
    close(fd);
    return -1;
  }
  if (answer != kAdmitted) {
    uint8_t head = 0;
    std::vector<std::string> reason;
    *refused = true;
    *why = recv_message(fd, deadline, &head, &reason, why) && !reason.empty()
               ? "refused by the store: " + reason[0]
               : "refused by the store";
    close(fd);
    return -1;
  }
  return fd;
}

Result<sockaddr_in> resolve(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Error{"cannot resolve '" + host + "' to an IPv4 address (" + gai_strerror(rc) + ")", {}};
  }
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

std::string to_string(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
  return std::string(text) + ":" + std::to_string(ntohs(address.sin_port));
}

}  // namespace loom::comm::wire
