#include "server_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"

namespace attnserve::testing {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// Printed by attnserve once its gRPC and HTTP listeners are up and the data channel is on or off
// (its last startup line but the warnings): only then does a client reach this server.
constexpr char kStartedLine[] = "attnserve: data channel ";
// Printed when another process holds a port (attnserve fails to start, or runs without the data
// channel): FreePort is only a guess, and a parallel test's server may take the same port.
constexpr char kPortTaken[] = "could not listen on ";
constexpr int kStartAttempts = 3;

}  // namespace

std::unique_ptr<ServerProcess> ServerProcess::Start(const std::vector<std::string>& extra_flags) {
  return Start(extra_flags, ClientOptions());
}

std::unique_ptr<ServerProcess> ServerProcess::Start(const std::vector<std::string>& extra_flags,
                                                    const ClientOptions& client_options) {
  std::unique_ptr<ServerProcess> server(new ServerProcess());
  server->client_options_ = client_options;
  for (int attempt = 1; attempt <= kStartAttempts; ++attempt) {
    server->grpc_port_ = FreePort();
    server->http_port_ = FreePort();
    server->data_port_ = FreePort();
    std::vector<std::string> args = {"--host=127.0.0.1",
                                     "--grpc_port=" + std::to_string(server->grpc_port_),
                                     "--http_port=" + std::to_string(server->http_port_),
                                     "--data_port=" + std::to_string(server->data_port_),
                                     "--devices=cpu"};
    for (std::string flag : extra_flags) {
      const size_t at = flag.find(kGrpcPortPlaceholder);
      if (at != std::string::npos) {
        flag.replace(at, std::string(kGrpcPortPlaceholder).size(),
                     std::to_string(server->grpc_port_));
      }
      args.push_back(std::move(flag));
    }
    server->Spawn(args);
    switch (server->AwaitStartup(/*last_attempt=*/attempt == kStartAttempts)) {
      case Startup::kReady:
        return server;
      case Startup::kPortTaken:
        continue;  // AwaitStartup stopped it; fresh ports
      case Startup::kFailed:
        return nullptr;
    }
  }
  return nullptr;
}

bool ServerProcess::Restart() {
  if (Terminate() != 0) ADD_FAILURE() << "attnserve did not exit cleanly:\n" << Log();
  unlink(log_path_.c_str());
  Spawn(args_);
  return AwaitStartup(/*last_attempt=*/true) == Startup::kReady;
}

ServerProcess::Startup ServerProcess::AwaitStartup(bool last_attempt) {
  // Nothing connects before the server says it listens: a call that found nothing listening
  // would put the channel into gRPC's reconnect backoff (1 s, 1.6 s, ...), and one that found
  // another process on the port would take its answer for this server's.
  const auto port_taken = [&] {
    if (last_attempt || Log().find(kPortTaken) == std::string::npos) return false;
    StopNow();  // a server that still runs lacks the data channel the tests expect
    unlink(log_path_.c_str());
    return true;
  };
  std::unique_ptr<Client> client;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (client == nullptr && Log().find(kStartedLine) != std::string::npos) {
      if (port_taken()) return Startup::kPortTaken;
      client = NewClient();
    }
    if (client != nullptr && client->GetServerInfo().ok()) return Startup::kReady;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (port_taken()) return Startup::kPortTaken;
      ADD_FAILURE() << "attnserve exited during startup:\n" << Log();
      return Startup::kFailed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "attnserve did not become ready in 30 s:\n" << Log();
  return Startup::kFailed;
}

void ServerProcess::StopNow() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void ServerProcess::Spawn(const std::vector<std::string>& args) {
  args_ = args;
  char log_template[] = "/tmp/attnserve_e2e_XXXXXX";
  const int log_fd = mkstemp(log_template);
  log_path_ = log_template;
  std::vector<std::string> argv_strings = {ATTNSERVE_BIN};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  pid_ = fork();
  if (pid_ == 0) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
}

int ServerProcess::RunToExit(const std::vector<std::string>& flags, std::string* output) {
  ServerProcess process;
  process.Spawn(flags);
  const int code = process.WaitForExit(30);
  *output = process.Log();
  return code;
}

ServerProcess::~ServerProcess() {
  // A failed test shows the server's side: whether it was still running and what it logged
  // (a sanitizer report in the server aborts it, and the client sees only a refused connection).
  const bool show_log = ::testing::Test::HasFailure() && !log_path_.empty();
  const pid_t pid = pid_;
  std::string state = "not running";
  int status = 0;
  if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    state = WIFSIGNALED(status) ? "had been killed by signal " + std::to_string(WTERMSIG(status))
                                : "had exited with code " + std::to_string(WEXITSTATUS(status));
  } else if (pid_ > 0) {
    state = "was still running";
    StopNow();
  }
  if (show_log) {
    std::string log = Log();
    constexpr size_t kTail = 64 << 10;
    if (log.size() > kTail) log = "[...]\n" + log.substr(log.size() - kTail);
    std::cerr << "attnserve (pid " << pid << ") " << state << " at the end of the failed test; "
              << "its log:\n" << log << "\n[end of attnserve's log]" << std::endl;
  }
  if (!log_path_.empty()) unlink(log_path_.c_str());
}

std::unique_ptr<Client> ServerProcess::NewClient() const {
  return NewClient(client_options_.transport);
}

std::unique_ptr<Client> ServerProcess::NewClient(Transport transport) const {
  ClientOptions options = client_options_;
  options.timeout = std::chrono::seconds(60);
  options.transport = transport;
  return *Client::Create(target(), options);
}

void ServerProcess::SendSigterm() { kill(pid_, SIGTERM); }

int ServerProcess::WaitForExit(int timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

int ServerProcess::Terminate(int timeout_seconds) {
  SendSigterm();
  return WaitForExit(timeout_seconds);
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace attnserve::testing
