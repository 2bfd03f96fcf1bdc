#include "tools/transport_choice.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/raw_socket_peer.h"

namespace attnserve::tools {
namespace {

using ::testing::HasSubstr;

TEST(ParseTransportTest, NamesAndAnError) {
  EXPECT_EQ(*ParseTransport("auto"), Transport::kAuto);
  EXPECT_EQ(*ParseTransport("grpc"), Transport::kGrpc);
  EXPECT_EQ(*ParseTransport("data"), Transport::kDataChannel);
  EXPECT_EQ(TransportName(Transport::kDataChannel), "data");
  EXPECT_THAT(std::string(ParseTransport("udp").status().message()),
              HasSubstr("--transport must be auto, grpc or data, not 'udp'"));
}

TEST(ParseSharedMemoryTest, NamesAndAnError) {
  for (SharedMemory choice : {SharedMemory::kOff, SharedMemory::kAuto, SharedMemory::kOn}) {
    EXPECT_EQ(*ParseSharedMemory(SharedMemoryName(choice)), choice);
  }
  EXPECT_THAT(std::string(ParseSharedMemory("yes").status().message()),
              HasSubstr("--shared_memory must be off, auto or on, not 'yes'"));
}

TEST(TargetHostTest, OneHostOrNone) {
  EXPECT_EQ(TargetHost("localhost:8001"), "localhost");
  EXPECT_EQ(TargetHost("dns:///attnserve.ns:8001"), "attnserve.ns");
  EXPECT_EQ(TargetHost("ipv4:10.0.0.2:8001"), "10.0.0.2");
  EXPECT_EQ(TargetHost("[::1]:8001"), "::1");
  EXPECT_EQ(TargetHost("attnserve"), "attnserve");
  EXPECT_EQ(TargetHost("unix:/tmp/socket"), std::nullopt);
  EXPECT_EQ(TargetHost("ipv4:10.0.0.2:8001,10.0.0.3:8001"), std::nullopt);
  EXPECT_EQ(SplitHostPort("h:99999"), std::nullopt);
}

v1::ServerInfo WithDataChannel(int port, const std::string& address, bool tls) {
  v1::ServerInfo info;
  info.mutable_data_channel()->set_port(port);
  info.mutable_data_channel()->set_address(address);
  info.mutable_data_channel()->set_tls(tls);
  info.mutable_data_channel()->set_protocol_version(1);
  return info;
}

TEST(ChooseDataChannelTest, AutoFallsBackToGrpcAndDataSaysWhy) {
  const v1::ServerInfo plain = WithDataChannel(9001, "", false);
  auto chosen = ChooseDataChannel(Transport::kAuto, "dns:///server:8001", plain, {});
  ASSERT_TRUE(chosen.ok() && chosen->has_value());
  EXPECT_EQ((*chosen)->host, "server");
  EXPECT_EQ((*chosen)->port, 9001);
  chosen = ChooseDataChannel(Transport::kDataChannel, "server:8001",
                             WithDataChannel(9001, "10.1.2.3:9002", false), {});
  ASSERT_TRUE(chosen.ok() && chosen->has_value());
  EXPECT_EQ((*chosen)->host, "10.1.2.3");
  EXPECT_EQ((*chosen)->port, 9002);
  EXPECT_EQ(*ChooseDataChannel(Transport::kGrpc, "server:8001", plain, {}), std::nullopt);

  // TLS on both sides: the data channel, with TLS.
  TlsOptions tls;
  tls.enabled = true;
  tls.root_certificates_file = "ca.pem";
  chosen = ChooseDataChannel(Transport::kAuto, "server:8001",
                             WithDataChannel(9001, "10.1.2.3:9002", true), tls);
  ASSERT_TRUE(chosen.ok() && chosen->has_value());
  EXPECT_TRUE((*chosen)->tls.enabled);
  EXPECT_EQ((*chosen)->tls.root_certificates_file, "ca.pem");
  EXPECT_EQ((*chosen)->tls.server_name, "server");  // the target's host, as gRPC checks

  v1::ServerInfo future_protocol = plain;
  future_protocol.mutable_data_channel()->set_protocol_version(2);
  const std::pair<v1::ServerInfo, TlsOptions> refused[] = {{v1::ServerInfo(), {}},
                                                           {WithDataChannel(9001, "", true), {}},
                                                           {plain, tls},
                                                           {future_protocol, {}}};
  const char* reasons[] = {"advertises no data channel", "wants TLS", "this client uses TLS",
                           "protocol version 2"};
  for (int i = 0; i < 4; ++i) {
    const auto& [info, client_tls] = refused[i];
    EXPECT_EQ(*ChooseDataChannel(Transport::kAuto, "server:8001", info, client_tls), std::nullopt);
    const auto data = ChooseDataChannel(Transport::kDataChannel, "server:8001", info, client_tls);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(data.status().message()), HasSubstr(reasons[i]));
  }
}

TEST(RawSocketPeerTest, MovesBytesOnOneAndSeveralConnections) {
  for (int connections : {1, 3}) {
    absl::StatusOr<double> gbps = load::MeasureRawSocket(10'000'003, connections);
    ASSERT_TRUE(gbps.ok()) << gbps.status();
    EXPECT_GT(*gbps, 0);
  }
  EXPECT_FALSE(load::MeasureRawSocket(0, 1).ok());
}

}  // namespace
}  // namespace attnserve::tools
