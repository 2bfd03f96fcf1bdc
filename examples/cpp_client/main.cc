// Asks an attnserve server what it runs on, then sends one forward it can check by hand: every
// sequence has a single key, so softmax gives it weight 1 and each query's output is that
// key's value row.
//
//   attnserve_example [target]      (default localhost:8001; exit 0 when the check passes)
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "attnserve/client.h"
#include "attnserve/tensor_codec.h"

namespace {

constexpr int kHeads = 2;
constexpr int kHeadDim = 8;
const std::vector<int32_t> kCuSeqlensQ = {0, 3, 5};  // two sequences: 3 and 2 queries
const std::vector<int32_t> kCuSeqlensK = {0, 1, 2};  // one key each

std::vector<float> Ramp(int count, float scale) {
  std::vector<float> values(count);
  for (int i = 0; i < count; ++i) values[i] = scale * static_cast<float>(i % 7 - 3);
  return values;
}

int Fail(const std::string& what) {
  std::cerr << "attnserve_example: " << what << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string target = argc > 1 ? argv[1] : "localhost:8001";
  attnserve::ClientOptions options;
  options.timeout = std::chrono::seconds(30);
  auto client = attnserve::Client::Create(target, options);
  if (!client.ok()) return Fail(client.status().ToString());

  auto info = (*client)->GetServerInfo();
  if (!info.ok()) return Fail(info.status().ToString());
  std::cout << "server version " << info->version() << "\n";
  // Forward takes the server's data channel when it offers one (ClientOptions::transport).
  auto transport = (*client)->ActiveTransport();
  if (!transport.ok()) return Fail(transport.status().ToString());
  std::cout << "transport " << *transport << "\n";

  const int total_q = kCuSeqlensQ.back(), total_k = kCuSeqlensK.back();
  const std::vector<float> v = Ramp(total_k * kHeads * kHeadDim, 0.5f);
  attnserve::v1::ForwardRequest request;
  auto q = attnserve::MakeTensor(attnserve::v1::DTYPE_FLOAT32, {total_q, kHeads, kHeadDim},
                                 Ramp(total_q * kHeads * kHeadDim, 0.25f));
  auto k = attnserve::MakeTensor(attnserve::v1::DTYPE_FLOAT32, {total_k, kHeads, kHeadDim},
                                 Ramp(total_k * kHeads * kHeadDim, 1.0f));
  auto v_tensor = attnserve::MakeTensor(attnserve::v1::DTYPE_FLOAT32,
                                        {total_k, kHeads, kHeadDim}, v);
  if (!q.ok() || !k.ok() || !v_tensor.ok()) return Fail("could not build the tensors");
  *request.mutable_q() = *std::move(q);
  *request.mutable_k() = *std::move(k);
  *request.mutable_v() = *std::move(v_tensor);
  request.mutable_cu_seqlens_q()->Add(kCuSeqlensQ.begin(), kCuSeqlensQ.end());
  request.mutable_cu_seqlens_k()->Add(kCuSeqlensK.begin(), kCuSeqlensK.end());

  auto response = (*client)->Forward(request);
  if (!response.ok()) return Fail(response.status().ToString());
  auto out = attnserve::TensorToFloats(response->out());
  if (!out.ok()) return Fail(out.status().ToString());
  if (out->size() != static_cast<size_t>(total_q * kHeads * kHeadDim)) {
    return Fail("out has " + std::to_string(out->size()) + " values");
  }
  const int row = kHeads * kHeadDim;
  for (size_t b = 0; b + 1 < kCuSeqlensQ.size(); ++b) {
    for (int i = kCuSeqlensQ[b]; i < kCuSeqlensQ[b + 1]; ++i) {
      for (int j = 0; j < row; ++j) {
        const float expected = v[kCuSeqlensK[b] * row + j];
        if (std::fabs((*out)[i * row + j] - expected) > 1e-6f) {
          return Fail("out[" + std::to_string(i) + "] is not the value row of its key");
        }
      }
    }
  }
  std::cout << "forward ran on " << response->execution().device() << " ("
            << response->execution().kernel() << "): out matches\n";
  return 0;
}
