"""The exception the client raises when the server (or the channel) rejects a request."""


class AttentionError(Exception):
    """A failed attnserve RPC.

    A plain Exception, not a grpc.RpcError, so callers can catch it without importing grpc.
    `code` is the grpc.StatusCode (INVALID_ARGUMENT for a malformed request, RESOURCE_EXHAUSTED
    for one over the server's limits, UNAVAILABLE while the server is down or draining, ...);
    `details` is the server's message, which names the offending field.
    """

    def __init__(self, code, details):
        self.code = code
        self.details = details or ""
        super().__init__(f"{getattr(code, 'name', code)}: {self.details}")


class UnsupportedOptionError(NotImplementedError):
    """A FlashAttention option that attnserve does not implement (yet): dropout_p > 0,
    alibi_slopes, block_table. Raised before anything is sent."""
