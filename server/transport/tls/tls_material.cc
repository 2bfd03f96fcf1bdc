#include "server/transport/tls/tls_material.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::transport {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

// OpenSSL's reason for the last failure, and the error queue cleared for the next caller.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data found";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::StatusOr<std::string> ReadFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the ", what, " ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in `pem`, in order; fails when there is none or one is malformed.
absl::StatusOr<std::vector<Cert>> ParseCertificates(const std::string& what,
                                                    const std::string& path,
                                                    const std::string& pem) {
  Bio bio = MemoryBio(pem);
  std::vector<Cert> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  // Running out of PEM blocks ends the loop with "no start line"; anything else is a bad block.
  const unsigned long last = ERR_peek_last_error();
  if (certs.empty() || (last != 0 && ERR_GET_REASON(last) != PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " ", path,
                                                   " holds no valid PEM certificate: ",
                                                   OpenSslError()));
  }
  ERR_clear_error();
  return certs;
}

absl::StatusOr<Pkey> ParsePrivateKey(const std::string& path, const std::string& pem) {
  Bio bio = MemoryBio(pem);
  Pkey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the TLS key file ", path, " holds no valid (unencrypted) PEM private key: ",
        OpenSslError()));
  }
  return key;
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsFiles& files) {
  TlsMaterial material;
  absl::StatusOr<std::string> cert = ReadFile("TLS certificate file", files.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile("TLS key file", files.key_file);
  if (!key.ok()) return key.status();
  absl::StatusOr<std::vector<Cert>> chain =
      ParseCertificates("TLS certificate file", files.cert_file, *cert);
  if (!chain.ok()) return chain.status();
  absl::StatusOr<Pkey> pkey = ParsePrivateKey(files.key_file, *key);
  if (!pkey.ok()) return pkey.status();
  if (X509_check_private_key(chain->front().get(), pkey->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("the TLS key file ", files.key_file,
                                                   " does not hold the private key of the "
                                                   "certificate in ", files.cert_file));
  }
  material.cert_chain_pem = *std::move(cert);
  material.private_key_pem = *std::move(key);
  if (!files.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile("TLS client CA file", files.client_ca_file);
    if (!ca.ok()) return ca.status();
    absl::StatusOr<std::vector<Cert>> cas =
        ParseCertificates("TLS client CA file", files.client_ca_file, *ca);
    if (!cas.ok()) return cas.status();
    material.client_ca_pem = *std::move(ca);
  }
  return material;
}

absl::Status ConfigureServerSslContext(void* ssl_ctx, const TlsMaterial& material) {
  SSL_CTX* ctx = static_cast<SSL_CTX*>(ssl_ctx);
  auto fail = [](const char* step) {
    return absl::InternalError(absl::StrCat("TLS setup failed at ", step, ": ", OpenSslError()));
  };
  absl::StatusOr<std::vector<Cert>> chain =
      ParseCertificates("TLS certificate", "", material.cert_chain_pem);
  if (!chain.ok()) return chain.status();
  absl::StatusOr<Pkey> key = ParsePrivateKey("", material.private_key_pem);
  if (!key.ok()) return key.status();
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) return fail("min version");
  if (SSL_CTX_use_certificate(ctx, chain->front().get()) != 1) return fail("certificate");
  for (size_t i = 1; i < chain->size(); ++i) {
    // add1 takes its own reference; ours is released with `chain`.
    if (SSL_CTX_add1_chain_cert(ctx, (*chain)[i].get()) != 1) return fail("chain");
  }
  if (SSL_CTX_use_PrivateKey(ctx, key->get()) != 1) return fail("private key");
  if (!material.mutual()) return absl::OkStatus();
  absl::StatusOr<std::vector<Cert>> cas =
      ParseCertificates("TLS client CA", "", material.client_ca_pem);
  if (!cas.ok()) return cas.status();
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  for (const Cert& ca : *cas) {
    if (X509_STORE_add_cert(store, ca.get()) != 1) return fail("client CA");
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return absl::OkStatus();
}

}  // namespace attnserve::transport
