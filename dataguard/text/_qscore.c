/* Repetition scores for a batch of UTF-8 texts in one pass per text (the compiled kernel).
 *
 * Same definitions as dataguard/text/quality_scores.py (the NumPy reference, which the tests
 * hold this kernel to): char_repeat_ratio, special_char_ratio, data-juicer char / word
 * n-gram repetition, Gopher duplicate lines and top / duplicate word n-gram fractions.
 *
 * Why C: the NumPy version needs ~25 array passes and several sorts per batch; here each text
 * is decoded once into scratch buffers that stay in cache. One pass computes prefix hashes
 * (so any window, word or line hashes with one multiply); n-grams that cannot repeat are
 * filtered by a byte counter over hash buckets, and the rest are grouped in an
 * open-addressing hash table. Groups are exact: on a hash match the underlying codepoints are
 * compared, so a collision never merges two different n-grams. Scratch memory is ~60 bytes
 * per character of the longest text in the call (8 MB records: ~0.5 GB, freed at the end).
 * URLs are found with the same rules as quality_scores.URL_RE (see count_urls).
 *
 * Entry point: score_texts(data, starts, ends, groups, cls, special, lower, out_f, out_i,
 *                          char_rep_len, word_rep_len, ignore_ws, top_ns, dup_ns)
 *   data     bytes-like UTF-8 (an Arrow string data buffer)
 *   starts, ends  int64[segments] byte ranges of segments in data
 *   groups   int64[n + 1]: text t is segments groups[t] .. groups[t+1]-1 joined by "\n"
 *            (one message per segment: a side of a conversation is scored without
 *            building the joined string)
 *   cls      uint8[0x110000]  0 space, 1 word character, 2 other
 *   special  uint8[0x110000]  data-juicer "special character" flag
 *   lower    uint32[0x110000] lower-case mapping
 *   out_f    float32[(6 + len(top_ns) + len(dup_ns)) * n], column-major (one score after
 *            another), written
 *   out_i    int32[4 * n]: characters, Gopher words, URLs, characters inside URLs (column-major)
 *   top_ns, dup_ns  bytes of n-gram sizes (2..20)
 * The GIL is released while scoring.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NCP 0x110000u
#define CLS_SPACE 0
#define CLS_WORD 1
#define MAX_N 20

/* ---------------------------------------------------------------------------------------- */
#define POLY 0x100000001B3ULL
#define WORD_MIX 0x9E3779B97F4A7C15ULL

/* Growable scratch array. */
typedef struct {
    void *p;
    size_t cap; /* elements */
} Buf;

static int buf_need(Buf *b, size_t n, size_t elem)
{
    if (n <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < n)
        cap *= 2;
    void *p = realloc(b->p, cap * elem);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Bucket of a hash in a power-of-two space of 2**lg: multiply-shift, so the top bits mix in
 * every bit of h (a polynomial hash mod 2**64 has weak low bits). */
#define GOLD 0x9E3779B97F4A7C15ULL
static inline size_t bucket(uint64_t h, unsigned lg) { return (size_t)((h * GOLD) >> (64 - lg)); }

/* Open-addressing hash table of groups; "stamp" generations make a reset O(1). One entry is
 * one 24-byte struct, so a probe touches one cache line. */
typedef struct {
    uint64_t hash;
    uint32_t first; /* element index of the group's first occurrence */
    uint32_t count;
    uint32_t stamp;
    uint32_t aux; /* Gopher n-grams of n >= 3: the slot of the first occurrence's (n-1)-gram */
} Entry;

typedef struct {
    Entry *e;
    uint32_t *used; /* slot of each group, in order of creation */
    size_t nused;
    size_t alloc;
    unsigned lg;
    uint32_t gen;
} Table;

static void table_free(Table *t)
{
    free(t->e);
    free(t->used);
    memset(t, 0, sizeof(*t));
}

static int table_reset(Table *t, size_t m)
{
    unsigned lg = 4;
    while (((size_t)1 << lg) < 2 * m + 2)
        lg++;
    size_t cap = (size_t)1 << lg;
    if (cap > t->alloc) {
        table_free(t);
        t->e = calloc(cap, sizeof(Entry));
        t->used = malloc(cap * sizeof(uint32_t));
        if (!t->e || !t->used) {
            table_free(t);
            return -1;
        }
        t->alloc = cap;
        t->gen = 0;
    }
    t->gen++;
    if (t->gen == 0) {
        for (size_t i = 0; i < t->alloc; i++)
            t->e[i].stamp = 0;
        t->gen = 1;
    }
    t->lg = lg;
    t->nused = 0;
    return 0;
}

/* How two elements compare, given their indices. Elements are codepoint windows
 * buf[i .. i+k) (WINDOW), spans (SPAN: start[i], len[i]) or runs of k spans (SPANS). */
enum { WINDOW, SPAN, SPANS };
typedef struct {
    int mode;
    const uint32_t *buf;
    const uint32_t *start;
    const uint32_t *len;
    uint32_t k;
} Eq;

static inline int same_u32(const uint32_t *x, const uint32_t *y, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return 0;
    return 1;
}

static inline int same_span(const Eq *e, uint32_t a, uint32_t b)
{
    uint32_t la = e->len[a];
    return la == e->len[b] && same_u32(e->buf + e->start[a], e->buf + e->start[b], la);
}

static inline int eq_elems(const Eq *e, uint32_t a, uint32_t b)
{
    switch (e->mode) {
    case WINDOW:
        return same_u32(e->buf + a, e->buf + b, e->k);
    case SPAN:
        return same_span(e, a, b);
    default:
        for (uint32_t j = 0; j < e->k; j++)
            if (!same_span(e, a + j, b + j))
                return 0;
        return 1;
    }
}

/* Starts a group in the free slot s. */
static inline size_t table_new(Table *t, size_t s, uint64_t h, uint32_t idx, uint32_t aux)
{
    Entry *x = &t->e[s];
    x->stamp = t->gen;
    x->hash = h;
    x->first = idx;
    x->count = 1;
    x->aux = aux;
    t->used[t->nused++] = (uint32_t)s;
    return s;
}

/* Adds element idx with hash h to its group; returns the group's slot. Elements must be
 * added in increasing index order, so a group's "first" is its first occurrence. */
static inline size_t table_add(Table *t, uint64_t h, uint32_t idx, const Eq *e)
{
    size_t mask = ((size_t)1 << t->lg) - 1;
    size_t s = bucket(h, t->lg);
    for (;;) {
        Entry *x = &t->e[s];
        if (x->stamp != t->gen)
            return table_new(t, s, h, idx, 0);
        if (x->hash == h && eq_elems(e, x->first, idx)) {
            x->count++;
            return s;
        }
        s = (s + 1) & mask;
    }
}

/* Adds the n-gram starting at word idx, known by its (n-1)-gram prefix's group (slot pg at
 * the previous level) and its last word: two n-grams are equal iff their prefixes are in the
 * same group and their last words are equal, so one word is compared, not n. */
static inline size_t table_add_prefixed(Table *t, uint64_t h, uint32_t idx, uint32_t pg, const uint32_t *cp,
                                        const uint32_t *gs, const uint32_t *gl, uint32_t last)
{
    size_t mask = ((size_t)1 << t->lg) - 1;
    size_t s = bucket(h, t->lg);
    for (;;) {
        Entry *x = &t->e[s];
        if (x->stamp != t->gen)
            return table_new(t, s, h, idx, pg);
        if (x->hash == h && x->aux == pg) {
            uint32_t a = x->first + last, b = idx + last;
            if (gl[a] == gl[b] && same_u32(cp + gs[a], cp + gs[b], gl[a])) {
                x->count++;
                return s;
            }
        }
        s = (s + 1) & mask;
    }
}

/* ---------------------------------------------------------------------------------------- */
typedef struct {
    /* Shared between the scores, which run one after another: ws/wl hold the spans of
     * words or lines; h64a/b/c hold hashes. ~57 bytes per character of the longest text. */
    Buf cp, low, cls, spf, ws, wl, h64a, h64b, h64c, sus, slot, pg, cover, reps, seen, twice, pc, pl, pw;
    size_t npw; /* powers computed so far */
    Table t;
} Scratch;

static void scratch_free(Scratch *s)
{
    Buf *bufs[] = {&s->cp,   &s->low,  &s->cls,   &s->spf,  &s->ws,   &s->wl,   &s->h64a, &s->h64b, &s->h64c, &s->sus,
                   &s->slot, &s->pg, &s->cover, &s->reps, &s->seen, &s->twice, &s->pc,   &s->pl,   &s->pw};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]->p);
    table_free(&s->t);
}

static int scratch_need(Scratch *s, size_t n)
{
    n += 2;
    Buf *b32[] = {&s->cp, &s->low, &s->ws, &s->wl, &s->sus, &s->slot, &s->pg, &s->cover, &s->reps};
    Buf *b64[] = {&s->h64a, &s->h64b, &s->h64c, &s->pc, &s->pl};
    for (size_t i = 0; i < sizeof(b32) / sizeof(b32[0]); i++)
        if (buf_need(b32[i], n, 4))
            return -1;
    for (size_t i = 0; i < sizeof(b64) / sizeof(b64[0]); i++)
        if (buf_need(b64[i], n, 8))
            return -1;
    if (buf_need(&s->pw, n, 8))
        return -1;
    uint64_t *pw = (uint64_t *)s->pw.p;
    if (s->npw == 0) {
        pw[0] = 1;
        s->npw = 1;
    }
    for (; s->npw < n; s->npw++)
        pw[s->npw] = pw[s->npw - 1] * POLY;
    return buf_need(&s->cls, n, 1) || buf_need(&s->spf, n, 1);
}

/* Elements whose hash bucket is shared with another element (in increasing order). The rest
 * are certainly unique, so only these go through the hash table: in typical text few
 * n-grams repeat, and a byte-counter update replaces a table insert. 16 buckets per element
 * keep false suspects near 1 in 16. */
#define MAX_SUSPECT_LG 26

/* Clears the byte counters for m elements; returns their log2 size, 0 on allocation failure. */
static unsigned suspects_begin(Scratch *s, size_t m)
{
    unsigned lg = 6;
    while (lg < MAX_SUSPECT_LG && ((size_t)1 << lg) < 16 * m)
        lg++;
    if (buf_need(&s->seen, (size_t)1 << lg, 1) || buf_need(&s->twice, m, 4))
        return 0;
    memset(s->seen.p, 0, (size_t)1 << lg);
    return lg;
}

static inline void suspects_mark(Scratch *s, size_t i, uint64_t h, unsigned lg)
{
    uint8_t *cnt = (uint8_t *)s->seen.p;
    uint32_t b = (uint32_t)bucket(h, lg);
    ((uint32_t *)s->twice.p)[i] = b;
    cnt[b] = (uint8_t)(1 + (cnt[b] != 0));
}

/* The marked elements whose bucket was hit more than once, in increasing order. */
static size_t suspects_collect(Scratch *s, size_t m, uint32_t *out)
{
    const uint8_t *cnt = (const uint8_t *)s->seen.p;
    const uint32_t *bk = (const uint32_t *)s->twice.p;
    size_t n = 0;
    for (size_t i = 0; i < m; i++) {
        out[n] = (uint32_t)i;
        n += cnt[bk[i]] > 1;
    }
    return n;
}

static int find_suspects(Scratch *s, const uint64_t *h, size_t m, uint32_t *out, size_t *nout)
{
    unsigned lg = suspects_begin(s, m);
    if (!lg)
        return -1;
    for (size_t i = 0; i < m; i++)
        suspects_mark(s, i, h[i], lg);
    *nout = suspects_collect(s, m, out);
    return 0;
}

/* UTF-8 -> codepoints; an invalid byte becomes U+FFFD (Arrow strings are valid UTF-8). */
static int all_ascii(const uint8_t *p, size_t nbytes)
{
    uint64_t high = 0, w;
    size_t j = 0;
    for (; j + 8 <= nbytes; j += 8) {
        memcpy(&w, p + j, 8);
        high |= w;
    }
    for (; j < nbytes; j++)
        high |= p[j];
    return (high & 0x8080808080808080ULL) == 0;
}

static size_t decode_utf8(const uint8_t *restrict p, size_t nbytes, uint32_t *restrict out)
{
    if (all_ascii(p, nbytes)) {
        for (size_t j = 0; j < nbytes; j++)
            out[j] = p[j];
        return nbytes;
    }
    size_t i = 0, n = 0;
    while (i < nbytes) {
        uint8_t c = p[i];
        if (c < 0x80) {
            out[n++] = c;
            i++;
            continue;
        }
        uint32_t cp;
        size_t extra;
        if ((c & 0xE0) == 0xC0) {
            cp = c & 0x1F;
            extra = 1;
        } else if ((c & 0xF0) == 0xE0) {
            cp = c & 0x0F;
            extra = 2;
        } else if ((c & 0xF8) == 0xF0) {
            cp = c & 0x07;
            extra = 3;
        } else {
            out[n++] = 0xFFFD;
            i++;
            continue;
        }
        if (i + extra >= nbytes) {
            out[n++] = 0xFFFD;
            i++;
            continue;
        }
        size_t j;
        for (j = 1; j <= extra; j++) {
            if ((p[i + j] & 0xC0) != 0x80)
                break;
            cp = (cp << 6) | (p[i + j] & 0x3F);
        }
        if (j <= extra || cp >= NCP) {
            out[n++] = 0xFFFD;
            i++;
            continue;
        }
        out[n++] = cp;
        i += extra + 1;
    }
    return n;
}

/* Hash of buf[start .. start+len) from the prefix hashes P[i] = sum_{j<i} (buf[j]+1) POLY^(i-1-j)
 * (mod 2**64): one multiply per span, no per-character loop and no dependency chain. */
static inline uint64_t span_hash(const uint64_t *P, const uint64_t *pw, uint32_t start, uint32_t len)
{
    return P[start + len] - P[start] * pw[len];
}

/* Sum of the k largest of v[0..n) (k <= n), reordering v: quickselect, O(n) on average. */
static uint64_t sum_top_k(uint32_t *v, size_t n, size_t k)
{
    uint64_t sum = 0;
    size_t lo = 0, hi = n; /* the k largest lie in v[lo..hi) once the loop ends */
    while (k > 0 && hi - lo > k) {
        uint32_t pivot = v[lo + (hi - lo) / 2];
        size_t i = lo, j = lo, g = hi; /* [lo,i): > pivot, [i,j): == pivot, [g,hi): < pivot */
        while (j < g) {
            if (v[j] > pivot) {
                uint32_t t = v[i];
                v[i++] = v[j];
                v[j++] = t;
            } else if (v[j] < pivot) {
                uint32_t t = v[--g];
                v[g] = v[j];
                v[j] = t;
            } else {
                j++;
            }
        }
        size_t above = i - lo, equal = g - i;
        if (k <= above) {
            hi = i;
        } else if (k <= above + equal) {
            for (size_t x = lo; x < i; x++)
                sum += v[x];
            return sum + (uint64_t)pivot * (k - above);
        } else {
            for (size_t x = lo; x < g; x++)
                sum += v[x];
            k -= above + equal;
            lo = g;
        }
    }
    for (size_t x = lo; x < lo + k; x++)
        sum += v[x];
    return sum;
}

static inline float ratio(double num, double den) { return den > 0 ? (float)(num / den) : 0.0f; }

static inline uint64_t power(uint64_t base, uint32_t e)
{
    uint64_t r = 1;
    while (e--)
        r *= base;
    return r;
}

/* data-juicer character_repetition_filter over codepoint windows of length L. */
static int char_rep(Scratch *s, const uint32_t *cp, size_t n, uint32_t L, float *out)
{
    *out = 0.0f;
    if (L == 0 || n < L)
        return 0;
    size_t m = n - L + 1;
    const uint64_t *P = (const uint64_t *)s->pc.p, pL = ((const uint64_t *)s->pw.p)[L];
    uint32_t *sus = (uint32_t *)s->sus.p;
    /* find_suspects with the window hashes computed in place (not stored: only the few
     * suspects need them again). */
    unsigned lg = suspects_begin(s, m);
    if (!lg)
        return -1;
    for (size_t i = 0; i < m; i++)
        suspects_mark(s, i, P[i + L] - P[i] * pL, lg);
    size_t ns = suspects_collect(s, m, sus);
    if (ns == 0)
        return 0; /* every window distinct: nothing repeats */
    if (table_reset(&s->t, ns))
        return -1;
    Eq e = {WINDOW, cp, NULL, NULL, L};
    for (size_t j = 0; j < ns; j++) {
        uint32_t i = sus[j];
        table_add(&s->t, P[i + L] - P[i] * pL, i, &e);
    }
    size_t distinct = (m - ns) + s->t.nused, nrep = 0;
    uint32_t *reps = (uint32_t *)s->reps.p;
    for (size_t g = 0; g < s->t.nused; g++) {
        uint32_t c = s->t.e[s->t.used[g]].count;
        if (c > 1)
            reps[nrep++] = c;
    }
    size_t k = (size_t)sqrt((double)distinct);
    if (k > nrep)
        k = nrep;
    if (k == 0)
        return 0;
    *out = ratio((double)sum_top_k(reps, nrep, k), (double)m);
    return 0;
}

/* Polynomial hashes of every run of L consecutive word hashes (rolling). */
static void gram_hashes(const uint64_t *wh, size_t nw, uint32_t L, uint64_t *out)
{
    size_t m = nw - L + 1;
    uint64_t top = power(WORD_MIX, L - 1), x = 0;
    for (uint32_t j = 0; j < L; j++)
        x = x * WORD_MIX + wh[j];
    out[0] = x;
    for (size_t i = 1; i < m; i++) {
        x = (x - wh[i - 1] * top) * WORD_MIX + wh[i + L - 1];
        out[i] = x;
    }
}

/* data-juicer word_repetition_filter: share of word L-grams whose frequency is > 1. Words
 * split on space/newline/tab, trimmed of special characters, lower-cased. */
static int word_rep(Scratch *s, const uint32_t *cp, size_t n, uint32_t L, float *out)
{
    *out = 0.0f;
    const uint8_t *spf = (const uint8_t *)s->spf.p; /* special-character flags from the first pass */
    uint32_t *ws = (uint32_t *)s->ws.p, *wl = (uint32_t *)s->wl.p;
    const uint32_t *low = (const uint32_t *)s->low.p;
    size_t nw = 0;
    int64_t first = -1, last = -1;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || cp[i] == 32 || cp[i] == 10 || cp[i] == 9) {
            if (first >= 0) {
                ws[nw] = (uint32_t)first;
                wl[nw] = (uint32_t)(last - first + 1);
                nw++;
            }
            first = last = -1;
        } else if (!spf[i]) {
            if (first < 0)
                first = (int64_t)i;
            last = (int64_t)i;
        }
    }
    if (L == 0 || nw < L)
        return 0;
    uint64_t *wh = (uint64_t *)s->h64b.p, *h = (uint64_t *)s->h64a.p;
    const uint64_t *P = (const uint64_t *)s->pl.p, *pw = (const uint64_t *)s->pw.p;
    for (size_t w = 0; w < nw; w++)
        wh[w] = span_hash(P, pw, ws[w], wl[w]);
    size_t m = nw - L + 1;
    gram_hashes(wh, nw, L, h);
    uint32_t *sus = (uint32_t *)s->sus.p;
    size_t ns;
    if (find_suspects(s, h, m, sus, &ns))
        return -1;
    if (ns == 0)
        return 0;
    if (table_reset(&s->t, ns))
        return -1;
    Eq e = {SPANS, low, ws, wl, L};
    for (size_t j = 0; j < ns; j++)
        table_add(&s->t, h[sus[j]], sus[j], &e);
    double rep = 0;
    for (size_t g = 0; g < s->t.nused; g++) {
        uint32_t c = s->t.e[s->t.used[g]].count;
        if (c > 1)
            rep += c;
    }
    *out = ratio(rep, (double)m);
    return 0;
}

/* Gopher duplicate lines: lines are maximal runs of non-newline characters. */
static int dup_lines(Scratch *s, const uint32_t *cp, size_t n, float *frac, float *char_frac)
{
    *frac = *char_frac = 0.0f;
    uint32_t *ls = (uint32_t *)s->ws.p, *ll = (uint32_t *)s->wl.p;
    size_t nl = 0, i = 0;
    while (i < n) {
        while (i < n && cp[i] == 10)
            i++;
        if (i >= n)
            break;
        size_t a = i;
        while (i < n && cp[i] != 10)
            i++;
        ls[nl] = (uint32_t)a;
        ll[nl] = (uint32_t)(i - a);
        nl++;
    }
    if (nl < 2) {
        return 0;
    }
    if (table_reset(&s->t, nl))
        return -1;
    Eq e = {SPAN, cp, ls, ll, 0};
    const uint64_t *P = (const uint64_t *)s->pc.p, *pw = (const uint64_t *)s->pw.p;
    double dl = 0, dc = 0;
    for (size_t j = 0; j < nl; j++) {
        size_t slot = table_add(&s->t, span_hash(P, pw, ls[j], ll[j]), (uint32_t)j, &e);
        if (s->t.e[slot].first != j) {
            dl += 1;
            dc += ll[j];
        }
    }
    *frac = ratio(dl, (double)nl);
    *char_frac = ratio(dc, (double)n);
    return 0;
}

/* Gopher word n-gram fractions. Grows n from 2 and follows only n-grams whose (n-1)-gram
 * prefix repeats (an n-gram can repeat only if its prefix does). */
static int gopher(Scratch *s, const uint32_t *cp, const uint8_t *cls, size_t n, const uint8_t *is_top,
                  const uint8_t *is_dup, int max_n, float *top_out, float *dup_out, int32_t *words_out)
{
    uint32_t *gs = (uint32_t *)s->ws.p, *gl = (uint32_t *)s->wl.p;
    size_t nw = 0, i = 0;
    while (i < n) {
        uint8_t c = cls[i];
        if (c == CLS_SPACE) {
            i++;
            continue;
        }
        size_t a = i++;
        if (c == CLS_WORD)
            while (i < n && cls[i] == CLS_WORD)
                i++;
        gs[nw] = (uint32_t)a;
        gl[nw] = (uint32_t)(i - a);
        nw++;
    }
    *words_out = (int32_t)nw;
    if (nw < 2 || max_n < 2)
        return 0;
    uint64_t *wh = (uint64_t *)s->h64a.p, *raw = (uint64_t *)s->h64b.p, *raw2 = (uint64_t *)s->h64c.p;
    const uint64_t *P = (const uint64_t *)s->pc.p, *pw = (const uint64_t *)s->pw.p;
    for (size_t w = 0; w < nw; w++)
        wh[w] = span_hash(P, pw, gs[w], gl[w]);
    /* Bigrams: only those whose bucket is shared can repeat. */
    gram_hashes(wh, nw, 2, raw);
    uint32_t *cand = (uint32_t *)s->sus.p, *slot = (uint32_t *)s->slot.p;
    size_t nc;
    if (find_suspects(s, raw, nw - 1, cand, &nc))
        return -1;
    for (size_t c = 0; c < nc; c++)
        raw2[c] = raw[cand[c]];
    raw = raw2;
    uint32_t *pg = (uint32_t *)s->pg.p;
    uint32_t *cs = (uint32_t *)s->cover.p; /* prefix sums of word lengths, made on first use */
    int have_cs = 0;
    double nchars = (double)n;
    int ti = 0, di = 0;
    for (int k = 2; k <= max_n && nc > 0; k++) {
        if (table_reset(&s->t, nc))
            return -1;
        if (k == 2) {
            Eq e = {SPANS, cp, gs, gl, 2};
            for (size_t c = 0; c < nc; c++)
                slot[c] = (uint32_t)table_add(&s->t, raw[c], cand[c], &e);
        } else {
            for (size_t c = 0; c < nc; c++)
                slot[c] = (uint32_t)table_add_prefixed(&s->t, (uint64_t)pg[c] * POLY + wh[cand[c] + k - 1], cand[c],
                                                       pg[c], cp, gs, gl, (uint32_t)(k - 1));
        }
        if (is_top[k]) {
            uint32_t best = 1, best_first = UINT32_MAX;
            for (size_t g = 0; g < s->t.nused; g++) {
                const Entry *x = &s->t.e[s->t.used[g]];
                if (x->count > best || (x->count == best && x->count > 1 && x->first < best_first)) {
                    best = x->count;
                    best_first = x->first;
                }
            }
            if (best > 1) {
                uint64_t chars = (uint64_t)(k - 1);
                for (int j = 0; j < k; j++)
                    chars += gl[best_first + j];
                top_out[ti] = (float)((double)(chars * best) / nchars);
            }
            ti++;
        }
        if (is_dup[k]) {
            /* Characters of words covered by second-or-later occurrences: the occurrences come
             * in word order, so their [w, w + k) intervals are merged in one pass and measured
             * with prefix sums of word lengths (no per-word pass per n-gram size). */
            double dc = 0;
            int64_t a = -1, b = -1;
            for (size_t c = 0; c < nc; c++) {
                if (s->t.e[slot[c]].first == cand[c])
                    continue;
                if (!have_cs) {
                    cs[0] = 0;
                    for (size_t w = 0; w < nw; w++)
                        cs[w + 1] = cs[w] + gl[w];
                    have_cs = 1;
                }
                int64_t w0 = cand[c], w1 = w0 + k;
                if (w0 > b) {
                    if (b > a)
                        dc += (double)(cs[b] - cs[a]);
                    a = w0;
                }
                b = w1 > b ? w1 : b;
            }
            if (b > a)
                dc += (double)(cs[b] - cs[a]);
            dup_out[di++] = ratio(dc, nchars);
        }
        if (k == max_n)
            break;
        /* Next level: n-grams whose prefix (this level's n-gram) repeats, known by its group. */
        size_t nn = 0;
        for (size_t c = 0; c < nc; c++) {
            uint32_t w = cand[c];
            if (s->t.e[slot[c]].count > 1 && (size_t)w + k < nw) {
                pg[nn] = slot[c];
                cand[nn] = w; /* nn <= c: in-place compaction is safe */
                nn++;
            }
        }
        nc = nn;
    }
    return 0;
}

/* URLs exactly as quality_scores.URL_RE.finditer finds them, trailing punctuation excluded:
 * (scheme "://" | "www.") followed by characters other than whitespace and <>"'`. A match
 * needs "://" at most 16 characters after its start, or starts at "www.", so only the
 * letters just before such an anchor are tried as starts. */
static inline int is_ascii_letter(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
static inline int is_scheme_char(uint32_t c)
{
    return is_ascii_letter(c) || (c >= '0' && c <= '9') || c == '+' || c == '.' || c == '-';
}
static inline int url_excluded(uint32_t c, const uint8_t *cls)
{
    return cls[c] == CLS_SPACE || c == '<' || c == '>' || c == '"' || c == '\'' || c == '`';
}
static inline int is_trail(uint32_t c)
{
    return c == '.' || c == ',' || c == ';' || c == ':' || c == '!' || c == '?' || c == ')' || c == ']' || c == '}';
}

/* Whether a URL match starts at p: "scheme://" or "www." (tried in the regex's order; the
 * scheme can fail where "www." still matches), then at least one allowed character. */
static int url_starts_at(const uint32_t *cp, size_t n, size_t p, const uint8_t *tcls)
{
    if (!is_ascii_letter(cp[p]))
        return 0;
    size_t r = p + 1;
    while (r < n && r - p <= 16 && is_scheme_char(cp[r]))
        r++;
    if (r - p >= 2 && r - p <= 16 && r + 3 < n && cp[r] == ':' && cp[r + 1] == '/' && cp[r + 2] == '/' &&
        !url_excluded(cp[r + 3], tcls))
        return 1;
    return p + 4 < n && cp[p] == 'w' && cp[p + 1] == 'w' && cp[p + 2] == 'w' && cp[p + 3] == '.' &&
           !url_excluded(cp[p + 4], tcls);
}

static void count_urls(const uint32_t *cp, const uint8_t *tcls, size_t n, int32_t *count, int32_t *chars)
{
    size_t pos = 0;
    *count = *chars = 0;
    while (pos < n) {
        size_t q = pos; /* next anchor */
        while (q < n && !((cp[q] == ':' && q + 3 <= n && cp[q + 1] == '/' && cp[q + 2] == '/') ||
                          (cp[q] == 'w' && q + 4 <= n && cp[q + 1] == 'w' && cp[q + 2] == 'w' && cp[q + 3] == '.')))
            q++;
        if (q >= n)
            break;
        size_t p = q > pos + 17 ? q - 17 : pos;
        while (p <= q && !url_starts_at(cp, n, p, tcls))
            p++;
        if (p > q) {
            pos = q + 1;
            continue;
        }
        /* Both prefixes are made of allowed characters: the match runs to the next excluded one. */
        size_t e = p;
        while (e < n && !url_excluded(cp[e], tcls))
            e++;
        size_t k = e;
        while (k > p && is_trail(cp[k - 1]))
            k--;
        if (k - p > 4) {
            (*count)++;
            *chars += (int32_t)(k - p);
        }
        pos = e;
    }
}

/* ---------------------------------------------------------------------------------------- */
static int get_buf(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    if (PyObject_GetBuffer(obj, view, writable ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "score_texts: %s must be a contiguous%s buffer", name,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
}

static PyObject *score_texts(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_data, *o_starts, *o_ends, *o_groups, *o_cls, *o_sp, *o_low, *o_outf, *o_outi;
    unsigned int char_len, word_len;
    int ignore_ws;
    const char *top_ns, *dup_ns;
    Py_ssize_t n_top, n_dup;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOIIpy#y#", &o_data, &o_starts, &o_ends, &o_groups, &o_cls, &o_sp, &o_low,
                          &o_outf, &o_outi, &char_len, &word_len, &ignore_ws, &top_ns, &n_top, &dup_ns, &n_dup))
        return NULL;
    Py_buffer data = {0}, starts = {0}, ends = {0}, groups = {0}, cls = {0}, sp = {0}, low = {0}, outf = {0},
              outi = {0};
    PyObject *result = NULL;
    if (get_buf(o_data, &data, 0, "data") || get_buf(o_starts, &starts, 0, "starts") ||
        get_buf(o_ends, &ends, 0, "ends") || get_buf(o_groups, &groups, 0, "groups") ||
        get_buf(o_cls, &cls, 0, "cls") || get_buf(o_sp, &sp, 0, "special") || get_buf(o_low, &low, 0, "lower") ||
        get_buf(o_outf, &outf, 1, "out_f") || get_buf(o_outi, &outi, 1, "out_i"))
        goto done;
    uint8_t is_top[MAX_N + 1] = {0}, is_dup[MAX_N + 1] = {0};
    int max_n = 0;
    for (Py_ssize_t j = 0; j < n_top + n_dup; j++) {
        int k = (uint8_t)(j < n_top ? top_ns[j] : dup_ns[j - n_top]);
        if (k < 2 || k > MAX_N) {
            PyErr_Format(PyExc_ValueError, "score_texts: n-gram size %d outside 2..%d", k, MAX_N);
            goto done;
        }
        if (j < n_top)
            is_top[k] = 1;
        else
            is_dup[k] = 1;
        if (k > max_n)
            max_n = k;
    }
    /* Sizes in ascending order (the column order of out_f) must match the given order. */
    for (Py_ssize_t j = 1; j < n_top; j++)
        if ((uint8_t)top_ns[j] <= (uint8_t)top_ns[j - 1]) {
            PyErr_SetString(PyExc_ValueError, "score_texts: top_ns must be strictly increasing");
            goto done;
        }
    for (Py_ssize_t j = 1; j < n_dup; j++)
        if ((uint8_t)dup_ns[j] <= (uint8_t)dup_ns[j - 1]) {
            PyErr_SetString(PyExc_ValueError, "score_texts: dup_ns must be strictly increasing");
            goto done;
        }
    if (groups.len % 8 || groups.len < 8 || starts.len % 8 || starts.len != ends.len) {
        PyErr_SetString(PyExc_ValueError, "score_texts: starts/ends must be int64[segments], groups int64[n + 1]");
        goto done;
    }
    size_t nt = (size_t)groups.len / 8 - 1, nseg = (size_t)starts.len / 8;
    size_t ncol = 6 + (size_t)n_top + (size_t)n_dup;
    if ((size_t)cls.len < NCP || (size_t)sp.len < NCP || (size_t)low.len < NCP * 4) {
        PyErr_SetString(PyExc_ValueError, "score_texts: cls/special/lower tables must cover all codepoints");
        goto done;
    }
    if ((size_t)outf.len < nt * ncol * 4 || (size_t)outi.len < nt * 4 * 4) {
        PyErr_SetString(PyExc_ValueError, "score_texts: output buffers are too small");
        goto done;
    }
    const int64_t *seg_a = (const int64_t *)starts.buf, *seg_b = (const int64_t *)ends.buf;
    const int64_t *grp = (const int64_t *)groups.buf;
    for (size_t j = 0; j < nseg; j++)
        if (seg_a[j] < 0 || seg_b[j] < seg_a[j] || seg_b[j] > (int64_t)data.len) {
            PyErr_SetString(PyExc_ValueError, "score_texts: segment offsets out of range");
            goto done;
        }
    for (size_t t = 0; t < nt; t++)
        if (grp[t] < 0 || grp[t + 1] < grp[t] || (size_t)grp[t + 1] > nseg) {
            PyErr_SetString(PyExc_ValueError, "score_texts: groups out of range");
            goto done;
        }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    Scratch s;
    memset(&s, 0, sizeof(s));
    const uint8_t *tcls = (const uint8_t *)cls.buf, *tsp = (const uint8_t *)sp.buf;
    const uint32_t *tlow = (const uint32_t *)low.buf;
    const uint8_t *bytes = (const uint8_t *)data.buf;
    float *of = (float *)outf.buf;
    int32_t *oi = (int32_t *)outi.buf;
    for (size_t t = 0; t < nt && !failed; t++) {
        /* Text t: its segments joined by "\n". */
        size_t nb = 0;
        for (int64_t j = grp[t]; j < grp[t + 1]; j++)
            nb += (size_t)(seg_b[j] - seg_a[j]) + 1;
        /* Scores of this text, stored column-major at the end (each score is one contiguous
         * array for Python: no copies). */
        float row[6 + 2 * MAX_N];
        int32_t ints[4] = {0, 0, 0, 0};
        memset(row, 0, sizeof(row));
        if (scratch_need(&s, nb)) {
            failed = 1;
            break;
        }
        uint32_t *cp = (uint32_t *)s.cp.p, *lw = (uint32_t *)s.low.p;
        size_t n = 0;
        for (int64_t j = grp[t]; j < grp[t + 1]; j++) {
            if (j > grp[t])
                cp[n++] = 10;
            n += decode_utf8(bytes + seg_a[j], (size_t)(seg_b[j] - seg_a[j]), cp + n);
        }
        ints[0] = (int32_t)n;
        if (n > 0) {
            size_t rep = 0, special = 0;
            int maybe_url = 0;
            uint64_t *pc = (uint64_t *)s.pc.p, *pl = (uint64_t *)s.pl.p, hc = 0, hl = 0;
            uint8_t *cl = (uint8_t *)s.cls.p, *spf = (uint8_t *)s.spf.p;
            uint32_t prev_c = 0xFFFFFFFFu;
            pc[0] = pl[0] = 0;
            for (size_t i = 0; i < n; i++) {
                uint32_t c = cp[i];
                uint8_t k = tcls[c];
                uint32_t lc = tlow[c];
                cl[i] = k;
                lw[i] = lc;
                hc = hc * POLY + c + 1;
                hl = hl * POLY + lc + 1;
                pc[i + 1] = hc;
                pl[i + 1] = hl;
                uint8_t sp_c = tsp[c];
                spf[i] = sp_c;
                special += sp_c;
                rep += (c == prev_c) & (!ignore_ws | (k != CLS_SPACE));
                /* "://" or "www." need "//" or "w.": a cheap superset test before count_urls. */
                maybe_url |= ((c == '/') & (prev_c == '/')) | ((c == '.') & (prev_c == 'w'));
                prev_c = c;
            }
            if (maybe_url)
                count_urls(cp, tcls, n, &ints[2], &ints[3]);
            row[0] = ratio((double)rep, (double)n);
            row[1] = ratio((double)special, (double)n);
            if (char_rep(&s, cp, n, char_len, &row[2]) || word_rep(&s, cp, n, word_len, &row[3]) ||
                dup_lines(&s, cp, n, &row[4], &row[5]) ||
                gopher(&s, cp, cl, n, is_top, is_dup, max_n, row + 6, row + 6 + n_top, &ints[1]))
                failed = 1;
        }
        for (size_t j = 0; j < ncol; j++)
            of[j * nt + t] = row[j];
        for (size_t j = 0; j < 4; j++)
            oi[j * nt + t] = ints[j];
    }
    scratch_free(&s);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&groups);
    PyBuffer_Release(&cls);
    PyBuffer_Release(&sp);
    PyBuffer_Release(&low);
    PyBuffer_Release(&outf);
    PyBuffer_Release(&outi);
    return result;
}

static PyMethodDef methods[] = {
    {"score_texts", score_texts, METH_VARARGS, "Repetition scores of a batch of UTF-8 texts (see module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qscore", "Compiled repetition scores.", -1, methods};

PyMODINIT_FUNC PyInit__qscore(void) { return PyModule_Create(&module); }
