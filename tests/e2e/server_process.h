// Runs the real attnserve binary on free loopback ports for end-to-end tests.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "attnserve/client.h"

namespace attnserve::testing {

// In an extra flag, stands for the gRPC port the server is given (e.g. to advertise it).
inline constexpr char kGrpcPortPlaceholder[] = "{grpc_port}";

class ServerProcess {
 public:
  // Starts the binary with --host=127.0.0.1, free ports (data channel's included),
  // --devices=cpu and `extra_flags`, and waits until it answers GetServerInfo; again on fresh
  // ports when another process took one of them first. Fails the current test on error.
  static std::unique_ptr<ServerProcess> Start(const std::vector<std::string>& extra_flags = {});
  // The same for servers with TLS or tokens: `client_options` is how NewClient (and the
  // readiness check) connects.
  static std::unique_ptr<ServerProcess> Start(const std::vector<std::string>& extra_flags,
                                              const ClientOptions& client_options);
  // Runs the binary with `flags` and no defaults and waits for it to exit by itself; returns
  // its exit code (or -1) and puts what it printed in `output`.
  static int RunToExit(const std::vector<std::string>& flags, std::string* output);
  ~ServerProcess();

  std::string target() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  int data_port() const { return data_port_; }
  std::unique_ptr<Client> NewClient() const;
  // The same, with Forward and Backward over `transport`.
  std::unique_ptr<Client> NewClient(Transport transport) const;

  // Sends SIGTERM and waits up to `timeout_seconds`; returns the exit code, or -1 if the
  // process had to be killed or died from a signal.
  int Terminate(int timeout_seconds = 30);
  // Terminates the server and starts it again with the same flags on the same ports (a server
  // restart as clients see it), waiting until it answers. Fails the current test on error.
  bool Restart();
  void SendSigterm();
  int WaitForExit(int timeout_seconds);
  std::string Log() const;

 private:
  ServerProcess() = default;
  enum class Startup { kReady, kPortTaken, kFailed };
  // Forks the binary with `args` (argv[0] excluded), output to a fresh log file.
  void Spawn(const std::vector<std::string>& args);
  // Waits until the server has logged that it listens and answers GetServerInfo. kPortTaken:
  // another process held one of its ports, and the server is stopped. On the last attempt that
  // is kFailed instead (or kReady for a server that runs without its data channel). kFailed
  // also fails the current test.
  Startup AwaitStartup(bool last_attempt);
  // SIGKILL and reap, if it runs.
  void StopNow();

  ClientOptions client_options_;
  std::vector<std::string> args_;  // as last spawned
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  int http_port_ = 0;
  int data_port_ = 0;
  std::string log_path_;
};

// A TCP port nobody listens on right now.
int FreePort();

}  // namespace attnserve::testing
