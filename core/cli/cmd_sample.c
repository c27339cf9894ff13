/*
 * core/cli/cmd_sample.c - `dtrain sample CKPT`: generate text from a
 * checkpoint's GPT-2 on a device plugin (run.device's default, cpu), one
 * position per token with a KV cache (core/model/generate.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_io.h"
#include "cli/cli.h"
#include "cli/cli_model.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "util/error.h"
#include "util/log.h"

/* dtrain's own tokenizer (`dtrain data prepare`) is byte-level: a
 * vocabulary of 256 is read as bytes, any other as token ids. */
#define BYTE_VOCAB 256

void dt_help_sample(FILE *f)
{
    fprintf(f,
            "usage: dtrain sample CKPT [--prompt TEXT] [--tokens N] [--temperature T]\n"
            "                          [--top-k K] [--seed S] [--ids] [--tokenizer JSON]\n\n"
            "Generate N tokens (default 64) after TEXT from the GPT-2 of checkpoint CKPT (a\n"
            "checkpoint directory, or a checkpoint root meaning its newest complete one),\n"
            "on the cpu device plugin with a KV cache: each token runs one position.\n\n"
            "A byte-level model (vocab_size 256, what 'dtrain data prepare' makes) reads\n"
            "TEXT as bytes and prints the prompt and the continuation as text.  Any other\n"
            "reads TEXT as token ids (\"464 2068 7586\", spaces or commas) and prints ids.\n"
            "Without --prompt it starts from one token: a newline for a byte-level model,\n"
            "else the last id of the vocabulary (GPT-2's <|endoftext|> is 50256).\n"
            "--ids prints token ids for a byte-level model too.  With --tokenizer (the\n"
            "Hugging Face tokenizer.json the data was prepared with: 'dtrain data prepare\n"
            "--tokenizer'), TEXT is encoded by it and the output decoded to text.  The\n"
            "prompt and the continuation together must fit the model's context.\n\n"
            "  --temperature T  0 picks the most likely token (greedy, deterministic);\n"
            "                   else logits / T are sampled (default 1.0)\n"
            "  --top-k K        sample only among the K most likely tokens (default 0: all;\n"
            "                   1 is greedy)\n"
            "  --seed S         the draws depend on S alone (default 1337)\n"
            "exit codes: 0 done, 1 unreadable or corrupt checkpoint or a device failure,\n"
            "2 usage error (bad option, prompt or length)\n");
}

static int usage(const char *why)
{
    fprintf(stderr, "dtrain sample: error: %s (see dtrain sample --help)\n", why);
    return DT_EXIT_USAGE;
}

static int parse_i64(const char *opt, const char *v, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo) {
        char why[256];
        snprintf(why, sizeof why, "%s '%s' is not an integer >= %lld", opt, v, (long long)lo);
        return usage(why);
    }
    *out = x;
    return DT_EXIT_OK;
}

typedef struct sample_args {
    const char *ckpt, *prompt, *tokenizer;
    int64_t tokens;
    dt_pick_opts_t pick;
    int ids;
} sample_args_t;

static int parse(int argc, char **argv, sample_args_t *a)
{
    *a = (sample_args_t){.tokens = 64, .pick = {.temperature = 1.0, .top_k = 0, .seed = 1337}};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int takes = strcmp(o, "--prompt") == 0 || strcmp(o, "--tokens") == 0 ||
                    strcmp(o, "--tokenizer") == 0 ||
                    strcmp(o, "--temperature") == 0 || strcmp(o, "--top-k") == 0 ||
                    strcmp(o, "--seed") == 0;
        if (takes && i + 1 == argc) {
            char why[128];
            snprintf(why, sizeof why, "%s needs a value", o);
            return usage(why);
        }
        int ec = DT_EXIT_OK;
        int64_t v;
        if (strcmp(o, "--prompt") == 0) {
            a->prompt = argv[++i];
        } else if (strcmp(o, "--tokenizer") == 0) {
            a->tokenizer = argv[++i];
        } else if (strcmp(o, "--tokens") == 0) {
            ec = parse_i64(o, argv[++i], 1, &a->tokens);
        } else if (strcmp(o, "--top-k") == 0) {
            ec = parse_i64(o, argv[++i], 0, &a->pick.top_k);
        } else if (strcmp(o, "--seed") == 0) {
            if (!(ec = parse_i64(o, argv[++i], 0, &v)))
                a->pick.seed = (uint64_t)v;
        } else if (strcmp(o, "--temperature") == 0) {
            char *end;
            const char *s = argv[++i];
            a->pick.temperature = strtod(s, &end);
            if (end == s || *end || !(a->pick.temperature >= 0) ||
                a->pick.temperature > 1e6) {
                char why[256];
                snprintf(why, sizeof why, "--temperature '%s' is not a number in [0, 1e6]", s);
                return usage(why);
            }
        } else if (strcmp(o, "--ids") == 0) {
            a->ids = 1;
        } else if (o[0] == '-' && o[1]) {
            char why[256];
            snprintf(why, sizeof why, "unknown option '%s'", o);
            return usage(why);
        } else if (a->ckpt) {
            char why[256];
            snprintf(why, sizeof why, "unexpected argument '%s'", o);
            return usage(why);
        } else {
            a->ckpt = o;
        }
        if (ec)
            return ec;
    }
    return a->ckpt ? DT_EXIT_OK : usage("missing CKPT");
}

/* The prompt encoded by the tokenizer (ids checked against V); no prompt:
 * the last id of the vocabulary, as without one. */
static int prompt_encoded(const dt_tokenizer_t *tok, const char *p, int64_t V, int32_t **out,
                          int64_t *n)
{
    dt_token_vec_t v = {0};
    int rc = p && *p ? dt_tokenizer_encode(tok, p, strlen(p), 1, NULL, NULL, &v) : DT_OK;
    if (rc) {
        dt_token_vec_free(&v);
        return dt_cli_fail("sample", rc);
    }
    *out = malloc((v.n ? v.n : 1) * sizeof **out);
    if (!*out) {
        dt_token_vec_free(&v);
        fprintf(stderr, "dtrain sample: error: out of memory\n");
        return DT_EXIT_RUNTIME;
    }
    *n = 0;
    if (!v.n)
        (*out)[(*n)++] = (int32_t)(V - 1);
    for (size_t i = 0; i < v.n; i++) {
        if ((int64_t)v.ids[i] >= V) {
            char why[256];
            snprintf(why, sizeof why, "--prompt: the tokenizer gives id %u, outside this "
                     "model's vocabulary of %lld (another tokenizer than the data's?)",
                     v.ids[i], (long long)V);
            dt_token_vec_free(&v);
            free(*out);
            *out = NULL;
            return usage(why);
        }
        (*out)[(*n)++] = (int32_t)v.ids[i];
    }
    dt_token_vec_free(&v);
    return DT_EXIT_OK;
}

/* The prompt as tokens (malloc'd): bytes, or ids in [0, V). */
static int prompt_tokens(const sample_args_t *a, int64_t V, int32_t **out, int64_t *n)
{
    const int bytes = V == BYTE_VOCAB;
    const char *p = a->prompt;
    size_t len = p ? strlen(p) : 0;
    int32_t *t = malloc((len ? len : 1) * sizeof *t);
    if (!t) {
        fprintf(stderr, "dtrain sample: error: out of memory\n");
        return DT_EXIT_RUNTIME;
    }
    *n = 0;
    if (!p || !p[0]) {
        t[(*n)++] = bytes ? '\n' : (int32_t)(V - 1);
    } else if (bytes) {
        for (size_t i = 0; i < len; i++)
            t[(*n)++] = (unsigned char)p[i];
    } else {
        while (*p) {
            if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
                p++;
                continue;
            }
            char *end;
            errno = 0;
            long long id = strtoll(p, &end, 10);
            if (end == p || errno || id < 0 || id >= V ||
                (*end && *end != ' ' && *end != ',' && *end != '\t' && *end != '\n')) {
                char why[256];
                snprintf(why, sizeof why,
                         "--prompt: '%.*s' is not a token id in [0, %lld) (this model's "
                         "vocabulary is not byte-level, so the prompt is token ids)",
                         (int)strcspn(p, " ,\t\n"), p, (long long)V);
                free(t);
                return usage(why);
            }
            t[(*n)++] = (int32_t)id;
            p = end;
        }
        if (!*n) {
            free(t);
            return usage("--prompt holds no token id");
        }
    }
    *out = t;
    return DT_EXIT_OK;
}

typedef struct out_fmt {
    int ids;
    int first; /* no separator before the next id */
    const dt_tokenizer_t *tok; /* text by the tokenizer */
} out_fmt_t;

static void emit(void *arg, int32_t token)
{
    out_fmt_t *o = arg;
    size_t n = 0;
    const char *text = o->tok && !o->ids ? dt_tokenizer_token(o->tok, (uint32_t)token, &n)
                                         : NULL;
    if (text)
        fwrite(text, 1, n, stdout);
    else if (o->ids || o->tok) /* an id no token has: shown as an id */
        printf(o->first ? "%d" : " %d", (int)token);
    else
        putchar(token);
    o->first = 0;
    fflush(stdout);
}

/* Everything the command holds, released by release(). */
typedef struct sample_run {
    dt_cli_model_t cm;
    dt_ckpt_reader_t *rd;
    dt_device_t *dev; /* starts with its table */
    dt_stream_t *stream;
    dt_model_t *model; /* cm's */
    void **params;
    uint32_t n_units;
    dt_decoder_t *dec;
    dt_pick_t pick;
    int32_t *prompt;
    dt_tokenizer_t *tok;
} sample_run_t;

static void release(sample_run_t *s)
{
    dt_pick_free(&s->pick);
    dt_decoder_free(s->dec);
    for (uint32_t u = 0; s->params && u < s->n_units; u++)
        if (s->params[u])
            dt_device_ops(s->dev)->free(s->dev, s->params[u]);
    free(s->params);
    if (s->stream)
        dt_device_ops(s->dev)->stream_destroy(s->dev, s->stream);
    if (s->dev)
        dt_device_ops(s->dev)->finalize(s->dev);
    dt_cli_model_close(&s->cm);
    dt_ckpt_close(s->rd);
    free(s->prompt);
    dt_tokenizer_free(s->tok);
}

/* The checkpoint's model on the device with its weights: the [model]
 * table from the manifest, the device plugin loaded as `dtrain run` loads
 * it, every unit's parameters copied to device memory. */
static int load_model(sample_run_t *s, const char *dir)
{
    char sets[DT_MODEL_MAX_KEYS + 1][96];
    const char *setp[DT_MODEL_MAX_KEYS + 1];
    int n = 0, rc;
    if ((rc = dt_ckpt_open(dir, &s->rd)) ||
        (rc = dt_ckpt_model_sets(s->rd, dir, sets, DT_MODEL_MAX_KEYS + 1, &n)))
        return rc;
    for (int i = 0; i < n; i++)
        setp[i] = sets[i];
    char origin[4200];
    snprintf(origin, sizeof origin, "checkpoint '%s'", dir);
    if ((rc = dt_cli_model_open(&s->cm, setp, n, origin)))
        return rc;
    s->model = s->cm.model;
    const dt_plugin_t *p = s->cm.dev;
    const dt_device_ops_t *table = p->ops;
    const dt_device_init_t da = {.struct_size = sizeof da, .local_size = 1, .device_index = -1};
    dt_err_clear();
    if ((rc = table->init(p->host, &da, &s->dev))) {
        s->dev = NULL;
        return dt_plugin_failed(p, rc, "init");
    }
    if ((rc = dt_plugin_check_instance(p, table, s->dev))) {
        s->dev = NULL;
        return rc;
    }
    if ((rc = dt_device_ops(s->dev)->stream_create(s->dev, &s->stream))) {
        s->stream = NULL;
        return dt_plugin_failed(p, rc, "stream_create");
    }
    if (!DT_HAS_OP(dt_model_ops_v1_t, dt_model_ops(s->model), decoder_create))
        return dt_err_set(DT_ERR_UNSUPPORTED,
                          "checkpoint '%s' holds an arch = \"%s\" model: generation needs a "
                          "model plugin with a decoder (gpt2 and llama have one)",
                          dir, dt_model_info(s->model)->arch);
    const dt_model_desc_t *d = dt_model_desc(s->model);
    if ((rc = dt_ckpt_check_tensors(dir, s->rd, d)))
        return rc;
    s->n_units = d->n_units;
    if (!(s->params = calloc(d->n_units, sizeof *s->params)))
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    for (uint32_t u = 0; u < d->n_units && !rc; u++) {
        float *host = malloc((d->units[u].numel ? d->units[u].numel : 1) * sizeof *host);
        if (!host)
            return dt_err_set(DT_ERR_NOMEM, "out of memory reading unit %s", d->units[u].name);
        const uint64_t bytes = d->units[u].numel * sizeof *host;
        if (!(rc = dt_ckpt_read_unit_params(s->rd, dir, d, u, host)) &&
            !(rc = dt_device_ops(s->dev)->alloc(s->dev, bytes, DT_TAG_PARAMS, &s->params[u])) &&
            !(rc = dt_device_ops(s->dev)->memcpy_async(s->dev, s->params[u], host, bytes,
                                                       DT_COPY_H2D, s->stream)))
            rc = dt_device_ops(s->dev)->stream_sync(s->dev, s->stream);
        free(host);
    }
    return rc;
}

int dt_cmd_sample(int argc, char **argv)
{
    sample_args_t a;
    int ec = parse(argc, argv, &a);
    if (ec)
        return ec;
    char dir[4096];
    sample_run_t s = {0};
    dt_log_set_rank(0); /* one process: the device's log lines are rank 0's */
    /* what sample prints is the text: the device's info line ("cpu (2
     * threads, ...)") only when DTRAIN_LOG asks for it */
    if (!getenv("DTRAIN_LOG"))
        dt_log_set_level(DT_LOG_WARN);
    int rc = dt_cli_ckpt_dir(a.ckpt, dir, sizeof dir);
    if (!rc && a.tokenizer)
        rc = dt_tokenizer_load(a.tokenizer, &s.tok);
    if (!rc)
        rc = load_model(&s, dir);
    if (rc) {
        release(&s);
        return dt_cli_fail("sample", rc);
    }
    const dt_model_info_t *mi = dt_model_info(s.model);
    int64_t n_prompt = 0;
    if (s.tok && dt_tokenizer_vocab_size(s.tok) > (uint32_t)mi->vocab_size)
        fprintf(stderr, "dtrain sample: warning: the tokenizer has %u ids, the model %lld: "
                        "ids past the model's are never produced\n",
                dt_tokenizer_vocab_size(s.tok), (long long)mi->vocab_size);
    if ((ec = s.tok ? prompt_encoded(s.tok, a.prompt, mi->vocab_size, &s.prompt, &n_prompt)
                    : prompt_tokens(&a, mi->vocab_size, &s.prompt, &n_prompt))) {
        release(&s);
        return ec;
    }
    if (n_prompt + a.tokens > mi->context) {
        fprintf(stderr,
                "dtrain sample: error: the prompt (%lld tokens) and --tokens %lld make %lld, "
                "more than the context of %lld positions the model in '%s' was built for\n",
                (long long)n_prompt, (long long)a.tokens, (long long)(n_prompt + a.tokens),
                (long long)mi->context, dir);
        release(&s);
        return DT_EXIT_USAGE;
    }
    const dt_model_ctx_t ctx = {.dev = s.dev, .stream = s.stream};
    out_fmt_t fmt = {.ids = a.ids || (!s.tok && mi->vocab_size != BYTE_VOCAB), .first = 1,
                     .tok = s.tok};
    if (!(rc = dt_decoder_create(s.model, &ctx, s.params, n_prompt + a.tokens - 1, &s.dec)) &&
        !(rc = dt_pick_init(&s.pick, &a.pick, mi->vocab_size))) {
        for (int64_t i = 0; i < n_prompt; i++)
            emit(&fmt, s.prompt[i]);
        rc = dt_generate(s.dec, &s.pick, s.prompt, n_prompt, a.tokens, NULL, emit, &fmt);
        putchar('\n');
    }
    release(&s);
    return rc ? dt_cli_fail("sample", rc) : DT_EXIT_OK;
}
