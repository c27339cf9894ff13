/*
 * tests/unit/core/ckpt/test_safetensors.c - the safetensors writer checked by an
 * independent parser (/usr/bin/python3 with json + struct), writer misuse,
 * and a full disk during export; and the tests' own reader
 * (tests/support/safetensors_read.h, which the model tests load their
 * reference files with) on a file Python wrote and on malformed files;
 * dtrain's own reader's rule that the tensors tile the data buffer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtrain/tensor.h"
#include "util/fileutil.h"
#include "ckpt/safetensors.h"
#include "safetensors_read.h"
#include "util/error.h"
#include "test_assert.h"
#include "test_hooks.h"

#define PYTHON "/usr/bin/python3"

static char g_dir[256];

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_st.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    dt_fileutil_test_fail_after(-1);
    return dt_fileutil_rm_rf(g_dir);
}

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* Run `script` (written to a temp file) with /usr/bin/python3 and `arg`;
 * returns its exit status.  Skips the test when python is absent. */
static int run_python(const char *script, const char *arg)
{
    if (access(PYTHON, X_OK) != 0)
        skip();
    char sp[512], cmd[1400];
    path_of(sp, sizeof sp, "check.py");
    assert_int_equal(dt_fileutil_write_atomic(sp, script, strlen(script)),
                     DT_OK);
    snprintf(cmd, sizeof cmd, PYTHON " '%s' '%s'", sp, arg);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* The values the round trip uses (exact in f32). */
static float wte_val(int i) { return (float)i * 0.5f - 3.0f; }

static void test_write_checked_by_python(void **state)
{
    char p[512];
    path_of(p, sizeof p, "model.safetensors");
    dt_safetensors_writer_t *w;
    assert_int_equal(dt_safetensors_writer_open(p, &w), DT_OK);
    int64_t wte_shape[2] = {5, 7}, ids_shape[1] = {3}, half_shape[1] = {4},
            empty_shape[2] = {0, 3};
    assert_int_equal(dt_safetensors_declare(w, "wte", DT_F32, 2, wte_shape),
                     DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "scalar", DT_F32, 0, NULL),
                     DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "ids", DT_I64, 1, ids_shape),
                     DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "empty", DT_F32, 2, empty_shape),
                     DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "half", DT_BF16, 1, half_shape),
                     DT_OK);
    assert_int_equal(dt_safetensors_set_meta(w, "format", "pt"), DT_OK);
    assert_int_equal(dt_safetensors_set_meta(w, "dtrain_step", "122"), DT_OK);
    assert_int_equal(dt_safetensors_set_meta(w, "dtrain_step", "123"), DT_OK);

    float wte[35];
    for (int i = 0; i < 35; i++)
        wte[i] = wte_val(i);
    /* streamed in pieces that split floats */
    assert_int_equal(dt_safetensors_write(w, wte, 5), DT_OK);
    assert_int_equal(dt_safetensors_write(w, (char *)wte + 5, 60), DT_OK);
    assert_int_equal(dt_safetensors_write(w, (char *)wte + 65, 75), DT_OK);
    float sc = 42.0f;
    int64_t ids[3] = {-1, 0, (int64_t)1 << 40};
    uint16_t half[4] = {0x3f80, 0xc000, 0x0000, 0x7f80}; /* 1, -2, 0, inf */
    assert_int_equal(dt_safetensors_write(w, &sc, 4), DT_OK);
    assert_int_equal(dt_safetensors_write(w, ids, sizeof ids), DT_OK);
    assert_int_equal(dt_safetensors_write(w, half, sizeof half), DT_OK);
    assert_int_equal(dt_safetensors_commit(w), DT_OK);

    static const char script[] =
        "import json, struct, sys\n"
        "b = open(sys.argv[1], 'rb').read()\n"
        "n = struct.unpack('<Q', b[:8])[0]\n"
        "assert n % 8 == 0, n\n"
        "raw = b[8:8 + n].decode('utf-8')\n"
        "js = raw.rstrip(' ')\n"
        "assert js.endswith('}') and len(raw) - len(js) < 8, repr(raw[-10:])\n"
        "h = json.loads(js)\n"
        "data = b[8 + n:]\n"
        "assert h.pop('__metadata__') == {'format': 'pt', 'dtrain_step': '123'}\n"
        "want = [('wte', 'F32', [5, 7], 140), ('scalar', 'F32', [], 4),\n"
        "        ('ids', 'I64', [3], 24), ('empty', 'F32', [0, 3], 0),\n"
        "        ('half', 'BF16', [4], 8)]\n"
        "assert list(h) == [w[0] for w in want], list(h)\n"
        "at = 0\n"
        "for name, dt, shape, nb in want:\n"
        "    t = h[name]\n"
        "    assert set(t) == {'dtype', 'shape', 'data_offsets'}, t\n"
        "    assert t['dtype'] == dt and t['shape'] == shape, t\n"
        "    assert t['data_offsets'] == [at, at + nb], (name, t)\n"
        "    at += nb\n"
        "assert at == len(data), (at, len(data))\n"
        "def get(name, fmt):\n"
        "    s, e = h[name]['data_offsets']\n"
        "    return list(struct.unpack('<%d%s' % ((e - s) // struct.calcsize(fmt), fmt), data[s:e]))\n"
        "assert get('wte', 'f') == [i * 0.5 - 3.0 for i in range(35)]\n"
        "assert get('scalar', 'f') == [42.0]\n"
        "assert get('ids', 'q') == [-1, 0, 1 << 40]\n"
        "assert get('half', 'H') == [0x3f80, 0xc000, 0, 0x7f80]\n"
        "print('safetensors ok')\n";
    assert_int_equal(run_python(script, p), 0);

    /* and our own reader agrees */
    dt_test_st_t *st;
    assert_int_equal(dt_test_st_open(p, &st), DT_OK);
    assert_int_equal(dt_test_st_count(st), 5);
    const dt_test_st_tensor_t *t = dt_test_st_find(st, "wte");
    assert_non_null(t);
    assert_int_equal(t->dtype, DT_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 7);
    assert_int_equal(t->numel, 35);
    assert_memory_equal(t->data, wte, sizeof wte);
    t = dt_test_st_find(st, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    t = dt_test_st_find(st, "empty");
    assert_int_equal(t->numel, 0);
    assert_int_equal(t->nbytes, 0);
    assert_string_equal(dt_test_st_at(st, 4)->name, "half");
    assert_string_equal(dt_test_st_meta(st, "dtrain_step"), "123");
    assert_null(dt_test_st_meta(st, "nope"));
    assert_null(dt_test_st_find(st, "nope"));
    dt_test_st_close(st);
}

static void test_read_python_file(void **state)
{
    /* Python writes tensors in an order different from their offsets, with
     * no metadata and the header padded. */
    static const char script[] =
        "import json, struct, sys\n"
        "a = struct.pack('<6f', *[1.5, -2.0, 3.25, 0.0, 7.0, -0.5])\n"
        "b = struct.pack('<3i', 7, -8, 9)\n"
        "h = {'b': {'dtype': 'I32', 'shape': [3], 'data_offsets': [0, 12]},\n"
        "     'a': {'dtype': 'F32', 'shape': [2, 3], 'data_offsets': [12, 36]}}\n"
        "js = json.dumps(h).encode()\n"
        "js += b' ' * (-len(js) % 8)\n"
        "open(sys.argv[1], 'wb').write(struct.pack('<Q', len(js)) + js + b + a)\n";
    char p[512];
    path_of(p, sizeof p, "py.safetensors");
    assert_int_equal(run_python(script, p), 0);
    dt_test_st_t *st;
    if (dt_test_st_open(p, &st) != DT_OK)
        fail_msg("%s", dt_last_error());
    assert_int_equal(dt_test_st_count(st), 2);
    const dt_test_st_tensor_t *a = dt_test_st_find(st, "a");
    const dt_test_st_tensor_t *b = dt_test_st_find(st, "b");
    float av[6], aw[6] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
    int32_t bv[3], bw[3] = {7, -8, 9};
    assert_int_equal(a->nbytes, sizeof av);
    memcpy(av, a->data, sizeof av);
    memcpy(bv, b->data, sizeof bv);
    assert_memory_equal(av, aw, sizeof av);
    assert_memory_equal(bv, bw, sizeof bv);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(b->dtype, DT_I32);
    dt_test_st_close(st);
}

/* Write a file: u64 length of `hdr`, `hdr`, then `ndata` zero bytes. */
static void write_st(const char *p, const char *hdr, size_t ndata)
{
    size_t hl = strlen(hdr);
    size_t n = 8 + hl + ndata;
    unsigned char *b = calloc(1, n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    assert_int_equal(dt_fileutil_write_atomic(p, b, n), DT_OK);
    free(b);
}

static void test_reader_errors(void **state)
{
    char p[512];
    path_of(p, sizeof p, "bad.safetensors");
    dt_test_st_t *st = (void *)1;
    struct {
        const char *hdr;
        size_t ndata;
        const char *msg;
    } cases[] = {
        {"[1, 2]   ", 0, "header does not start with '{'"},
        {"{\"a\": 1", 0, "header is not a JSON object"},
        {"{\"a\": {\"dtype\": \"F8_E4M3\", \"shape\": [1], "
         "\"data_offsets\": [0, 1]}}", 1,
         "tensor a: missing or unsupported dtype F8_E4M3"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
         "\"data_offsets\": [0, 4]}}", 4,
         "tensor a: data_offsets span 4 bytes but shape and dtype need 8"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
         "\"data_offsets\": [0, 8]}}", 4,
         "tensor a: data_offsets missing or outside the 4-byte data buffer"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
         "\"data_offsets\": [4, 8]}}", 8,
         "tensor a: data starts at byte 4, expected 0 (hole before it)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
         8, "tensor b: data starts at byte 4, expected 8 (overlaps the previous)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
         "\"data_offsets\": [0, 4]}}", 12, "tensors cover 4 of 12 data bytes"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], "
         "\"data_offsets\": [0, 4]}}", 4, "tensor a: bad shape"},
        {"{\"__metadata__\": {\"k\": 3}}", 0,
         "__metadata__ value 'k' is not a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_st(p, cases[i].hdr, cases[i].ndata);
        assert_int_equal(dt_test_st_open(p, &st), DT_ERR_DATA);
        assert_null(st);
        char want[800];
        snprintf(want, sizeof want, "safetensors '%s': %s", p, cases[i].msg);
        assert_msg_has(want);
    }
    /* length field larger than the file */
    unsigned char b[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    assert_int_equal(dt_fileutil_write_atomic(p, b, sizeof b), DT_OK);
    assert_int_equal(dt_test_st_open(p, &st), DT_ERR_DATA);
    assert_msg_has("header length 65535 exceeds the file (16 bytes)");
    assert_int_equal(dt_fileutil_write_atomic(p, b, 5), DT_OK);
    assert_int_equal(dt_test_st_open(p, &st), DT_ERR_DATA);
    assert_msg_has("truncated: 5 bytes, the header length alone needs 8");
    path_of(p, sizeof p, "missing.safetensors");
    assert_int_equal(dt_test_st_open(p, &st), DT_ERR_NOT_FOUND);
    assert_msg_has("missing.safetensors': No such file or directory");
    /* an empty model is valid */
    path_of(p, sizeof p, "empty.safetensors");
    write_st(p, "{}      ", 0);
    assert_int_equal(dt_test_st_open(p, &st), DT_OK);
    assert_int_equal(dt_test_st_count(st), 0);
    dt_test_st_close(st);
}

/* dtrain's own reader (core/ckpt/safetensors.h, what `dtrain import`
 * opens): the tensors' data_offsets must tile the data buffer exactly, in
 * whatever order the header lists them; an overlap, a hole (at the start,
 * between two tensors, or bytes left after the last) and a span that does
 * not fit its shape and dtype are refused naming the tensor and the
 * bytes.  Before the tiling check, the overlap and hole cases opened. */
static void test_core_reader_spans(void **state)
{
    (void)state;
    char p[512];
    path_of(p, sizeof p, "spans.safetensors");
    dt_safetensors_reader_t *r = (void *)1;
    /* valid: listed out of order, with a zero-sized tensor between two */
    write_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]},"
                " \"z\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]},"
                " \"b\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
             12);
    assert_ok(dt_safetensors_open(p, &r));
    assert_int_equal(dt_safetensors_count(r), 3);
    assert_int_equal(dt_safetensors_find(r, "a")->nbytes, 8);
    dt_safetensors_close(r);
    static const struct {
        const char *hdr;
        size_t ndata;
        const char *msg; /* after "safetensors '<path>': " */
    } cases[] = {
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8,
         "tensor b: data_offsets [4, 8] overlap tensor a's [0, 8]"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12,
         "tensor b: data_offsets [4, 12] overlap tensor a's [0, 8]"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8,
         "tensor a: data_offsets [4, 8] leave a hole: no tensor holds data bytes [0, 4)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 12,
         "tensor b: data_offsets [8, 12] leave a hole: no tensor holds data bytes [4, 8) after "
         "tensor a's [0, 4]"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 12,
         "the tensors hold 4 of the 12 data bytes: no tensor holds bytes [4, 12) after tensor "
         "a's [0, 4]"},
        {"{\"__metadata__\": {\"k\": \"v\"}}", 4,
         "the tensors hold none of the 4 data bytes"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4,
         "tensor a: 4 bytes of data for 2 F32 elements (8 bytes)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4,
         "tensor a: data_offsets lie outside the 4 bytes of data"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_st(p, cases[i].hdr, cases[i].ndata);
        assert_status(dt_safetensors_open(p, &r), DT_ERR_DATA);
        assert_null(r);
        char want[800];
        snprintf(want, sizeof want, "safetensors '%s': %s", p, cases[i].msg);
        assert_msg(want);
    }
}

static void test_writer_misuse(void **state)
{
    char p[512];
    path_of(p, sizeof p, "misuse.safetensors");
    int64_t shape[1] = {2};
    float x[3] = {1, 2, 3};
    dt_safetensors_writer_t *w;

    assert_int_equal(dt_safetensors_writer_open(p, &w), DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "a", DT_F32, 1, shape), DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "a", DT_F32, 1, shape),
                     DT_ERR_INVALID);
    assert_msg_has("tensor name 'a' is empty, reserved or declared twice");
    assert_int_equal(dt_safetensors_declare(w, "__metadata__", DT_F32, 1, shape),
                     DT_ERR_INVALID);
    assert_int_equal(dt_safetensors_write(w, x, 12), DT_ERR_INVALID);
    assert_msg_has("12 bytes written past the 8 declared");
    assert_int_equal(dt_safetensors_write(w, x, 4), DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "b", DT_F32, 1, shape),
                     DT_ERR_INVALID);
    assert_msg_has("tensor b declared after data was written");
    assert_int_equal(dt_safetensors_set_meta(w, "k", "v"), DT_ERR_INVALID);
    /* committing short: refused, nothing published */
    assert_int_equal(dt_safetensors_commit(w), DT_ERR_INVALID);
    assert_msg_has("4 of 8 declared data bytes written");
    assert_int_equal(access(p, F_OK), -1);
    dt_test_assert_no_tmp(g_dir);
}

static void test_disk_full(void **state)
{
    char p[512];
    path_of(p, sizeof p, "full.safetensors");
    int64_t shape[1] = {1000};
    float *x = calloc(1000, sizeof *x);
    dt_safetensors_writer_t *w;
    /* a previous export */
    assert_int_equal(dt_safetensors_writer_open(p, &w), DT_OK);
    assert_int_equal(dt_safetensors_declare(w, "old", DT_F32, 1, shape), DT_OK);
    assert_int_equal(dt_safetensors_write(w, x, 4000), DT_OK);
    assert_int_equal(dt_safetensors_commit(w), DT_OK);

    int64_t budgets[] = {0, 20, 2000};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dt_safetensors_writer_open(p, &w), DT_OK);
        assert_int_equal(dt_safetensors_declare(w, "new", DT_F32, 1, shape),
                         DT_OK);
        dt_fileutil_test_fail_after(budgets[i]);
        int rc = dt_safetensors_write(w, x, 4000);
        if (rc == DT_OK) /* buffered: the failure comes at commit */
            rc = dt_safetensors_commit(w);
        else
            dt_safetensors_abort(w);
        dt_fileutil_test_fail_after(-1);
        assert_int_equal(rc, DT_ERR_IO);
        char want[700];
        snprintf(want, sizeof want, "writing '%s': No space left on device", p);
        assert_msg_has(want);
        dt_test_assert_no_tmp(g_dir);
        dt_test_st_t *st;
        assert_int_equal(dt_test_st_open(p, &st), DT_OK);
        assert_non_null(dt_test_st_find(st, "old"));
        dt_test_st_close(st);
    }
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_checked_by_python),
        cmocka_unit_test(test_read_python_file),
        cmocka_unit_test(test_reader_errors),
        cmocka_unit_test(test_core_reader_spans),
        cmocka_unit_test(test_writer_misuse),
        cmocka_unit_test(test_disk_full),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
