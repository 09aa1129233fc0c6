#ifndef CSQLITE_SHIM_H
#define CSQLITE_SHIM_H
// SQLite 3 (Debian: libsqlite3-dev). The store needs 3.24 or later (INSERT ... ON
// CONFLICT DO UPDATE); Debian 12 ships 3.40.
#include <sqlite3.h>

// SQLITE_TRANSIENT is a macro casting -1 to a function pointer, which Swift cannot
// import. Bound strings and blobs use it so SQLite copies them before the call returns.
static inline sqlite3_destructor_type csqlite_transient(void) {
    return SQLITE_TRANSIENT;
}
#endif
