#include "subprocess.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace attnserve::testing {

ProcessResult RunProcess(const std::vector<std::string>& argv, int timeout_seconds) {
  char log_template[] = "/tmp/attnserve_process_XXXXXX";
  const int log_fd = mkstemp(log_template);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    std::vector<std::string> args = argv;
    std::vector<char*> c_args;
    for (std::string& a : args) c_args.push_back(a.data());
    c_args.push_back(nullptr);
    execv(c_args[0], c_args.data());
    _exit(127);
  }
  close(log_fd);

  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  int status = 0;
  bool exited = false;
  while (!exited && std::chrono::steady_clock::now() < deadline) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  std::ifstream in(log_template);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  unlink(log_template);
  return result;
}

}  // namespace attnserve::testing
