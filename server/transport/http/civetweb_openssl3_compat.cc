// Makes Debian 12's civetweb (1.15) serve HTTPS with OpenSSL 3. Linked into the attnserve
// executable itself, together with two link options (server/CMakeLists.txt); see there.
//
// civetweb does not link OpenSSL: it dlopen()s "libssl.so" and looks up OpenSSL 1.1's names,
// one of which, SSL_get_peer_certificate, OpenSSL 3 no longer exports (it became a macro for
// SSL_get1_peer_certificate). civetweb leaves that pointer null and calls it on every HTTPS
// connection, which crashes the process (upstream: civetweb/civetweb#1334). The executable is
// linked with the soname "libssl.so", so the dynamic loader answers civetweb's dlopen with the
// executable itself, whose symbol lookup covers the OpenSSL 3 that gRPC already loaded plus the
// one function below.
#include <openssl/ssl.h>

// OpenSSL 3 defines the old name as a macro; the function civetweb looks up must be real.
#undef SSL_get_peer_certificate

extern "C" X509* SSL_get_peer_certificate(const SSL* ssl) {
  // Both return a new reference, which civetweb releases with X509_free.
  return SSL_get1_peer_certificate(ssl);
}
