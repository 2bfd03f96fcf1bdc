// An engine that checks each job as the real one does and answers it at once with outputs of
// the right shapes and zero bytes, computing nothing: a server run with it
// (--transport_ceiling) measures what the transports alone sustain, the ceiling any real
// configuration is compared against (issue 24: small requests at >= 0.8x of it). Answers are
// wrong by design, so it is for benchmarks only; the startup log and ServerInfo's kernel
// families say so. Everything but Enqueue is the wrapped engine's.
#pragma once

#include <memory>

#include "server/engine/engine.h"

namespace attnserve::engine {

class TransportCeilingEngine final : public Engine {
 public:
  explicit TransportCeilingEngine(std::unique_ptr<Engine> inner);

  // Validated like the real engine's jobs; `done` runs before Enqueue returns. A backward on a
  // saved context is refused (FAILED_PRECONDITION): nothing is ever kept.
  absl::Status Enqueue(ForwardJob job) override;
  absl::Status Enqueue(BackwardJob job) override;

  bool Drain(absl::Duration timeout) override { return inner_->Drain(timeout); }
  void Stop() override { inner_->Stop(); }
  int64_t InflightCount() const override { return inner_->InflightCount(); }
  HostBuffers& host_buffers() override { return inner_->host_buffers(); }
  const Limits& limits() const override { return inner_->limits(); }
  std::vector<devices::DeviceDescription> Devices() const override { return inner_->Devices(); }
  std::vector<std::string> KernelFamilies() const override { return {kFamily}; }
  std::vector<std::string> DeviceKernelFamilies(const std::string&) const override {
    return {kFamily};
  }

  static constexpr const char* kFamily = "transport_ceiling";

 private:
  const std::unique_ptr<Engine> inner_;
};

}  // namespace attnserve::engine
