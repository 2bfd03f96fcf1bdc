#include "server/transport/oip/shared_memory_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::transport::oip {

MappedRegion::MappedRegion(std::string name, std::string key, uint64_t offset,
                           uint64_t byte_size, void* mapping, size_t mapping_bytes,
                           std::shared_ptr<void> page_lock)
    : name_(std::move(name)),
      key_(std::move(key)),
      offset_(offset),
      byte_size_(byte_size),
      mapping_(mapping),
      mapping_bytes_(mapping_bytes),
      page_lock_(std::move(page_lock)) {}

MappedRegion::MappedRegion(std::string name,
                           std::shared_ptr<engine::ForeignDeviceMemory> memory)
    : name_(std::move(name)),
      offset_(0),
      byte_size_(memory->bytes()),
      mapping_(nullptr),
      mapping_bytes_(0),
      device_memory_(std::move(memory)) {}

const char* RegionKindName(RegionKind kind) {
  return kind == RegionKind::kCuda ? "cuda" : "system";
}

MappedRegion::~MappedRegion() {
  page_lock_.reset();
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

SharedMemoryRegions::SharedMemoryRegions(SharedMemoryOptions options) : options_(options) {
  if (!options_.allowed) return;
  sweeper_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    // Often enough that an idle region outlives its timeout by at most a quarter of it.
    const auto period = absl::ToChronoMilliseconds(
        std::max(absl::Milliseconds(50), options_.idle_timeout / 4));
    while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
      lock.unlock();
      SweepIdle();
      lock.lock();
    }
  });
}

SharedMemoryRegions::~SharedMemoryRegions() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
}

void SharedMemoryRegions::SweepIdle() {
  std::vector<std::shared_ptr<const MappedRegion>> expired;  // unmapped outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (now - it->second.last_used >= options_.idle_timeout) {
      expired.push_back(std::move(it->second.region));
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status SharedMemoryRegions::CheckRegisterable(const std::string& principal,
                                                    const std::string& name) {
  if (!options_.allowed) {
    return absl::FailedPreconditionError(
        "shared memory is off on this server (start it with --allow_shared_memory)");
  }
  if (name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  std::lock_guard<std::mutex> lock(mu_);
  if (regions_.count({principal, name}) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("name: a shared memory region \"", name, "\" is already registered"));
  }
  if (static_cast<int64_t>(regions_.size()) >= options_.max_regions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "name: at most ", options_.max_regions, " shared memory regions may be registered"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegions::Insert(const std::string& principal,
                                         std::shared_ptr<const MappedRegion> region) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string name = region->name();
  // Registered meanwhile by a concurrent call: the later one loses (its mapping goes with it).
  if (!regions_.emplace(RegionKey{principal, name}, Entry{std::move(region), absl::Now()})
           .second) {
    return absl::AlreadyExistsError(
        absl::StrCat("name: a shared memory region \"", name, "\" is already registered"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegions::RegisterSystem(const std::string& principal,
                                                 const std::string& name, const std::string& key,
                                                 uint64_t offset, uint64_t byte_size) {
  if (absl::Status s = CheckRegisterable(principal, name); !s.ok()) return s;
  // POSIX names one object by "/name"; anything else is not portable and may mean a path.
  if (key.size() < 2 || key[0] != '/' || key.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: must be a POSIX shared-memory name \"/name\", got \"", key, "\""));
  }
  if (byte_size == 0) return absl::InvalidArgumentError("byte_size: must be positive");
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("key: cannot open shared memory \"", key,
                                                   "\": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || offset > static_cast<uint64_t>(st.st_size) ||
      byte_size > static_cast<uint64_t>(st.st_size) - offset) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_size: offset ", offset, " + byte_size ", byte_size, " exceed the ", st.st_size,
        " bytes of shared memory \"", key, "\""));
  }
  const size_t mapping_bytes = static_cast<size_t>(offset + byte_size);
  void* mapping = mmap(nullptr, mapping_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map shared memory \"", key,
                                            "\": ", std::strerror(errno)));
  }
  std::shared_ptr<void> page_lock =
      options_.page_lock ? options_.page_lock(mapping, mapping_bytes) : nullptr;
  return Insert(principal, std::make_shared<MappedRegion>(name, key, offset, byte_size, mapping,
                                                          mapping_bytes, std::move(page_lock)));
}

absl::Status SharedMemoryRegions::RegisterCuda(const std::string& principal,
                                               const std::string& name,
                                               const OpenDeviceMemory& open) {
  if (absl::Status s = CheckRegisterable(principal, name); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<engine::ForeignDeviceMemory>> memory = open();
  if (!memory.ok()) return memory.status();
  return Insert(principal, std::make_shared<MappedRegion>(name, *std::move(memory)));
}

absl::Status SharedMemoryRegions::Unregister(const std::string& principal, RegionKind kind,
                                             const std::string& name) {
  std::map<RegionKey, Entry> removed;  // unmapped outside the lock (declared before it)
  std::lock_guard<std::mutex> lock(mu_);
  if (name.empty()) {
    for (auto it = regions_.begin(); it != regions_.end();) {
      const auto next = std::next(it);
      if (it->first.first == principal && it->second.region->kind() == kind) {
        removed.insert(regions_.extract(it));
      }
      it = next;
    }
    return absl::OkStatus();
  }
  auto it = regions_.find({principal, name});
  if (it == regions_.end() || it->second.region->kind() != kind) {
    return absl::NotFoundError(
        absl::StrCat("name: no shared memory region \"", name, "\" is registered"));
  }
  removed.insert(regions_.extract(it));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<const MappedRegion>>> SharedMemoryRegions::Status(
    const std::string& principal, RegionKind kind, const std::string& name) {
  std::map<RegionKey, Entry> removed;  // unmapped outside the lock (declared before it)
  std::lock_guard<std::mutex> lock(mu_);
  DropInvalid(&removed);
  std::vector<std::shared_ptr<const MappedRegion>> out;
  for (const auto& [region_key, entry] : regions_) {
    if (region_key.first == principal && entry.region->kind() == kind &&
        (name.empty() || name == region_key.second)) {
      out.push_back(entry.region);
    }
  }
  if (!name.empty() && out.empty()) {
    return absl::NotFoundError(
        absl::StrCat("name: no shared memory region \"", name, "\" is registered"));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const MappedRegion>> SharedMemoryRegions::Use(
    const std::string& principal, const std::string& name, uint64_t offset, uint64_t byte_size,
    const std::string& field) {
  if (!options_.allowed) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".shared_memory_region: shared memory is off on this server (start it with "
               "--allow_shared_memory)"));
  }
  std::map<RegionKey, Entry> removed;  // unmapped outside the lock (declared before it)
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find({principal, name});
  if (it != regions_.end() && !it->second.region->valid()) {
    removed.insert(regions_.extract(it));
    // "no shared memory region" tells clients to register it again (attnserve's do).
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shared_memory_region: no shared memory region \"", name,
        "\" is registered any more: its device was reset after a fault; register it again"));
  }
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shared_memory_region: no shared memory region \"", name, "\" is registered"));
  }
  const MappedRegion& region = *it->second.region;
  if (offset > region.byte_size() || byte_size > region.byte_size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shared_memory_byte_size: shared_memory_offset ", offset, " + byte size ",
        byte_size, " exceed the ", region.byte_size(), " bytes registered as \"", name, "\""));
  }
  it->second.last_used = absl::Now();
  return it->second.region;
}

void SharedMemoryRegions::DropInvalid(std::map<RegionKey, Entry>* removed) {
  for (auto it = regions_.begin(); it != regions_.end();) {
    const auto next = std::next(it);
    if (!it->second.region->valid()) removed->insert(regions_.extract(it));
    it = next;
  }
}

}  // namespace attnserve::transport::oip
