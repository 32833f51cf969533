/* Repetition scores for a batch of UTF-8 texts in one pass per text (the compiled kernel).
 *
 * The one implementation of the repetition / URL scores (definitions: the docstring of
 * dataguard/text/repetition_kernel.py): char_repeat_ratio, special_char_ratio, data-juicer
 * char / word n-gram repetition, Gopher duplicate lines and top / duplicate word n-gram
 * fractions. tests/reference_quality_scores.py is an independent NumPy implementation the
 * tests hold it to.
 *
 * Why C: the NumPy version needs ~25 array passes and several sorts per batch; here each text
 * is decoded once into scratch buffers that stay in cache. One pass computes prefix hashes
 * (so any window, word or line hashes with one multiply); n-grams that cannot repeat are
 * filtered by a byte counter over hash buckets, and the rest are grouped in an
 * open-addressing hash table. Groups are exact: on a hash match the underlying codepoints are
 * compared, so a collision never merges two different n-grams. Scratch memory is ~80 bytes
 * per character of the longest text in the call plus the table (8 MiB texts: ~1 GB at
 * most, freed at the end); a failed allocation is a MemoryError.
 * URLs are found with the rules of the regex in repetition_kernel's docstring (see count_urls).
 *
 * Hash floods: a polynomial hash mod 2**64 has known collisions (Thue-Morse blocks) and
 * crafted inputs can pile hashes into one bucket. Exact comparison keeps the scores right
 * whatever the hash; to keep the time linear, a text whose table sees more than a few false
 * matches (equal hash, different content) or too many probes is scored again with a keyed
 * hash mod 2**61 - 1 (random base per process), which a text cannot be built to defeat.
 *
 * Entry point: score_texts(data, starts, ends, groups, spec, stats=None) -> {name: bytearray}
 *   data     bytes-like UTF-8 (an Arrow string data buffer; invalid bytes decode as
 *            Python's bytes.decode("utf-8", "replace") does)
 *   starts, ends  int64[segments] byte ranges of segments in data
 *   groups   int64[n + 1]: text t is segments groups[t] .. groups[t+1]-1 joined by "\n"
 *            (one message per segment: a side of a conversation is scored without
 *            building the joined string); each text at most MAX_TEXT_BYTES
 *   spec     the parameters, read by name (repetition_kernel.ScoreSpec): char_rep_len and
 *            word_rep_len (1..MAX_REP_LEN), ignore_whitespace, top_ns and dup_ns
 *            (strictly increasing n-gram sizes in 2..MAX_NGRAM)
 *   stats    optional int64[3], added to: content comparisons on equal hashes, false matches
 *            among them, texts rescored with the keyed hash (for tests and benchmarks)
 * The result maps each score's name to a new bytearray of n float32 values (char_repeat_ratio,
 * special_char_ratio, char_rep_ratio, word_rep_ratio, dup_line_frac, dup_line_char_frac,
 * top{k}_gram_char_frac, dup{k}_gram_char_frac, url_char_ratio) or n int32 values (chars:
 * the characters each text decoded to, gopher_words, url_count).
 * starts/ends/groups are copied, checked and measured before the GIL is released, so a caller
 * changing them meanwhile cannot make the kernel read or write out of bounds.
 * The character tables (class, "special" flag, lower case) are built at import from the
 * interpreter's Unicode database; tables() shows them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define NCP 0x110000u
#define CLS_SPACE 0
#define CLS_WORD 1
#define CLS_OTHER 2
#define MAX_N 20
/* Positions, counts and the characters column are 32-bit: a text must stay below 2**31. */
#define MAX_TEXT_BYTES 0x7FFFFF00LL
/* Window / n-gram length of the data-juicer scores (their default is 10). */
#define MAX_REP_LEN 1000

/* Character tables over all codepoints, built at import (see build_tables). */
static uint8_t *tab_cls, *tab_special;
static uint32_t *tab_lower;

/* ---------------------------------------------------------------------------------------- */
#define POLY 0x100000001B3ULL
#define WORD_MIX 0x9E3779B97F4A7C15ULL

/* Keyed hashes (see "Hash floods" above): polynomials mod the prime 2**61 - 1 with random
 * bases, drawn once per process. Two different strings of length L collide with probability
 * <= L / 2**61 over the base, whatever the strings. */
#define MP 0x1FFFFFFFFFFFFFFFULL
static uint64_t key_char = 0x1234567ULL, key_word = 0x7654321ULL;

static inline uint64_t mp_add(uint64_t a, uint64_t b)
{
    uint64_t x = a + b;
    return x >= MP ? x - MP : x;
}

static inline uint64_t mp_sub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + MP - b; }

static inline uint64_t mp_mul(uint64_t a, uint64_t b)
{
#ifdef __SIZEOF_INT128__
    unsigned __int128 z = (unsigned __int128)a * b;
    return mp_add((uint64_t)z & MP, (uint64_t)(z >> 61));
#else
    /* a, b < 2**61: schoolbook on 32-bit halves, reduced with 2**61 = 1 (mod MP). */
    uint64_t a1 = a >> 32, a0 = a & 0xFFFFFFFFULL, b1 = b >> 32, b0 = b & 0xFFFFFFFFULL;
    uint64_t hi = a1 * b1, mid = a1 * b0 + a0 * b1, lo = a0 * b0; /* mid < 2**62 */
    uint64_t r = (lo & MP) + (lo >> 61) + ((mid & ((1ULL << 29) - 1)) << 32) + (mid >> 29) + (hi << 3);
    return mp_add(r & MP, r >> 61);
#endif
}

/* Window hash from prefix hashes: P[i + L] - P[i] * base**L, mod 2**64 or keyed mod MP. */
static inline uint64_t win_hash(const uint64_t *P, uint64_t pL, size_t i, size_t L, int keyed)
{
    return keyed ? mp_sub(P[i + L], mp_mul(P[i], pL)) : P[i + L] - P[i] * pL;
}

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
    /* Flood guard (see "Hash floods"): with the fast hash, more than max_false false matches
     * in a text or max_probes probes in one build make table_add give up (TOO_MANY); with
     * the keyed hash (keyed = 1) nothing is limited. */
    int keyed;
    uint64_t probes, max_probes, false_hits, max_false;
    uint64_t cmps, false_total; /* debug counters over the whole call */
} Table;

#define TOO_MANY SIZE_MAX
#define FAST_MAX_FALSE 8

static void table_free(Table *t)
{
    free(t->e);
    free(t->used);
    t->e = NULL;
    t->used = NULL;
    t->alloc = t->nused = 0;
    t->gen = 0;
}

/* Empties the table for m elements. Entries come from calloc and a reset bumps the
 * generation, so no page is touched before a probe reaches it. */
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
    /* Random hashes at load <= 1/2 average < 2 probes per insert; 8 per element plus slack
     * is only ever passed by a flood. */
    t->probes = 0;
    t->max_probes = t->keyed ? UINT64_MAX : 8 * (uint64_t)m + 4096;
    return 0;
}

/* Whether the fast hash is being flooded: called once per probe past an occupied slot. */
static inline int table_flooded(Table *t) { return ++t->probes > t->max_probes; }

/* Counts a comparison on equal hashes; returns whether false matches passed the limit. */
static inline int table_false_hit(Table *t)
{
    t->false_total++;
    return ++t->false_hits > t->max_false;
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

/* Adds element idx with hash h to its group; returns the group's slot, or TOO_MANY when the
 * fast hash is flooded. Elements must be added in increasing index order, so a group's
 * "first" is its first occurrence. */
static inline size_t table_add(Table *t, uint64_t h, uint32_t idx, const Eq *e)
{
    size_t mask = ((size_t)1 << t->lg) - 1;
    size_t s = bucket(h, t->lg);
    for (;;) {
        Entry *x = &t->e[s];
        if (x->stamp != t->gen)
            return table_new(t, s, h, idx, 0);
        if (x->hash == h) {
            t->cmps++;
            if (eq_elems(e, x->first, idx)) {
                x->count++;
                return s;
            }
            if (table_false_hit(t))
                return TOO_MANY;
        }
        if (table_flooded(t))
            return TOO_MANY;
        s = (s + 1) & mask;
    }
}

/* Adds the n-gram starting at word idx, known by its (n-1)-gram prefix's group (slot pg at
 * the previous level) and its last word: two n-grams are equal iff their prefixes are in the
 * same group and their last words are equal, so one word is compared, not n. TOO_MANY as
 * table_add. */
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
            t->cmps++;
            if (gl[a] == gl[b] && same_u32(cp + gs[a], cp + gs[b], gl[a])) {
                x->count++;
                return s;
            }
            if (table_false_hit(t))
                return TOO_MANY;
        }
        if (table_flooded(t))
            return TOO_MANY;
        s = (s + 1) & mask;
    }
}

/* ---------------------------------------------------------------------------------------- */
typedef struct {
    /* Shared between the scores, which run one after another: ws/wl hold the spans of
     * words or lines; h64a/b hold hashes; pc/pl the prefix hashes of the codepoints and of
     * their lower-case forms (fast, or keyed once a text floods the fast one); pw/pk the
     * powers of the fast and keyed bases. ~80 bytes per character of the longest text. */
    Buf cp, low, cls, spf, ws, wl, h64a, h64b, sus, slot, pg, cover, seen, twice, pc, pl, pw, pk;
    size_t npw, npk; /* powers computed so far */
    uint64_t rescored; /* texts scored again with the keyed hash */
    Table t;
} Scratch;

static void scratch_free(Scratch *s)
{
    Buf *bufs[] = {&s->cp,  &s->low,  &s->cls, &s->spf,   &s->ws,   &s->wl,    &s->h64a, &s->h64b, &s->sus,
                   &s->slot, &s->pg, &s->cover, &s->seen, &s->twice, &s->pc, &s->pl, &s->pw, &s->pk};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]->p);
    table_free(&s->t);
}

/* Powers base**i for i < n in b (have: how many are already there), mod 2**64 or keyed. */
static int powers_need(Buf *b, size_t *have, size_t n, uint64_t base, int keyed)
{
    if (buf_need(b, n, 8))
        return -1;
    uint64_t *pw = (uint64_t *)b->p;
    if (*have == 0) {
        pw[0] = 1;
        *have = 1;
    }
    for (; *have < n; (*have)++)
        pw[*have] = keyed ? mp_mul(pw[*have - 1], base) : pw[*have - 1] * base;
    return 0;
}

/* Room for a text of n codepoints (allocated, not touched: the passes fill what they use). */
static int scratch_need(Scratch *s, size_t n)
{
    n += 2;
    Buf *b32[] = {&s->cp, &s->low, &s->ws, &s->wl, &s->sus, &s->slot, &s->pg, &s->cover};
    Buf *b64[] = {&s->h64a, &s->h64b, &s->pc, &s->pl};
    for (size_t i = 0; i < sizeof(b32) / sizeof(b32[0]); i++)
        if (buf_need(b32[i], n, 4))
            return -1;
    for (size_t i = 0; i < sizeof(b64) / sizeof(b64[0]); i++)
        if (buf_need(b64[i], n, 8))
            return -1;
    if (powers_need(&s->pw, &s->npw, n, POLY, 0))
        return -1;
    return buf_need(&s->cls, n, 1) || buf_need(&s->spf, n, 1);
}

/* Powers of the current base (fast or keyed). */
static inline const uint64_t *powers(const Scratch *s) { return (const uint64_t *)(s->t.keyed ? s->pk.p : s->pw.p); }

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

/* UTF-8 -> codepoints. Arrow strings should be valid UTF-8; where they are not, each
 * maximal ill-formed subpart becomes one U+FFFD (Unicode's recommended practice, what
 * Python's bytes.decode("utf-8", "replace") does and the NumPy reference uses), so both
 * implementations see the same characters. Writes at most min(nbytes, cap) codepoints. */
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

/* Continuation bytes of a lead byte c, the allowed range of the first one (which rules out
 * overlong forms, surrogates and codepoints above U+10FFFF), and c's payload bits; extra = 0
 * for a byte that cannot start a sequence. */
static inline size_t utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi, uint32_t *bits)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        *bits = c & 0x1F;
        return 1;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        *lo = c == 0xE0 ? 0xA0 : 0x80;
        *hi = c == 0xED ? 0x9F : 0xBF;
        *bits = c & 0x0F;
        return 2;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        *lo = c == 0xF0 ? 0x90 : 0x80;
        *hi = c == 0xF4 ? 0x8F : 0xBF;
        *bits = c & 0x07;
        return 3;
    }
    return 0;
}

static size_t decode_utf8(const uint8_t *restrict p, size_t nbytes, uint32_t *restrict out, size_t cap)
{
    if (nbytes > cap)
        nbytes = cap; /* never reached by score_texts, which sizes cap from the same ranges */
    if (all_ascii(p, nbytes)) {
        for (size_t j = 0; j < nbytes; j++)
            out[j] = p[j];
        return nbytes;
    }
    size_t i = 0, n = 0;
    while (i < nbytes) {
        uint8_t c = p[i], lo, hi;
        if (c < 0x80) {
            out[n++] = c;
            i++;
            continue;
        }
        uint32_t cp;
        size_t extra = utf8_lead(c, &lo, &hi, &cp), j = 1;
        for (; j <= extra && i + j < nbytes; j++) {
            uint8_t b = p[i + j];
            if (b < lo || b > hi)
                break;
            cp = (cp << 6) | (b & 0x3F);
            lo = 0x80;
            hi = 0xBF;
        }
        if (extra == 0 || j <= extra) {
            out[n++] = 0xFFFD; /* the lead byte and the j - 1 valid continuations seen */
            i += j;
            continue;
        }
        out[n++] = cp;
        i += extra + 1;
    }
    return n;
}

/* Hash of buf[start .. start+len) from the prefix hashes P[i] = sum_{j<i} (buf[j]+1) B^(i-1-j)
 * (mod 2**64, or keyed mod MP): one multiply per span, no per-character loop and no
 * dependency chain. */
static inline uint64_t span_hash(const uint64_t *P, const uint64_t *pw, uint32_t start, uint32_t len, int keyed)
{
    return win_hash(P, pw[len], start, len, keyed);
}

static int cmp_desc_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

/* Sum of the k largest of v[0..n) (k <= n), reordering v: quickselect, O(n) on average. */
static uint64_t sum_top_k(uint32_t *v, size_t n, size_t k)
{
    uint64_t sum = 0;
    size_t lo = 0, hi = n; /* the k largest lie in v[lo..hi) once the loop ends */
    unsigned rounds = 0;
    while (k > 0 && hi - lo > k) {
        if (++rounds > 64) {
            /* Pivots keep failing (crafted counts): sort what is left, O(n log n). */
            qsort(v + lo, hi - lo, sizeof(uint32_t), cmp_desc_u32);
            hi = lo + k;
            break;
        }
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

/* What a score returns: done, out of memory, or the fast hash was flooded (score the text
 * again with the keyed hash). */
enum { SCORED = 0, NO_MEMORY = -1, REHASH = 1 };

/* data-juicer character_repetition_filter over codepoint windows of length L. */
static int char_rep(Scratch *s, const uint32_t *cp, size_t n, uint32_t L, float *out)
{
    *out = 0.0f;
    if (L == 0 || n < L)
        return SCORED;
    size_t m = n - L + 1;
    const int keyed = s->t.keyed;
    const uint64_t *P = (const uint64_t *)s->pc.p, pL = powers(s)[L];
    uint32_t *sus = (uint32_t *)s->sus.p;
    unsigned lg = suspects_begin(s, m);
    if (!lg)
        return NO_MEMORY;
    /* find_suspects with the window hashes computed in place (only the few suspects need
     * them again). The fast and keyed loops are written out apiece: one loop with a branch
     * on keyed made this, the hottest score, ~10% slower on long texts. */
    if (keyed)
        for (size_t i = 0; i < m; i++)
            suspects_mark(s, i, win_hash(P, pL, i, L, 1), lg);
    else
        for (size_t i = 0; i < m; i++)
            suspects_mark(s, i, P[i + L] - P[i] * pL, lg);
    size_t ns = suspects_collect(s, m, sus);
    if (ns == 0)
        return SCORED; /* every window distinct: nothing repeats */
    if (table_reset(&s->t, ns))
        return NO_MEMORY;
    Eq e = {WINDOW, cp, NULL, NULL, L};
    if (keyed) {
        for (size_t j = 0; j < ns; j++)
            table_add(&s->t, win_hash(P, pL, sus[j], L, 1), sus[j], &e); /* keyed: never TOO_MANY */
    } else {
        for (size_t j = 0; j < ns; j++) {
            uint32_t i = sus[j];
            if (table_add(&s->t, P[i + L] - P[i] * pL, i, &e) == TOO_MANY)
                return REHASH;
        }
    }
    size_t distinct = (m - ns) + s->t.nused, nrep = 0;
    uint32_t *reps = (uint32_t *)s->slot.p;
    for (size_t g = 0; g < s->t.nused; g++) {
        uint32_t c = s->t.e[s->t.used[g]].count;
        if (c > 1)
            reps[nrep++] = c;
    }
    size_t k = (size_t)sqrt((double)distinct);
    if (k > nrep)
        k = nrep;
    if (k == 0)
        return SCORED;
    *out = ratio((double)sum_top_k(reps, nrep, k), (double)m);
    return SCORED;
}

/* Polynomial hashes of every run of L consecutive word hashes (rolling); keyed: mod MP with
 * the keyed word base, as crafted word sequences can collide mod 2**64 too. */
static void gram_hashes(const uint64_t *wh, size_t nw, uint32_t L, uint64_t *out, int keyed)
{
    size_t m = nw - L + 1;
    if (keyed) {
        uint64_t top = 1, x = 0;
        for (uint32_t j = 0; j + 1 < L; j++)
            top = mp_mul(top, key_word);
        for (uint32_t j = 0; j < L; j++)
            x = mp_add(mp_mul(x, key_word), wh[j]);
        out[0] = x;
        for (size_t i = 1; i < m; i++) {
            x = mp_add(mp_mul(mp_sub(x, mp_mul(wh[i - 1], top)), key_word), wh[i + L - 1]);
            out[i] = x;
        }
        return;
    }
    uint64_t top = power(WORD_MIX, L - 1), x = 0;
    for (uint32_t j = 0; j < L; j++)
        x = x * WORD_MIX + wh[j];
    out[0] = x;
    for (size_t i = 1; i < m; i++) {
        x = (x - wh[i - 1] * top) * WORD_MIX + wh[i + L - 1];
        out[i] = x;
    }
}

/* Hashes of the spans (ws[w], wl[w]) for w < nw. */
static void span_hashes(const Scratch *s, const uint64_t *P, const uint32_t *ws, const uint32_t *wl, size_t nw,
                        uint64_t *out)
{
    const uint64_t *pw = powers(s);
    if (s->t.keyed)
        for (size_t w = 0; w < nw; w++)
            out[w] = span_hash(P, pw, ws[w], wl[w], 1);
    else
        for (size_t w = 0; w < nw; w++)
            out[w] = span_hash(P, pw, ws[w], wl[w], 0);
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
        return SCORED;
    uint64_t *wh = (uint64_t *)s->h64b.p, *h = (uint64_t *)s->h64a.p;
    span_hashes(s, (const uint64_t *)s->pl.p, ws, wl, nw, wh);
    size_t m = nw - L + 1;
    gram_hashes(wh, nw, L, h, s->t.keyed);
    uint32_t *sus = (uint32_t *)s->sus.p;
    size_t ns;
    if (find_suspects(s, h, m, sus, &ns))
        return NO_MEMORY;
    if (ns == 0)
        return SCORED;
    if (table_reset(&s->t, ns))
        return NO_MEMORY;
    Eq e = {SPANS, low, ws, wl, L};
    for (size_t j = 0; j < ns; j++)
        if (table_add(&s->t, h[sus[j]], sus[j], &e) == TOO_MANY)
            return REHASH;
    double rep = 0;
    for (size_t g = 0; g < s->t.nused; g++) {
        uint32_t c = s->t.e[s->t.used[g]].count;
        if (c > 1)
            rep += c;
    }
    *out = ratio(rep, (double)m);
    return SCORED;
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
    if (nl < 2)
        return SCORED;
    if (table_reset(&s->t, nl))
        return NO_MEMORY;
    Eq e = {SPAN, cp, ls, ll, 0};
    const uint64_t *P = (const uint64_t *)s->pc.p, *pw = powers(s);
    const int keyed = s->t.keyed;
    double dl = 0, dc = 0;
    for (size_t j = 0; j < nl; j++) {
        size_t slot = table_add(&s->t, span_hash(P, pw, ls[j], ll[j], keyed), (uint32_t)j, &e);
        if (slot == TOO_MANY)
            return REHASH;
        if (s->t.e[slot].first != j) {
            dl += 1;
            dc += ll[j];
        }
    }
    *frac = ratio(dl, (double)nl);
    *char_frac = ratio(dc, (double)n);
    return SCORED;
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
        return SCORED;
    uint64_t *wh = (uint64_t *)s->h64a.p, *raw = (uint64_t *)s->h64b.p;
    span_hashes(s, (const uint64_t *)s->pc.p, gs, gl, nw, wh);
    /* Bigrams: only those whose bucket is shared can repeat. */
    gram_hashes(wh, nw, 2, raw, s->t.keyed);
    uint32_t *cand = (uint32_t *)s->sus.p, *slot = (uint32_t *)s->slot.p;
    size_t nc;
    if (find_suspects(s, raw, nw - 1, cand, &nc))
        return NO_MEMORY;
    for (size_t c = 0; c < nc; c++)
        raw[c] = raw[cand[c]]; /* cand[c] >= c: in-place compaction is safe */
    uint32_t *pg = (uint32_t *)s->pg.p;
    uint32_t *cs = (uint32_t *)s->cover.p; /* prefix sums of word lengths, made on first use */
    int have_cs = 0;
    double nchars = (double)n;
    int ti = 0, di = 0;
    for (int k = 2; k <= max_n && nc > 0; k++) {
        if (table_reset(&s->t, nc))
            return NO_MEMORY;
        if (k == 2) {
            Eq e = {SPANS, cp, gs, gl, 2};
            for (size_t c = 0; c < nc; c++) {
                size_t x = table_add(&s->t, raw[c], cand[c], &e);
                if (x == TOO_MANY)
                    return REHASH;
                slot[c] = (uint32_t)x;
            }
        } else {
            for (size_t c = 0; c < nc; c++) {
                size_t x = table_add_prefixed(&s->t, (uint64_t)pg[c] * POLY + wh[cand[c] + k - 1], cand[c], pg[c], cp,
                                              gs, gl, (uint32_t)(k - 1));
                if (x == TOO_MANY)
                    return REHASH;
                slot[c] = (uint32_t)x;
            }
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
    return SCORED;
}

/* URLs exactly as URL_RE.finditer finds them (repetition_kernel's docstring), trailing punctuation excluded:
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
/* One call, fixed before the GIL is released: everything the scoring loop reads about the
 * texts' layout is a private copy, checked once, so a caller changing its arrays meanwhile
 * changes nothing here. */
typedef struct {
    const uint8_t *bytes;
    int64_t *seg_a, *seg_b, *grp; /* copies of starts, ends, groups */
    size_t *cap;                  /* codepoints each joined text can decode to: its bytes */
    size_t nt, ncol;
    uint32_t char_len, word_len;
    int ignore_ws, max_n;
    size_t n_top;
    uint8_t is_top[MAX_N + 1], is_dup[MAX_N + 1];
    float *col[6 + 2 * MAX_N]; /* the float score columns, in the order of column_names */
    float *url_ratio;
    int32_t *icol[3]; /* characters, Gopher words, URLs */
} Call;

static void call_free(Call *c)
{
    free(c->seg_a);
    free(c->seg_b);
    free(c->grp);
    free(c->cap);
}

/* Decodes text t (its segments joined by "\n") into s->cp; returns its length. Writes are
 * bounded by c->cap[t], computed once from the same private ranges. */
static size_t decode_text(Scratch *s, const Call *c, size_t t)
{
    uint32_t *cp = (uint32_t *)s->cp.p;
    size_t n = 0, cap = c->cap[t];
    for (int64_t j = c->grp[t]; j < c->grp[t + 1]; j++) {
        if (j > c->grp[t] && n < cap)
            cp[n++] = 10;
        n += decode_utf8(c->bytes + c->seg_a[j], (size_t)(c->seg_b[j] - c->seg_a[j]), cp + n, cap - n);
    }
    return n;
}

/* One pass over the codepoints: classes, lower case, special flags and the fast prefix hashes,
 * plus the scores that need nothing else (repeats, special characters, URLs). */
static void first_pass(Scratch *s, const Call *c, size_t n, float *row, int32_t *ints)
{
    const uint32_t *cp = (const uint32_t *)s->cp.p;
    uint32_t *lw = (uint32_t *)s->low.p;
    size_t rep = 0, special = 0;
    int maybe_url = 0;
    uint64_t *pc = (uint64_t *)s->pc.p, *pl = (uint64_t *)s->pl.p, hc = 0, hl = 0;
    uint8_t *cl = (uint8_t *)s->cls.p, *spf = (uint8_t *)s->spf.p;
    uint32_t prev_c = 0xFFFFFFFFu;
    /* Locals, not c->...: the byte stores below may alias c, which would force reloads. */
    const int ignore_ws = c->ignore_ws;
    const uint8_t *tcls = tab_cls, *tsp = tab_special;
    const uint32_t *tlow = tab_lower;
    pc[0] = pl[0] = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t ch = cp[i];
        uint8_t k = tcls[ch];
        uint32_t lc = tlow[ch];
        cl[i] = k;
        lw[i] = lc;
        hc = hc * POLY + ch + 1;
        hl = hl * POLY + lc + 1;
        pc[i + 1] = hc;
        pl[i + 1] = hl;
        uint8_t sp_c = tsp[ch];
        spf[i] = sp_c;
        special += sp_c;
        rep += (ch == prev_c) & (!ignore_ws | (k != CLS_SPACE));
        /* "://" or "www." need "//" or "w.": a cheap superset test before count_urls. */
        maybe_url |= ((ch == '/') & (prev_c == '/')) | ((ch == '.') & (prev_c == 'w'));
        prev_c = ch;
    }
    if (maybe_url)
        count_urls(cp, tcls, n, &ints[2], &ints[3]);
    row[0] = ratio((double)rep, (double)n);
    row[1] = ratio((double)special, (double)n);
}

/* Replaces the fast prefix hashes by keyed ones (mod MP, random base) for the rescoring. */
static int keyed_prefixes(Scratch *s, size_t n)
{
    if (powers_need(&s->pk, &s->npk, n + 2, key_char, 1))
        return -1;
    const uint32_t *cp = (const uint32_t *)s->cp.p, *lw = (const uint32_t *)s->low.p;
    uint64_t *pc = (uint64_t *)s->pc.p, *pl = (uint64_t *)s->pl.p, hc = 0, hl = 0;
    pc[0] = pl[0] = 0;
    for (size_t i = 0; i < n; i++) {
        hc = mp_add(mp_mul(hc, key_char), cp[i] + 1);
        hl = mp_add(mp_mul(hl, key_char), lw[i] + 1);
        pc[i + 1] = hc;
        pl[i + 1] = hl;
    }
    return 0;
}

/* The scores that group n-grams, words and lines: SCORED, NO_MEMORY or REHASH. */
static int hashed_scores(Scratch *s, const Call *c, size_t n, float *row, int32_t *ints)
{
    const uint32_t *cp = (const uint32_t *)s->cp.p;
    const uint8_t *cl = (const uint8_t *)s->cls.p;
    int r = char_rep(s, cp, n, c->char_len, &row[2]);
    if (r == SCORED)
        r = word_rep(s, cp, n, c->word_len, &row[3]);
    if (r == SCORED)
        r = dup_lines(s, cp, n, &row[4], &row[5]);
    if (r == SCORED)
        r = gopher(s, cp, cl, n, c->is_top, c->is_dup, c->max_n, row + 6, row + 6 + c->n_top, &ints[1]);
    return r;
}

/* Scores text t into row / ints; -1 when memory ran out. A text that floods the fast hash
 * is scored again with the keyed one (same numbers: groups are exact either way). */
static int score_text(Scratch *s, const Call *c, size_t t, float *row, int32_t *ints)
{
    if (scratch_need(s, c->cap[t]))
        return -1;
    size_t n = decode_text(s, c, t);
    ints[0] = (int32_t)n;
    if (n == 0)
        return 0;
    first_pass(s, c, n, row, ints);
    s->t.keyed = 0;
    s->t.false_hits = 0;
    s->t.max_false = FAST_MAX_FALSE;
    int r = hashed_scores(s, c, n, row, ints);
    if (r != REHASH)
        return r == SCORED ? 0 : -1;
    memset(row + 2, 0, (c->ncol - 2) * sizeof(float));
    if (keyed_prefixes(s, n))
        return -1;
    s->rescored++;
    s->t.keyed = 1;
    s->t.max_false = UINT64_MAX;
    r = hashed_scores(s, c, n, row, ints);
    s->t.keyed = 0;
    return r == SCORED ? 0 : -1;
}

/* Scores every text (no Python calls: runs without the GIL); -1 when memory ran out. */
static int score_all(const Call *c, int64_t counters[3])
{
    Scratch s;
    memset(&s, 0, sizeof(s));
    int failed = 0;
    for (size_t t = 0; t < c->nt && !failed; t++) {
        float row[6 + 2 * MAX_N];
        int32_t ints[4] = {0, 0, 0, 0}; /* characters, words, URLs, characters inside URLs */
        memset(row, 0, sizeof(row));
        failed = score_text(&s, c, t, row, ints);
        for (size_t j = 0; j < c->ncol; j++)
            c->col[j][t] = row[j];
        for (size_t j = 0; j < 3; j++)
            c->icol[j][t] = ints[j];
        c->url_ratio[t] = ratio((double)ints[3], (double)ints[0]);
    }
    counters[0] = (int64_t)s.t.cmps;
    counters[1] = (int64_t)s.t.false_total;
    counters[2] = (int64_t)s.rescored;
    scratch_free(&s);
    return failed ? -1 : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Character tables over all codepoints, built once at import from the interpreter's Unicode
 * database (so they follow the running Python's Unicode version): class (space, word
 * character: letter, digit/number, mark or "_", other), data-juicer "special" flag
 * (whitespace, categories P, S, N, Z and Cc) and the lower-case mapping (str.lower where it
 * gives one character, else the character itself). Codepoints past U+323AF (CJK ext. H)
 * outside plane 14's tags and variation selectors are unassigned or private use: "other",
 * not special, their own lower case. */
static int table_range(uint32_t lo, uint32_t hi, PyObject *category, PyObject *lower)
{
    for (uint32_t c = lo; c < hi; c++) {
        PyObject *ch = PyUnicode_FromOrdinal((int)c);
        PyObject *cat = ch ? PyObject_CallOneArg(category, ch) : NULL;
        PyObject *low = cat ? PyObject_CallMethodNoArgs(ch, lower) : NULL;
        if (!low || !PyUnicode_Check(cat) || PyUnicode_GET_LENGTH(cat) != 2) {
            Py_XDECREF(ch);
            Py_XDECREF(cat);
            Py_XDECREF(low);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "_qscore: unexpected unicodedata.category result");
            return -1;
        }
        Py_UCS4 major = PyUnicode_READ_CHAR(cat, 0), minor = PyUnicode_READ_CHAR(cat, 1);
        if (Py_UNICODE_ISSPACE(c)) { /* str.isspace */
            tab_cls[c] = CLS_SPACE;
            tab_special[c] = 1;
        } else if (major == 'L' || major == 'N' || major == 'M' || c == '_') {
            tab_cls[c] = CLS_WORD;
        }
        if (major == 'P' || major == 'S' || major == 'N' || major == 'Z' || (major == 'C' && minor == 'c'))
            tab_special[c] = 1;
        if (PyUnicode_GET_LENGTH(low) == 1)
            tab_lower[c] = PyUnicode_READ_CHAR(low, 0);
        Py_DECREF(ch);
        Py_DECREF(cat);
        Py_DECREF(low);
    }
    return 0;
}

/* The three tables in one block (6.6 MB) on 2 MiB pages where Linux allows: every character
 * of every text is looked up, and 4 KiB pages measured ~3.5% slower scoring (TLB misses). */
static int alloc_tables(void)
{
    size_t bytes = (size_t)NCP * 6;
#ifdef __linux__
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    bytes = (bytes + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, bytes))
        p = NULL;
#ifdef MADV_HUGEPAGE
    if (p)
        madvise(p, bytes, MADV_HUGEPAGE); /* a hint: failing only costs speed */
#endif
#else
    void *p = malloc(bytes);
#endif
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    tab_lower = (uint32_t *)p; /* first: 4-byte aligned */
    tab_cls = (uint8_t *)p + (size_t)NCP * 4;
    tab_special = tab_cls + NCP;
    return 0;
}

static int build_tables(void)
{
    if (alloc_tables())
        return -1;
    for (uint32_t c = 0; c < NCP; c++) {
        tab_cls[c] = CLS_OTHER;
        tab_special[c] = 0;
        tab_lower[c] = c;
    }
    PyObject *ud = PyImport_ImportModule("unicodedata");
    PyObject *category = ud ? PyObject_GetAttrString(ud, "category") : NULL;
    PyObject *lower = PyUnicode_InternFromString("lower");
    int r = (category && lower && !table_range(0, 0x323B0, category, lower) &&
             !table_range(0xE0000, 0xE01F0, category, lower)) ? 0 : -1;
    Py_XDECREF(ud);
    Py_XDECREF(category);
    Py_XDECREF(lower);
    return r;
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

/* An integer attribute of the spec, range-checked (never wrapped into a C int). */
static int spec_int(PyObject *spec, const char *name, long lo, long hi, long *out)
{
    PyObject *v = PyObject_GetAttrString(spec, name);
    if (!v)
        return -1;
    long x = PyLong_AsLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "score_texts: %s must be between %ld and %ld, got %ld", name, lo, hi, x);
        return -1;
    }
    *out = x;
    return 0;
}

/* spec.top_ns or spec.dup_ns: n-gram sizes in 2..MAX_N, strictly increasing (the column order). */
static int spec_ngrams(PyObject *spec, const char *name, uint8_t *is_n, size_t *count, int *max_n)
{
    PyObject *v = PyObject_GetAttrString(spec, name);
    PyObject *seq = v ? PySequence_Fast(v, "score_texts: n-gram sizes must be a sequence") : NULL;
    Py_XDECREF(v);
    if (!seq)
        return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    long prev = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        long k = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        if (k == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (k < 2 || k > MAX_N || k <= prev) {
            PyErr_Format(PyExc_ValueError, "score_texts: %s must be strictly increasing n-gram sizes in 2..%d, "
                         "got %ld after %ld", name, MAX_N, k, prev);
            Py_DECREF(seq);
            return -1;
        }
        is_n[k] = 1;
        if (k > *max_n)
            *max_n = (int)k;
        prev = k;
    }
    Py_DECREF(seq);
    *count = (size_t)m;
    return 0;
}

/* Reads the score parameters from spec (a ScoreSpec, or anything with its attributes). */
static int read_spec(Call *c, PyObject *spec)
{
    long char_len, word_len;
    size_t n_dup;
    if (spec_int(spec, "char_rep_len", 1, MAX_REP_LEN, &char_len) ||
        spec_int(spec, "word_rep_len", 1, MAX_REP_LEN, &word_len) ||
        spec_ngrams(spec, "top_ns", c->is_top, &c->n_top, &c->max_n) ||
        spec_ngrams(spec, "dup_ns", c->is_dup, &n_dup, &c->max_n))
        return -1;
    PyObject *ws = PyObject_GetAttrString(spec, "ignore_whitespace");
    c->ignore_ws = ws ? PyObject_IsTrue(ws) : -1;
    Py_XDECREF(ws);
    if (c->ignore_ws < 0)
        return -1;
    c->char_len = (uint32_t)char_len;
    c->word_len = (uint32_t)word_len;
    c->ncol = 6 + c->n_top + n_dup;
    return 0;
}

/* Copies starts / ends / groups (memcpy: any alignment), checks the copies and measures each
 * joined text once. Runs with the GIL held. */
static int snapshot_layout(Call *c, const Py_buffer *starts, const Py_buffer *ends, const Py_buffer *groups,
                           Py_ssize_t data_len)
{
    if (groups->len % 8 || groups->len < 8 || starts->len % 8 || starts->len != ends->len) {
        PyErr_SetString(PyExc_ValueError, "score_texts: starts/ends must be int64[segments], groups int64[n + 1]");
        return -1;
    }
    size_t nseg = (size_t)starts->len / 8;
    c->nt = (size_t)groups->len / 8 - 1;
    c->seg_a = malloc(nseg * 8 + 8);
    c->seg_b = malloc(nseg * 8 + 8);
    c->grp = malloc((size_t)groups->len);
    c->cap = malloc(c->nt * sizeof(size_t) + 8);
    if (!c->seg_a || !c->seg_b || !c->grp || !c->cap) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(c->seg_a, starts->buf, nseg * 8);
    memcpy(c->seg_b, ends->buf, nseg * 8);
    memcpy(c->grp, groups->buf, (size_t)groups->len);
    for (size_t j = 0; j < nseg; j++)
        if (c->seg_a[j] < 0 || c->seg_b[j] < c->seg_a[j] || c->seg_b[j] > (int64_t)data_len) {
            PyErr_SetString(PyExc_ValueError, "score_texts: segment offsets out of range");
            return -1;
        }
    for (size_t t = 0; t < c->nt; t++) {
        if (c->grp[t] < 0 || c->grp[t + 1] < c->grp[t] || (size_t)c->grp[t + 1] > nseg) {
            PyErr_SetString(PyExc_ValueError, "score_texts: groups out of range");
            return -1;
        }
        int64_t nb = 0; /* the segments and the newlines between them */
        for (int64_t j = c->grp[t]; j < c->grp[t + 1] && nb <= MAX_TEXT_BYTES; j++)
            nb += c->seg_b[j] - c->seg_a[j] + (j > c->grp[t]); /* each term < 2**63: no overflow */
        if (nb > MAX_TEXT_BYTES) {
            PyErr_Format(PyExc_ValueError, "score_texts: text %zu is longer than %lld bytes", t,
                         (long long)MAX_TEXT_BYTES);
            return -1;
        }
        c->cap[t] = (size_t)nb;
    }
    return 0;
}

/* A new result column of n 4-byte values, stored in out[name]; its data pointer, or NULL. */
static void *new_column(PyObject *out, PyObject *name, size_t n)
{
    if (!name)
        return NULL;
    PyObject *col = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 4));
    int bad = !col || PyDict_SetItem(out, name, col) < 0;
    Py_DECREF(name);
    Py_XDECREF(col);
    if (bad)
        return NULL;
    char *p = PyByteArray_AS_STRING(col); /* the dict holds it */
    if (n && (uintptr_t)p % 4) { /* an empty bytearray's buffer is a shared empty string */
        PyErr_SetString(PyExc_RuntimeError, "score_texts: misaligned result buffer");
        return NULL;
    }
    return p;
}

/* The result: {name: bytearray of float32 or int32 per text}, in the order of the columns. */
static PyObject *new_result(Call *c)
{
    static const char *fixed[6] = {"char_repeat_ratio", "special_char_ratio", "char_rep_ratio",
                                   "word_rep_ratio", "dup_line_frac", "dup_line_char_frac"};
    static const char *ints[3] = {"chars", "gopher_words", "url_count"};
    PyObject *out = PyDict_New();
    if (!out)
        return NULL;
    size_t j = 0;
    for (; j < 6; j++)
        if (!(c->col[j] = new_column(out, PyUnicode_FromString(fixed[j]), c->nt)))
            goto fail;
    for (int k = 2; k <= MAX_N; k++)
        if (c->is_top[k] && !(c->col[j++] = new_column(out, PyUnicode_FromFormat("top%d_gram_char_frac", k), c->nt)))
            goto fail;
    for (int k = 2; k <= MAX_N; k++)
        if (c->is_dup[k] && !(c->col[j++] = new_column(out, PyUnicode_FromFormat("dup%d_gram_char_frac", k), c->nt)))
            goto fail;
    for (size_t i = 0; i < 3; i++)
        if (!(c->icol[i] = new_column(out, PyUnicode_FromString(ints[i]), c->nt)))
            goto fail;
    if (!(c->url_ratio = new_column(out, PyUnicode_FromString("url_char_ratio"), c->nt)))
        goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *score_texts(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"data", "starts", "ends", "groups", "spec", "stats", NULL};
    PyObject *o_data, *o_starts, *o_ends, *o_groups, *spec, *o_stats = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|O:score_texts", kwlist, &o_data, &o_starts, &o_ends,
                                     &o_groups, &spec, &o_stats))
        return NULL;
    Py_buffer data = {0}, starts = {0}, ends = {0}, groups = {0}, stats = {0};
    Call c;
    memset(&c, 0, sizeof(c));
    PyObject *out = NULL;
    if (get_buf(o_data, &data, 0, "data") || get_buf(o_starts, &starts, 0, "starts") ||
        get_buf(o_ends, &ends, 0, "ends") || get_buf(o_groups, &groups, 0, "groups") ||
        (o_stats != Py_None && get_buf(o_stats, &stats, 1, "stats")))
        goto done;
    if (stats.buf && (stats.len < 3 * 8 || (uintptr_t)stats.buf % 8)) {
        PyErr_SetString(PyExc_ValueError, "score_texts: stats must be an aligned int64[3]");
        goto done;
    }
    if (read_spec(&c, spec) || snapshot_layout(&c, &starts, &ends, &groups, data.len) || !(out = new_result(&c)))
        goto done;
    c.bytes = (const uint8_t *)data.buf;
    int failed;
    int64_t counters[3];
    Py_BEGIN_ALLOW_THREADS
    failed = score_all(&c, counters);
    Py_END_ALLOW_THREADS
    if (stats.buf)
        for (int j = 0; j < 3; j++)
            ((int64_t *)stats.buf)[j] += counters[j];
    if (failed) {
        Py_CLEAR(out);
        PyErr_NoMemory();
    }
done:
    call_free(&c);
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&groups);
    PyBuffer_Release(&stats);
    return out;
}

/* The character tables, read-only (for the tests that check them against the reference). */
static PyObject *tables(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("{sNsNsN}", "cls", PyMemoryView_FromMemory((char *)tab_cls, NCP, PyBUF_READ),
                         "special", PyMemoryView_FromMemory((char *)tab_special, NCP, PyBUF_READ), "lower",
                         PyMemoryView_FromMemory((char *)tab_lower, NCP * 4, PyBUF_READ));
}

static PyMethodDef methods[] = {
    {"score_texts", (PyCFunction)(void (*)(void))score_texts, METH_VARARGS | METH_KEYWORDS,
     "score_texts(data, starts, ends, groups, spec, stats=None) -> {score name: bytearray}\n\n"
     "Repetition scores of a batch of UTF-8 texts (see the module source)."},
    {"tables", tables, METH_NOARGS, "The character tables: {'cls', 'special', 'lower'} as read-only memoryviews."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qscore", "Compiled repetition scores.", -1, methods};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Draws the keyed bases from os.urandom (else from the clock and an address): a text cannot
 * be built to collide under a base it does not know. Only timing depends on them. */
static void draw_keys(void)
{
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)&key_char << 16);
    PyObject *os = PyImport_ImportModule("os");
    PyObject *b = os ? PyObject_CallMethod(os, "urandom", "n", (Py_ssize_t)8) : NULL;
    if (b && PyBytes_Check(b) && PyBytes_GET_SIZE(b) == 8)
        memcpy(&seed, PyBytes_AS_STRING(b), 8);
    Py_XDECREF(b);
    Py_XDECREF(os);
    PyErr_Clear();
    key_char = (1ULL << 32) + splitmix64(&seed) % (MP - (1ULL << 33));
    key_word = (1ULL << 32) + splitmix64(&seed) % (MP - (1ULL << 33));
}

PyMODINIT_FUNC PyInit__qscore(void)
{
    draw_keys();
    if (build_tables())
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "MAX_REP_LEN", MAX_REP_LEN) ||
              PyModule_AddIntConstant(m, "MAX_NGRAM", MAX_N) ||
              PyModule_AddObject(m, "MAX_TEXT_BYTES", PyLong_FromLongLong(MAX_TEXT_BYTES)))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
