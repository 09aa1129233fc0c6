#ifndef COPENSSLSHIMS_H
#define COPENSSLSHIMS_H
// The slice of OpenSSL's libcrypto the Swift code uses, behind a header that includes no
// system header (OpenSSL's headers pull in <stdio.h> and <sys/types.h>, which clash with
// Swift's Glibc module on a clean build, as libevent's do). Types stay opaque.
#include <stdint.h>
#include <stddef.h>

/// An HMAC-SHA256 key, prepared once (an EVP_MAC_CTX already keyed): each MAC copies it,
/// so it is never modified after `vs_hmac_sha256_key_new` and may be used by several
/// threads at once.
typedef struct vs_hmac_sha256_key vs_hmac_sha256_key;

#define VS_SHA256_DIGEST_LENGTH 32

/// NULL when OpenSSL cannot make the context (out of memory, no HMAC provider) or the
/// key is empty (OpenSSL 3 reads an empty key as "keep the previous one").
vs_hmac_sha256_key *vs_hmac_sha256_key_new(const uint8_t *key, size_t length);
void vs_hmac_sha256_key_free(vs_hmac_sha256_key *key);
/// Writes the 32-byte MAC of `message` to `out`; 1 on success, 0 on failure.
int vs_hmac_sha256(const vs_hmac_sha256_key *key, const uint8_t *message, size_t length, uint8_t *out);
/// 1 when the `length` bytes at `a` and `b` are equal, in a time that depends only on
/// `length` (CRYPTO_memcmp).
int vs_crypto_equal(const void *a, const void *b, size_t length);
/// Fills `out` from OpenSSL's CSPRNG (RAND_bytes); 1 on success, 0 on failure.
int vs_random_bytes(uint8_t *out, size_t length);
/// OpenSSL's most recent error on this thread as text (empties the queue); 0 if none.
unsigned long vs_crypto_last_error(char *text, size_t capacity);

// TLS connections and contexts (libssl).
#include "TLSShims.h"
// JWT signing keys (ES256, RS256), in a header of their own.
#include "JWTShims.h"
#endif
