/*
 * core/cli/cmd_plot.c - `dtrain plot METRICS.jsonl -o FILE.png|svg`: the
 * curves of a run's metrics file (loss and validation loss, learning rate,
 * tokens/s, gradient norm against step) and its last memory record (peak
 * bytes by tag, planned beside measured), drawn by gnuplot.
 *
 * The metrics file is read here (one JSON object per line, as
 * core/train/train.c writes it); gnuplot gets a script on its stdin with
 * the numbers inline as datablocks and writes the image to its stdout,
 * which is written to FILE atomically: a failed plot leaves no file.  A
 * resumed run appends to its metrics file and repeats the steps after its
 * checkpoint: the later rows of a step replace the earlier ones.
 *
 * Nothing the user wrote reaches gnuplot as script.  The output path never
 * goes to gnuplot at all; the metrics file's name, the one user text in
 * the image (its title), goes through gp_quote: a single-quoted gnuplot
 * string, in which gnuplot expands nothing (no `command` substitution, no
 * @macro, no backslash escape; '' is a quote), on one line (control bytes
 * and invalid UTF-8 become '?'), drawn by terminals set `noenhanced` (no
 * ^_{}@& markup).  The memory record's tag names are kept to [a-z_] and
 * every other value is a number printed by printf.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "util/error.h"
#include "util/fileutil.h"
#include "util/utf8.h"

#define PLOT_W 1200
#define PLOT_H 900
#define PLOT_TIMEOUT_S 120      /* gnuplot gets this long for the whole plot */
#define PLOT_MAX_OUT (256u << 20) /* bytes of image accepted from gnuplot */
#define PLOT_TITLE_MAX 160        /* bytes of the metrics file's name in the title */

void dt_help_plot(FILE *f)
{
    fprintf(f,
            "usage: dtrain plot METRICS.jsonl -o FILE.png|FILE.svg\n\n"
            "Draw a run's metrics file (dtrain run --metrics, or run.metrics) as one\n"
            "%dx%d image: loss and validation loss, learning rate, tokens/s and\n"
            "gradient norm against step, and the peak memory of the last memory record\n"
            "by tag, planned beside measured.  The format follows FILE's extension;\n"
            "FILE's folder is made if missing, and only a regular file there is replaced.\n"
            "Needs gnuplot on PATH (Debian: gnuplot-nox; scripts/install-deps.sh\n"
            "installs it).\n\n"
            "exit codes: 0 written, 1 unreadable metrics or gnuplot failed, 2 usage\n",
            PLOT_W, PLOT_H);
}

/* The fields of a step's row. */
enum { F_STEP, F_LOSS, F_VAL, F_LR, F_TOK, F_NORM, F_COUNT };

/* One step's row; NAN where the metrics line has no such field. */
typedef struct row {
    double v[F_COUNT];
} row_t;

typedef struct metrics {
    row_t *rows;
    size_t n, cap;
    cJSON *memory; /* the last {"memory": ...} record's object; owned */
} metrics_t;

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Add a step line; a step at or before the last one (a resumed run went
 * back to its checkpoint) drops the rows it supersedes. */
static int add_row(metrics_t *m, const row_t *r)
{
    while (m->n > 0 && m->rows[m->n - 1].v[F_STEP] >= r->v[F_STEP])
        m->n--;
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 256;
        row_t *p = realloc(m->rows, cap * sizeof *p);
        if (!p)
            return dt_err_set(DT_ERR_NOMEM, "out of memory for %zu metrics rows", cap);
        m->rows = p;
        m->cap = cap;
    }
    m->rows[m->n++] = *r;
    return DT_OK;
}

static int load_metrics(const char *path, metrics_t *m)
{
    char *text = NULL;
    size_t len = 0;
    int rc = dt_fileutil_read_all(path, &text, &len);
    if (rc)
        return rc;
    char *line = text;
    for (int ln = 1; rc == DT_OK && line < text + len; ln++) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (line[strspn(line, " \t\r")] != '\0') {
            cJSON *o = cJSON_Parse(line);
            const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "memory");
            if (!cJSON_IsObject(o)) {
                rc = dt_err_set(DT_ERR_DATA, "%s:%d: not a JSON object", path, ln);
            } else if (cJSON_IsObject(mem)) {
                cJSON_Delete(m->memory);
                m->memory = cJSON_DetachItemFromObjectCaseSensitive(o, "memory");
            } else if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step"))) {
                row_t r = {{num(o, "step"), num(o, "loss"), num(o, "val_loss"), num(o, "lr"),
                            num(o, "tokens_per_s"), num(o, "grad_norm")}};
                rc = add_row(m, &r);
            }
            cJSON_Delete(o);
        }
        line = nl ? nl + 1 : text + len;
    }
    free(text);
    if (rc == DT_OK && m->n == 0)
        rc = dt_err_set(DT_ERR_DATA, "%s: no step records (lines with \"step\"): is it a "
                        "metrics file of dtrain run?", path);
    return rc;
}

/* Write text[0..n) as a gnuplot single-quoted string: the one quoting in
 * which gnuplot evaluates nothing (no `...` substitution, no @macro, no
 * backslash escapes); a quote is written twice.  Control bytes (a newline
 * would end the command) and bytes that are not UTF-8 become '?'. */
static void gp_quote(FILE *s, const char *text, size_t n)
{
    const unsigned char *p = (const unsigned char *)text;
    fputc('\'', s);
    for (size_t i = 0; i < n;) {
        size_t u = p[i] >= 0x80 ? dt_utf8_len(p + i, n - i) : 0;
        if (u) {
            fwrite(p + i, 1, u, s);
            i += u;
            continue;
        }
        if (p[i] == '\'')
            fputs("''", s);
        else
            fputc(p[i] < 0x20 || p[i] >= 0x7f ? '?' : p[i], s);
        i++;
    }
    fputc('\'', s);
}

/* A datablock of the rows' step and `field`, finite values only. */
static void datablock(FILE *s, const char *name, const metrics_t *m, size_t field)
{
    fprintf(s, "$%s << EOD\n", name);
    for (size_t i = 0; i < m->n; i++) {
        double v = m->rows[i].v[field];
        if (isfinite(v))
            fprintf(s, "%.17g %.17g\n", m->rows[i].v[F_STEP], v);
    }
    fprintf(s, "EOD\n");
}

static int has_field(const metrics_t *m, size_t field)
{
    for (size_t i = 0; i < m->n; i++)
        if (isfinite(m->rows[i].v[field]))
            return 1;
    return 0;
}

/* One panel: `title`, and the n series fields[i] (datablock blocks[i],
 * drawn with styles[i], key keys[i]) that have any value; "no data" when
 * none has. */
static void panel(FILE *s, const metrics_t *m, const char *title, const char *ylabel,
                  const size_t *fields, const char *const *keys, const char *const *blocks,
                  const char *const *styles, int n)
{
    fprintf(s, "set title ");
    gp_quote(s, title, strlen(title));
    fprintf(s, "\nset ylabel ");
    gp_quote(s, ylabel, strlen(ylabel));
    fprintf(s, "\n");
    int any = 0;
    for (int i = 0; i < n; i++)
        any |= has_field(m, fields[i]);
    if (!any) {
        fprintf(s, "set label 1 'no data' at graph 0.5, 0.5 center\n"
                   "plot [0:1] [0:1] NaN notitle\nunset label 1\n");
        return;
    }
    fprintf(s, "plot ");
    for (int i = 0, k = 0; i < n; i++)
        if (has_field(m, fields[i])) {
            fprintf(s, "%s$%s using 1:2 with %s title ", k++ ? ", " : "", blocks[i], styles[i]);
            gp_quote(s, keys[i], strlen(keys[i]));
        }
    fprintf(s, "\n");
}

/* The memory panel: every tag with bytes planned or measured, in MiB. */
static void memory_panel(FILE *s, const metrics_t *m)
{
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(m->memory, "peak_bytes");
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(m->memory, "planned_bytes");
    const cJSON *rank = cJSON_GetObjectItemCaseSensitive(m->memory, "rank");
    fprintf(s, "set title 'peak memory by tag, rank %d (MiB)'\nset ylabel 'MiB'\n"
               "unset xlabel\n",
            cJSON_IsNumber(rank) ? rank->valueint : 0);
    fprintf(s, "$memory << EOD\n");
    int n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, peak)
    {
        double measured = cJSON_IsNumber(t) ? t->valuedouble : 0;
        double planned = num(plan, t->string);
        if (!isfinite(planned))
            planned = 0;
        if (measured <= 0 && planned <= 0)
            continue;
        /* tag names are the core's ([a-z_]+); anything else is dropped */
        if (strspn(t->string, "abcdefghijklmnopqrstuvwxyz_") != strlen(t->string))
            continue;
        fprintf(s, "%s %.9g %.9g\n", t->string, planned / 1048576.0, measured / 1048576.0);
        n++;
    }
    fprintf(s, "EOD\n");
    if (n == 0) {
        fprintf(s, "set label 1 'no memory record' at graph 0.5, 0.5 center\n"
                   "plot [0:1] [0:1] NaN notitle\nunset label 1\n");
        return;
    }
    fprintf(s, "set style data histograms\nset style histogram clustered gap 1\n"
               "set style fill solid 0.7 border -1\nset boxwidth 0.9\nset yrange [0:*]\n"
               "set xtics rotate by -30\n"
               "plot $memory using 2:xtic(1) title 'planned', '' using 3 title 'measured'\n");
}

/* The whole script: terminal, datablocks, then the five panels. */
static char *build_script(const metrics_t *m, const char *input, int svg, size_t *len)
{
    char *buf = NULL;
    FILE *s = open_memstream(&buf, len);
    if (!s)
        return NULL;
    if (svg)
        fprintf(s, "set terminal svg size %d,%d fixed noenhanced font 'sans,10'\n", PLOT_W,
                PLOT_H);
    else
        fprintf(s, "set terminal pngcairo size %d,%d noenhanced font 'sans,9'\n", PLOT_W,
                PLOT_H);
    datablock(s, "loss", m, F_LOSS);
    datablock(s, "val", m, F_VAL);
    datablock(s, "lr", m, F_LR);
    datablock(s, "tok", m, F_TOK);
    datablock(s, "norm", m, F_NORM);
    /* the title names the file as a string gnuplot only draws (gp_quote):
     * a long name keeps its end, where the file's own name is */
    char title[PLOT_TITLE_MAX + 128];
    size_t name_len = strlen(input);
    const char *name = input;
    if (name_len > PLOT_TITLE_MAX) {
        name = input + name_len - PLOT_TITLE_MAX;
        while ((*name & 0xc0) == 0x80) /* not inside a UTF-8 sequence */
            name++;
    }
    snprintf(title, sizeof title, "dtrain: %s%s (steps %.0f-%.0f)", name == input ? "" : "...",
             name, m->rows[0].v[F_STEP], m->rows[m->n - 1].v[F_STEP]);
    fprintf(s, "set multiplot layout 3,2 title ");
    gp_quote(s, title, strlen(title));
    fprintf(s, "\n");
    fprintf(s, "set grid\nset key top right\nset xlabel 'step'\n");
    static const char *const lines = "lines", *const points = "linespoints pt 7 ps 0.6";
    panel(s, m, "loss", "loss", (const size_t[]){F_LOSS, F_VAL},
          (const char *const[]){"loss", "val loss"}, (const char *const[]){"loss", "val"},
          (const char *const[]){lines, points}, 2);
    panel(s, m, "learning rate", "lr", (const size_t[]){F_LR}, (const char *const[]){"lr"},
          (const char *const[]){"lr"}, (const char *const[]){lines}, 1);
    panel(s, m, "throughput", "tokens/s", (const size_t[]){F_TOK},
          (const char *const[]){"tokens/s"}, (const char *const[]){"tok"},
          (const char *const[]){lines}, 1);
    panel(s, m, "gradient norm", "norm", (const size_t[]){F_NORM},
          (const char *const[]){"grad norm"}, (const char *const[]){"norm"},
          (const char *const[]){lines}, 1);
    memory_panel(s, m);
    fprintf(s, "unset multiplot\n");
    if (fclose(s) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Feed `script` to gnuplot's stdin and collect its stdout (stderr is
 * the user's), within PLOT_TIMEOUT_S; gnuplot is killed when it runs
 * over.  *out is malloc'd. */
static int run_gnuplot(const char *script, size_t len, char **out, size_t *out_len)
{
    int in[2], op[2];
    if (pipe2(in, O_CLOEXEC) != 0)
        return dt_err_set(DT_ERR_SYSTEM, "plot: pipe: %s", strerror(errno));
    if (pipe2(op, O_CLOEXEC) != 0) {
        int err = errno;
        close(in[0]);
        close(in[1]);
        return dt_err_set(DT_ERR_SYSTEM, "plot: pipe: %s", strerror(err));
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(op[1], 1);
        char *const argv[] = {"gnuplot", NULL};
        execvp(argv[0], argv);
        _exit(127);
    }
    int err = errno;
    close(in[0]);
    close(op[1]);
    if (pid < 0) {
        close(in[1]);
        close(op[0]);
        return dt_err_set(DT_ERR_SYSTEM, "plot: fork: %s", strerror(err));
    }
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe;
    sigaction(SIGPIPE, &ign, &old_pipe); /* gnuplot may exit before reading it all */
    size_t sent = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    int rc = buf ? DT_OK : dt_err_set(DT_ERR_NOMEM, "plot: out of memory");
    int wfd = len ? in[1] : (close(in[1]), -1), rfd = op[0];
    *out_len = 0;
    const double deadline = mono_s() + PLOT_TIMEOUT_S;
    while (rc == DT_OK && rfd >= 0) {
        struct pollfd p[2] = {{.fd = rfd, .events = POLLIN}, {.fd = wfd, .events = POLLOUT}};
        double left = deadline - mono_s();
        if (left <= 0) {
            rc = dt_err_set(DT_ERR_TIMEOUT, "plot: gnuplot did not finish within %d s; killed "
                            "it", PLOT_TIMEOUT_S);
            kill(pid, SIGKILL);
            break;
        }
        if (poll(p, wfd >= 0 ? 2 : 1, (int)(left * 1000) + 1) < 0) {
            if (errno != EINTR)
                rc = dt_err_set(DT_ERR_SYSTEM, "plot: poll: %s", strerror(errno));
            continue;
        }
        if (wfd >= 0 && p[1].revents) {
            ssize_t w = write(wfd, script + sent, len - sent);
            if (w > 0)
                sent += (size_t)w;
            if (sent == len || (w < 0 && errno != EAGAIN && errno != EINTR)) {
                close(wfd); /* done, or gnuplot stopped reading: its status says why */
                wfd = -1;
            }
        }
        if (p[0].revents) {
            if (*out_len == cap) {
                char *nb = cap < PLOT_MAX_OUT ? realloc(buf, cap * 2) : NULL;
                if (!nb) {
                    rc = dt_err_set(DT_ERR_DATA, "plot: gnuplot wrote more than %zu bytes",
                                    cap);
                    kill(pid, SIGKILL);
                    break;
                }
                buf = nb;
                cap *= 2;
            }
            ssize_t r = read(rfd, buf + *out_len, cap - *out_len);
            if (r > 0) {
                *out_len += (size_t)r;
            } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(rfd);
                rfd = -1;
            }
        }
    }
    if (wfd >= 0)
        close(wfd);
    if (rfd >= 0)
        close(rfd);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    sigaction(SIGPIPE, &old_pipe, NULL);
    if (rc == DT_OK && WIFEXITED(st) && WEXITSTATUS(st) == 127)
        rc = dt_err_set(DT_ERR_NOT_FOUND, "plot: gnuplot is not on PATH (Debian: apt-get "
                        "install gnuplot-nox, or scripts/install-deps.sh)");
    else if (rc == DT_OK && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        rc = dt_err_set(DT_ERR_SYSTEM, "plot: gnuplot failed (%s %d; its messages are above)",
                        WIFEXITED(st) ? "exit" : "signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    else if (rc == DT_OK && *out_len == 0)
        rc = dt_err_set(DT_ERR_SYSTEM, "plot: gnuplot wrote no image");
    if (rc) {
        free(buf);
        buf = NULL;
    }
    *out = buf;
    return rc;
}

/* ".png" -> 0, ".svg" -> 1, else -1. */
static int format_of(const char *path)
{
    size_t n = strlen(path);
    if (n > 4 && strcasecmp(path + n - 4, ".png") == 0)
        return 0;
    if (n > 4 && strcasecmp(path + n - 4, ".svg") == 0)
        return 1;
    return -1;
}

int dt_cmd_plot(int argc, char **argv)
{
    const char *input = NULL, *output = NULL;
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) && i + 1 < argc) {
            output = argv[++i];
        } else if (argv[i][0] != '-' && !input) {
            input = argv[i];
        } else {
            fprintf(stderr, "dtrain plot: error: unexpected argument '%s' (see dtrain plot "
                            "--help)\n", argv[i]);
            return DT_EXIT_USAGE;
        }
    }
    if (!input || !output) {
        fprintf(stderr, "dtrain plot: error: need METRICS.jsonl and -o FILE.png|FILE.svg\n");
        return DT_EXIT_USAGE;
    }
    int svg = format_of(output);
    if (svg < 0) {
        fprintf(stderr, "dtrain plot: error: -o '%s': the name must end in .png or .svg\n",
                output);
        return DT_EXIT_USAGE;
    }
    metrics_t m = {0};
    char *script = NULL, *image = NULL;
    size_t script_len = 0, image_len = 0;
    int rc = load_metrics(input, &m);
    /* where the image goes, before gnuplot runs: its folder made (mkdir
     * -p), and nothing but a regular file there to replace */
    if (rc == DT_OK && (rc = dt_fileutil_mkdir_parent(output)) == DT_OK)
        rc = dt_fileutil_check_output(output, NULL);
    if (rc == DT_OK && !(script = build_script(&m, input, svg, &script_len)))
        rc = dt_err_set(DT_ERR_NOMEM, "plot: out of memory for the gnuplot script");
    if (rc == DT_OK)
        rc = run_gnuplot(script, script_len, &image, &image_len);
    if (rc == DT_OK && (rc = dt_fileutil_write_atomic(output, image, image_len)) == DT_OK)
        printf("dtrain plot: %s: %zu steps (%.0f-%.0f)%s -> %s (%zu bytes)\n", input, m.n,
               m.rows[0].v[F_STEP], m.rows[m.n - 1].v[F_STEP],
               m.memory ? " and memory" : "", output, image_len);
    free(script);
    free(image);
    free(m.rows);
    cJSON_Delete(m.memory);
    return rc ? dt_cli_fail("plot", rc) : DT_EXIT_OK;
}
