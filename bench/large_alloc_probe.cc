// How long one large answer-sized buffer takes to allocate and fill (std::string(src, n), as the
// server builds each answer tensor), made on one thread and freed on another, the way an answer
// is built on a lane and freed by the transport. Compares allocators without the GPU:
//   g++ -O2 -pthread bench/large_alloc_probe.cc -o /tmp/probe && /tmp/probe
//   g++ -O2 -pthread bench/large_alloc_probe.cc -o /tmp/probe -ltcmalloc_minimal && /tmp/probe
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main() {
  constexpr size_t kBytes = size_t{128} << 20;  // a 256k-token, 2-head, hdim-128 bf16 answer
  const std::vector<char> source(kBytes, 1);
  for (int round = 0; round < 6; ++round) {
    const auto start = std::chrono::steady_clock::now();
    auto* answer = new std::string(source.data(), kBytes);
    const auto end = std::chrono::steady_clock::now();
    std::thread([answer] { delete answer; }).join();
    std::printf("round %d: %.1f ms\n", round,
                std::chrono::duration<double, std::milli>(end - start).count());
  }
}
