/*
 * core/config/toml_shim.h - a TOML document as a plain C tree.
 *
 * toml++ is C++; the rest of the core is C.  The shim (toml_shim.cpp) parses
 * with toml++ and copies the whole document into the tree below, so no C++
 * object and no exception ever crosses into C.  Every node keeps the
 * position of its key and of its value (1-based; 0 when toml++ knows none),
 * because every config error message points at one of them.
 */
#ifndef DT_CORE_TOML_SHIM_H
#define DT_CORE_TOML_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_toml_type {
    DT_TOML_TABLE = 0,
    DT_TOML_ARRAY = 1,
    DT_TOML_STRING = 2,
    DT_TOML_INT = 3,
    DT_TOML_FLOAT = 4,
    DT_TOML_BOOL = 5,
    DT_TOML_DATE = 6,     /* dates and times are kept only so that a  */
    DT_TOML_TIME = 7,     /* message can name them; no schema type    */
    DT_TOML_DATETIME = 8  /* accepts them                             */
} dt_toml_type_t;

typedef struct dt_toml_node dt_toml_node_t;
struct dt_toml_node {
    int type;           /* dt_toml_type_t */
    char *key;          /* NULL for the root and for array items */
    int key_line, key_col; /* where the key is written */
    int line, col;      /* where the value starts ([table] headers: the '[') */
    union {
        int64_t i;
        double f;
        int b;
        char *s;        /* STRING (NUL-terminated; TOML forbids NUL) */
        struct {
            dt_toml_node_t *items; /* TABLE (in file order) / ARRAY */
            size_t n;
        } children;
    } u;
};

/* Where and why parsing failed. */
typedef struct dt_toml_error {
    int line, col;      /* 0 when unknown */
    char msg[512];      /* toml++'s description */
} dt_toml_error_t;

/* Parse `len` bytes of TOML text.  `source` names the document in toml++'s
 * own bookkeeping only.  On success *out is the root table (free with
 * dt_toml_free).  Returns DT_OK, DT_ERR_CONFIG (syntax; `err` filled) or
 * DT_ERR_NOMEM.  Never throws. */
int dt_toml_parse(const char *text, size_t len, const char *source,
                  dt_toml_node_t **out, dt_toml_error_t *err);

/* Parse one TOML value written as `text` (e.g. "3e-4", "true", "\"x\"",
 * "[1, 2]").  *out is the value node with key NULL.  Returns DT_OK,
 * DT_ERR_CONFIG when `text` is not exactly one TOML value, or
 * DT_ERR_NOMEM. */
int dt_toml_parse_value(const char *text, dt_toml_node_t **out);

/* Free a tree returned by either parse function (NULL is a no-op). */
void dt_toml_free(dt_toml_node_t *n);

/* "string", "integer", "float", "boolean", "array", "table", "date",
 * "time", "date-time". */
const char *dt_toml_type_name(int type);

#ifdef __cplusplus
}
#endif
#endif /* DT_CORE_TOML_SHIM_H */
