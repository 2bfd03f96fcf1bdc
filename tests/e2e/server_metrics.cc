#include "server_metrics.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnserve::testing {

double Metric(int http_port, const std::string& name) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(http_port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const std::string get = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)send(fd, get.data(), get.size(), MSG_NOSIGNAL);
  std::string page;
  char buffer[65536];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) page.append(buffer, n);
  close(fd);
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::ConsumePrefix(&line, name + " ")) {
      double value = 0;
      if (absl::SimpleAtod(line, &value)) return value;
    }
  }
  return -1;
}

double AwaitMetric(int http_port, const std::string& name, double want) {
  double value = -1;
  for (int i = 0; i < 200 && (value = Metric(http_port, name)) != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return value;
}

}  // namespace attnserve::testing
