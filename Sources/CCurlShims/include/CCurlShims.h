#ifndef CCURLSHIMS_H
#define CCURLSHIMS_H
// The slice of libcurl's multi-socket interface the push providers use, behind a header
// that includes no system header (curl.h pulls in <sys/socket.h>, which clashes with
// Swift's Glibc module on a clean build). curl_easy_setopt and curl_multi_setopt are
// variadic, which Swift cannot call: every option is set here. Types stay opaque.
#include <stdint.h>
#include <stddef.h>

typedef struct vs_curl_multi vs_curl_multi;
typedef struct vs_curl_request vs_curl_request;

// What curl wants to hear about a socket (CURL_POLL_*), checked against curl's values.
#define VS_CURL_POLL_NONE 0
#define VS_CURL_POLL_IN 1
#define VS_CURL_POLL_OUT 2
#define VS_CURL_POLL_INOUT 3
#define VS_CURL_POLL_REMOVE 4
// What happened on a socket (CURL_CSELECT_*).
#define VS_CURL_CSELECT_IN 1
#define VS_CURL_CSELECT_OUT 2
#define VS_CURL_CSELECT_ERR 4
/// The "no socket" value of vs_curl_multi_socket_action: a timeout fired.
#define VS_CURL_SOCKET_TIMEOUT (-1)

/// Called from inside vs_curl_multi_socket_action: watch `fd` for `what` (VS_CURL_POLL_*).
/// `socket_data` is what vs_curl_multi_assign last attached to the socket (NULL at first).
/// Must not call back into curl.
typedef void (*vs_curl_socket_callback)(int fd, int what, void *socket_data, void *argument);
/// Called from inside curl: run vs_curl_multi_socket_action(VS_CURL_SOCKET_TIMEOUT) in
/// `timeout_ms` (0: as soon as possible; -1: cancel the timer). Must not call back into curl.
typedef void (*vs_curl_timer_callback)(long timeout_ms, void *argument);

/// Initialises libcurl once per process (thread-safe). 1 on success.
int vs_curl_global_init(void);

/// A multi handle that multiplexes HTTP/2 streams over at most `max_host_connections`
/// connections per host, `max_streams` streams each (the server's SETTINGS may lower it).
vs_curl_multi *vs_curl_multi_new(vs_curl_socket_callback on_socket, vs_curl_timer_callback on_timer, void *argument,
                                 long max_host_connections, long max_streams);
/// Frees the handle; remove and free every request first.
void vs_curl_multi_free(vs_curl_multi *multi);
/// Attaches `socket_data` to `fd` for later socket callbacks. 0 on success.
int vs_curl_multi_assign(vs_curl_multi *multi, int fd, void *socket_data);
/// Tells curl that `fd` is ready (`events`: VS_CURL_CSELECT_*) or, with
/// VS_CURL_SOCKET_TIMEOUT, that its timer fired. 0 on success.
int vs_curl_multi_socket_action(vs_curl_multi *multi, int fd, int events);
/// The next finished request (removed from the multi handle), or NULL. `result` gets
/// curl's CURLcode (0: an HTTP answer arrived; its status may still be an error).
vs_curl_request *vs_curl_multi_next_done(vs_curl_multi *multi, int *result);

/// A POST of `body` to `url` over HTTP/2 (TLS, ALPN h2; prior knowledge for http://),
/// with `header_count` "Name: value" lines. The body and headers are copied. `timeout_ms`
/// bounds the whole transfer. `ca_file` (may be NULL) replaces the system's trusted CAs.
/// `user` comes back from vs_curl_request_user. NULL when curl cannot make the handle.
vs_curl_request *vs_curl_request_new(const char *url, const char *const *headers, size_t header_count,
                                     const uint8_t *body, size_t body_length, long timeout_ms,
                                     const char *ca_file, void *user);
/// Starts the request on the multi handle. 0 on success.
int vs_curl_multi_add(vs_curl_multi *multi, vs_curl_request *request);
/// Takes a request off the multi handle (cancels it). Harmless if it is not on it.
void vs_curl_multi_remove(vs_curl_multi *multi, vs_curl_request *request);
/// Frees a request that is not on a multi handle.
void vs_curl_request_free(vs_curl_request *request);
void *vs_curl_request_user(const vs_curl_request *request);
/// The HTTP status, 0 if none arrived.
long vs_curl_request_status(const vs_curl_request *request);
/// The HTTP version of the answer: 2 for HTTP/2, 1 for 1.x, 0 if none.
int vs_curl_request_http_version(const vs_curl_request *request);
/// New connections this request had to open (0: it reused one).
long vs_curl_request_new_connections(const vs_curl_request *request);
/// The value of response header `name` (case-insensitive; the last one wins), or NULL.
/// Valid until the request is freed.
const char *vs_curl_request_header(vs_curl_request *request, const char *name);
/// The response body (at most 64 KiB are kept). Valid until the request is freed.
const uint8_t *vs_curl_request_body(const vs_curl_request *request, size_t *length);
/// curl's message for a failed transfer ("" if none).
const char *vs_curl_request_error(const vs_curl_request *request);
/// curl's text for a CURLcode.
const char *vs_curl_strerror(int code);
/// Whether a transfer's result says its HTTP/2 stream was refused or cut by the peer's
/// framing (CURLE_HTTP2, CURLE_HTTP2_STREAM) rather than the connection failing: what a
/// GOAWAY does to a stream above its last-stream-id that libcurl does not retry itself.
int vs_curl_result_is_stream_refused(int code);
#endif
