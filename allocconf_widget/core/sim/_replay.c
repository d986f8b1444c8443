/* The replay engine of core/sim/engine.py, compiled: the same model of PyTorch's caching
 * allocator, step for step, on C structures instead of Python objects.
 *
 * engine.py is the reference: every function here names the Python function it follows, and
 * every choice that decides a result (best fit with the release's tie-break, splits, merges,
 * the OOM path, GC ages, expandable mapping and the room search, the driver address model,
 * the order of pending frees) is made in the same order with the same numbers, so results
 * are identical field for field (tests/unit/test_native_engine.py, benchmarks/bench_native.py).
 * Only the data structures differ, where the answer does not depend on them: the free lists
 * are sorted chunks of (size, tie-break) keys, the driver's free ranges a treap with its own
 * priorities, blocks an arena of structs.
 *
 * Values stay far below 2^63: the caller (core/sim/native.py) hands a trace here only when
 * its sizes, the settings and the start state are within bounds that keep every sum in
 * range, and the replay gives up (status UNSUPPORTED, the caller replays in Python) where an
 * address would leave the range the Python model keeps positive.
 *
 * Built on CPython's limited API (one abi3 module for every Python from 3.10).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;
typedef int32_t i32;

#define MIB (1LL << 20)
#define MIN_BLOCK 512
#define SMALL_SIZE MIB
#define SMALL_BUFFER (2 * MIB)
#define MIN_LARGE_ALLOC (10 * MIB)
#define ROUND_LARGE (2 * MIB)
#define VA_ALIGN (32 * MIB)
#define VA_TOP_DOWN_FROM (80 * MIB)
#define NO_CHANGE (1LL << 62)
#define BUMP_BASE (1LL << 60)
#define SPACE_TOP (1LL << 59)
#define FRESH_DRAIN_AT 2048
#define NONE (-1)

enum { SEG_ALLOC = 0, SEG_FREE = 1, SEG_MAP = 2, SEG_UNMAP = 3 };
enum { OK = 0, UNSUPPORTED = 1, NOMEM = 2 };

/* ------------------------------------------------------------------ structures */
typedef struct {
    i64 *last, *res, *alloc, *alloc_end, *res_end;
    i64 n, cap;
} Series;

typedef struct {
    i64 ptr, size, tb, req, gcb, ks, kt; /* ks, kt: the free-list key it was cached under */
    i32 prev, next, fl, seg;
    uint8_t busy, pending, mapped, cached, in_cands, in_fresh, dead, pad;
} Block;

typedef struct {
    i64 ks, kt;
    i32 b, pad;
} Ent;

typedef struct {
    Ent *a;
    i32 n, cap;
} Chunk;

typedef struct { /* SortedKeys: sorted chunks of at most 2 * load keys */
    Chunk *c;
    i32 nc, cc;
} SK;

typedef struct {
    i64 ptr;
    i32 b, pad;
} UM;

typedef struct {
    SK keys;
    UM *um; /* unmapped expandable ranges, by address */
    i32 num, umcap;
    i64 *rptr, *rtot; /* the room search's records */
    i32 nroom, roomcap;
    i64 room_end, dirty;
    i32 pool;
    i64 srank; /* the stream's rank among the trace's streams (torch's set order) */
} FL;

typedef struct {
    i64 clock;
    i32 *cands;
    i32 ncands, ccap;
    uint8_t small, dflt, exp;
} Pool;

typedef struct {
    i64 base, page, size;
} ExpSeg;

typedef struct { /* a node of the driver model's free ranges */
    i64 key, ln, al, mln, mal;
    uint64_t pr;
    i32 l, r;
} TN;

typedef struct {
    i64 start, end;
} VA;

typedef struct {
    i64 allowed, reject, release, budget;
    int gc_on;
} Limits;

typedef struct {
    i64 key;
    Limits lim;
} LimitRow;

typedef struct {
    i64 row, kind, addr, size;
} SegEv;

typedef struct {
    jmp_buf jb;
    /* trace */
    i64 n;
    int8_t *ops;
    const i64 *aids, *sizes, *lanes, *op_index, *op_time;
    i64 num_addresses;
    /* rules */
    i64 slots[16];
    int div2;
    i64 max_split;
    int max_split_unlimited;
    i64 slack, large_segment;
    int by_addr, exp_on, skip_expandable, stop_at_oom, record_segments;
    Limits lim;
    i64 usable; /* -1: unknown */
    i64 exp_reserve;
    LimitRow *limit_rows;
    i32 nlimit_rows;
    /* state */
    Block *B;
    i32 nb, bcap, freeb;
    FL *fls;
    i32 nfl;
    Pool *pools;
    i32 npools;
    ExpSeg *res;
    i32 nres, rescap;
    i32 *live;
    i32 *pend_blk;
    i64 *pend_seq;
    i64 *pend_order; /* (aid, seq) pairs, in insertion order */
    i64 npend_order, pend_order_cap, npend, pend_counter;
    i32 *fresh;
    i32 nfresh, freshcap;
    i64 counter;
    /* address model */
    TN *T;
    i32 nt, tcap, freet, troot;
    uint64_t rng;
    i64 space_low, bump;
    i64 *hint_size, *hint_addr;
    i64 nhints, hint_pos;
    i64 *map_hints;
    i64 nmap_hints, map_pos;
    int has_hints;
    VA *va;
    i64 nva, vacap;
    /* statistics */
    i64 reserved, allocated, active, requested;
    i64 peak_reserved, peak_active, peak_allocated, chunk_max_reserved, chunk_max_alloc;
    i64 num_device_alloc, num_device_free, num_alloc_retries, num_ooms, num_oom_rejections;
    i64 num_sync_all_streams, recorded_ooms, recorded_ooms_avoided, largest_segment;
    i64 first_avoided; /* row, -1 none */
    int rejected;
    int has_oom;
    i64 oom_row, oom_n, oom_r, oom_seg, oom_reserved, oom_allocated;
    int oom_recorded, oom_rejected;
    SegEv *ev;
    i64 nev, evcap;
    i64 stop_op; /* -1: none */
    /* scratch */
    i32 *scratch;
    i32 nscratch, scratchcap;
    i32 load; /* sorted_keys.LOAD: a chunk splits past 2 * load keys, merges below load / 2 */
} E;

static void bail(E *e, int code) { longjmp(e->jb, code); }

static void *grow_array(E *e, void *p, i64 *cap, i64 need, size_t item) {
    if (need <= *cap) return p;
    i64 c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(p, (size_t)c * item);
    if (!q) bail(e, NOMEM);
    *cap = c;
    return q;
}

static void *grow32(E *e, void *p, i32 *cap, i64 need, size_t item) {
    i64 c = *cap;
    void *q = grow_array(e, p, &c, need, item);
    if (c > INT32_MAX) bail(e, UNSUPPORTED);
    *cap = (i32)c;
    return q;
}

static inline i64 floordiv(i64 a, i64 b) { /* b > 0 */
    i64 q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static inline i64 ceildiv(i64 a, i64 b) { return -floordiv(-a, b); }

static inline int bit_length(i64 v) { return v ? 64 - __builtin_clzll((unsigned long long)v) : 0; }

static inline int key_lt(i64 ks, i64 kt, i64 ks2, i64 kt2) { return ks < ks2 || (ks == ks2 && kt < kt2); }

/* -------------------------------------------------------------- sorted keys (SK) */
static i32 sk_chunk_for(const SK *s, i64 ks, i64 kt) { /* first chunk whose last key >= key */
    if (s->nc == 1) {
        const Ent *last = &s->c[0].a[s->c[0].n - 1];
        return key_lt(last->ks, last->kt, ks, kt) ? 1 : 0;
    }
    i32 lo = 0, hi = s->nc;
    while (lo < hi) {
        i32 mid = (lo + hi) >> 1;
        const Ent *last = &s->c[mid].a[s->c[mid].n - 1];
        if (key_lt(last->ks, last->kt, ks, kt)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static i32 ch_lb(const Chunk *c, i64 ks, i64 kt) {
    i32 lo = 0, hi = c->n;
    while (lo < hi) {
        i32 mid = (lo + hi) >> 1;
        if (key_lt(c->a[mid].ks, c->a[mid].kt, ks, kt)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void ch_reserve(E *e, Chunk *c, i64 need) { c->a = grow32(e, c->a, &c->cap, need, sizeof(Ent)); }

static void sk_insert_chunk(E *e, SK *s, i32 pos) {
    s->c = grow32(e, s->c, &s->cc, (i64)s->nc + 1, sizeof(Chunk));
    memmove(&s->c[pos + 1], &s->c[pos], (size_t)(s->nc - pos) * sizeof(Chunk));
    s->c[pos].a = NULL;
    s->c[pos].n = s->c[pos].cap = 0;
    s->nc++;
}

static void sk_drop_chunk(SK *s, i32 pos) {
    free(s->c[pos].a);
    memmove(&s->c[pos], &s->c[pos + 1], (size_t)(s->nc - pos - 1) * sizeof(Chunk));
    s->nc--;
}

static void sk_add(E *e, SK *s, i64 ks, i64 kt, i32 b) {
    i32 pos = 0;
    if (s->nc == 0) {
        sk_insert_chunk(e, s, 0);
    } else {
        pos = sk_chunk_for(s, ks, kt);
        if (pos == s->nc) pos--;
    }
    Chunk *c = &s->c[pos];
    i32 j = ch_lb(c, ks, kt);
    ch_reserve(e, c, (i64)c->n + 1);
    memmove(&c->a[j + 1], &c->a[j], (size_t)(c->n - j) * sizeof(Ent));
    c->a[j].ks = ks;
    c->a[j].kt = kt;
    c->a[j].b = b;
    c->n++;
    if (c->n > 2 * e->load) {
        i32 half = c->n >> 1;
        sk_insert_chunk(e, s, pos + 1);
        c = &s->c[pos];
        Chunk *u = &s->c[pos + 1];
        ch_reserve(e, u, c->n - half);
        memcpy(u->a, &c->a[half], (size_t)(c->n - half) * sizeof(Ent));
        u->n = c->n - half;
        c->n = half;
    }
}

static void sk_remove_at(E *e, SK *s, i32 pos, i32 j) {
    Chunk *c = &s->c[pos];
    memmove(&c->a[j], &c->a[j + 1], (size_t)(c->n - j - 1) * sizeof(Ent));
    c->n--;
    if (c->n == 0) {
        sk_drop_chunk(s, pos);
    } else if (c->n < e->load / 2 && s->nc > 1) {
        i32 p = pos == 0 ? 1 : pos; /* join chunk p into p - 1 */
        Chunk *a = &s->c[p - 1], *b = &s->c[p];
        ch_reserve(e, a, (i64)a->n + b->n);
        a = &s->c[p - 1];
        b = &s->c[p];
        memcpy(&a->a[a->n], b->a, (size_t)b->n * sizeof(Ent));
        a->n += b->n;
        sk_drop_chunk(s, p);
        if (s->c[p - 1].n > 2 * e->load) {
            Chunk *c2 = &s->c[p - 1];
            i32 half = c2->n >> 1;
            sk_insert_chunk(e, s, p);
            c2 = &s->c[p - 1];
            Chunk *u = &s->c[p];
            ch_reserve(e, u, c2->n - half);
            memcpy(u->a, &c2->a[half], (size_t)(c2->n - half) * sizeof(Ent));
            u->n = c2->n - half;
            c2->n = half;
        }
    }
}

static void sk_remove(E *e, SK *s, i64 ks, i64 kt) {
    i32 pos = sk_chunk_for(s, ks, kt);
    if (pos == s->nc) bail(e, UNSUPPORTED);
    Chunk *c = &s->c[pos];
    i32 j = ch_lb(c, ks, kt);
    if (j >= c->n || c->a[j].ks != ks || c->a[j].kt != kt) bail(e, UNSUPPORTED);
    sk_remove_at(e, s, pos, j);
}

/* the smallest key >= (ks, kt): its entry, and where it is */
static inline Ent *sk_ceiling(SK *s, i64 ks, i64 kt, i32 *pos, i32 *j) {
    if (s->nc == 0) return NULL;
    i32 p = s->nc == 1 ? 0 : sk_chunk_for(s, ks, kt);
    if (p == s->nc) return NULL;
    Chunk *c = &s->c[p];
    i32 k = ch_lb(c, ks, kt);
    if (k >= c->n) return NULL;
    *pos = p;
    *j = k;
    return &c->a[k];
}

/* the largest key < (ks, kt) */
static Ent *sk_lower(SK *s, i64 ks, i64 kt) {
    if (s->nc == 0) return NULL;
    i32 p = sk_chunk_for(s, ks, kt);
    if (p < s->nc) {
        Chunk *c = &s->c[p];
        i32 k = ch_lb(c, ks, kt);
        if (k) return &c->a[k - 1];
    }
    if (p == 0) return NULL;
    Chunk *c = &s->c[p - 1];
    return &c->a[c->n - 1];
}

static inline Ent *sk_next(SK *s, i32 *pos, i32 *j) {
    if (*j + 1 < s->c[*pos].n) {
        (*j)++;
    } else {
        if (*pos + 1 >= s->nc) return NULL;
        (*pos)++;
        *j = 0;
    }
    return &s->c[*pos].a[*j];
}

/* -------------------------------------------------------------------- blocks */
#define BK(i) (e->B[(i)])

static i32 new_block(E *e, i64 ptr, i64 size, i32 fl, i32 seg, i64 tb) {
    i32 b;
    if (e->freeb != NONE) {
        b = e->freeb;
        e->freeb = BK(b).next;
    } else {
        e->B = grow32(e, e->B, &e->bcap, (i64)e->nb + 1, sizeof(Block));
        b = e->nb++;
    }
    Block *k = &BK(b);
    memset(k, 0, sizeof(Block));
    k->ptr = ptr;
    k->size = size;
    k->fl = fl;
    k->seg = seg;
    k->tb = tb;
    k->prev = k->next = NONE;
    k->mapped = 1;
    return b;
}

static inline void recycle(E *e, i32 b) {
    Block *k = &BK(b);
    if (k->dead && !k->in_cands && !k->in_fresh) {
        k->dead = 2; /* on the free chain */
        k->next = e->freeb;
        e->freeb = b;
    }
}

static inline void kill(E *e, i32 b) { /* merged away or released: only fresh/cands may hold it */
    BK(b).dead = 1;
    BK(b).prev = BK(b).next = NONE;
    recycle(e, b);
}

static inline i64 new_tb(E *e, i64 ptr) { return e->by_addr ? ptr : e->counter++; }

static int releasable(E *e, i32 b) {
    Block *k = &BK(b);
    if (k->prev == NONE && k->next == NONE) return 1;
    if (k->seg == NONE) return 0;
    ExpSeg *s = &e->res[k->seg];
    i64 page = s->page, off = k->ptr - s->base;
    return ceildiv(off, page) * page < floordiv(off + k->size, page) * page;
}

static void cands_add(E *e, i32 b) {
    Block *k = &BK(b);
    if (k->in_cands) return;
    Pool *p = &e->pools[e->fls[k->fl].pool];
    p->cands = grow32(e, p->cands, &p->ccap, (i64)p->ncands + 1, sizeof(i32));
    p->cands[p->ncands++] = b;
    BK(b).in_cands = 1;
}

static inline void fresh_add(E *e, i32 b) {
    if (BK(b).in_fresh) return;
    e->fresh = grow32(e, e->fresh, &e->freshcap, (i64)e->nfresh + 1, sizeof(i32));
    e->fresh[e->nfresh++] = b;
    BK(b).in_fresh = 1;
}

/* blocks.insert_free */
static void insert_free(E *e, i32 b) {
    Block *k = &BK(b);
    FL *fl = &e->fls[k->fl];
    sk_add(e, &fl->keys, k->size, k->tb, b);
    k = &BK(b);
    k->ks = k->size;
    k->kt = k->tb;
    k->cached = 1;
    k->gcb = e->pools[fl->pool].clock;
    if (releasable(e, b)) cands_add(e, b);
}

/* blocks.remove_free */
static inline void remove_free(E *e, i32 b) {
    Block *k = &BK(b);
    sk_remove(e, &e->fls[k->fl].keys, k->ks, k->kt);
    BK(b).cached = 0;
}

/* blocks.drain */
static void drain(E *e) {
    for (i32 i = 0; i < e->nfresh; i++) {
        i32 b = e->fresh[i];
        BK(b).in_fresh = 0;
        if (!BK(b).busy && BK(b).cached && releasable(e, b)) cands_add(e, b);
        recycle(e, b);
    }
    e->nfresh = 0;
}

typedef struct {
    i64 srank, ks, kt;
    i32 b, pad;
} Order;

static int set_order(const void *x, const void *y) {
    const Order *a = x, *b = y;
    if (a->srank != b->srank) return a->srank < b->srank ? -1 : 1;
    if (a->ks != b->ks) return a->ks < b->ks ? -1 : 1;
    if (a->kt != b->kt) return a->kt < b->kt ? -1 : 1;
    return 0;
}

/* blocks.candidates: the pool's cached blocks a release or GC may act on, in torch's set
 * order, into e->scratch (copied by the caller before anything else uses it) */
static i32 candidates(E *e, i32 pool) {
    Pool *p = &e->pools[pool];
    i32 keep = 0;
    e->nscratch = 0;
    for (i32 i = 0; i < p->ncands; i++) {
        i32 b = p->cands[i];
        if (!BK(b).busy && BK(b).mapped && BK(b).cached && releasable(e, b)) {
            p->cands[keep++] = b;
            e->scratch = grow32(e, e->scratch, &e->scratchcap, (i64)e->nscratch + 1, sizeof(i32));
            e->scratch[e->nscratch++] = b;
        } else {
            BK(b).in_cands = 0;
            recycle(e, b);
        }
    }
    p->ncands = keep;
    if (e->nscratch > 1) {
        Order *o = malloc((size_t)e->nscratch * sizeof(Order));
        if (!o) bail(e, NOMEM);
        for (i32 i = 0; i < e->nscratch; i++) {
            Block *k = &BK(e->scratch[i]);
            o[i].srank = e->fls[k->fl].srank;
            o[i].ks = k->ks;
            o[i].kt = k->kt;
            o[i].b = e->scratch[i];
        }
        qsort(o, (size_t)e->nscratch, sizeof(Order), set_order);
        for (i32 i = 0; i < e->nscratch; i++) e->scratch[i] = o[i].b;
        free(o);
    }
    return e->nscratch;
}

static i32 *copy_scratch(E *e, i32 n) {
    i32 *out = malloc((size_t)(n ? n : 1) * sizeof(i32));
    if (!out) bail(e, NOMEM);
    memcpy(out, e->scratch, (size_t)n * sizeof(i32));
    return out;
}

/* -------------------------------------------------------- driver address model */
static inline i64 aligned_room(i64 start, i64 length) {
    return start + length - ceildiv(start, VA_ALIGN) * VA_ALIGN;
}

static inline void tn_pull(E *e, i32 t) {
    TN *n = &e->T[t];
    i64 ln = n->ln, al = n->al;
    if (n->l != NONE) {
        if (e->T[n->l].mln > ln) ln = e->T[n->l].mln;
        if (e->T[n->l].mal > al) al = e->T[n->l].mal;
    }
    if (n->r != NONE) {
        if (e->T[n->r].mln > ln) ln = e->T[n->r].mln;
        if (e->T[n->r].mal > al) al = e->T[n->r].mal;
    }
    n->mln = ln;
    n->mal = al;
}

static void tn_split(E *e, i32 t, i64 key, i32 *a, i32 *b) { /* a: keys < key, b: keys >= key */
    if (t == NONE) {
        *a = *b = NONE;
        return;
    }
    if (e->T[t].key < key) {
        i32 x, y;
        tn_split(e, e->T[t].r, key, &x, &y);
        e->T[t].r = x;
        tn_pull(e, t);
        *a = t;
        *b = y;
    } else {
        i32 x, y;
        tn_split(e, e->T[t].l, key, &x, &y);
        e->T[t].l = y;
        tn_pull(e, t);
        *a = x;
        *b = t;
    }
}

static i32 tn_merge(E *e, i32 a, i32 b) {
    if (a == NONE) return b;
    if (b == NONE) return a;
    if (e->T[a].pr > e->T[b].pr) {
        e->T[a].r = tn_merge(e, e->T[a].r, b);
        tn_pull(e, a);
        return a;
    }
    e->T[b].l = tn_merge(e, a, e->T[b].l);
    tn_pull(e, b);
    return b;
}

static uint64_t next_rand(E *e) { /* splitmix64: the treap's shape only, never a result */
    uint64_t z = (e->rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void fr_add(E *e, i64 start, i64 length) {
    i32 t;
    if (e->freet != NONE) {
        t = e->freet;
        e->freet = e->T[t].l;
    } else {
        e->T = grow32(e, e->T, &e->tcap, (i64)e->nt + 1, sizeof(TN));
        t = e->nt++;
    }
    TN *n = &e->T[t];
    n->key = start;
    n->ln = n->mln = length;
    n->al = n->mal = aligned_room(start, length);
    n->pr = next_rand(e);
    n->l = n->r = NONE;
    i32 a, b;
    tn_split(e, e->troot, start, &a, &b);
    e->troot = tn_merge(e, tn_merge(e, a, t), b);
}

static i64 fr_remove(E *e, i64 start) {
    i32 a, b, m, c;
    tn_split(e, e->troot, start, &a, &b);
    tn_split(e, b, start + 1, &m, &c);
    if (m == NONE) bail(e, UNSUPPORTED);
    i64 length = e->T[m].ln;
    e->T[m].l = e->freet;
    e->freet = m;
    e->troot = tn_merge(e, a, c);
    return length;
}

static i32 fr_find(E *e, i64 key) {
    i32 t = e->troot;
    while (t != NONE && e->T[t].key != key) t = key < e->T[t].key ? e->T[t].l : e->T[t].r;
    return t;
}

static i32 fr_pred(E *e, i64 x) { /* the range with the largest start below x */
    i32 t = e->troot, best = NONE;
    while (t != NONE) {
        if (e->T[t].key < x) {
            best = t;
            t = e->T[t].r;
        } else {
            t = e->T[t].l;
        }
    }
    return best;
}

/* ranges.FreeRanges.release */
static void fr_release(E *e, i64 addr, i64 size) {
    i64 end = addr + size;
    i32 p = fr_pred(e, addr);
    int has_below = p != NONE && e->T[p].key + e->T[p].ln == addr;
    i64 below = has_below ? e->T[p].key : 0;
    i32 q = fr_find(e, end);
    if (has_below) {
        if (q != NONE) end += fr_remove(e, end);
        fr_remove(e, below);
        fr_add(e, below, end - below);
    } else if (q != NONE) {
        i64 above = fr_remove(e, end);
        fr_add(e, addr, end + above - addr);
    } else {
        fr_add(e, addr, size);
    }
}

/* ranges.FreeRanges.take */
static void fr_take(E *e, i64 start, i64 addr, i64 size) {
    i32 t = fr_find(e, start);
    if (t == NONE) bail(e, UNSUPPORTED);
    i64 end = start + e->T[t].ln;
    if (start < addr) {
        fr_remove(e, start);
        fr_add(e, start, addr - start);
        if (addr + size < end) fr_add(e, addr + size, end - addr - size);
    } else if (addr + size < end) {
        fr_remove(e, start);
        fr_add(e, addr + size, end - addr - size);
    } else {
        fr_remove(e, start);
    }
}

static i32 fr_lowest_fit(E *e, i64 size) {
    i32 t = e->troot;
    if (t == NONE || e->T[t].mln < size) return NONE;
    for (;;) {
        i32 a = e->T[t].l;
        if (a != NONE && e->T[a].mln >= size) t = a;
        else if (e->T[t].ln >= size) return t;
        else t = e->T[t].r;
    }
}

static i32 fr_highest_aligned_fit(E *e, i64 size) {
    i32 t = e->troot;
    if (t == NONE || e->T[t].mal < size) return NONE;
    for (;;) {
        i32 b = e->T[t].r;
        if (b != NONE && e->T[b].mal >= size) t = b;
        else if (e->T[t].al >= size) return t;
        else t = e->T[t].l;
    }
}

/* engine.AddressSpace.allocate */
static i64 space_allocate(E *e, i64 size) {
    if (size < VA_TOP_DOWN_FROM) {
        i32 t = fr_lowest_fit(e, size);
        if (t != NONE) {
            i64 start = e->T[t].key;
            fr_take(e, start, start, size);
            return start;
        }
    } else {
        i32 t = fr_highest_aligned_fit(e, size);
        if (t != NONE) {
            i64 start = e->T[t].key;
            i64 addr = floordiv(start + e->T[t].ln - size, VA_ALIGN) * VA_ALIGN;
            fr_take(e, start, addr, size);
            return addr;
        }
    }
    i64 addr = floordiv(e->space_low - size, VA_ALIGN) * VA_ALIGN;
    if (addr < 0) bail(e, UNSUPPORTED);
    if (addr + size < e->space_low) fr_release(e, addr + size, e->space_low - addr - size);
    e->space_low = addr;
    return addr;
}

/* engine.Engine.reserve_va */
static i64 reserve_va(E *e, i64 size) {
    e->bump -= ceildiv(size, ROUND_LARGE) * ROUND_LARGE;
    if (e->bump < 0) bail(e, UNSUPPORTED);
    return e->bump;
}

static i64 va_lb(E *e, i64 start) {
    i64 lo = 0, hi = e->nva;
    while (lo < hi) {
        i64 mid = (lo + hi) >> 1;
        if (e->va[mid].start < start) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void va_insert(E *e, i64 start, i64 end) {
    i64 pos = va_lb(e, start);
    if (pos < e->nva && e->va[pos].start == start) bail(e, UNSUPPORTED);
    e->va = grow_array(e, e->va, &e->vacap, e->nva + 1, sizeof(VA));
    memmove(&e->va[pos + 1], &e->va[pos], (size_t)(e->nva - pos) * sizeof(VA));
    e->va[pos].start = start;
    e->va[pos].end = end;
    e->nva++;
}

/* engine.Engine._range_free */
static int range_free(E *e, i64 start, i64 size) {
    i64 pos = va_lb(e, start);
    if (pos < e->nva && e->va[pos].start < start + size) return 0;
    return !(pos > 0 && e->va[pos - 1].end > start);
}

/* engine.Engine.segment_address */
static i64 segment_address(E *e, i64 size) {
    if (!e->has_hints) return space_allocate(e, size);
    i64 addr = reserve_va(e, size);
    if (e->hint_pos < e->nhints) {
        i64 hsize = e->hint_size[e->hint_pos], haddr = e->hint_addr[e->hint_pos];
        e->hint_pos++;
        if (hsize == size && range_free(e, haddr, size)) {
            va_insert(e, haddr, haddr + size);
            return haddr;
        }
    }
    return addr;
}

/* engine.Engine.release_address */
static void release_address(E *e, i64 addr, i64 size) {
    if (!e->has_hints) {
        fr_release(e, addr, size);
        return;
    }
    i64 pos = va_lb(e, addr);
    if (pos < e->nva && e->va[pos].start == addr) {
        memmove(&e->va[pos], &e->va[pos + 1], (size_t)(e->nva - pos - 1) * sizeof(VA));
        e->nva--;
    }
}

/* engine.Engine.expandable_base */
static i64 expandable_base(E *e, i64 size) {
    if (e->map_hints && e->map_pos < e->nmap_hints) {
        i64 addr = e->map_hints[e->map_pos];
        int clear = 1;
        for (i32 i = 0; i < e->nres; i++) {
            if (e->res[i].base < addr + size && addr < e->res[i].base + e->res[i].size) {
                clear = 0;
                break;
            }
        }
        if (clear) return addr;
    }
    return reserve_va(e, size);
}

/* ------------------------------------------------------------------- counters */
static inline void grow_reserved(E *e, i64 nbytes) {
    e->reserved += nbytes;
    if (e->reserved > e->peak_reserved) e->peak_reserved = e->reserved;
    if (e->reserved > e->chunk_max_reserved) e->chunk_max_reserved = e->reserved;
}

static void segment_event(E *e, i64 row, int kind, i64 addr, i64 size) {
    if (!e->record_segments) return;
    e->ev = grow_array(e, e->ev, &e->evcap, e->nev + 1, sizeof(SegEv));
    e->ev[e->nev].row = row;
    e->ev[e->nev].kind = kind;
    e->ev[e->nev].addr = addr;
    e->ev[e->nev].size = size;
    e->nev++;
}

static inline int refused(E *e, i64 bs, i64 r) {
    return bs >= e->max_split && (r < e->max_split || bs >= r + e->slack);
}

/* ------------------------------------------------------------ expandable (xp) */
static i64 growable(E *e, i32 b) {
    i32 nx = BK(b).next;
    return BK(b).size + (nx != NONE && !BK(nx).mapped ? BK(nx).size : 0);
}

/* expandable.take_free_expandable */
static i32 take_free_expandable(E *e, FL *fl, i64 r) {
    i32 pos, j;
    Ent *x = sk_ceiling(&fl->keys, r, 0, &pos, &j);
    if (!x) return NONE;
    i32 b = x->b;
    i32 bp = pos, bj = j;
    if (BK(b).seg != NONE) {
        i32 p2 = pos, j2 = j;
        Ent *y;
        while ((y = sk_next(&fl->keys, &p2, &j2)) != NULL) {
            i32 nb = y->b;
            if (growable(e, nb) >= growable(e, b)) break;
            b = nb;
            bp = p2;
            bj = j2;
            if (BK(b).seg == NONE) break;
        }
    }
    if (refused(e, BK(b).size, r)) return NONE;
    sk_remove_at(e, &fl->keys, bp, bj);
    BK(b).cached = 0;
    return b;
}

/* expandable.take_free_skipping_expandable */
static i32 take_free_skipping(E *e, FL *fl, i64 r) {
    i32 pos, j;
    Ent *x = sk_ceiling(&fl->keys, r, 0, &pos, &j);
    while (x) {
        i32 b = x->b;
        if (BK(b).seg == NONE) {
            if (refused(e, BK(b).size, r)) return NONE;
            sk_remove_at(e, &fl->keys, pos, j);
            BK(b).cached = 0;
            return b;
        }
        x = sk_next(&fl->keys, &pos, &j);
    }
    return NONE;
}

static i32 um_lb(FL *fl, i64 ptr) {
    i32 lo = 0, hi = fl->num;
    while (lo < hi) {
        i32 mid = (lo + hi) >> 1;
        if (fl->um[mid].ptr < ptr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void unmapped_insert(E *e, FL *fl, i32 b) {
    i64 ptr = BK(b).ptr;
    i32 pos = um_lb(fl, ptr);
    fl->um = grow32(e, fl->um, &fl->umcap, (i64)fl->num + 1, sizeof(UM));
    memmove(&fl->um[pos + 1], &fl->um[pos], (size_t)(fl->num - pos) * sizeof(UM));
    fl->um[pos].ptr = ptr;
    fl->um[pos].b = b;
    fl->num++;
    if (ptr < fl->dirty) fl->dirty = ptr;
}

static void unmapped_remove(E *e, FL *fl, i32 b) {
    i32 pos = um_lb(fl, BK(b).ptr);
    if (pos >= fl->num || fl->um[pos].ptr != BK(b).ptr) bail(e, UNSUPPORTED);
    memmove(&fl->um[pos], &fl->um[pos + 1], (size_t)(fl->num - pos - 1) * sizeof(UM));
    fl->num--;
}

/* expandable._try_merge */
static void try_merge(E *e, i32 dst, i32 src) {
    if (src == NONE || BK(src).busy || BK(src).mapped != BK(dst).mapped) return;
    if (BK(src).mapped) remove_free(e, src);
    else unmapped_remove(e, &e->fls[BK(src).fl], src);
    if (BK(dst).prev == src) {
        BK(dst).ptr = BK(src).ptr;
        BK(dst).prev = BK(src).prev;
        if (BK(src).prev != NONE) BK(BK(src).prev).next = dst;
        if (e->by_addr) BK(dst).tb = BK(dst).ptr;
    } else {
        BK(dst).next = BK(src).next;
        if (BK(src).next != NONE) BK(BK(src).next).prev = dst;
    }
    BK(dst).size += BK(src).size;
    kill(e, src);
}

static void room_push(E *e, FL *fl, i64 ptr, i64 total) {
    if (fl->nroom == fl->roomcap) {
        i64 cap = fl->roomcap ? 2 * (i64)fl->roomcap : 16;
        if (cap > INT32_MAX) bail(e, UNSUPPORTED);
        i64 *a = realloc(fl->rptr, (size_t)cap * sizeof(i64));
        if (!a) bail(e, NOMEM);
        fl->rptr = a;
        i64 *b = realloc(fl->rtot, (size_t)cap * sizeof(i64));
        if (!b) bail(e, NOMEM);
        fl->rtot = b;
        fl->roomcap = (i32)cap;
    }
    fl->rptr[fl->nroom] = ptr;
    fl->rtot[fl->nroom] = total;
    fl->nroom++;
}

/* expandable._forget_from */
static void forget_from(E *e, FL *fl, i64 dirty) {
    i64 low = dirty;
    /* bisect_right(unmapped_ptrs, dirty) - 1 */
    i32 lo = 0, hi = fl->num;
    while (lo < hi) {
        i32 mid = (lo + hi) >> 1;
        if (fl->um[mid].ptr <= dirty) lo = mid + 1;
        else hi = mid;
    }
    i32 k = lo - 1;
    if (k >= 0) {
        i32 b = fl->um[k].b;
        while (b != NONE && !BK(b).busy) {
            if (!BK(b).mapped && BK(b).ptr < low) low = BK(b).ptr;
            b = BK(b).prev;
        }
    }
    lo = 0;
    hi = fl->nroom;
    while (lo < hi) {
        i32 mid = (lo + hi) >> 1;
        if (fl->rptr[mid] < low) lo = mid + 1;
        else hi = mid;
    }
    fl->nroom = lo;
    if (low < fl->room_end) fl->room_end = low;
}

/* expandable._find_room */
static i32 find_room(E *e, i32 fli, i64 r) {
    FL *fl = &e->fls[fli];
    if (fl->dirty != NO_CHANGE) {
        forget_from(e, fl, fl->dirty);
        fl->dirty = NO_CHANGE;
    }
    i32 lo = 0, hi = fl->nroom;
    while (lo < hi) {
        i32 mid = (lo + hi) >> 1;
        if (fl->rtot[mid] < r) lo = mid + 1;
        else hi = mid;
    }
    i64 start;
    if (lo < fl->nroom) {
        start = fl->rptr[lo];
        fl->nroom = lo;
    } else {
        start = fl->room_end;
    }
    i64 best = fl->nroom ? fl->rtot[fl->nroom - 1] : 0;
    i32 found = NONE;
    i32 pos = um_lb(fl, start);
    int broke = 0;
    for (; pos < fl->num; pos++) {
        i32 u = fl->um[pos].b;
        i32 c = u;
        if (BK(u).prev != NONE && !BK(BK(u).prev).busy) c = BK(u).prev;
        i64 total = 0;
        i32 x = c;
        while (total < r && x != NONE && !BK(x).busy) {
            total += BK(x).size;
            x = BK(x).next;
        }
        if (total >= r) {
            room_push(e, fl, BK(u).ptr, NO_CHANGE);
            fl->room_end = BK(u).ptr + 1;
            found = c;
            broke = 1;
            break;
        }
        if (total > best) {
            best = total;
            room_push(e, fl, BK(u).ptr, total);
        }
    }
    if (!broke) fl->room_end = fl->num ? fl->um[fl->num - 1].ptr + 1 : 0;
    if (found != NONE) return found;
    i64 page = e->pools[fl->pool].small ? SMALL_BUFFER : e->large_segment;
    i64 size = ceildiv(e->exp_reserve, page) * page;
    i64 base = expandable_base(e, size);
    e->res = grow32(e, e->res, &e->rescap, (i64)e->nres + 1, sizeof(ExpSeg));
    e->res[e->nres].base = base;
    e->res[e->nres].page = page;
    e->res[e->nres].size = size;
    i32 seg = e->nres++;
    i32 c = new_block(e, base, size, fli, seg, new_tb(e, base));
    BK(c).mapped = 0;
    unmapped_insert(e, &e->fls[fli], c);
    return c;
}

/* expandable._map_block */
static int map_block(E *e, i32 b, i64 n, i64 row) {
    ExpSeg *s = &e->res[BK(b).seg];
    i64 m = ceildiv(n, s->page) * s->page;
    if (e->usable >= 0 && e->reserved + m > e->usable) return 0;
    i32 fli = BK(b).fl;
    unmapped_remove(e, &e->fls[fli], b);
    e->map_pos++;
    BK(b).mapped = 1;
    if (m < BK(b).size) {
        i32 rest = new_block(e, BK(b).ptr + m, BK(b).size - m, fli, BK(b).seg, new_tb(e, BK(b).ptr + m));
        BK(rest).mapped = 0;
        BK(rest).prev = b;
        BK(rest).next = BK(b).next;
        if (BK(b).next != NONE) BK(BK(b).next).prev = rest;
        BK(b).next = rest;
        unmapped_insert(e, &e->fls[fli], rest);
        BK(b).size = m;
    }
    i64 start = BK(b).ptr;
    try_merge(e, b, BK(b).prev);
    try_merge(e, b, BK(b).next);
    insert_free(e, b);
    grow_reserved(e, m);
    e->num_device_alloc++;
    segment_event(e, row, SEG_MAP, start, m);
    return 1;
}

/* expandable.grow */
static i32 xp_grow(E *e, i32 fli, i64 r, i64 row) {
    i32 c = find_room(e, fli, r);
    if (!BK(c).mapped && !map_block(e, c, BK(c).size < r ? BK(c).size : r, row)) return NONE;
    while (BK(c).size < r) {
        i32 nx = BK(c).next;
        if (nx == NONE || BK(nx).mapped) return NONE;
        i64 want = r - BK(c).size;
        if (!map_block(e, nx, want < BK(nx).size ? want : BK(nx).size, row)) return NONE;
        c = nx;
    }
    remove_free(e, c);
    return c;
}

/* expandable.unmap_block */
static void unmap_block(E *e, i32 b, i64 row) {
    ExpSeg s = e->res[BK(b).seg];
    i64 page = s.page, base = s.base;
    i64 off = BK(b).ptr - base;
    i64 begin = ceildiv(off, page) * page;
    i64 end = floordiv(off + BK(b).size, page) * page;
    if (begin >= end) return;
    i32 fli = BK(b).fl;
    remove_free(e, b);
    i64 before = base + begin - BK(b).ptr;
    if (before > 0) {
        i32 head = new_block(e, BK(b).ptr, before, fli, BK(b).seg, new_tb(e, BK(b).ptr));
        BK(head).prev = BK(b).prev;
        BK(head).next = b;
        if (BK(b).prev != NONE) BK(BK(b).prev).next = head;
        BK(b).prev = head;
        insert_free(e, head);
    }
    i64 after = BK(b).size - before - (end - begin);
    if (after > 0) {
        i32 tail = new_block(e, base + end, after, fli, BK(b).seg, new_tb(e, base + end));
        BK(tail).prev = b;
        BK(tail).next = BK(b).next;
        if (BK(b).next != NONE) BK(BK(b).next).prev = tail;
        BK(b).next = tail;
        insert_free(e, tail);
    }
    BK(b).ptr = base + begin;
    BK(b).size = end - begin;
    BK(b).mapped = 0;
    if (e->by_addr) BK(b).tb = BK(b).ptr;
    try_merge(e, b, BK(b).prev);
    try_merge(e, b, BK(b).next);
    unmapped_insert(e, &e->fls[fli], b);
    e->reserved -= end - begin;
    e->num_device_free++;
    segment_event(e, row, SEG_UNMAP, base + begin, end - begin);
}

/* ------------------------------------------------------------------ reclaim */
/* engine.Engine.to_cache */
static void to_cache(E *e, i32 b) {
    BK(b).busy = 0;
    BK(b).pending = 0;
    i32 nbs[2] = {BK(b).prev, BK(b).next};
    for (int k = 0; k < 2; k++) {
        i32 nb = nbs[k];
        if (nb == NONE || BK(nb).busy || !BK(nb).mapped) continue;
        remove_free(e, nb);
        if (nb == BK(b).prev) {
            BK(b).ptr = BK(nb).ptr;
            BK(b).prev = BK(nb).prev;
            if (BK(nb).prev != NONE) BK(BK(nb).prev).next = b;
            if (e->by_addr) BK(b).tb = BK(b).ptr;
        } else {
            BK(b).next = BK(nb).next;
            if (BK(nb).next != NONE) BK(BK(nb).next).prev = b;
        }
        BK(b).size += BK(nb).size;
        kill(e, nb);
    }
    insert_free(e, b);
    FL *fl = &e->fls[BK(b).fl];
    if (BK(b).ptr < fl->dirty) fl->dirty = BK(b).ptr;
}

/* reclaim.release_block */
static void release_block(E *e, i32 b, i64 row) {
    remove_free(e, b);
    e->reserved -= BK(b).size;
    e->num_device_free++;
    segment_event(e, row, SEG_FREE, BK(b).ptr, BK(b).size);
    release_address(e, BK(b).ptr, BK(b).size);
    BK(b).dead = 1; /* whole: no neighbours to clear */
    recycle(e, b);
}

/* reclaim.release_oversize */
static int release_oversize(E *e, FL *fl, i64 r, i64 row) {
    if (e->max_split_unlimited) return 0;
    i64 need = r > e->max_split ? r : e->max_split;
    i32 pos, j;
    Ent *x = sk_ceiling(&fl->keys, need, 0, &pos, &j);
    if (x && BK(x->b).seg == NONE) {
        release_block(e, x->b, row);
        return 1;
    }
    i64 released = 0;
    Ent *k = sk_lower(&fl->keys, need, 0);
    while (released < need && k) {
        i64 ks = k->ks, kt = k->kt;
        i32 b = k->b;
        if (BK(b).size < e->max_split) break;
        if (BK(b).seg == NONE && BK(b).prev == NONE && BK(b).next == NONE) {
            released += BK(b).size;
            release_block(e, b, row);
        }
        k = sk_lower(&fl->keys, ks, kt);
    }
    return released >= need;
}

/* reclaim._release_blocks */
static void release_blocks(E *e, i32 pool, i64 row) {
    drain(e);
    i32 n = candidates(e, pool);
    i32 *list = copy_scratch(e, n);
    i32 *to_unmap = malloc((size_t)(n ? n : 1) * sizeof(i32));
    if (!to_unmap) {
        free(list);
        bail(e, NOMEM);
    }
    i32 nu = 0;
    for (i32 i = 0; i < n; i++) {
        i32 b = list[i];
        if (BK(b).seg != NONE) to_unmap[nu++] = b;
        else if (BK(b).prev == NONE && BK(b).next == NONE) release_block(e, b, row);
    }
    free(list);
    /* a block merged away meanwhile stays on the list, as in Python: nothing merges a block
     * waiting to be unmapped (it is mapped, its neighbours that merge are unmapped) */
    for (i32 i = 0; i < nu; i++) {
        i32 b = to_unmap[i];
        unmap_block(e, b, row);
        if (!BK(b).mapped && BK(b).prev == NONE && BK(b).next == NONE) {
            unmapped_remove(e, &e->fls[BK(b).fl], b);
        }
    }
    free(to_unmap);
}

static void pend_put(E *e, i64 aid, i32 b) {
    if (e->pend_blk[aid] == NONE) {
        i64 seq = ++e->pend_counter;
        e->pend_seq[aid] = seq;
        e->pend_order = grow_array(e, e->pend_order, &e->pend_order_cap, e->npend_order * 2 + 2, sizeof(i64));
        e->pend_order[2 * e->npend_order] = aid;
        e->pend_order[2 * e->npend_order + 1] = seq;
        e->npend_order++;
        e->npend++;
        if (e->npend_order > 2 * e->npend + 64) { /* drop the order's stale entries */
            i64 keep = 0;
            for (i64 i = 0; i < e->npend_order; i++) {
                i64 a = e->pend_order[2 * i], s = e->pend_order[2 * i + 1];
                if (e->pend_blk[a] != NONE && e->pend_seq[a] == s) {
                    e->pend_order[2 * keep] = a;
                    e->pend_order[2 * keep + 1] = s;
                    keep++;
                }
            }
            e->npend_order = keep;
        }
    }
    e->pend_blk[aid] = b;
}

static i32 pend_pop(E *e, i64 aid) {
    i32 b = e->pend_blk[aid];
    if (b != NONE) {
        e->pend_blk[aid] = NONE;
        e->npend--;
    }
    return b;
}

/* reclaim.free_all_cached */
static void free_all_cached(E *e, i64 row) {
    e->num_sync_all_streams++;
    i64 n = e->npend_order;
    for (i64 i = 0; i < n; i++) {
        i64 aid = e->pend_order[2 * i], seq = e->pend_order[2 * i + 1];
        if (e->pend_blk[aid] == NONE || e->pend_seq[aid] != seq) continue;
        i32 b = e->pend_blk[aid];
        if (e->live[aid] == b) e->live[aid] = NONE;
        e->active -= BK(b).size;
        e->requested -= BK(b).req;
        to_cache(e, b);
    }
    for (i64 i = 0; i < n; i++) e->pend_blk[e->pend_order[2 * i]] = NONE;
    e->npend_order = 0;
    e->npend = 0;
    release_blocks(e, 0, row); /* default large */
    release_blocks(e, 1, row); /* default small */
}

/* reclaim.release_pool */
static void release_pool(E *e, i64 lane, i64 row) {
    e->num_sync_all_streams++;
    release_blocks(e, e->fls[lane * 2].pool, row);
    release_blocks(e, e->fls[lane * 2 + 1].pool, row);
}

/* reclaim.collect_garbage */
static void collect_garbage(E *e, i64 row) {
    i64 budget = e->lim.budget;
    if (e->reserved <= budget) return;
    i64 target = e->reserved - budget;
    Pool *pool = &e->pools[0];
    i64 clock = pool->clock;
    drain(e);
    i32 n = candidates(e, 0);
    i64 total_age = 0, count = 0;
    for (i32 i = 0; i < n; i++) {
        i32 b = e->scratch[i];
        if (BK(b).prev == NONE && BK(b).next == NONE) {
            total_age += clock - BK(b).gcb;
            count++;
        }
    }
    i64 reclaimed = 0;
    int freed = 1;
    while (reclaimed < target && freed && count > 0) {
        if (total_age < 0 || total_age >= (1LL << 53) || count >= (1LL << 53)) bail(e, UNSUPPORTED);
        double threshold = (double)total_age / (double)count;
        freed = 0;
        i32 m = candidates(e, 0);
        i32 *list = copy_scratch(e, m);
        for (i32 i = 0; i < m; i++) {
            i32 b = list[i];
            if (BK(b).prev == NONE && BK(b).next == NONE && BK(b).seg == NONE) {
                i64 age = clock - BK(b).gcb;
                if (age >= (1LL << 53) || age < -(1LL << 53)) {
                    free(list);
                    bail(e, UNSUPPORTED);
                }
                if ((double)age >= threshold) {
                    freed = 1;
                    reclaimed += BK(b).size;
                    total_age -= age;
                    count--;
                    release_block(e, b, row);
                }
            }
        }
        free(list);
    }
}

/* ----------------------------------------------------------------- slow path */
static i64 segment_bytes(E *e, i64 r) {
    if (r <= SMALL_SIZE) return SMALL_BUFFER;
    if (r < MIN_LARGE_ALLOC) return e->large_segment;
    return ceildiv(r, ROUND_LARGE) * ROUND_LARGE;
}

/* engine.Engine.new_segment */
static i32 new_segment(E *e, i32 fli, i64 r, i64 seg, int retry, i64 row) {
    if (retry) e->num_alloc_retries++;
    if (e->lim.allowed >= 0 && e->reserved + seg > e->lim.allowed) return NONE;
    if (e->lim.reject >= 0 && e->reserved + seg > e->lim.reject) {
        e->num_oom_rejections++;
        e->rejected = 1;
        return NONE;
    }
    if (e->pools[e->fls[fli].pool].exp) return xp_grow(e, fli, r, row);
    if (e->usable >= 0 && e->reserved + seg > e->usable) return NONE;
    i64 addr = segment_address(e, seg);
    if (seg > e->largest_segment) e->largest_segment = seg;
    i32 b = new_block(e, addr, seg, fli, NONE, new_tb(e, addr));
    grow_reserved(e, seg);
    e->num_device_alloc++;
    segment_event(e, row, SEG_ALLOC, addr, seg);
    return b;
}

/* engine.Engine.malloc_miss */
static i32 malloc_miss(E *e, i32 fli, i64 r, i64 n, i64 row, int recorded) {
    i64 seg = segment_bytes(e, r);
    if (e->lim.gc_on) collect_garbage(e, row);
    e->rejected = 0;
    i32 b = new_segment(e, fli, r, seg, 0, row);
    if (b == NONE && !e->rejected) {
        if (release_oversize(e, &e->fls[fli], r, row)) b = new_segment(e, fli, r, seg, 0, row);
        if (b == NONE && e->pools[e->fls[fli].pool].dflt) {
            free_all_cached(e, row);
            b = new_segment(e, fli, r, seg, 1, row);
        }
    }
    if (b == NONE) {
        if (!e->rejected) e->num_ooms++;
        if (!e->has_oom || (e->oom_recorded && !recorded)) {
            e->has_oom = 1;
            e->oom_row = row;
            e->oom_n = n;
            e->oom_r = r;
            e->oom_seg = seg;
            e->oom_reserved = e->reserved;
            e->oom_allocated = e->allocated;
            e->oom_recorded = recorded;
            e->oom_rejected = e->rejected;
        }
    }
    return b;
}

/* engine.Engine.take_free */
static i32 take_free(E *e, FL *fl, i64 r) {
    if (e->lim.gc_on) e->pools[fl->pool].clock++;
    if (e->exp_on) return take_free_expandable(e, fl, r);
    if (e->skip_expandable) return take_free_skipping(e, fl, r);
    i32 pos, j;
    Ent *x = sk_ceiling(&fl->keys, r, 0, &pos, &j);
    if (!x) return NONE;
    i32 b = x->b;
    if (refused(e, BK(b).size, r)) return NONE;
    sk_remove_at(e, &fl->keys, pos, j);
    BK(b).cached = 0;
    return b;
}

/* engine.Engine.replay_recorded_oom */
static void replay_recorded_oom(E *e, i64 row, i64 r, i64 lane) {
    e->recorded_ooms++;
    i32 fli = (i32)(lane * 2 + (r <= SMALL_SIZE ? 0 : 1));
    i32 b = take_free(e, &e->fls[fli], r);
    if (b == NONE) b = malloc_miss(e, fli, r, r, row, 1);
    if (b != NONE) {
        e->recorded_ooms_avoided++;
        if (e->first_avoided < 0) e->first_avoided = row;
        to_cache(e, b);
    }
}

static void change_fraction(E *e, i64 encoded) {
    i32 lo = 0, hi = e->nlimit_rows;
    while (lo < hi) {
        i32 mid = (lo + hi) >> 1;
        if (e->limit_rows[mid].key < encoded) lo = mid + 1;
        else hi = mid;
    }
    if (lo >= e->nlimit_rows || e->limit_rows[lo].key != encoded) bail(e, UNSUPPORTED);
    e->lim = e->limit_rows[lo].lim;
}

static inline i64 round_size(E *e, i64 n) {
    if (n < MIN_BLOCK) return MIN_BLOCK;
    int bl = bit_length(n);
    int idx = bl - 21;
    if (idx < 0) idx = 0;
    if (idx > 15) idx = 15;
    i64 d = e->slots[idx];
    if ((e->div2 ? d > 1 : d > 0) && d <= ((n - 1) >> 9)) {
        if (d <= 1 || (n & (n - 1)) == 0) return n;
        i64 low = 1LL << (bl - 1);
        i64 step = low >> (bit_length(d) - 1);
        if (step == 0) return low << 1;
        return ceildiv(n, step) * step;
    }
    return ceildiv(n, MIN_BLOCK) * MIN_BLOCK;
}

/* ------------------------------------------------------------------ hot loop */
/* engine.Engine.run_ops: rows [a, b); 0 when stopped at an OOM */
static int run_ops(E *e, i64 a, i64 bnd) {
    const int8_t *ops = e->ops;
    const i64 *aids = e->aids, *sizes = e->sizes, *lanes = e->lanes;
    i32 *live = e->live;
    const int exp_on = e->exp_on, by_addr = e->by_addr;
    const int exp_lookup = exp_on || e->skip_expandable;
    const i64 max_split = e->max_split;
    for (i64 i = a; i < bnd; i++) {
        int op = ops[i];
        i64 aid = aids[i], n = sizes[i], lane = lanes[i];
        if (op == 0 || op == 7) {
            const int gc_on = e->lim.gc_on;
            i64 r = round_size(e, n);
            int small = r <= SMALL_SIZE;
            i32 fli = (i32)(lane * 2 + (small ? 0 : 1));
            FL *fl = &e->fls[fli];
            if (gc_on) e->pools[fl->pool].clock++;
            i32 blk = NONE;
            if (exp_lookup) {
                blk = exp_on ? take_free_expandable(e, fl, r) : take_free_skipping(e, fl, r);
            } else {
                i32 pos, j;
                Ent *x = sk_ceiling(&fl->keys, r, 0, &pos, &j);
                if (x) {
                    i64 bs = x->ks;
                    if (bs >= max_split && (r < max_split || bs >= r + e->slack)) {
                        blk = NONE;
                    } else if (op == 7 && by_addr && !gc_on && i + 1 < bnd && live[aid] == NONE) {
                        /* freed by the next row and served by the cache: the split and the
                         * merge undo each other, so only the peaks move */
                        i64 rest = bs - r;
                        if (rest >= 512 && (small || (rest > 1048576 && r < max_split))) bs = r;
                        if (e->allocated + bs > e->chunk_max_alloc) e->chunk_max_alloc = e->allocated + bs;
                        if (e->active + bs > e->peak_active) e->peak_active = e->active + bs;
                        i++; /* its free */
                        continue;
                    } else {
                        blk = x->b;
                        sk_remove_at(e, &fl->keys, pos, j);
                        BK(blk).cached = 0;
                    }
                }
            }
            if (blk == NONE) {
                blk = malloc_miss(e, fli, r, n, i, 0);
                if (blk == NONE) {
                    if (e->stop_at_oom) {
                        e->stop_op = i;
                        return 0;
                    }
                    continue;
                }
            }
            fl = &e->fls[fli];
            i64 bs = BK(blk).size;
            i64 rest = bs - r;
            if (rest >= 512 && (small || exp_on || (rest > 1048576 && r < max_split))) {
                i64 ptr = BK(blk).ptr;
                i32 nb = new_block(e, ptr, r, fli, BK(blk).seg, by_addr ? ptr : e->counter++);
                i32 p = BK(blk).prev;
                BK(nb).prev = p;
                if (p != NONE) BK(p).next = nb;
                BK(nb).next = blk;
                BK(blk).prev = nb;
                ptr += r;
                BK(blk).ptr = ptr;
                BK(blk).size = rest;
                if (by_addr) BK(blk).tb = ptr;
                sk_add(e, &fl->keys, rest, BK(blk).tb, blk);
                BK(blk).ks = rest;
                BK(blk).kt = BK(blk).tb;
                BK(blk).cached = 1;
                if (e->lim.gc_on) BK(blk).gcb = e->pools[fl->pool].clock;
                blk = nb;
                bs = r;
            }
            BK(blk).busy = 1;
            BK(blk).req = n;
            live[aid] = blk;
            e->allocated += bs;
            e->active += bs;
            e->requested += n;
            if (e->allocated > e->chunk_max_alloc) e->chunk_max_alloc = e->allocated;
            if (e->active > e->peak_active) e->peak_active = e->active;
        } else if (op == 1) {
            i32 blk = live[aid];
            if (blk == NONE || BK(blk).pending) continue;
            live[aid] = NONE;
            i64 bs = BK(blk).size;
            e->allocated -= bs;
            e->active -= bs;
            e->requested -= BK(blk).req;
            BK(blk).busy = 0;
            i32 fli = BK(blk).fl;
            FL *fl = &e->fls[fli];
            i32 p = BK(blk).prev;
            if (p != NONE && !BK(p).busy && BK(p).mapped) {
                remove_free(e, p);
                BK(blk).ptr = BK(p).ptr;
                BK(blk).size += BK(p).size;
                i32 pp = BK(p).prev;
                BK(blk).prev = pp;
                if (pp != NONE) BK(pp).next = blk;
                kill(e, p);
                if (by_addr) BK(blk).tb = BK(blk).ptr;
            }
            i32 q = BK(blk).next;
            if (q != NONE && !BK(q).busy && BK(q).mapped) {
                remove_free(e, q);
                BK(blk).size += BK(q).size;
                i32 qn = BK(q).next;
                BK(blk).next = qn;
                if (qn != NONE) BK(qn).prev = blk;
                kill(e, q);
            }
            sk_add(e, &fl->keys, BK(blk).size, BK(blk).tb, blk);
            BK(blk).ks = BK(blk).size;
            BK(blk).kt = BK(blk).tb;
            BK(blk).cached = 1;
            if (e->lim.gc_on) BK(blk).gcb = e->pools[fl->pool].clock;
            if (exp_lookup) {
                fresh_add(e, blk);
                if (BK(blk).ptr < fl->dirty) fl->dirty = BK(blk).ptr;
            } else if (BK(blk).prev == NONE && BK(blk).next == NONE) {
                fresh_add(e, blk);
            }
        } else if (op == 2) {
            i32 blk = live[aid];
            if (blk == NONE || BK(blk).pending) continue;
            BK(blk).pending = 1;
            e->allocated -= BK(blk).size;
            pend_put(e, aid, blk);
        } else if (op == 3) {
            i32 blk = pend_pop(e, aid);
            if (blk == NONE) continue;
            if (live[aid] == blk) live[aid] = NONE;
            e->active -= BK(blk).size;
            e->requested -= BK(blk).req;
            to_cache(e, blk);
        } else if (op == 4) {
            replay_recorded_oom(e, i, n, lane);
        } else if (op == 6) {
            change_fraction(e, n);
        } else if (!e->pools[e->fls[lane * 2 + 1].pool].dflt) {
            release_pool(e, lane, i);
        } else if (n == 0 || e->lim.release < 0 || n <= e->lim.release) {
            free_all_cached(e, i);
        }
    }
    if (e->allocated > e->chunk_max_alloc) e->chunk_max_alloc = e->allocated;
    return 1;
}

/* ---------------------------------------------------------------- the module */

static void series_push(E *e, Series *s, i64 last) {
    if (s->n == s->cap) {
        i64 cap = s->cap ? s->cap * 2 : 64;
        i64 **cols[5] = {&s->last, &s->res, &s->alloc, &s->alloc_end, &s->res_end};
        for (int k = 0; k < 5; k++) {
            i64 *q = realloc(*cols[k], (size_t)cap * sizeof(i64));
            if (!q) bail(e, NOMEM);
            *cols[k] = q;
        }
        s->cap = cap;
    }
    s->last[s->n] = last;
    s->res[s->n] = e->chunk_max_reserved;
    s->alloc[s->n] = e->chunk_max_alloc;
    s->alloc_end[s->n] = e->allocated;
    s->res_end[s->n] = e->reserved;
    s->n++;
}

/* engine.Engine._run */
static void replay(E *e, i64 series_points, Series *s) {
    i64 n = e->n;
    i64 sp = series_points > 1 ? series_points : 1;
    i64 chunk = (n + sp - 1) / sp;
    if (chunk < 1) chunk = 1;
    for (i64 a = 0; a < n; a += chunk) {
        e->chunk_max_reserved = e->reserved;
        e->chunk_max_alloc = e->allocated;
        i64 end = a + chunk < n ? a + chunk : n;
        int done = run_ops(e, a, end);
        if (e->nfresh > FRESH_DRAIN_AT) drain(e);
        i64 last = e->stop_op >= 0 ? e->stop_op : end - 1;
        series_push(e, s, last);
        if (e->chunk_max_alloc > e->peak_allocated) e->peak_allocated = e->chunk_max_alloc;
        if (!done) break;
    }
}

static void free_engine(E *e) {
    for (i32 i = 0; i < e->nfl; i++) {
        FL *fl = &e->fls[i];
        for (i32 c = 0; c < fl->keys.nc; c++) free(fl->keys.c[c].a);
        free(fl->keys.c);
        free(fl->um);
        free(fl->rptr);
        free(fl->rtot);
    }
    free(e->fls);
    for (i32 i = 0; i < e->npools; i++) free(e->pools[i].cands);
    free(e->pools);
    free(e->B);
    free(e->res);
    free(e->live);
    free(e->pend_blk);
    free(e->pend_seq);
    free(e->pend_order);
    free(e->fresh);
    free(e->T);
    free(e->hint_size);
    free(e->hint_addr);
    free(e->map_hints);
    free(e->va);
    free(e->ev);
    free(e->scratch);
    free(e->limit_rows);
    free(e->ops);
}

static int get_i64(PyObject *seq, Py_ssize_t i, i64 *out) {
    PyObject *item = PySequence_GetItem(seq, i);
    if (!item) return -1;
    long long v = PyLong_AsLongLong(item);
    Py_DECREF(item);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

static int read_i64s(PyObject *seq, i64 *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (get_i64(seq, i, &out[i]) < 0) return -1;
    return 0;
}

static int bytes_view(PyObject *obj, i64 items, size_t item, const char **out) {
    if (!PyBytes_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "columns must be bytes");
        return -1;
    }
    if (PyBytes_Size(obj) != (Py_ssize_t)(items * (i64)item)) {
        PyErr_SetString(PyExc_ValueError, "a column has the wrong length");
        return -1;
    }
    *out = PyBytes_AsString(obj);
    return *out ? 0 : -1;
}

static i64 *alloc_i64(i64 n) { return malloc((size_t)(n ? n : 1) * sizeof(i64)); }

/* a tuple of v[i], or of at[v[i]]; a value equal to the one before shares its object (a
 * series repeats its peaks from point to point) */
static PyObject *i64_tuple(const i64 *v, i64 n, const i64 *at) {
    PyObject *out = PyTuple_New((Py_ssize_t)n);
    if (!out) return NULL;
    PyObject *prev = NULL;
    i64 last = 0;
    for (i64 i = 0; i < n; i++) {
        i64 value = at ? at[v[i]] : v[i];
        PyObject *x;
        if (prev && value == last) {
            Py_INCREF(prev);
            x = prev;
        } else {
            x = PyLong_FromLongLong(value);
            if (!x) {
                Py_DECREF(out);
                return NULL;
            }
        }
        PyTuple_SetItem(out, (Py_ssize_t)i, x);
        prev = x;
        last = value;
    }
    return out;
}

/* engine.Engine._run's cached share per point, 1 - allocated / reserved: the same double as
 * Python's where both are below 2^53 (then a / r is the correctly rounded quotient in either);
 * None where one is not, and the caller computes them */
static PyObject *frag_tuple(const Series *s) {
    for (i64 i = 0; i < s->n; i++)
        if (s->alloc_end[i] < 0 || s->alloc_end[i] >= (1LL << 53) || s->res_end[i] < 0 ||
            s->res_end[i] >= (1LL << 53))
            Py_RETURN_NONE;
    PyObject *out = PyTuple_New((Py_ssize_t)s->n);
    if (!out) return NULL;
    PyObject *prev = NULL;
    for (i64 i = 0; i < s->n; i++) {
        PyObject *x;
        if (prev && s->alloc_end[i] == s->alloc_end[i - 1] && s->res_end[i] == s->res_end[i - 1]) {
            Py_INCREF(prev);
            x = prev;
        } else {
            double v = s->res_end[i] ? 1.0 - (double)s->alloc_end[i] / (double)s->res_end[i] : 0.0;
            x = PyFloat_FromDouble(v);
            if (!x) {
                Py_DECREF(out);
                return NULL;
            }
        }
        PyTuple_SetItem(out, (Py_ssize_t)i, x);
        prev = x;
    }
    return out;
}

/* The start state, as core/sim/native.py lays out the Python engine's seeded blocks. */
static int seed(E *e, PyObject *payload) {
    PyObject *blocks = PyTuple_GetItem(payload, 0);
    PyObject *live = PyTuple_GetItem(payload, 1);
    PyObject *pending = PyTuple_GetItem(payload, 2);
    PyObject *res = PyTuple_GetItem(payload, 3);
    PyObject *counts = PyTuple_GetItem(payload, 4);
    PyObject *va = PyTuple_GetItem(payload, 5);
    if (!blocks || !live || !pending || !res || !counts || !va) return -1;
    Py_ssize_t nres = PySequence_Size(res);
    if (nres < 0) return -1;
    for (Py_ssize_t i = 0; i < nres; i++) {
        PyObject *t = PySequence_GetItem(res, i);
        if (!t) return -1;
        i64 v[3];
        int bad = read_i64s(t, v, 3);
        Py_DECREF(t);
        if (bad) return -1;
        e->res = grow32(e, e->res, &e->rescap, (i64)e->nres + 1, sizeof(ExpSeg));
        e->res[e->nres].base = v[0];
        e->res[e->nres].page = v[1];
        e->res[e->nres].size = v[2];
        e->nres++;
    }
    Py_ssize_t nb = PySequence_Size(blocks);
    if (nb < 0) return -1;
    for (Py_ssize_t i = 0; i < nb; i++) {
        PyObject *t = PySequence_GetItem(blocks, i);
        if (!t) return -1;
        /* ptr size tb req gcb ks kt prev next fl seg busy pending mapped cached in_cands */
        i64 v[16];
        int bad = read_i64s(t, v, 16);
        Py_DECREF(t);
        if (bad) return -1;
        if (v[9] < 0 || v[9] >= e->nfl || v[10] < NONE || v[10] >= e->nres || v[7] < NONE || v[7] >= nb ||
            v[8] < NONE || v[8] >= nb)
            bail(e, UNSUPPORTED);
        i32 b = new_block(e, v[0], v[1], (i32)v[9], (i32)v[10], v[2]);
        Block *k = &BK(b);
        k->req = v[3];
        k->gcb = v[4];
        k->ks = v[5];
        k->kt = v[6];
        k->prev = (i32)v[7];
        k->next = (i32)v[8];
        k->busy = (uint8_t)v[11];
        k->pending = (uint8_t)v[12];
        k->mapped = (uint8_t)v[13];
        if (v[14]) {
            sk_add(e, &e->fls[v[9]].keys, v[5], v[6], b);
            BK(b).cached = 1;
        }
        if (!BK(b).mapped) unmapped_insert(e, &e->fls[v[9]], b);
        if (v[15]) cands_add(e, b);
    }
    Py_ssize_t nl = PySequence_Size(live);
    for (Py_ssize_t i = 0; i < nl; i++) {
        PyObject *t = PySequence_GetItem(live, i);
        if (!t) return -1;
        i64 v[2];
        int bad = read_i64s(t, v, 2);
        Py_DECREF(t);
        if (bad) return -1;
        if (v[0] < 0 || v[0] >= e->num_addresses || v[1] < 0 || v[1] >= e->nb) bail(e, UNSUPPORTED);
        e->live[v[0]] = (i32)v[1];
    }
    Py_ssize_t np = PySequence_Size(pending);
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *t = PySequence_GetItem(pending, i);
        if (!t) return -1;
        i64 v[2];
        int bad = read_i64s(t, v, 2);
        Py_DECREF(t);
        if (bad) return -1;
        if (v[0] < 0 || v[0] >= e->num_addresses || v[1] < 0 || v[1] >= e->nb) bail(e, UNSUPPORTED);
        pend_put(e, v[0], (i32)v[1]);
    }
    /* reserved allocated active requested peak_reserved chunk_max_reserved peak_allocated
     * chunk_max_alloc peak_active largest_segment skip_expandable space_low counter */
    i64 c[13];
    if (read_i64s(counts, c, 13) < 0) return -1;
    e->reserved = c[0];
    e->allocated = c[1];
    e->active = c[2];
    e->requested = c[3];
    e->peak_reserved = c[4];
    e->chunk_max_reserved = c[5];
    e->peak_allocated = c[6];
    e->chunk_max_alloc = c[7];
    e->peak_active = c[8];
    e->largest_segment = c[9];
    e->skip_expandable = (int)c[10];
    e->space_low = c[11];
    e->counter = c[12];
    Py_ssize_t nv = PySequence_Size(va);
    for (Py_ssize_t i = 0; i < nv; i++) {
        PyObject *t = PySequence_GetItem(va, i);
        if (!t) return -1;
        i64 v[2];
        int bad = read_i64s(t, v, 2);
        Py_DECREF(t);
        if (bad) return -1;
        va_insert(e, v[0], v[1]);
    }
    return 0;
}

static PyObject *result_tuple(E *e, Series *s) {
    PyObject *oom;
    if (e->has_oom) {
        oom = Py_BuildValue("(LLLLLLii)", (long long)e->op_index[e->oom_row], (long long)e->oom_n,
                            (long long)e->oom_r, (long long)e->oom_seg, (long long)e->oom_reserved,
                            (long long)e->oom_allocated, e->oom_recorded, e->oom_rejected);
    } else {
        oom = Py_None;
        Py_INCREF(oom);
    }
    if (!oom) return NULL;
    PyObject *events = PyList_New((Py_ssize_t)e->nev);
    if (!events) {
        Py_DECREF(oom);
        return NULL;
    }
    for (i64 i = 0; i < e->nev; i++) {
        PyObject *t = Py_BuildValue("(LLLL)", (long long)e->op_index[e->ev[i].row], (long long)e->ev[i].kind,
                                    (long long)e->ev[i].addr, (long long)e->ev[i].size);
        if (!t) {
            Py_DECREF(oom);
            Py_DECREF(events);
            return NULL;
        }
        PyList_SetItem(events, (Py_ssize_t)i, t);
    }
    PyObject *cols[7] = {i64_tuple(s->last, s->n, e->op_index), i64_tuple(s->last, s->n, e->op_time),
                         i64_tuple(s->res, s->n, NULL), i64_tuple(s->alloc, s->n, NULL), frag_tuple(s),
                         i64_tuple(s->alloc_end, s->n, NULL), i64_tuple(s->res_end, s->n, NULL)};
    for (int k = 0; k < 7; k++) {
        if (!cols[k]) {
            for (int j = 0; j < 7; j++) Py_XDECREF(cols[j]);
            Py_DECREF(oom);
            Py_DECREF(events);
            return NULL;
        }
    }
    PyObject *counters = Py_BuildValue(
        "(LLLLLLLLLLLLLLLLLL)", (long long)e->peak_reserved, (long long)e->peak_allocated,
        (long long)e->peak_active, (long long)e->reserved, (long long)e->allocated,
        (long long)e->num_device_alloc, (long long)e->num_device_free, (long long)e->num_alloc_retries,
        (long long)e->num_ooms, (long long)e->num_oom_rejections, (long long)e->num_sync_all_streams,
        (long long)e->recorded_ooms, (long long)e->recorded_ooms_avoided, (long long)e->largest_segment,
        (long long)(e->stop_op >= 0 ? e->stop_op : -1),
        (long long)(e->first_avoided >= 0 ? e->op_index[e->first_avoided] : -1), (long long)e->active,
        (long long)e->requested);
    if (!counters) {
        for (int j = 0; j < 7; j++) Py_DECREF(cols[j]);
        Py_DECREF(oom);
        Py_DECREF(events);
        return NULL;
    }
    return Py_BuildValue("(iNNNNNNNNNN)", OK, counters, oom, events, cols[0], cols[1], cols[2], cols[3], cols[4],
                         cols[5], cols[6]);
}

/* replay(columns, lanes, rules, limit_rows, hints, seed, series_points, load) -> tuple
 *
 * columns: (n, ops bytes (int8), aids, sizes, lanes, op_index, op_time (int64 bytes), num_addresses)
 * lanes: (fl_pool tuple: pool index per free list (lane*2 small, lane*2+1 large),
 *         fl_srank tuple, pools tuple of (small, default, expandable))
 * rules: (slots16, div2, max_split (-1 unlimited), slack, large_segment, by_addr, exp_on,
 *         allowed, reject, usable, release, budget, gc_on, exp_reserve, stop_at_oom,
 *         record_segments)
 * limit_rows: sorted tuple of (encoded, allowed, reject, release, budget, gc_on)
 * hints: None or (sizes, addrs, map_addrs)
 * seed: None or the start state (see seed())
 */
static PyObject *py_replay(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *columns, *lanes, *rules, *limit_rows, *hints, *seedp;
    long long series_points;
    int load;
    if (!PyArg_ParseTuple(args, "OOOOOOLi", &columns, &lanes, &rules, &limit_rows, &hints, &seedp, &series_points,
                          &load))
        return NULL;
    if (load < 1) {
        PyErr_SetString(PyExc_ValueError, "load must be positive");
        return NULL;
    }
    E *e = calloc(1, sizeof(E));
    if (!e) return PyErr_NoMemory();
    Series s;
    memset(&s, 0, sizeof(s));
    PyObject *out = NULL;
    /* chunks of 2 * 48 keys at most: a key here is 24 bytes where a Python chunk holds 8-byte
     * references, and an insertion moves half a chunk on average */
    e->load = load < 48 ? load : 48;
    int code = setjmp(e->jb);
    if (code != 0) goto done_code;
    {
        i64 n, num_addresses;
        PyObject *ops_b, *aids_b, *sizes_b, *lanes_b, *index_b, *time_b;
        if (!PyArg_ParseTuple(columns, "LOOOOOOL", &n, &ops_b, &aids_b, &sizes_b, &lanes_b, &index_b, &time_b,
                              &num_addresses))
            goto fail;
        const char *p;
        if (n < 0 || num_addresses < 0 || num_addresses >= INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a trace's rows and address ids are counts below 2^31");
            goto fail;
        }
        e->n = n;
        if (bytes_view(ops_b, n, 1, &p) < 0) goto fail;
        e->ops = malloc((size_t)(n ? n : 1));
        if (!e->ops) bail(e, NOMEM);
        memcpy(e->ops, p, (size_t)n);
        if (bytes_view(aids_b, n, 8, &p) < 0) goto fail;
        e->aids = (const i64 *)p;
        if (bytes_view(sizes_b, n, 8, &p) < 0) goto fail;
        e->sizes = (const i64 *)p;
        if (bytes_view(lanes_b, n, 8, &p) < 0) goto fail;
        e->lanes = (const i64 *)p;
        if (bytes_view(index_b, n, 8, &p) < 0) goto fail;
        e->op_index = (const i64 *)p;
        if (bytes_view(time_b, n, 8, &p) < 0) goto fail;
        e->op_time = (const i64 *)p;
        e->num_addresses = num_addresses;
        PyObject *fl_pool, *fl_srank, *pools;
        if (!PyArg_ParseTuple(lanes, "OOO", &fl_pool, &fl_srank, &pools)) goto fail;
        Py_ssize_t nfl = PySequence_Size(fl_pool), npools = PySequence_Size(pools);
        if (nfl < 0 || npools < 2) goto fail;
        e->fls = calloc((size_t)nfl, sizeof(FL));
        e->pools = calloc((size_t)npools, sizeof(Pool));
        if (!e->fls || !e->pools) bail(e, NOMEM);
        e->nfl = (i32)nfl;
        e->npools = (i32)npools;
        for (Py_ssize_t i = 0; i < nfl; i++) {
            i64 pool, rank;
            if (get_i64(fl_pool, i, &pool) < 0 || get_i64(fl_srank, i, &rank) < 0) goto fail;
            if (pool < 0 || pool >= npools) {
                PyErr_SetString(PyExc_ValueError, "a free list names no pool");
                goto fail;
            }
            e->fls[i].pool = (i32)pool;
            e->fls[i].srank = rank;
            e->fls[i].dirty = NO_CHANGE;
        }
        for (Py_ssize_t i = 0; i < npools; i++) {
            PyObject *t = PySequence_GetItem(pools, i);
            if (!t) goto fail;
            i64 v[3];
            int bad = read_i64s(t, v, 3);
            Py_DECREF(t);
            if (bad) goto fail;
            e->pools[i].small = (uint8_t)v[0];
            e->pools[i].dflt = (uint8_t)v[1];
            e->pools[i].exp = (uint8_t)v[2];
        }
        PyObject *slots;
        long long r[15];
        if (!PyArg_ParseTuple(rules, "OLLLLLLLLLLLLLLL", &slots, &r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6],
                              &r[7], &r[8], &r[9], &r[10], &r[11], &r[12], &r[13], &r[14]))
            goto fail;
        if (read_i64s(slots, e->slots, 16) < 0) goto fail;
        e->div2 = (int)r[0];
        e->max_split_unlimited = r[1] < 0;
        e->max_split = r[1] < 0 ? INT64_MAX : r[1];
        e->slack = r[2];
        e->large_segment = r[3];
        e->by_addr = (int)r[4];
        e->exp_on = (int)r[5];
        e->lim.allowed = r[6];
        e->lim.reject = r[7];
        e->usable = r[8];
        e->lim.release = r[9];
        e->lim.budget = r[10];
        e->lim.gc_on = (int)r[11];
        e->exp_reserve = r[12];
        e->stop_at_oom = (int)r[13];
        e->record_segments = (int)r[14];
        Py_ssize_t nlr = PySequence_Size(limit_rows);
        if (nlr < 0) goto fail;
        e->limit_rows = calloc((size_t)(nlr ? nlr : 1), sizeof(LimitRow));
        if (!e->limit_rows) bail(e, NOMEM);
        e->nlimit_rows = (i32)nlr;
        for (Py_ssize_t i = 0; i < nlr; i++) {
            PyObject *t = PySequence_GetItem(limit_rows, i);
            if (!t) goto fail;
            i64 v[6];
            int bad = read_i64s(t, v, 6);
            Py_DECREF(t);
            if (bad) goto fail;
            e->limit_rows[i].key = v[0];
            e->limit_rows[i].lim.allowed = v[1];
            e->limit_rows[i].lim.reject = v[2];
            e->limit_rows[i].lim.release = v[3];
            e->limit_rows[i].lim.budget = v[4];
            e->limit_rows[i].lim.gc_on = (int)v[5];
        }
        e->live = malloc((size_t)(num_addresses ? num_addresses : 1) * sizeof(i32));
        e->pend_blk = malloc((size_t)(num_addresses ? num_addresses : 1) * sizeof(i32));
        e->pend_seq = alloc_i64(num_addresses);
        if (!e->live || !e->pend_blk || !e->pend_seq) bail(e, NOMEM);
        for (i64 i = 0; i < num_addresses; i++) e->live[i] = e->pend_blk[i] = NONE;
        for (i64 i = 0; i < n; i++) { /* rows a replay can index by */
            if (e->aids[i] < 0 || e->aids[i] >= num_addresses || e->lanes[i] < 0 || 2 * e->lanes[i] + 1 >= nfl) {
                PyErr_SetString(PyExc_ValueError, "a row names an address or lane the trace does not have");
                goto fail;
            }
        }
        for (i64 i = 0; i + 1 < n; i++) /* trace/rows.ops_marking_temporaries */
            if (e->ops[i] == 0 && e->ops[i + 1] == 1 && e->aids[i] == e->aids[i + 1]) e->ops[i] = 7;
        e->freeb = NONE;
        e->freet = NONE;
        e->troot = NONE;
        e->rng = 0x5EED;
        e->space_low = SPACE_TOP;
        e->bump = BUMP_BASE;
        e->stop_op = -1;
        e->first_avoided = -1;
        if (hints != Py_None) {
            PyObject *hs, *ha, *mh;
            if (!PyArg_ParseTuple(hints, "OOO", &hs, &ha, &mh)) goto fail;
            e->has_hints = 1;
            e->nhints = PySequence_Size(hs);
            e->nmap_hints = PySequence_Size(mh);
            if (e->nhints < 0 || e->nmap_hints < 0) goto fail;
            e->hint_size = alloc_i64(e->nhints);
            e->hint_addr = alloc_i64(e->nhints);
            e->map_hints = alloc_i64(e->nmap_hints);
            if (!e->hint_size || !e->hint_addr || !e->map_hints) bail(e, NOMEM);
            if (read_i64s(hs, e->hint_size, e->nhints) < 0 || read_i64s(ha, e->hint_addr, e->nhints) < 0 ||
                read_i64s(mh, e->map_hints, e->nmap_hints) < 0)
                goto fail;
        }
        if (seedp != Py_None && seed(e, seedp) < 0) goto fail;
    }
    {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = setjmp(e->jb);
        if (rc == 0) replay(e, series_points, &s);
        Py_END_ALLOW_THREADS
        if (rc != 0) {
            code = rc;
            goto done_code;
        }
    }
    out = result_tuple(e, &s);
    goto done;
done_code:
    if (code == NOMEM) {
        PyErr_NoMemory();
        out = NULL;
    } else {
        out = Py_BuildValue("(i)", UNSUPPORTED);
    }
    goto done;
fail:
    out = NULL;
done:
    free(s.last);
    free(s.res);
    free(s.alloc);
    free(s.alloc_end);
    free(s.res_end);
    free_engine(e);
    free(e);
    return out;
}

/* timing._own_ids_after_reuse: own_ids(ops, aids, watched, num_addresses) -> (aids bytes, fresh)
 * ops: int8 per row; aids: int64 per row; watched: one byte per address id */
static PyObject *py_own_ids(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ops_b, *aids_b, *watched_b;
    long long num;
    if (!PyArg_ParseTuple(args, "OOOL", &ops_b, &aids_b, &watched_b, &num)) return NULL;
    Py_ssize_t n = PyBytes_Size(ops_b);
    if (n < 0) return NULL;
    const char *ops_p, *aids_p, *w_p;
    if (bytes_view(ops_b, n, 1, &ops_p) < 0 || bytes_view(aids_b, n, 8, &aids_p) < 0 ||
        bytes_view(watched_b, num, 1, &w_p) < 0)
        return NULL;
    const int8_t *ops = (const int8_t *)ops_p;
    const i64 *aids = (const i64 *)aids_p;
    const uint8_t *watched = (const uint8_t *)w_p;
    PyObject *out = PyBytes_FromStringAndSize(aids_p, n * 8);
    i64 *cur = malloc((size_t)(num ? num : 1) * sizeof(i64));
    i64 *req = malloc((size_t)(num ? num : 1) * sizeof(i64));
    if (!out || !cur || !req) {
        Py_XDECREF(out);
        free(cur);
        free(req);
        return PyErr_NoMemory();
    }
    i64 *ids = (i64 *)PyBytes_AsString(out);
    for (i64 a = 0; a < num; a++) cur[a] = req[a] = -1;
    i64 fresh = num;
    for (Py_ssize_t row = 0; row < n; row++) {
        int op = ops[row];
        if (op < 0 || op > 3) continue;
        i64 aid = aids[row];
        if (aid < 0 || aid >= num) {
            Py_DECREF(out);
            free(cur);
            free(req);
            PyErr_SetString(PyExc_ValueError, "a row names an address id the trace does not have");
            return NULL;
        }
        if (!watched[aid]) continue;
        if (op == 0) cur[aid] = fresh++;
        if (op == 3) {
            if (req[aid] >= 0) {
                ids[row] = req[aid];
                req[aid] = -1;
            } else {
                ids[row] = cur[aid] >= 0 ? cur[aid] : aid;
            }
            continue;
        }
        ids[row] = cur[aid] >= 0 ? cur[aid] : aid;
        if (op == 2) req[aid] = ids[row];
    }
    free(cur);
    free(req);
    return Py_BuildValue("(NL)", out, (long long)fresh);
}

/* timing._rebuild: reorder(columns, item sizes, moves, early) -> columns
 * Each row j of moves ((j, p) pairs, p -1: dropped) leaves its place and goes in before row p
 * (p == n: at the end), after the rows moved there earlier in moves' order; with early, ops
 * (the first column, int8) turn free_requested (2) into free (1). */
static PyObject *py_reorder(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cols, *itemsizes, *moves;
    int early;
    if (!PyArg_ParseTuple(args, "OOOp", &cols, &itemsizes, &moves, &early)) return NULL;
    Py_ssize_t ncol = PySequence_Size(cols), nmoves = PySequence_Size(moves);
    if (ncol <= 0 || nmoves < 0 || PySequence_Size(itemsizes) != ncol) {
        PyErr_SetString(PyExc_ValueError, "columns and item sizes must match");
        return NULL;
    }
    i64 item[16];
    const char *src[16];
    if (ncol > 16) {
        PyErr_SetString(PyExc_ValueError, "at most 16 columns");
        return NULL;
    }
    if (read_i64s(itemsizes, item, ncol) < 0) return NULL;
    PyObject *first = PySequence_GetItem(cols, 0);
    if (!first) return NULL;
    Py_ssize_t nbytes0 = PyBytes_Size(first);
    Py_DECREF(first);
    if (nbytes0 < 0 || item[0] <= 0) return NULL;
    i64 n = nbytes0 / item[0];
    PyObject *keep[16];
    for (Py_ssize_t c = 0; c < ncol; c++) {
        keep[c] = PySequence_GetItem(cols, c);
        if (!keep[c] || item[c] <= 0 || item[c] > 8 || bytes_view(keep[c], n, (size_t)item[c], &src[c]) < 0) {
            for (Py_ssize_t k = 0; k <= c; k++) Py_XDECREF(keep[k]);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a column has the wrong length");
            return NULL;
        }
    }
    uint8_t *removed = calloc((size_t)n + 1, 1);
    i64 *at = malloc((size_t)(nmoves ? nmoves : 1) * sizeof(i64)); /* where each move goes */
    i64 *from = malloc((size_t)(nmoves ? nmoves : 1) * sizeof(i64));
    i64 *start = calloc((size_t)n + 2, sizeof(i64)); /* counting sort of the moves by target */
    i64 *order = malloc((size_t)(nmoves ? nmoves : 1) * sizeof(i64));
    PyObject *outs[16] = {NULL};
    i64 kept = n, added = 0;
    int ok = removed && at && from && start && order;
    for (Py_ssize_t m = 0; ok && m < nmoves; m++) {
        PyObject *t = PySequence_GetItem(moves, m);
        i64 v[2];
        if (!t || read_i64s(t, v, 2) < 0) ok = 0;
        Py_XDECREF(t);
        if (!ok) break;
        if (v[0] < 0 || v[0] >= n || v[1] < -1 || v[1] > n || removed[v[0]]) {
            PyErr_SetString(PyExc_ValueError, "a move names a row the trace does not have, or one twice");
            ok = 0;
            break;
        }
        removed[v[0]] = 1;
        kept--;
        from[m] = v[0];
        at[m] = v[1];
        if (v[1] >= 0) {
            start[v[1] + 1]++;
            added++;
        }
    }
    if (ok) {
        for (i64 r = 0; r <= n; r++) start[r + 1] += start[r];
        i64 *fill = malloc((size_t)(n + 1) * sizeof(i64));
        if (!fill) {
            ok = 0;
        } else {
            memcpy(fill, start, (size_t)(n + 1) * sizeof(i64));
            for (Py_ssize_t m = 0; m < nmoves; m++)
                if (at[m] >= 0) order[fill[at[m]]++] = from[m];
            free(fill);
        }
    }
    i64 total = kept + added;
    for (Py_ssize_t c = 0; ok && c < ncol; c++) {
        outs[c] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * item[c]));
        if (!outs[c]) ok = 0;
    }
    if (ok) {
        for (Py_ssize_t c = 0; c < ncol; c++) {
            char *dst = PyBytes_AsString(outs[c]);
            size_t w = (size_t)item[c];
            i64 k = 0;
            for (i64 r = 0; r <= n; r++) {
                for (i64 q = start[r]; q < start[r + 1]; q++) memcpy(dst + (k++) * w, src[c] + order[q] * w, w);
                if (r < n && !removed[r]) {
                    /* a run of kept rows up to the next cut goes in one copy */
                    i64 e2 = r;
                    while (e2 + 1 < n && !removed[e2 + 1] && start[e2 + 2] == start[e2 + 1]) e2++;
                    memcpy(dst + k * w, src[c] + r * w, (size_t)(e2 - r + 1) * w);
                    k += e2 - r + 1;
                    r = e2;
                }
            }
            if (c == 0 && early)
                for (i64 i = 0; i < total; i++)
                    if (dst[i] == 2) dst[i] = 1;
        }
    }
    free(removed);
    free(at);
    free(from);
    free(start);
    free(order);
    for (Py_ssize_t c = 0; c < ncol; c++) Py_DECREF(keep[c]);
    if (!ok) {
        for (Py_ssize_t c = 0; c < ncol; c++) Py_XDECREF(outs[c]);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    PyObject *res = PyTuple_New(ncol);
    if (!res) {
        for (Py_ssize_t c = 0; c < ncol; c++) Py_DECREF(outs[c]);
        return NULL;
    }
    for (Py_ssize_t c = 0; c < ncol; c++) PyTuple_SetItem(res, c, outs[c]);
    return res;
}

/* ------------------------------------------------------------ the decoder's common rows */
typedef struct {
    char *buf;
    Py_ssize_t n, cap;
} Buf;

static int buf_put(Buf *b, const void *v, Py_ssize_t size) {
    if (b->n + size > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + size) cap *= 2;
        char *q = realloc(b->buf, (size_t)cap);
        if (!q) return -1;
        b->buf = q;
        b->cap = cap;
    }
    memcpy(b->buf + b->n, v, (size_t)size);
    b->n += size;
    return 0;
}

static PyObject *s_action, *s_addr, *s_size, *s_stream, *s_time_us, *s_pool_id, *s_segment_pool_id, *s_mempool_id,
    *s_alloc, *s_free_requested, *s_free_completed;

/* the value under key (borrowed), NULL where absent; sets *err on an error */
static PyObject *get(PyObject *d, PyObject *key, int *err) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (!v && PyErr_Occurred()) *err = 1;
    return v;
}

/* an exact int that fits in 64 bits: 1, its value in *out; 0 otherwise */
static int exact_i64(PyObject *v, i64 *out) {
    if (!v || !PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (overflow) return 0;
    *out = x;
    return 1;
}

/* The row a common entry emits (trace/decode._Decoder._emitter's emit): its lane from
 * default_lanes (0: the stream has none yet, or the entry names a pool: not common), its time
 * (0: not an int in 64 bits, or a bool: not common). */
static int emit_fields(PyObject *e, PyObject *default_lanes, i64 *lane, i64 *stamp, int *err) {
    PyObject *stream = get(e, s_stream, err);
    if (*err || !stream || !PyLong_CheckExact(stream)) return 0;
    if (get(e, s_pool_id, err) || *err || get(e, s_segment_pool_id, err) || *err || get(e, s_mempool_id, err) ||
        *err)
        return 0;
    PyObject *l = get(default_lanes, stream, err);
    if (*err || !l || !exact_i64(l, lane)) return 0;
    PyObject *t = get(e, s_time_us, err);
    if (*err) return 0;
    if (!t) {
        *stamp = 0;
        return 1;
    }
    return exact_i64(t, stamp);
}

static int aid_of(PyObject *addr_ids, PyObject *addr, i64 *aid) {
    PyObject *v = PyDict_GetItemWithError(addr_ids, addr);
    if (v) {
        if (!exact_i64(v, aid)) {
            PyErr_SetString(PyExc_ValueError, "an address id is not an int");
            return -1;
        }
        return 0;
    }
    if (PyErr_Occurred()) return -1;
    Py_ssize_t n = PyDict_Size(addr_ids);
    PyObject *id = PyLong_FromSsize_t(n);
    if (!id) return -1;
    int rc = PyDict_SetItem(addr_ids, addr, id);
    Py_DECREF(id);
    *aid = n;
    return rc;
}

static int count(PyObject *counts, PyObject *act) {
    PyObject *v = PyDict_GetItemWithError(counts, act);
    if (!v && PyErr_Occurred()) return -1;
    PyObject *one = PyLong_FromLong(1);
    if (!one) return -1;
    PyObject *next = v ? PyNumber_Add(v, one) : (Py_INCREF(one), one);
    Py_DECREF(one);
    if (!next) return -1;
    int rc = PyDict_SetItem(counts, act, next);
    Py_DECREF(next);
    return rc;
}

/* decode_common(entries, start, addr_ids, live, counts, default_lanes)
 *     -> (next index, deferred added, ops, aids, sizes, lanes, index, times)
 *
 * trace/decode._Decoder.run for a run of common entries from ``start``: exact dicts whose
 * action is alloc, free_requested or free_completed, with an exact int address, stream and time
 * (and size, for an alloc) in 64 bits, no pool field, a stream that has its default lane already,
 * a free of an address the decoder knows. Each updates the same dicts as the Python loop, in the
 * same order, and its row goes to the returned columns (raw bytes: int8 ops, int64 the rest). It
 * stops at the first entry that is not common, untouched, for the Python loop. The caller uses it
 * only while no completion is held (_Decoder.held) and no private pool was read off the run. */
static PyObject *py_decode_common(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *entries, *addr_ids, *live, *counts, *default_lanes;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!O!O!O!", &PyList_Type, &entries, &start, &PyDict_Type, &addr_ids, &PyDict_Type,
                          &live, &PyDict_Type, &counts, &PyDict_Type, &default_lanes))
        return NULL;
    Py_ssize_t n = PyList_Size(entries);
    Buf cols[6];
    memset(cols, 0, sizeof(cols));
    i64 deferred = 0;
    Py_ssize_t idx = start < 0 ? 0 : start;
    int err = 0;
    while (idx < n && !err) {
        PyObject *e = PyList_GetItem(entries, idx);
        if (!e || !PyDict_CheckExact(e)) break;
        PyObject *act = get(e, s_action, &err);
        if (err || !act || !PyUnicode_CheckExact(act)) break;
        int kind = PyUnicode_Compare(act, s_alloc) == 0 ? 0
                   : PyUnicode_Compare(act, s_free_requested) == 0 ? 1
                   : PyUnicode_Compare(act, s_free_completed) == 0 ? 2 : -1;
        if (PyErr_Occurred()) {
            err = 1;
            break;
        }
        if (kind < 0) break;
        PyObject *addr = get(e, s_addr, &err);
        i64 addr_v;
        if (err || !exact_i64(addr, &addr_v)) break;
        i64 lane, stamp, size = 0;
        if (!emit_fields(e, default_lanes, &lane, &stamp, &err)) break;
        int8_t op;
        int fused = 0;
        PyObject *was = NULL; /* live[addr], borrowed */
        if (kind == 0) {
            if (!exact_i64(get(e, s_size, &err), &size) || err) break;
            op = 0;
        } else {
            was = get(live, addr, &err);
            if (err || !was) break; /* a free of an address the decoder does not know: Python counts it */
            if (kind == 1) {
                if (idx + 1 < n) {
                    PyObject *nx = PyList_GetItem(entries, idx + 1);
                    if (!nx || !PyDict_CheckExact(nx)) break;
                    PyObject *nact = get(nx, s_action, &err);
                    if (err || !nact) break;
                    if (PyUnicode_CheckExact(nact)) {
                        int same = PyUnicode_Compare(nact, s_free_completed) == 0;
                        if (PyErr_Occurred()) {
                            err = 1;
                            break;
                        }
                        if (same) {
                            PyObject *other = get(nx, s_addr, &err);
                            i64 other_v;
                            if (err || !exact_i64(other, &other_v)) break;
                            fused = other_v == addr_v;
                        }
                    } else {
                        break; /* an action Python compares by ==: left to it */
                    }
                }
                int requested = PyObject_IsTrue(was);
                if (requested < 0) {
                    err = 1;
                    break;
                }
                op = fused ? (requested ? 3 : 1) : (requested ? -1 : 2);
            } else {
                int requested = PyObject_IsTrue(was);
                if (requested < 0) {
                    err = 1;
                    break;
                }
                op = requested ? 3 : 1;
            }
        }
        /* the entry is common: its effects, in the Python loop's order */
        if (count(counts, act) < 0) {
            err = 1;
            break;
        }
        if (kind == 0) {
            if (PyDict_SetItem(live, addr, Py_False) < 0) {
                err = 1;
                break;
            }
        } else if (kind == 1) {
            if (fused && count(counts, s_free_completed) < 0) {
                err = 1;
                break;
            }
            if (fused) {
                if (PyDict_DelItem(live, addr) < 0) {
                    err = 1;
                    break;
                }
            } else if (op == 2) {
                if (PyDict_SetItem(live, addr, Py_True) < 0) {
                    err = 1;
                    break;
                }
                deferred++;
            }
        } else {
            if (PyDict_DelItem(live, addr) < 0) {
                err = 1;
                break;
            }
        }
        if (op >= 0) {
            i64 aid, row = idx;
            if (aid_of(addr_ids, addr, &aid) < 0) {
                err = 1;
                break;
            }
            if (buf_put(&cols[0], &op, 1) < 0 || buf_put(&cols[1], &aid, 8) < 0 || buf_put(&cols[2], &size, 8) < 0 ||
                buf_put(&cols[3], &lane, 8) < 0 || buf_put(&cols[4], &row, 8) < 0 ||
                buf_put(&cols[5], &stamp, 8) < 0) {
                PyErr_NoMemory();
                err = 1;
                break;
            }
        }
        idx += fused ? 2 : 1;
    }
    PyObject *out = NULL;
    if (!err && !PyErr_Occurred()) {
        out = Py_BuildValue("(nLy#y#y#y#y#y#)", idx, (long long)deferred, cols[0].buf ? cols[0].buf : "", cols[0].n,
                            cols[1].buf ? cols[1].buf : "", cols[1].n, cols[2].buf ? cols[2].buf : "", cols[2].n,
                            cols[3].buf ? cols[3].buf : "", cols[3].n, cols[4].buf ? cols[4].buf : "", cols[4].n,
                            cols[5].buf ? cols[5].buf : "", cols[5].n);
    }
    for (int k = 0; k < 6; k++) free(cols[k].buf);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_common", py_decode_common, METH_VARARGS, "trace/decode's loop over common entries."},
    {"replay", py_replay, METH_VARARGS, "Replay one trace under one configuration (see core/sim/native.py)."},
    {"own_ids", py_own_ids, METH_VARARGS, "timing._own_ids_after_reuse on raw columns."},
    {"reorder", py_reorder, METH_VARARGS, "timing._rebuild on raw columns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay", "The compiled replay engine (core/sim/native.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__replay(void) {
    const char *names[] = {"action", "addr", "size", "stream", "time_us", "pool_id", "segment_pool_id", "mempool_id",
                           "alloc", "free_requested", "free_completed"};
    PyObject **slots[] = {&s_action, &s_addr, &s_size, &s_stream, &s_time_us, &s_pool_id, &s_segment_pool_id,
                          &s_mempool_id, &s_alloc, &s_free_requested, &s_free_completed};
    for (int k = 0; k < 11; k++) {
        *slots[k] = PyUnicode_InternFromString(names[k]);
        if (!*slots[k]) return NULL;
    }
    return PyModule_Create(&module);
}
