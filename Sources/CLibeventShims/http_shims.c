#include "http_shims.h"
#include <stdio.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

_Static_assert(VS_HTTP_ERROR_TIMEOUT == EVREQ_HTTP_TIMEOUT, "EVREQ_HTTP_TIMEOUT");
_Static_assert(VS_HTTP_ERROR_EOF == EVREQ_HTTP_EOF, "EVREQ_HTTP_EOF");
_Static_assert(VS_HTTP_ERROR_INVALID_HEADER == EVREQ_HTTP_INVALID_HEADER, "EVREQ_HTTP_INVALID_HEADER");
_Static_assert(VS_HTTP_ERROR_BUFFER == EVREQ_HTTP_BUFFER_ERROR, "EVREQ_HTTP_BUFFER_ERROR");
_Static_assert(VS_HTTP_ERROR_CANCELLED == EVREQ_HTTP_REQUEST_CANCEL, "EVREQ_HTTP_REQUEST_CANCEL");
_Static_assert(VS_HTTP_ERROR_DATA_TOO_LONG == EVREQ_HTTP_DATA_TOO_LONG, "EVREQ_HTTP_DATA_TOO_LONG");

void vs_event_active(struct event *event) { event_active(event, EV_TIMEOUT, 0); }

struct evhttp_connection *vs_http_connection_new(
    struct event_base *base, const char *address, uint16_t port, int64_t timeout_microseconds,
    int64_t max_header_bytes, int64_t max_body_bytes) {
    struct evhttp_connection *connection = evhttp_connection_base_new(base, NULL, address, port);
    if (connection == NULL) return NULL;
    struct timeval timeout;
    timeout.tv_sec = (time_t)(timeout_microseconds / 1000000);
    timeout.tv_usec = (suseconds_t)(timeout_microseconds % 1000000);
    evhttp_connection_set_timeout_tv(connection, &timeout);
    evhttp_connection_set_retries(connection, 0);
    evhttp_connection_set_max_headers_size(connection, (ev_ssize_t)max_header_bytes);
    evhttp_connection_set_max_body_size(connection, (ev_ssize_t)max_body_bytes);
    return connection;
}

void vs_http_connection_free(struct evhttp_connection *connection) { evhttp_connection_free(connection); }

int vs_http_post(
    struct evhttp_connection *connection, const char *path, const char *host, const char *content_type,
    const char *user_agent, const void *body, size_t body_length,
    vs_http_done_callback done, vs_http_error_callback error, void *argument,
    struct evhttp_request **request_out) {
    *request_out = NULL;
    struct evhttp_request *request = evhttp_request_new(done, argument);
    if (request == NULL) return -1;
    // The two callback types differ only in the error's enum vs int: same ABI.
    evhttp_request_set_error_cb(request, (void (*)(enum evhttp_request_error, void *))error);
    struct evkeyvalq *headers = evhttp_request_get_output_headers(request);
    char length[32];
    snprintf(length, sizeof length, "%zu", body_length);
    if (evhttp_add_header(headers, "Host", host) != 0
        || evhttp_add_header(headers, "Content-Type", content_type) != 0
        || evhttp_add_header(headers, "Content-Length", length) != 0
        || evhttp_add_header(headers, "User-Agent", user_agent) != 0
        || evbuffer_add(evhttp_request_get_output_buffer(request), body, body_length) != 0) {
        evhttp_request_free(request);
        return -1;
    }
    *request_out = request;
    // On -1 no callback runs. libevent 2.1 has freed the request on one such path (out of
    // memory for the URI) but not on the other (setting up the socket failed), and the
    // two cannot be told apart: leaking one request on a path that practically never
    // happens is better than a double free.
    if (evhttp_make_request(connection, request, EVHTTP_REQ_POST, path) != 0) {
        *request_out = NULL;
        return -1;
    }
    return 0;
}

void vs_http_cancel(struct evhttp_request *request) { evhttp_cancel_request(request); }

int vs_http_response_code(const struct evhttp_request *response) { return evhttp_request_get_response_code(response); }

const char *vs_http_response_header(struct evhttp_request *response, const char *name) {
    return evhttp_find_header(evhttp_request_get_input_headers(response), name);
}
