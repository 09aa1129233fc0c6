#ifndef CSYSTEMD_SHIM_H
#define CSYSTEMD_SHIM_H
// libsystemd's sd_notify: how a Type=notify service tells systemd it is ready, reloading
// or stopping. Debian: libsystemd-dev.
#include <systemd/sd-daemon.h>
#endif
