#ifndef HTTP_SHIMS_H
#define HTTP_SHIMS_H
// libevent's HTTP client, as the push gateway uses it, behind a header with no system
// includes (the same reason as CLibeventShims.h: libevent's headers pull in <sys/select.h>,
// which clashes with Swift's Glibc module on a clean build). Types stay opaque; error
// codes are ours and checked against libevent's at compile time in http_shims.c.
#include <stdint.h>
#include <stddef.h>

struct event;
struct event_base;
struct evhttp_connection;
struct evhttp_request;

/// Why a request failed (enum evhttp_request_error).
#define VS_HTTP_ERROR_TIMEOUT 0
#define VS_HTTP_ERROR_EOF 1
#define VS_HTTP_ERROR_INVALID_HEADER 2
#define VS_HTTP_ERROR_BUFFER 3
#define VS_HTTP_ERROR_CANCELLED 4
#define VS_HTTP_ERROR_DATA_TOO_LONG 5

/// Called once per request: with the response, or with NULL (or a response whose code is
/// 0) when there was none. Not called for a cancelled request.
typedef void (*vs_http_done_callback)(struct evhttp_request *response, void *argument);
/// Called before the done callback when the request failed, and alone when cancelled.
typedef void (*vs_http_error_callback)(int error, void *argument);

/// Makes `event` active at once: its callback runs from the loop, after the current one.
void vs_event_active(struct event *event);

/// A client connection to `address` (an IP literal: no DNS base is used) and `port`.
/// libevent's own retries are off; `timeout_microseconds` bounds connecting and every wait
/// on the socket; the response's headers and body are capped. NULL on failure.
struct evhttp_connection *vs_http_connection_new(
    struct event_base *base, const char *address, uint16_t port, int64_t timeout_microseconds,
    int64_t max_header_bytes, int64_t max_body_bytes);
/// Closes the connection and frees any request on it, without calling back.
void vs_http_connection_free(struct evhttp_connection *connection);

/// Sends `POST path` (HTTP/1.1, keep-alive) with Host, Content-Type, Content-Length and
/// User-Agent headers and `body`. Returns 0 and the request in `request_out` once started;
/// the callbacks may already have run before this returns (libevent reports a connect
/// that fails at once synchronously), in which case the request is already freed. Returns
/// -1 when libevent refused to start it: no callback will come.
int vs_http_post(
    struct evhttp_connection *connection, const char *path, const char *host, const char *content_type,
    const char *user_agent, const void *body, size_t body_length,
    vs_http_done_callback done, vs_http_error_callback error, void *argument,
    struct evhttp_request **request_out);
/// Abandons a request in flight: it is freed and its connection reset; only the error
/// callback runs (with VS_HTTP_ERROR_CANCELLED), synchronously.
void vs_http_cancel(struct evhttp_request *request);

/// The response's status code (0 when there was none).
int vs_http_response_code(const struct evhttp_request *response);
/// A response header's value (the first of that name), or NULL. Valid during the callback.
const char *vs_http_response_header(struct evhttp_request *response, const char *name);
#endif
