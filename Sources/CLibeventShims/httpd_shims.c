#include "httpd_shims.h"
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

struct evhttp *vs_httpd_new(
    struct event_base *base, const char *address, uint16_t port, int64_t max_body_bytes, int timeout_seconds,
    vs_httpd_request_callback callback, void *argument, uint16_t *port_out) {
    struct evhttp *server = evhttp_new(base);
    if (server == NULL) return NULL;
    evhttp_set_max_body_size(server, (ev_ssize_t)max_body_bytes);
    evhttp_set_max_headers_size(server, 16384);
    evhttp_set_timeout(server, timeout_seconds);
    evhttp_set_allowed_methods(server, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD);
    evhttp_set_gencb(server, callback, argument);
    struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(server, address, port);
    if (bound == NULL) {
        int saved = errno;
        evhttp_free(server);
        errno = saved;
        return NULL;
    }
    evutil_socket_t fd = evhttp_bound_socket_get_fd(bound);
    struct sockaddr_storage storage;
    socklen_t length = sizeof storage;
    *port_out = 0;
    if (getsockname(fd, (struct sockaddr *)&storage, &length) == 0) {
        if (storage.ss_family == AF_INET) *port_out = ntohs(((struct sockaddr_in *)&storage)->sin_port);
        else if (storage.ss_family == AF_INET6) *port_out = ntohs(((struct sockaddr_in6 *)&storage)->sin6_port);
    }
    return server;
}

void vs_httpd_free(struct evhttp *server) { evhttp_free(server); }

int vs_httpd_method(struct evhttp_request *request) {
    switch (evhttp_request_get_command(request)) {
    case EVHTTP_REQ_GET: return VS_HTTPD_GET;
    case EVHTTP_REQ_POST: return VS_HTTPD_POST;
    case EVHTTP_REQ_DELETE: return VS_HTTPD_DELETE;
    case EVHTTP_REQ_HEAD: return VS_HTTPD_HEAD;
    default: return VS_HTTPD_OTHER;
    }
}

const char *vs_httpd_uri(struct evhttp_request *request) {
    const char *uri = evhttp_request_get_uri(request);
    return uri == NULL ? "" : uri;
}

const char *vs_httpd_header(struct evhttp_request *request, const char *name) {
    return evhttp_find_header(evhttp_request_get_input_headers(request), name);
}

size_t vs_httpd_body_length(struct evhttp_request *request) {
    return evbuffer_get_length(evhttp_request_get_input_buffer(request));
}

size_t vs_httpd_copy_body(struct evhttp_request *request, void *buffer, size_t capacity) {
    ev_ssize_t copied = evbuffer_copyout(evhttp_request_get_input_buffer(request), buffer, capacity);
    return copied < 0 ? 0 : (size_t)copied;
}

void vs_httpd_reply(
    struct evhttp_request *request, int code, const char *reason, const char *content_type, const void *body,
    size_t length) {
    struct evhttp_connection *connection = evhttp_request_get_connection(request);
    if (connection != NULL) evhttp_connection_set_closecb(connection, NULL, NULL);
    struct evkeyvalq *headers = evhttp_request_get_output_headers(request);
    evhttp_add_header(headers, "Content-Type", content_type);
    evhttp_add_header(headers, "Cache-Control", "no-store");
    struct evbuffer *out = evbuffer_new();
    if (out != NULL && length > 0) evbuffer_add(out, body, length);
    evhttp_send_reply(request, code, reason, out);
    if (out != NULL) evbuffer_free(out);
}

void vs_httpd_on_close(struct evhttp_request *request, vs_httpd_close_callback callback, void *argument) {
    struct evhttp_connection *connection = evhttp_request_get_connection(request);
    if (connection == NULL) return;
    evhttp_connection_set_closecb(connection, callback, argument);
}
