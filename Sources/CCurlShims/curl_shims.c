#include "CCurlShims.h"
#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

_Static_assert(VS_CURL_POLL_NONE == CURL_POLL_NONE && VS_CURL_POLL_IN == CURL_POLL_IN && VS_CURL_POLL_OUT == CURL_POLL_OUT
               && VS_CURL_POLL_INOUT == CURL_POLL_INOUT && VS_CURL_POLL_REMOVE == CURL_POLL_REMOVE, "CURL_POLL_*");
_Static_assert(VS_CURL_CSELECT_IN == CURL_CSELECT_IN && VS_CURL_CSELECT_OUT == CURL_CSELECT_OUT
               && VS_CURL_CSELECT_ERR == CURL_CSELECT_ERR, "CURL_CSELECT_*");
_Static_assert(VS_CURL_SOCKET_TIMEOUT == CURL_SOCKET_TIMEOUT, "CURL_SOCKET_TIMEOUT");

// A push service answers with a status, a few headers and a small JSON body: anything
// larger is cut (the reason is in the first bytes).
#define VS_CURL_MAX_BODY (64 * 1024)
#define VS_CURL_MAX_HEADERS (16 * 1024)

struct vs_curl_multi {
    CURLM *handle;
    vs_curl_socket_callback on_socket;
    vs_curl_timer_callback on_timer;
    void *argument;
};

struct vs_curl_request {
    CURL *easy;
    struct curl_slist *headers;
    void *user;
    // Response header lines as received ("Name: value\r\n" each), NUL-terminated.
    char *response_headers;
    size_t response_headers_length;
    char *header_value;  // the last vs_curl_request_header answer
    uint8_t *body;
    size_t body_length;
    char error[CURL_ERROR_SIZE];
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_result = CURLE_FAILED_INIT;
static void global_init(void) { global_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

int vs_curl_global_init(void) {
    pthread_once(&global_once, global_init);
    return global_result == CURLE_OK;
}

static int socket_function(CURL *easy, curl_socket_t fd, int what, void *argument, void *socket_data) {
    (void)easy;
    vs_curl_multi *multi = argument;
    multi->on_socket(fd, what, socket_data, multi->argument);
    return 0;
}

static int timer_function(CURLM *handle, long timeout_ms, void *argument) {
    (void)handle;
    vs_curl_multi *multi = argument;
    multi->on_timer(timeout_ms, multi->argument);
    return 0;
}

vs_curl_multi *vs_curl_multi_new(vs_curl_socket_callback on_socket, vs_curl_timer_callback on_timer, void *argument,
                                 long max_host_connections, long max_streams) {
    if (!vs_curl_global_init()) return NULL;
    vs_curl_multi *multi = calloc(1, sizeof *multi);
    if (multi == NULL) return NULL;
    multi->handle = curl_multi_init();
    if (multi->handle == NULL) {
        free(multi);
        return NULL;
    }
    multi->on_socket = on_socket;
    multi->on_timer = on_timer;
    multi->argument = argument;
    curl_multi_setopt(multi->handle, CURLMOPT_SOCKETFUNCTION, socket_function);
    curl_multi_setopt(multi->handle, CURLMOPT_SOCKETDATA, multi);
    curl_multi_setopt(multi->handle, CURLMOPT_TIMERFUNCTION, timer_function);
    curl_multi_setopt(multi->handle, CURLMOPT_TIMERDATA, multi);
    curl_multi_setopt(multi->handle, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    curl_multi_setopt(multi->handle, CURLMOPT_MAX_HOST_CONNECTIONS, max_host_connections);
    curl_multi_setopt(multi->handle, CURLMOPT_MAX_CONCURRENT_STREAMS, max_streams);
    return multi;
}

void vs_curl_multi_free(vs_curl_multi *multi) {
    if (multi == NULL) return;
    curl_multi_cleanup(multi->handle);
    free(multi);
}

int vs_curl_multi_assign(vs_curl_multi *multi, int fd, void *socket_data) {
    return curl_multi_assign(multi->handle, fd, socket_data) == CURLM_OK ? 0 : -1;
}

int vs_curl_multi_socket_action(vs_curl_multi *multi, int fd, int events) {
    int running = 0;
    return curl_multi_socket_action(multi->handle, fd, events, &running) == CURLM_OK ? 0 : -1;
}

vs_curl_request *vs_curl_multi_next_done(vs_curl_multi *multi, int *result) {
    int queued = 0;
    CURLMsg *message;
    while ((message = curl_multi_info_read(multi->handle, &queued)) != NULL) {
        if (message->msg != CURLMSG_DONE) continue;
        CURL *easy = message->easy_handle;
        *result = (int)message->data.result;  // read before the remove invalidates message
        vs_curl_request *request = NULL;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&request);
        curl_multi_remove_handle(multi->handle, easy);
        return request;
    }
    return NULL;
}

static size_t write_body(char *data, size_t size, size_t count, void *argument) {
    vs_curl_request *request = argument;
    size_t length = size * count;
    size_t room = VS_CURL_MAX_BODY - request->body_length;
    size_t kept = length < room ? length : room;
    if (kept > 0) {
        uint8_t *grown = realloc(request->body, request->body_length + kept);
        if (grown == NULL) return 0;
        memcpy(grown + request->body_length, data, kept);
        request->body = grown;
        request->body_length += kept;
    }
    return length;  // the rest is read and dropped
}

static size_t write_header(char *data, size_t size, size_t count, void *argument) {
    vs_curl_request *request = argument;
    size_t length = size * count;
    if (request->response_headers_length + length > VS_CURL_MAX_HEADERS) return length;
    char *grown = realloc(request->response_headers, request->response_headers_length + length + 1);
    if (grown == NULL) return 0;
    memcpy(grown + request->response_headers_length, data, length);
    request->response_headers = grown;
    request->response_headers_length += length;
    grown[request->response_headers_length] = 0;
    return length;
}

vs_curl_request *vs_curl_request_new(const char *url, const char *const *headers, size_t header_count,
                                     const uint8_t *body, size_t body_length, long timeout_ms,
                                     const char *ca_file, void *user) {
    if (!vs_curl_global_init()) return NULL;
    vs_curl_request *request = calloc(1, sizeof *request);
    if (request == NULL) return NULL;
    request->easy = curl_easy_init();
    if (request->easy == NULL) {
        free(request);
        return NULL;
    }
    request->user = user;
    for (size_t i = 0; i < header_count; i++) {
        struct curl_slist *appended = curl_slist_append(request->headers, headers[i]);
        if (appended == NULL) {
            vs_curl_request_free(request);
            return NULL;
        }
        request->headers = appended;
    }
    // libcurl adds "Expect: 100-continue" to large POSTs over HTTP/1.1 and an Accept
    // header; neither means anything to APNs or FCM.
    request->headers = curl_slist_append(request->headers, "Expect:");
    CURL *easy = request->easy;
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, request);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, request->error);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, request->headers);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, (long)body_length);
    curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, body_length > 0 ? (const char *)body : "");
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, write_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, request);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, write_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, request);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    // HTTP/2 only: both services require it. A new request waits for the connection
    // being set up rather than opening a second one, so every stream shares one.
    curl_easy_setopt(easy, CURLOPT_HTTP_VERSION,
                     strncasecmp(url, "http://", 7) == 0 ? (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE
                                                           : (long)CURL_HTTP_VERSION_2TLS);
    curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "https,http");
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    // APNs asks providers to keep their connection open for many requests; curl would
    // otherwise not reuse a connection idle for more than 118 s.
    curl_easy_setopt(easy, CURLOPT_MAXAGE_CONN, 3600L);
    if (ca_file != NULL) curl_easy_setopt(easy, CURLOPT_CAINFO, ca_file);
    return request;
}

int vs_curl_multi_add(vs_curl_multi *multi, vs_curl_request *request) {
    return curl_multi_add_handle(multi->handle, request->easy) == CURLM_OK ? 0 : -1;
}

void vs_curl_multi_remove(vs_curl_multi *multi, vs_curl_request *request) {
    curl_multi_remove_handle(multi->handle, request->easy);
}

void vs_curl_request_free(vs_curl_request *request) {
    if (request == NULL) return;
    curl_easy_cleanup(request->easy);
    curl_slist_free_all(request->headers);
    free(request->response_headers);
    free(request->header_value);
    free(request->body);
    free(request);
}

void *vs_curl_request_user(const vs_curl_request *request) { return request->user; }

long vs_curl_request_status(const vs_curl_request *request) {
    long status = 0;
    curl_easy_getinfo(request->easy, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

int vs_curl_request_http_version(const vs_curl_request *request) {
    long version = 0;
    curl_easy_getinfo(request->easy, CURLINFO_HTTP_VERSION, &version);
    switch (version) {
    case CURL_HTTP_VERSION_2_0: return 2;
    case CURL_HTTP_VERSION_1_0:
    case CURL_HTTP_VERSION_1_1: return 1;
    default: return version == 0 ? 0 : 3;
    }
}

long vs_curl_request_new_connections(const vs_curl_request *request) {
    long count = 0;
    curl_easy_getinfo(request->easy, CURLINFO_NUM_CONNECTS, &count);
    return count;
}

const char *vs_curl_request_header(vs_curl_request *request, const char *name) {
    if (request->response_headers == NULL) return NULL;
    size_t name_length = strlen(name);
    const char *found = NULL;
    size_t found_length = 0;
    const char *line = request->response_headers;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t line_length = end ? (size_t)(end - line) : strlen(line);
        if (line_length > name_length && line[name_length] == ':' && strncasecmp(line, name, name_length) == 0) {
            const char *value = line + name_length + 1;
            const char *value_end = line + line_length;
            while (value < value_end && (*value == ' ' || *value == '\t')) value++;
            while (value_end > value && (value_end[-1] == '\r' || value_end[-1] == ' ' || value_end[-1] == '\t')) value_end--;
            found = value;
            found_length = (size_t)(value_end - value);
        }
        if (!end) break;
        line = end + 1;
    }
    if (found == NULL) return NULL;
    char *copy = malloc(found_length + 1);
    if (copy == NULL) return NULL;
    memcpy(copy, found, found_length);
    copy[found_length] = 0;
    free(request->header_value);
    request->header_value = copy;
    return copy;
}

const uint8_t *vs_curl_request_body(const vs_curl_request *request, size_t *length) {
    *length = request->body_length;
    return request->body;
}

const char *vs_curl_request_error(const vs_curl_request *request) { return request->error; }

const char *vs_curl_strerror(int code) { return curl_easy_strerror((CURLcode)code); }

int vs_curl_result_is_stream_refused(int code) { return code == CURLE_HTTP2 || code == CURLE_HTTP2_STREAM; }
