// Notices when gRPC's listener has stopped for good. gRPC 1.51 gives up on a listening socket
// the first time accept4 fails with anything but EAGAIN/ECONNABORTED, e.g. EMFILE when the
// process's descriptors run out (upstream CVE-2023-4785): the port then accepts nothing while
// the process, /healthz included, looks fine. gRPC reports it only in its log ("Failed
// accept4"), so this hooks gRPC's log function, still writing every line as gRPC would.
// /healthz then fails and the orchestrator restarts the process.
#pragma once

#include <string>

namespace attnserve::transport {

// Hooks gRPC's log (once per process; later calls do nothing). Call before the server starts.
void WatchGrpcListener();

// Why the gRPC listener stopped (gRPC's own line); empty while it accepts.
std::string GrpcListenerFailure();

}  // namespace attnserve::transport
