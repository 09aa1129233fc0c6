#include "COpenSSLShims.h"
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <pthread.h>

_Static_assert(VS_SHA256_DIGEST_LENGTH == 32, "SHA-256 digests are 32 bytes");

// EVP_MAC_fetch takes a global lock and searches the provider store: done once, not per MAC.
static EVP_MAC *hmac_algorithm;
static pthread_once_t hmac_algorithm_once = PTHREAD_ONCE_INIT;

static void fetch_hmac(void) { hmac_algorithm = EVP_MAC_fetch(NULL, "HMAC", NULL); }

vs_hmac_sha256_key *vs_hmac_sha256_key_new(const uint8_t *key, size_t length) {
    if (length == 0) return NULL;
    pthread_once(&hmac_algorithm_once, fetch_hmac);
    if (hmac_algorithm == NULL) return NULL;
    EVP_MAC_CTX *context = EVP_MAC_CTX_new(hmac_algorithm);
    if (context == NULL) return NULL;
    char digest[] = "SHA256";
    OSSL_PARAM parameters[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    if (!EVP_MAC_init(context, key, length, parameters)) {
        EVP_MAC_CTX_free(context);
        return NULL;
    }
    return (vs_hmac_sha256_key *)context;
}

void vs_hmac_sha256_key_free(vs_hmac_sha256_key *key) { EVP_MAC_CTX_free((EVP_MAC_CTX *)key); }

int vs_hmac_sha256(const vs_hmac_sha256_key *key, const uint8_t *message, size_t length, uint8_t *out) {
    // A copy of the keyed context: the padded key blocks are already hashed, and the shared
    // context is only read, so concurrent MACs under one key need no lock.
    EVP_MAC_CTX *context = EVP_MAC_CTX_dup((const EVP_MAC_CTX *)key);
    if (context == NULL) return 0;
    size_t written = 0;
    int ok = EVP_MAC_update(context, message, length)
        && EVP_MAC_final(context, out, &written, VS_SHA256_DIGEST_LENGTH)
        && written == VS_SHA256_DIGEST_LENGTH;
    EVP_MAC_CTX_free(context);
    return ok;
}

int vs_crypto_equal(const void *a, const void *b, size_t length) { return CRYPTO_memcmp(a, b, length) == 0; }

int vs_random_bytes(uint8_t *out, size_t length) {
    // RAND_bytes takes an int: fill large requests in slices.
    while (length > 0) {
        int slice = length > (1u << 30) ? (1 << 30) : (int)length;
        if (RAND_bytes(out, slice) != 1) return 0;
        out += slice;
        length -= (size_t)slice;
    }
    return 1;
}

unsigned long vs_crypto_last_error(char *text, size_t capacity) {
    unsigned long code = ERR_get_error();
    if (code != 0 && capacity > 0) ERR_error_string_n(code, text, capacity);
    ERR_clear_error();
    return code;
}
