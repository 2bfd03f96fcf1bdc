// A server's Prometheus metrics, read from its /metrics page, for end-to-end tests.
#pragma once

#include <string>

namespace attnserve::testing {

// The value of an unlabelled metric on the server's /metrics page (-1 when absent).
double Metric(int http_port, const std::string& name);

// Polls until the metric reads `want`; returns the last value read.
double AwaitMetric(int http_port, const std::string& name, double want);

}  // namespace attnserve::testing
