#ifndef HTTPD_SHIMS_H
#define HTTPD_SHIMS_H
// libevent's HTTP server (evhttp), as the admin API uses it, behind a header with no
// system includes (see CLibeventShims.h). Types stay opaque.
#include <stdint.h>
#include <stddef.h>

struct event_base;
struct evhttp;
struct evhttp_request;
struct evhttp_connection;

#define VS_HTTPD_GET 1
#define VS_HTTPD_POST 2
#define VS_HTTPD_DELETE 3
#define VS_HTTPD_HEAD 4
#define VS_HTTPD_OTHER 0

/// Called once per complete request, on the loop's thread.
typedef void (*vs_httpd_request_callback)(struct evhttp_request *request, void *argument);
/// Called when the connection of a request whose reply was deferred closes first.
typedef void (*vs_httpd_close_callback)(struct evhttp_connection *connection, void *argument);

/// A server on `base` bound to `address:port` (port 0: any), with bodies capped at
/// `max_body_bytes` and idle connections closed after `timeout_seconds`. Writes the bound
/// port to `port_out`. NULL on failure (errno tells why).
struct evhttp *vs_httpd_new(
    struct event_base *base, const char *address, uint16_t port, int64_t max_body_bytes, int timeout_seconds,
    vs_httpd_request_callback callback, void *argument, uint16_t *port_out);
void vs_httpd_free(struct evhttp *server);

/// VS_HTTPD_* for the request's method.
int vs_httpd_method(struct evhttp_request *request);
/// The request target as sent (path and query), never NULL.
const char *vs_httpd_uri(struct evhttp_request *request);
/// A request header's value, or NULL.
const char *vs_httpd_header(struct evhttp_request *request, const char *name);
/// The body's length, and a copy of at most `capacity` of its bytes into `buffer`.
size_t vs_httpd_body_length(struct evhttp_request *request);
size_t vs_httpd_copy_body(struct evhttp_request *request, void *buffer, size_t capacity);
/// Sends the reply (and frees the request once written).
void vs_httpd_reply(
    struct evhttp_request *request, int code, const char *reason, const char *content_type, const void *body,
    size_t length);
/// Calls `callback(argument)` if the request's connection closes before its reply is sent.
void vs_httpd_on_close(struct evhttp_request *request, vs_httpd_close_callback callback, void *argument);
#endif
