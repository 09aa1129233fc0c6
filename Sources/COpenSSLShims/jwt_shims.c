#include "JWTShims.h"
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <string.h>

static int no_passphrase(char *buffer, int size, int rwflag, void *argument) {
    (void)buffer; (void)size; (void)rwflag; (void)argument;
    return -1;
}

vs_signing_key *vs_signing_key_from_pem(const char *pem, size_t length) {
    if (length > 1 << 20) return NULL;
    BIO *bio = BIO_new_mem_buf(pem, (int)length);
    if (bio == NULL) return NULL;
    EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL);
    BIO_free(bio);
    return (vs_signing_key *)key;
}

void vs_signing_key_free(vs_signing_key *key) { EVP_PKEY_free((EVP_PKEY *)key); }

int vs_signing_key_type(const vs_signing_key *key) {
    const EVP_PKEY *pkey = (const EVP_PKEY *)key;
    if (EVP_PKEY_is_a(pkey, "RSA")) return VS_SIGNING_KEY_RSA;
    if (EVP_PKEY_is_a(pkey, "EC")) {
        char group[64];
        size_t group_length = 0;
        if (EVP_PKEY_get_utf8_string_param(pkey, "group", group, sizeof group, &group_length)
            && (strcmp(group, "prime256v1") == 0 || strcmp(group, "P-256") == 0)) {
            return VS_SIGNING_KEY_EC_P256;
        }
    }
    return VS_SIGNING_KEY_OTHER;
}

long vs_jwt_sign_sha256(const vs_signing_key *key, const uint8_t *message, size_t length, uint8_t *out, size_t capacity) {
    EVP_PKEY *pkey = (EVP_PKEY *)key;
    int type = vs_signing_key_type(key);
    if (type == VS_SIGNING_KEY_OTHER) return -1;
    EVP_MD_CTX *context = EVP_MD_CTX_new();
    if (context == NULL) return -1;
    long result = -1;
    unsigned char *der = NULL;
    ECDSA_SIG *signature = NULL;
    size_t signature_length = 0;
    if (EVP_DigestSignInit(context, NULL, EVP_sha256(), NULL, pkey) != 1) goto done;
    if (EVP_DigestSign(context, NULL, &signature_length, message, length) != 1) goto done;
    if (type == VS_SIGNING_KEY_RSA) {
        if (signature_length > capacity) goto done;
        if (EVP_DigestSign(context, out, &signature_length, message, length) != 1) goto done;
        result = (long)signature_length;
        goto done;
    }
    // ECDSA: OpenSSL writes a DER SEQUENCE of r and s; JWS (RFC 7518 3.4) wants the two
    // integers as fixed 32-byte big-endian strings side by side.
    if (capacity < 64) goto done;
    der = OPENSSL_malloc(signature_length);
    if (der == NULL) goto done;
    if (EVP_DigestSign(context, der, &signature_length, message, length) != 1) goto done;
    const unsigned char *cursor = der;
    signature = d2i_ECDSA_SIG(NULL, &cursor, (long)signature_length);
    if (signature == NULL) goto done;
    const BIGNUM *r = NULL, *s = NULL;
    ECDSA_SIG_get0(signature, &r, &s);
    if (BN_bn2binpad(r, out, 32) != 32 || BN_bn2binpad(s, out + 32, 32) != 32) goto done;
    result = 64;
done:
    ECDSA_SIG_free(signature);
    OPENSSL_free(der);
    EVP_MD_CTX_free(context);
    return result;
}
