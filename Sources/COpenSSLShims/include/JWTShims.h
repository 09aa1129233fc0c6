#ifndef JWTSHIMS_H
#define JWTSHIMS_H
// Private keys read from PEM and SHA-256 signatures in the forms JSON Web Tokens use
// (ES256: raw r||s; RS256: PKCS#1 v1.5), for the APNs provider token and the FCM
// service-account assertion. No system header, as COpenSSLShims.h.
#include <stdint.h>
#include <stddef.h>

/// A private key (an EVP_PKEY). Only read after it is made, so several threads may sign
/// with one key at once.
typedef struct vs_signing_key vs_signing_key;

#define VS_SIGNING_KEY_OTHER 0
/// An EC key on P-256 (prime256v1): ES256.
#define VS_SIGNING_KEY_EC_P256 1
/// An RSA key: RS256.
#define VS_SIGNING_KEY_RSA 2

/// Parses a PEM private key (PKCS#8 "PRIVATE KEY", as Apple's .p8 files and Google's
/// service-account JSON hold, or the traditional EC/RSA forms). NULL on failure
/// (vs_crypto_last_error says why). Never prompts for a passphrase.
vs_signing_key *vs_signing_key_from_pem(const char *pem, size_t length);
void vs_signing_key_free(vs_signing_key *key);
/// VS_SIGNING_KEY_*.
int vs_signing_key_type(const vs_signing_key *key);
/// Signs SHA-256(`message`): ES256 writes 64 bytes (r and s, 32 bytes each, big-endian),
/// RS256 the PKCS#1 v1.5 signature (the modulus' size). Returns the length written, or
/// -1 (an error, or `capacity` too small: 64 for ES256, 512 covers RSA-4096).
long vs_jwt_sign_sha256(const vs_signing_key *key, const uint8_t *message, size_t length, uint8_t *out, size_t capacity);
#endif
