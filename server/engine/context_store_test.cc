#include "server/engine/context_store.h"

#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace attnserve::engine {
namespace {

using ::testing::HasSubstr;

// Counts live payloads so tests see when memory is really freed.
class FakeMemory : public ContextMemory {
 public:
  FakeMemory(int64_t bytes, std::atomic<int>* live) : bytes_(bytes), live_(live) { ++*live_; }
  ~FakeMemory() override { --*live_; }
  int64_t bytes() const override { return bytes_; }
  bool on_host() const override { return true; }
  const char* address(ContextTensor) const override { return nullptr; }

 private:
  int64_t bytes_;
  std::atomic<int>* live_;
};

class ContextStoreTest : public ::testing::Test {
 protected:
  ContextStoreOptions FakeClock() {
    ContextStoreOptions options;
    options.ttl = absl::Seconds(10);
    options.sweep_interval = absl::ZeroDuration();
    options.now = [this] { return now_; };
    return options;
  }
  std::unique_ptr<SavedContext> Context(int64_t bytes, const std::string& device = "cpu",
                                        const std::string& principal = "alice") {
    auto context = std::make_unique<SavedContext>();
    context->device = device;
    context->principal = principal;
    context->memory = std::make_unique<FakeMemory>(bytes, &live_);
    return context;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::atomic<int> live_{0};
};

TEST_F(ContextStoreTest, AddLookupReleaseAndIds) {
  ContextStore store(FakeClock(), nullptr);
  store.SetBudget("cpu", 100);
  std::optional<std::string> a = store.Add(Context(40));
  std::optional<std::string> b = store.Add(Context(40));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), 32u);  // 128 bits in hex
  EXPECT_NE(*a, *b);
  EXPECT_EQ(store.BytesOn("cpu"), 80);
  EXPECT_EQ(store.CountOn("cpu"), 2);
  absl::StatusOr<std::shared_ptr<const SavedContext>> found = store.Lookup(*a, "alice");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)->memory->bytes(), 40);

  EXPECT_TRUE(store.Release(*a, "alice"));
  EXPECT_FALSE(store.Release(*a, "alice"));
  EXPECT_EQ(store.BytesOn("cpu"), 40);
  EXPECT_EQ(live_, 2);  // `found` still holds a's payload
  found = absl::NotFoundError("");
  EXPECT_EQ(live_, 1);
  absl::Status missing = store.Lookup(*a, "alice").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr(*a));
}

TEST_F(ContextStoreTest, OnlyItsPrincipalSeesAContext) {
  ContextStore store(FakeClock(), nullptr);
  store.SetBudget("cpu", 100);
  const std::string id = *store.Add(Context(10, "cpu", "alice"));
  EXPECT_EQ(store.Lookup(id, "mallory").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store.Release(id, "mallory"));
  EXPECT_TRUE(store.Lookup(id, "alice").ok());
}

TEST_F(ContextStoreTest, ExpiresAfterTheTtlSinceLastUse) {
  ContextStore store(FakeClock(), nullptr);
  store.SetBudget("cpu", 100);
  const std::string a = *store.Add(Context(10));
  const std::string b = *store.Add(Context(10));
  now_ += absl::Seconds(6);
  ASSERT_TRUE(store.Lookup(a, "alice").ok());  // a used again: its TTL restarts
  now_ += absl::Seconds(5);                     // b unused for 11 s, a for 5 s
  store.Sweep();
  EXPECT_EQ(live_, 1);
  EXPECT_EQ(store.CountOn("cpu"), 1);
  EXPECT_EQ(store.Lookup(b, "alice").status().code(), absl::StatusCode::kNotFound);
  now_ += absl::Seconds(10);
  // Expired but not swept yet: a lookup misses and frees it.
  EXPECT_EQ(store.Lookup(a, "alice").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(live_, 0);
  EXPECT_EQ(store.BytesOn("cpu"), 0);
}

TEST_F(ContextStoreTest, EvictsLeastRecentlyUsedOfTheSameDeviceToFit) {
  ContextStore store(FakeClock(), nullptr);
  store.SetBudget("cuda:0", 100);
  store.SetBudget("cuda:1", 100);
  const std::string a = *store.Add(Context(40, "cuda:0"));
  const std::string b = *store.Add(Context(40, "cuda:0"));
  const std::string other = *store.Add(Context(90, "cuda:1"));
  ASSERT_TRUE(store.Lookup(a, "alice").ok());  // b is now the least recently used
  const std::string c = *store.Add(Context(40, "cuda:0"));
  EXPECT_EQ(store.Lookup(b, "alice").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.Lookup(a, "alice").ok());
  EXPECT_TRUE(store.Lookup(c, "alice").ok());
  EXPECT_TRUE(store.Lookup(other, "alice").ok());  // another device's budget
  EXPECT_EQ(store.BytesOn("cuda:0"), 80);
  EXPECT_EQ(store.BytesOn("cuda:1"), 90);
  // Needs everything of cuda:0 gone.
  const std::string d = *store.Add(Context(100, "cuda:0"));
  EXPECT_EQ(store.CountOn("cuda:0"), 1);
  EXPECT_EQ(live_, 2);
  EXPECT_TRUE(store.Lookup(d, "alice").ok());
}

TEST_F(ContextStoreTest, TooLargeForTheBudgetIsNotKeptAndEvictsNothing) {
  ContextStore store(FakeClock(), nullptr);
  store.SetBudget("cpu", 100);
  const std::string a = *store.Add(Context(60));
  EXPECT_FALSE(store.Add(Context(101)).has_value());
  EXPECT_FALSE(store.Add(Context(1, "cuda:7")).has_value());  // no budget there
  EXPECT_TRUE(store.Lookup(a, "alice").ok());
  EXPECT_EQ(live_, 1);
}

TEST_F(ContextStoreTest, TheSweeperFreesExpiredContextsWithoutTraffic) {
  ContextStoreOptions options;
  options.ttl = absl::Milliseconds(100);
  options.sweep_interval = absl::Milliseconds(20);
  ContextStore store(options, nullptr);
  store.SetBudget("cpu", 100);
  ASSERT_TRUE(store.Add(Context(10)).has_value());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (live_ > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(live_, 0);
  EXPECT_EQ(store.BytesOn("cpu"), 0);
}

TEST_F(ContextStoreTest, CountsInMetrics) {
  prometheus::Registry registry;
  metrics::ContextMetrics metrics(registry);
  ContextStore store(FakeClock(), &metrics);
  store.SetBudget("cpu", 100);
  const std::string a = *store.Add(Context(60));
  ASSERT_TRUE(store.Lookup(a, "alice").ok());
  EXPECT_FALSE(store.Lookup("nope", "alice").ok());
  const std::string b = *store.Add(Context(60));  // evicts a
  EXPECT_TRUE(store.Release(b, "alice"));
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string key = family.name;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        key += "," + label.name + "=" + label.value;
      }
      values[key] = family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                                    : metric.gauge.value;
    }
  }
  EXPECT_EQ(values["attnserve_context_lookups_total,result=hit"], 1);
  EXPECT_EQ(values["attnserve_context_lookups_total,result=miss"], 1);
  EXPECT_EQ(values["attnserve_context_evictions_total,device=cpu,reason=lru"], 1);
  EXPECT_EQ(values["attnserve_context_releases_total"], 1);
  EXPECT_EQ(values["attnserve_contexts,device=cpu"], 0);
  EXPECT_EQ(values["attnserve_context_bytes,device=cpu"], 0);
}

}  // namespace
}  // namespace attnserve::engine
