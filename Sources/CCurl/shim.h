#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H
// libcurl (Debian libcurl4-openssl-dev, built with nghttp2): the HTTP/2 client of the
// APNs and FCM providers. Swift code does not import this module: it calls CCurlShims,
// whose header includes no system header (see CLibeventShims for why). This target only
// supplies the include path and the link flags to the shims.
#include <curl/curl.h>
#endif
