/*
 * core/cli/cmd_data.c - `dtrain data prepare TEXT OUT [--val FILE
 * --val-fraction F]`: byte-level token files in llm.c's format.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/data.h"
#include "util/error.h"

void dt_help_data(FILE *f)
{
    fprintf(f, "usage: dtrain data prepare TEXT OUT [--val VALOUT --val-fraction F]\n\n"
               "Write TEXT as byte-level tokens (vocab 256) in llm.c's token-file format\n"
               "(256 int32 header, magic 20240520, version 1, then uint16 tokens), so\n"
               "[data] train = \"OUT\" trains on it.  With --val, the last F of the text\n"
               "(default 0.05) goes to VALOUT instead.  Missing folders of OUT and VALOUT are\n"
               "made; only a regular file there is replaced (a folder, a link, a FIFO or a\n"
               "device is an error).\n");
}

int dt_cmd_data(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "prepare") != 0) {
        fprintf(stderr, "dtrain data: error: expected 'prepare' (see dtrain data --help)\n");
        return DT_EXIT_USAGE;
    }
    const char *pos[2] = {NULL, NULL}, *val = NULL;
    double frac = 0.05;
    int npos = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--val") == 0 && i + 1 < argc) {
            val = argv[++i];
        } else if (strcmp(argv[i], "--val-fraction") == 0 && i + 1 < argc) {
            char *end;
            frac = strtod(argv[++i], &end);
            if (*end || !(frac > 0 && frac < 1)) {
                fprintf(stderr, "dtrain data: error: --val-fraction '%s' is not in (0, 1)\n",
                        argv[i]);
                return DT_EXIT_USAGE;
            }
        } else if (argv[i][0] != '-' && npos < 2) {
            pos[npos++] = argv[i];
        } else {
            fprintf(stderr, "dtrain data: error: unexpected argument '%s'\n", argv[i]);
            return DT_EXIT_USAGE;
        }
    }
    if (npos != 2) {
        fprintf(stderr, "dtrain data: error: need TEXT and OUT (see dtrain data --help)\n");
        return DT_EXIT_USAGE;
    }
    uint64_t nt = 0, nv = 0;
    int rc = dt_data_prepare(pos[0], pos[1], val, val ? frac : 0.0, &nt, &nv);
    if (rc)
        return dt_cli_fail("data", rc);
    printf("dtrain data: %s: %llu tokens", pos[1], (unsigned long long)nt);
    if (val)
        printf("; %s: %llu tokens", val, (unsigned long long)nv);
    printf(" (byte-level, vocab 256)\n");
    return DT_EXIT_OK;
}
