#ifndef VS_TLS_SHIMS_H
#define VS_TLS_SHIMS_H
// The slice of OpenSSL's libssl the Swift code uses for TLS on non-blocking sockets, behind
// a header with no system include (see COpenSSLShims.h for why). Types stay opaque.
//
// Threads: a context (SSL_CTX) is immutable once made and reference-counted by OpenSSL, so
// any thread may start connections on it and a connection keeps its context alive after
// the context's owner frees it (a certificate reload swaps contexts under live
// connections). A connection (`vs_tls`) is used by one thread at a time.
#include <stddef.h>
#include <stdint.h>

typedef struct vs_tls_context vs_tls_context;
typedef struct vs_tls vs_tls;
typedef struct vs_tls_session vs_tls_session;

/// Protocol versions, as on the wire.
#define VS_TLS_VERSION_1_2 0x0303
#define VS_TLS_VERSION_1_3 0x0304
/// The length of a session-ticket key: 16 bytes of key name, 32 of HMAC key, 32 of AES key.
#define VS_TLS_TICKET_KEY_LENGTH 80

/// What a handshake, read, write or shutdown step came to.
typedef enum {
    VS_TLS_DONE = 0,        // finished (a read or write moved `*count` bytes)
    VS_TLS_WANT_READ = 1,   // call again once the socket is readable
    VS_TLS_WANT_WRITE = 2,  // call again once the socket is writable
    VS_TLS_CLOSED = 3,      // the peer closed the connection (close_notify or, when reading, EOF)
    VS_TLS_FAILED = 4,      // a protocol, certificate or socket error: `vs_tls_describe_failure`
} vs_tls_status;

/// A server context: the certificate chain (PEM, leaf first) and its private key, the lowest
/// version accepted, ALPN `alpn` required when the client offers ALPN at all, renegotiation
/// off, stateless session tickets (one per handshake), TLS 1.3 suites in the server's order
/// (AES-128-GCM first: the cheapest handshake; ChaCha20 for a client that lists it first),
/// and record buffers released while idle
/// (SSL_MODE_RELEASE_BUFFERS). NULL on failure, with the reason in `error`.
vs_tls_context *vs_tls_server_context_new(
    const char *chain_file, const char *key_file, int minimum_version, const char *alpn, char *error, size_t capacity);
/// Sets the key that encrypts session tickets, so that tickets survive a certificate reload
/// and a restart (each new context otherwise draws its own). 1 on success.
int vs_tls_context_set_ticket_key(vs_tls_context *context, const uint8_t *key, size_t length);
/// A client context verifying the server against `ca_file` (PEM), or the system's store when
/// NULL, offering ALPN `alpn` (NULL: none). NULL on failure, with the reason in `error`.
vs_tls_context *vs_tls_client_context_new(
    const char *ca_file, int minimum_version, const char *alpn, char *error, size_t capacity);
/// When the server context's certificate (the chain's leaf) expires, in seconds since the
/// Unix epoch; 0 when unknown.
int64_t vs_tls_context_certificate_expiry(vs_tls_context *context);
/// Drops the caller's reference; connections made from it keep theirs.
void vs_tls_context_free(vs_tls_context *context);

/// A connection on the connected, non-blocking socket `fd`, which stays the caller's to
/// close. A client passes the name to check the certificate against (a DNS name, also sent
/// as SNI, or an IP address literal), or NULL for no name check. NULL when out of memory.
vs_tls *vs_tls_new(vs_tls_context *context, int fd, int is_server, const char *server_name);
void vs_tls_free(vs_tls *tls);

vs_tls_status vs_tls_handshake(vs_tls *tls);
vs_tls_status vs_tls_read(vs_tls *tls, void *buffer, size_t capacity, size_t *count);
/// Partial writes are allowed, and a retried write may come from another address with
/// other bytes after the first `*count` of the previous attempt are taken into account
/// (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER): the caller keeps its own queue.
vs_tls_status vs_tls_write(vs_tls *tls, const void *bytes, size_t length, size_t *count);
/// Sends close_notify without waiting for the peer's (the socket is closed right after).
vs_tls_status vs_tls_shutdown(vs_tls *tls);
/// 1 when OpenSSL holds input, decrypted or not yet (a server context reads ahead), that no
/// readiness event will announce; 0 when the next record, if any, is still on the socket.
int vs_tls_has_buffered_input(const vs_tls *tls);

/// Why the last step FAILED: the certificate check's verdict, OpenSSL's error, the socket's
/// errno, or an unexpected end of the stream. Always NUL-terminated.
void vs_tls_describe_failure(const vs_tls *tls, char *text, size_t capacity);
/// True when the last failure was the peer's certificate failing verification.
int vs_tls_failed_verification(const vs_tls *tls);

/// What the last failure was, in classes an operator can act on (a server's metrics and
/// logs): a few reasons of OpenSSL's hundreds, the rest OTHER.
typedef enum {
    VS_TLS_FAILURE_OTHER = 0,
    VS_TLS_FAILURE_NOT_TLS = 1,      // the bytes were no TLS record (plain protocol, HTTP, garbage)
    VS_TLS_FAILURE_VERSION = 2,      // no protocol version both sides accept
    VS_TLS_FAILURE_ALPN = 3,         // no ALPN protocol both sides accept
    VS_TLS_FAILURE_CIPHER = 4,       // no cipher suite, group or signature algorithm in common
    VS_TLS_FAILURE_CERTIFICATE = 5,  // a certificate was refused: ours by the peer (its alert), or the peer's
    VS_TLS_FAILURE_SOCKET = 6,       // the socket failed (reset, timed out)
} vs_tls_failure_class;
vs_tls_failure_class vs_tls_failure_kind(const vs_tls *tls);

/// The negotiated cipher suite's IANA name (e.g. "TLS_AES_128_GCM_SHA256"), NULL before the
/// handshake. The string is OpenSSL's, static.
const char *vs_tls_cipher_suite(const vs_tls *tls);
/// The negotiated version (VS_TLS_VERSION_*), 0 before the handshake.
int vs_tls_version(const vs_tls *tls);
/// The negotiated ALPN protocol copied to `out` (NUL-terminated); its length, 0 for none.
size_t vs_tls_alpn(const vs_tls *tls, char *out, size_t capacity);
/// 1 when the handshake resumed an earlier session (a ticket), 0 for a full handshake.
int vs_tls_session_reused(const vs_tls *tls);
/// SHA-256 of the peer certificate's SubjectPublicKeyInfo (what a pin names) into `out`
/// (32 bytes). 1 on success, 0 with no peer certificate.
int vs_tls_peer_public_key_sha256(const vs_tls *tls, uint8_t *out);

/// A copy of the session to resume next time (client side), NULL when none; free it. The
/// copy stays resumable however the connection ends.
vs_tls_session *vs_tls_copy_session(const vs_tls *tls);
/// Offers `session` for resumption on a client connection before its handshake. 1 on success.
int vs_tls_offer_session(vs_tls *tls, vs_tls_session *session);
void vs_tls_session_free(vs_tls_session *session);
#endif
