/*
 * core/config/toml_shim.cpp - the only C++ in the core: parse TOML with
 * toml++ and copy the document into the plain C tree of toml_shim.h.
 *
 * Why copy instead of wrapping: the C side then owns ordinary malloc'd
 * memory, never touches a C++ object, and cannot see an exception.  Every
 * entry point catches everything (parse errors, std::bad_alloc, anything
 * else) and turns it into a status code.
 */
#include "config/toml_shim.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>

#include <toml++/toml.h>

#include "dtrain/status.h"

namespace {

char *dup_str(std::string_view s)
{
    char *p = static_cast<char *>(std::malloc(s.size() + 1));
    if (!p)
        throw std::bad_alloc();
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
    return p;
}

/* calloc'd so that a half-filled array is still a valid tree to free: a
 * zeroed node is an empty table with no key. */
dt_toml_node_t *alloc_nodes(size_t n)
{
    if (n == 0)
        return nullptr;
    auto *p = static_cast<dt_toml_node_t *>(std::calloc(n, sizeof(dt_toml_node_t)));
    if (!p)
        throw std::bad_alloc();
    return p;
}

void set_pos(int &line, int &col, const toml::source_region &r)
{
    line = static_cast<int>(r.begin.line);
    col = static_cast<int>(r.begin.column);
}

void convert(const toml::node &src, dt_toml_node_t *dst)
{
    set_pos(dst->line, dst->col, src.source());
    switch (src.type()) {
    case toml::node_type::table: {
        const toml::table &t = *src.as_table();
        dst->type = DT_TOML_TABLE;
        dst->u.children.items = alloc_nodes(t.size());
        dst->u.children.n = t.size();
        size_t i = 0;
        for (auto &&[k, v] : t) {
            dt_toml_node_t *c = &dst->u.children.items[i++];
            c->key = dup_str(k.str());
            set_pos(c->key_line, c->key_col, k.source());
            convert(v, c);
        }
        /* toml++ keeps keys sorted by name; messages and "first error"
         * should follow the file instead. */
        std::stable_sort(dst->u.children.items, dst->u.children.items + t.size(),
                         [](const dt_toml_node_t &a, const dt_toml_node_t &b) {
                             if (a.key_line != b.key_line)
                                 return a.key_line < b.key_line;
                             return a.key_col < b.key_col;
                         });
        break;
    }
    case toml::node_type::array: {
        const toml::array &a = *src.as_array();
        dst->type = DT_TOML_ARRAY;
        dst->u.children.items = alloc_nodes(a.size());
        dst->u.children.n = a.size();
        for (size_t i = 0; i < a.size(); i++)
            convert(a[i], &dst->u.children.items[i]);
        break;
    }
    case toml::node_type::string:
        dst->type = DT_TOML_STRING;
        dst->u.s = dup_str(*src.value<std::string_view>());
        break;
    case toml::node_type::integer:
        dst->type = DT_TOML_INT;
        dst->u.i = *src.value<int64_t>();
        break;
    case toml::node_type::floating_point:
        dst->type = DT_TOML_FLOAT;
        dst->u.f = *src.value<double>();
        break;
    case toml::node_type::boolean:
        dst->type = DT_TOML_BOOL;
        dst->u.b = *src.value<bool>() ? 1 : 0;
        break;
    case toml::node_type::date:
        dst->type = DT_TOML_DATE;
        break;
    case toml::node_type::time:
        dst->type = DT_TOML_TIME;
        break;
    default:
        dst->type = DT_TOML_DATETIME;
        break;
    }
}

void fill_error(dt_toml_error_t *err, int line, int col, std::string_view msg)
{
    if (!err)
        return;
    err->line = line;
    err->col = col;
    size_t n = std::min(msg.size(), sizeof err->msg - 1);
    std::memcpy(err->msg, msg.data(), n);
    err->msg[n] = '\0';
}

/* Parse into a fresh root; throws on a syntax error only when toml++ was
 * built with exceptions, so both configurations are handled here. */
int parse_impl(std::string_view doc, std::string_view source,
               dt_toml_node_t **out, dt_toml_error_t *err)
{
    *out = nullptr;
    dt_toml_node_t *root = nullptr;
    try {
#if TOML_EXCEPTIONS
        toml::table tbl;
        try {
            tbl = toml::parse(doc, source);
        } catch (const toml::parse_error &e) {
            fill_error(err, static_cast<int>(e.source().begin.line),
                       static_cast<int>(e.source().begin.column), e.description());
            return DT_ERR_CONFIG;
        }
#else
        toml::parse_result res = toml::parse(doc, source);
        if (!res) {
            const toml::parse_error &e = res.error();
            fill_error(err, static_cast<int>(e.source().begin.line),
                       static_cast<int>(e.source().begin.column), e.description());
            return DT_ERR_CONFIG;
        }
        toml::table tbl = std::move(res).table();
#endif
        root = alloc_nodes(1);
        convert(tbl, root);
        *out = root;
        return DT_OK;
    } catch (const std::bad_alloc &) {
        dt_toml_free(root);
        fill_error(err, 0, 0, "out of memory while parsing TOML");
        return DT_ERR_NOMEM;
    } catch (...) {
        dt_toml_free(root);
        fill_error(err, 0, 0, "internal error in the TOML parser");
        return DT_ERR_CONFIG;
    }
}

void free_children(dt_toml_node_t *n)
{
    std::free(n->key);
    if (n->type == DT_TOML_TABLE || n->type == DT_TOML_ARRAY) {
        for (size_t i = 0; i < n->u.children.n; i++)
            free_children(&n->u.children.items[i]);
        std::free(n->u.children.items);
    } else if (n->type == DT_TOML_STRING) {
        std::free(n->u.s);
    }
}

} // namespace

extern "C" int dt_toml_parse(const char *text, size_t len, const char *source,
                             dt_toml_node_t **out, dt_toml_error_t *err)
{
    if (err)
        fill_error(err, 0, 0, "");
    if (!out || (!text && len))
        return DT_ERR_INVALID;
    return parse_impl(std::string_view(text ? text : "", len),
                      std::string_view(source ? source : ""), out, err);
}

extern "C" int dt_toml_parse_value(const char *text, dt_toml_node_t **out)
{
    if (!out || !text)
        return DT_ERR_INVALID;
    *out = nullptr;
    dt_toml_node_t *root = nullptr;
    try {
        std::string doc = "v = ";
        doc += text;
        int rc = parse_impl(doc, "", &root, nullptr);
        if (rc != DT_OK)
            return rc;
        /* Exactly one value: "1\nx = 2" is two keys, not a value. */
        if (root->u.children.n != 1 || std::strcmp(root->u.children.items[0].key, "v") != 0) {
            dt_toml_free(root);
            return DT_ERR_CONFIG;
        }
        /* Detach the single child into its own allocation. */
        dt_toml_node_t *v = alloc_nodes(1);
        *v = root->u.children.items[0];
        std::free(v->key);
        v->key = nullptr;
        v->key_line = v->key_col = v->line = v->col = 0;
        std::free(root->u.children.items);
        std::free(root);
        *out = v;
        return DT_OK;
    } catch (...) {
        dt_toml_free(root);
        return DT_ERR_NOMEM;
    }
}

extern "C" void dt_toml_free(dt_toml_node_t *n)
{
    if (!n)
        return;
    free_children(n);
    std::free(n);
}

extern "C" const char *dt_toml_type_name(int type)
{
    switch (type) {
    case DT_TOML_TABLE: return "table";
    case DT_TOML_ARRAY: return "array";
    case DT_TOML_STRING: return "string";
    case DT_TOML_INT: return "integer";
    case DT_TOML_FLOAT: return "float";
    case DT_TOML_BOOL: return "boolean";
    case DT_TOML_DATE: return "date";
    case DT_TOML_TIME: return "time";
    case DT_TOML_DATETIME: return "date-time";
    default: return "unknown";
    }
}
