/* Tiny check helpers shared by the C tests of unirt's libinfinirt. */
#ifndef UNIRT_CAPI_TEST_CHECK_H
#define UNIRT_CAPI_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

#include <infinirt.h>

static int g_failures = 0;
static int g_checks = 0;
static const char *g_where = "";

static void report_status(infiniStatus_t got, const char *want_text, const char *expr,
                          const char *file, int line) {
    char msg[512] = {0};
    unirtGetLastErrorMessage(msg, sizeof msg);
    fprintf(stderr, "%s:%d: [%s] %s returned %d, expected %s (last error: %s)\n", file, line,
            g_where, expr, (int)got, want_text, msg);
    g_failures++;
}

/* EXPECT(call, status): the call returns exactly that status. */
#define EXPECT(call, want)                                                      \
    do {                                                                        \
        infiniStatus_t got_ = (call);                                           \
        g_checks++;                                                             \
        if (got_ != (want)) report_status(got_, #want, #call, __FILE__, __LINE__); \
    } while (0)

/* EXPECT2(call, a, b): the call returns one of two statuses. */
#define EXPECT2(call, a, b)                                                        \
    do {                                                                           \
        infiniStatus_t got_ = (call);                                              \
        g_checks++;                                                                \
        if (got_ != (a) && got_ != (b))                                            \
            report_status(got_, #a " or " #b, #call, __FILE__, __LINE__);          \
    } while (0)

#define OK(call) EXPECT(call, INFINI_STATUS_SUCCESS)

/* CHECK(cond): a plain condition on data. */
#define CHECK(cond)                                                                  \
    do {                                                                             \
        g_checks++;                                                                  \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: [%s] check failed: %s\n", __FILE__, __LINE__, g_where, #cond); \
            g_failures++;                                                            \
        }                                                                            \
    } while (0)

static int all_bytes(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

static void fill_pattern(unsigned char *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 16);
    }
}

static int finish(const char *name) {
    if (g_failures) {
        fprintf(stderr, "%s: %d of %d checks FAILED\n", name, g_failures, g_checks);
        return 1;
    }
    printf("%s: all %d checks passed\n", name, g_checks);
    return 0;
}

#endif
