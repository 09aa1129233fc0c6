#ifndef CHIREDIS_SHIM_H
#define CHIREDIS_SHIM_H
// hiredis 0.14 (Debian libhiredis-dev): the synchronous client. Swift code does not import
// this module: it calls CHiredisShims, whose header includes no system header (hiredis.h
// pulls in <stdio.h> and <sys/time.h>, which clash with Swift's Glibc module on a clean
// build, as libevent's do). This target only supplies the include path and the link flags.
#include <hiredis/hiredis.h>
#endif
