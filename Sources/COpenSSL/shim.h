#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
// OpenSSL 3 (Debian libssl-dev). Swift code does not import this module: it calls
// COpenSSLShims, whose header includes no system header (see CLibeventShims for why).
// This target only supplies the include path and the link flags to the shims.
#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif
