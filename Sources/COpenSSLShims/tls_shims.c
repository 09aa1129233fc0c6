#include "TLSShims.h"
#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(VS_TLS_VERSION_1_2 == TLS1_2_VERSION, "wire value of TLS 1.2");
_Static_assert(VS_TLS_VERSION_1_3 == TLS1_3_VERSION, "wire value of TLS 1.3");

/// The server's TLS 1.3 cipher suites, most preferred first (see vs_tls_server_context_new).
#define VS_TLS_SERVER_SUITES "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384"

/// One connection and what its last failure was: SSL_get_error and errno must be read
/// right after the failing call, but the caller describes the failure later (or never).
struct vs_tls {
    SSL *ssl;
    int failure;            // SSL_get_error of the last FAILED step, 0 if none
    int system_errno;       // errno at that failure, when the socket failed
    unsigned long error;    // OpenSSL's first queued error at that failure, 0 if none
};

// ---- ALPN ------------------------------------------------------------------------------

// The server's protocol list in wire format (length-prefixed names), hung on its SSL_CTX
// and freed with it.
static int alpn_index = -1;
static pthread_once_t alpn_index_once = PTHREAD_ONCE_INIT;

static void free_alpn(void *parent, void *pointer, CRYPTO_EX_DATA *data, int index, long argl, void *argp) {
    (void)parent; (void)data; (void)index; (void)argl; (void)argp;
    free(pointer);
}

static void make_alpn_index(void) { alpn_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, free_alpn); }

/// `name` as a one-entry ALPN list: a length byte then the name. NULL when the name is empty
/// or longer than 255 bytes.
static unsigned char *alpn_wire(const char *name, unsigned int *length) {
    size_t count = strlen(name);
    if (count == 0 || count > 255) return NULL;
    unsigned char *wire = malloc(count + 2);
    if (wire == NULL) return NULL;
    wire[0] = (unsigned char)count;
    memcpy(wire + 1, name, count);
    wire[count + 1] = 0;
    *length = (unsigned int)count + 1;
    return wire;
}

// A client that offers ALPN must offer ours (RFC 7301: otherwise the no_application_protocol
// alert); a client that offers none (openssl s_client, old devices) is served all the same.
static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *out_length, const unsigned char *offered,
                       unsigned int offered_length, void *argument) {
    (void)argument;
    const unsigned char *ours = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), alpn_index);
    if (ours == NULL) return SSL_TLSEXT_ERR_NOACK;
    unsigned char *selected = NULL;
    if (SSL_select_next_proto(&selected, out_length, ours, (unsigned int)ours[0] + 1, offered, offered_length) !=
        OPENSSL_NPN_NEGOTIATED) {
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    }
    *out = selected;
    return SSL_TLSEXT_ERR_OK;
}

// ---- Contexts --------------------------------------------------------------------------

static void report(char *error, size_t capacity, const char *what, const char *detail) {
    if (error == NULL || capacity == 0) return;
    char reason[256] = "";
    unsigned long code = ERR_peek_last_error();
    if (code != 0) ERR_error_string_n(code, reason, sizeof reason);
    ERR_clear_error();
    if (detail != NULL && reason[0] != 0) snprintf(error, capacity, "%s %s: %s", what, detail, reason);
    else if (detail != NULL) snprintf(error, capacity, "%s %s", what, detail);
    else if (reason[0] != 0) snprintf(error, capacity, "%s: %s", what, reason);
    else snprintf(error, capacity, "%s", what);
}

/// What both sides share: the lowest version, no renegotiation or compression, an EOF without
/// close_notify read as a close (a phone that loses its network never sends one, and the
/// frames above are self-delimiting, so a truncation cannot pass for a whole message),
/// partial writes from a moving buffer, and no record buffers held while idle.
static int configure_common(SSL_CTX *context, int minimum_version) {
    if (minimum_version != TLS1_2_VERSION && minimum_version != TLS1_3_VERSION) return 0;
    if (!SSL_CTX_set_min_proto_version(context, minimum_version)) return 0;
    SSL_CTX_set_options(context, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(context, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return 1;
}

/// A context for `method` with what both sides share; NULL with the reason in `error`.
static SSL_CTX *new_context(const SSL_METHOD *method, int minimum_version, char *error, size_t capacity) {
    ERR_clear_error();
    SSL_CTX *context = SSL_CTX_new(method);
    if (context == NULL) {
        report(error, capacity, "cannot make a TLS context", NULL);
        return NULL;
    }
    if (!configure_common(context, minimum_version)) {
        report(error, capacity, "unsupported minimum TLS version", NULL);
        SSL_CTX_free(context);
        return NULL;
    }
    return context;
}

vs_tls_context *vs_tls_server_context_new(
    const char *chain_file, const char *key_file, int minimum_version, const char *alpn, char *error, size_t capacity) {
    pthread_once(&alpn_index_once, make_alpn_index);
    SSL_CTX *context = new_context(TLS_server_method(), minimum_version, error, capacity);
    if (context == NULL) return NULL;
    SSL_CTX_set_options(context, SSL_OP_CIPHER_SERVER_PREFERENCE);
    // TLS 1.3 suites in the server's order, AES-128-GCM first: every TLS 1.3 client has it
    // (RFC 8446, 9.1), and with its SHA-256 transcript and key schedule a full handshake
    // costs the server about 10% less CPU under OpenSSL 3.0 than with OpenSSL's first
    // choice, AES-256-GCM-SHA384, which OpenSSL's clients (the client library, voipload,
    // Python) list first; BoringSSL's and Apple's list AES-128-GCM first anyway
    // (docs/LOAD-TESTING.md, "TLS"). The others stay for clients that insist on them, and a
    // client that lists ChaCha20 first (a phone without AES instructions) gets it: the
    // server's order is for its own CPU, not to slow such a client down.
    SSL_CTX_set_options(context, SSL_OP_PRIORITIZE_CHACHA);
    if (SSL_CTX_set_ciphersuites(context, VS_TLS_SERVER_SUITES) != 1) {
        report(error, capacity, "cannot set the TLS 1.3 cipher suites", NULL);
        goto fail;
    }
    // Read ahead: one recv takes a record's header and body (and whatever follows) instead
    // of two (header, then body), per record. Input OpenSSL then holds is announced by no
    // readiness event: the caller reads while `vs_tls_has_buffered_input` says so.
    SSL_CTX_set_read_ahead(context, 1);
    // Stateless tickets carry the whole session, so the server keeps no per-session cache
    // (memory that would grow with every device), and one ticket per handshake is enough
    // for a client that holds one connection.
    SSL_CTX_set_session_cache_mode(context, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(context, 1);
    if (SSL_CTX_use_certificate_chain_file(context, chain_file) != 1) {
        report(error, capacity, "cannot load the certificate chain", chain_file);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(context, key_file, SSL_FILETYPE_PEM) != 1) {
        int mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
        report(error, capacity, mismatch ? "the private key does not match the certificate:" : "cannot load the private key", key_file);
        goto fail;
    }
    if (SSL_CTX_check_private_key(context) != 1) {
        report(error, capacity, "the private key does not match the certificate", key_file);
        goto fail;
    }
    if (alpn != NULL) {
        unsigned int length = 0;
        unsigned char *wire = alpn_wire(alpn, &length);
        if (wire == NULL || alpn_index < 0 || !SSL_CTX_set_ex_data(context, alpn_index, wire)) {
            free(wire);
            report(error, capacity, "invalid ALPN protocol name", alpn);
            goto fail;
        }
        SSL_CTX_set_alpn_select_cb(context, select_alpn, NULL);
    }
    return (vs_tls_context *)context;
fail:
    SSL_CTX_free(context);
    return NULL;
}

int vs_tls_context_set_ticket_key(vs_tls_context *context, const uint8_t *key, size_t length) {
    if (length != VS_TLS_TICKET_KEY_LENGTH) return 0;
    return SSL_CTX_set_tlsext_ticket_keys((SSL_CTX *)context, (void *)key, (long)length) == 1;
}

vs_tls_context *vs_tls_client_context_new(
    const char *ca_file, int minimum_version, const char *alpn, char *error, size_t capacity) {
    SSL_CTX *context = new_context(TLS_client_method(), minimum_version, error, capacity);
    if (context == NULL) return NULL;
    SSL_CTX_set_verify(context, SSL_VERIFY_PEER, NULL);
    if (ca_file != NULL) {
        if (SSL_CTX_load_verify_locations(context, ca_file, NULL) != 1) {
            report(error, capacity, "cannot load the CA certificates", ca_file);
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(context) != 1) {
        report(error, capacity, "cannot load the system's CA certificates", NULL);
        goto fail;
    }
    // The caller keeps the session to resume (vs_tls_copy_session); no internal cache.
    SSL_CTX_set_session_cache_mode(context, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    if (alpn != NULL) {
        unsigned int length = 0;
        unsigned char *wire = alpn_wire(alpn, &length);
        int failed = wire == NULL || SSL_CTX_set_alpn_protos(context, wire, length) != 0;  // 0 is success here
        free(wire);
        if (failed) {
            report(error, capacity, "invalid ALPN protocol name", alpn);
            goto fail;
        }
    }
    return (vs_tls_context *)context;
fail:
    SSL_CTX_free(context);
    return NULL;
}

int64_t vs_tls_context_certificate_expiry(vs_tls_context *context) {
    X509 *leaf = SSL_CTX_get0_certificate((SSL_CTX *)context);
    const ASN1_TIME *not_after = leaf == NULL ? NULL : X509_get0_notAfter(leaf);
    struct tm expiry;
    if (not_after == NULL || ASN1_TIME_to_tm(not_after, &expiry) != 1) {
        ERR_clear_error();
        return 0;
    }
    return (int64_t)timegm(&expiry);
}

void vs_tls_context_free(vs_tls_context *context) { SSL_CTX_free((SSL_CTX *)context); }

// ---- Connections -----------------------------------------------------------------------

vs_tls *vs_tls_new(vs_tls_context *context, int fd, int is_server, const char *server_name) {
    struct vs_tls *tls = calloc(1, sizeof *tls);
    if (tls == NULL) return NULL;
    tls->ssl = SSL_new((SSL_CTX *)context);
    if (tls->ssl == NULL || SSL_set_fd(tls->ssl, fd) != 1) goto fail;
    if (is_server) {
        SSL_set_accept_state(tls->ssl);
    } else {
        SSL_set_connect_state(tls->ssl);
        if (server_name != NULL) {
            unsigned char address[16];
            if (inet_pton(AF_INET, server_name, address) == 1 || inet_pton(AF_INET6, server_name, address) == 1) {
                // An address is checked against the certificate's IP entries, and is never
                // sent as SNI (RFC 6066 allows host names only).
                if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(tls->ssl), server_name) != 1) goto fail;
            } else if (SSL_set_tlsext_host_name(tls->ssl, server_name) != 1 || SSL_set1_host(tls->ssl, server_name) != 1) {
                goto fail;
            }
        }
    }
    ERR_clear_error();
    return tls;
fail:
    ERR_clear_error();
    SSL_free(tls->ssl);
    free(tls);
    return NULL;
}

void vs_tls_free(vs_tls *tls) {
    if (tls == NULL) return;
    SSL_free(tls->ssl);
    free(tls);
}

/// Turns a step's result into a status, remembering what a failure needs for its description
/// and leaving this thread's error queue empty for the next connection.
static vs_tls_status settle(vs_tls *tls, int result) {
    int saved_errno = errno;
    int error = SSL_get_error(tls->ssl, result);
    switch (error) {
    case SSL_ERROR_WANT_READ:
        return VS_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE:
        return VS_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        return VS_TLS_CLOSED;
    default:
        tls->failure = error;
        tls->system_errno = error == SSL_ERROR_SYSCALL ? saved_errno : 0;
        tls->error = ERR_peek_error();
        ERR_clear_error();
        // An EOF read as a close (SSL_OP_IGNORE_UNEXPECTED_EOF) can still surface as a
        // syscall error with errno 0 on some paths: a close all the same.
        if (error == SSL_ERROR_SYSCALL && tls->error == 0 && saved_errno == 0) return VS_TLS_CLOSED;
        return VS_TLS_FAILED;
    }
}

vs_tls_status vs_tls_handshake(vs_tls *tls) {
    ERR_clear_error();
    int result = SSL_do_handshake(tls->ssl);
    return result == 1 ? VS_TLS_DONE : settle(tls, result);
}

vs_tls_status vs_tls_read(vs_tls *tls, void *buffer, size_t capacity, size_t *count) {
    ERR_clear_error();
    size_t got = 0;
    int result = SSL_read_ex(tls->ssl, buffer, capacity, &got);
    *count = result == 1 ? got : 0;
    return result == 1 ? VS_TLS_DONE : settle(tls, result);
}

vs_tls_status vs_tls_write(vs_tls *tls, const void *bytes, size_t length, size_t *count) {
    ERR_clear_error();
    size_t written = 0;
    int result = SSL_write_ex(tls->ssl, bytes, length, &written);
    *count = result == 1 ? written : 0;
    return result == 1 ? VS_TLS_DONE : settle(tls, result);
}

vs_tls_status vs_tls_shutdown(vs_tls *tls) {
    // Nothing to close politely before the handshake finished or after a fatal error.
    if (!SSL_is_init_finished(tls->ssl) || tls->failure != 0) return VS_TLS_DONE;
    ERR_clear_error();
    int result = SSL_shutdown(tls->ssl);
    return result >= 0 ? VS_TLS_DONE : settle(tls, result);
}

int vs_tls_has_buffered_input(const vs_tls *tls) { return SSL_has_pending(tls->ssl); }

int vs_tls_failed_verification(const vs_tls *tls) {
    return tls->failure == SSL_ERROR_SSL && SSL_get_verify_result(tls->ssl) != X509_V_OK;
}

vs_tls_failure_class vs_tls_failure_kind(const vs_tls *tls) {
    if (vs_tls_failed_verification(tls)) return VS_TLS_FAILURE_CERTIFICATE;
    if (tls->failure == SSL_ERROR_SYSCALL && tls->error == 0) return VS_TLS_FAILURE_SOCKET;
    if (tls->error == 0 || ERR_GET_LIB(tls->error) != ERR_LIB_SSL) return VS_TLS_FAILURE_OTHER;
    switch (ERR_GET_REASON(tls->error)) {
    case SSL_R_WRONG_VERSION_NUMBER: case SSL_R_HTTP_REQUEST: case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_UNKNOWN_PROTOCOL: case SSL_R_PACKET_LENGTH_TOO_LONG: case SSL_R_RECORD_LENGTH_MISMATCH:
    case SSL_R_BAD_PACKET_LENGTH: case SSL_R_UNEXPECTED_MESSAGE:
        return VS_TLS_FAILURE_NOT_TLS;
    case SSL_R_UNSUPPORTED_PROTOCOL: case SSL_R_VERSION_TOO_LOW: case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
        return VS_TLS_FAILURE_VERSION;
    case SSL_R_NO_APPLICATION_PROTOCOL: case SSL_R_TLSV1_ALERT_NO_APPLICATION_PROTOCOL:
        return VS_TLS_FAILURE_ALPN;
    case SSL_R_NO_SHARED_CIPHER: case SSL_R_NO_SHARED_GROUPS: case SSL_R_NO_SUITABLE_SIGNATURE_ALGORITHM:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE: case SSL_R_TLSV1_ALERT_INSUFFICIENT_SECURITY:
        return VS_TLS_FAILURE_CIPHER;
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE: case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED: case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN: case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR: case SSL_R_TLSV1_UNRECOGNIZED_NAME:
        return VS_TLS_FAILURE_CERTIFICATE;
    default:
        return VS_TLS_FAILURE_OTHER;
    }
}

void vs_tls_describe_failure(const vs_tls *tls, char *text, size_t capacity) {
    if (capacity == 0) return;
    if (vs_tls_failed_verification(tls)) {
        snprintf(text, capacity, "certificate verify failed: %s",
                 X509_verify_cert_error_string(SSL_get_verify_result(tls->ssl)));
    } else if (tls->error != 0) {
        ERR_error_string_n(tls->error, text, capacity);
    } else if (tls->system_errno != 0) {
        char reason[128] = "";
        if (strerror_r(tls->system_errno, reason, sizeof reason) != 0) snprintf(reason, sizeof reason, "errno %d", tls->system_errno);
        snprintf(text, capacity, "socket error: %s", reason);
    } else if (tls->failure != 0) {
        snprintf(text, capacity, "TLS error %d", tls->failure);
    } else {
        snprintf(text, capacity, "no TLS failure");
    }
}

const char *vs_tls_cipher_suite(const vs_tls *tls) {
    const SSL_CIPHER *cipher = SSL_is_init_finished(tls->ssl) ? SSL_get_current_cipher(tls->ssl) : NULL;
    return cipher == NULL ? NULL : SSL_CIPHER_standard_name(cipher);
}

int vs_tls_version(const vs_tls *tls) { return SSL_is_init_finished(tls->ssl) ? SSL_version(tls->ssl) : 0; }

size_t vs_tls_alpn(const vs_tls *tls, char *out, size_t capacity) {
    const unsigned char *data = NULL;
    unsigned int length = 0;
    SSL_get0_alpn_selected(tls->ssl, &data, &length);
    if (capacity == 0) return 0;
    if (data == NULL || length == 0 || length >= capacity) {
        out[0] = 0;
        return 0;
    }
    memcpy(out, data, length);
    out[length] = 0;
    return length;
}

int vs_tls_session_reused(const vs_tls *tls) { return SSL_session_reused(tls->ssl); }

int vs_tls_peer_public_key_sha256(const vs_tls *tls, uint8_t *out) {
    X509 *certificate = SSL_get1_peer_certificate(tls->ssl);
    if (certificate == NULL) return 0;
    unsigned char *der = NULL;
    int length = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(certificate), &der);
    int ok = length > 0 && EVP_Digest(der, (size_t)length, out, NULL, EVP_sha256(), NULL) == 1;
    OPENSSL_free(der);
    X509_free(certificate);
    ERR_clear_error();
    return ok;
}

vs_tls_session *vs_tls_copy_session(const vs_tls *tls) {
    SSL_SESSION *session = SSL_get0_session(tls->ssl);
    if (session == NULL || !SSL_SESSION_is_resumable(session)) return NULL;
    // A copy, not another reference to the connection's session: SSL_free of a connection
    // that ended without close_notify marks its session not resumable (a TLS 1.2 rule
    // against truncation), and a phone's connection usually ends that way (the network
    // went). TLS 1.3 dropped the rule (RFC 8446, 6.1), and our frames are self-delimiting,
    // so a truncation cannot pass for a whole frame: the copy stays resumable.
    return (vs_tls_session *)SSL_SESSION_dup(session);
}

int vs_tls_offer_session(vs_tls *tls, vs_tls_session *session) { return SSL_set_session(tls->ssl, (SSL_SESSION *)session); }

void vs_tls_session_free(vs_tls_session *session) { SSL_SESSION_free((SSL_SESSION *)session); }
