/* ragspec's exact top-k BM25 in C (bm25_native.py compiles and loads it): MaxScore over the
 * posting segments of bm25_postings.py.
 *
 * One term's contribution to a row is idf * tf * k1p1 / (tf + norms[row]) -- the very
 * operations, in the very order, of bm25_postings.contribution (compiled with
 * -ffp-contract=off, no fast-math: every step is one IEEE rounding, as in numpy). A row's final
 * score is the sum of its terms' contributions added in the caller's term order, starting from
 * 0.0, as the exhaustive numpy scorer adds them, so the scores are equal to the last bit.
 *
 * ragspec_bm25_lookup: per query term and segment, the term's posting range (binary search in
 * the segment's sorted term ids), the term's document frequency over live rows, and its largest
 * term factor (the segment bounds, scaled).
 *
 * ragspec_bm25_maxscore: the rows that may be in the top k, with their exact scores. Terms are
 * ordered by their bound. First the rows of the highest-bound (rare) terms' lists, up to
 * `seed_rows`, are scored exactly: their k-th best is a floor under the final k-th score
 * (theta). Terms whose bounds together stay below the floor are "non-essential": a row is only
 * looked up in their lists (galloping forward) when it appears in an essential list, and
 * dropped as soon as its partial score plus the bounds still unread falls below the floor.
 * Two traversals of the essential lists: term at a time (when `scratch` and `marks` are given:
 * each essential list read straight through into per-row scratch scores, then the touched rows
 * visited in increasing order; the scratch is left zeroed) or document at a time (the lists
 * merged row by row, and terms turn non-essential as the floor rises). Rows whose score,
 * summed in traversal order, reaches the floor within a relative margin are kept; at the end
 * those still within the margin of the final floor are re-scored exactly, in the caller's
 * order. The caller then keeps the k best of those. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const int32_t *rows;
    const int32_t *tfs;
    int64_t len;
    int64_t pos;
    int64_t term;
} cursor_t;

static inline double contribution(double idf, int32_t count, double k1p1, double norm) {
    double tf = (double)count;
    double c = idf * tf;
    c = c * k1p1;
    c = c / (tf + norm);
    return c;
}

/* The first index >= pos whose row is >= target (len when none). */
static inline int64_t gallop(const int32_t *rows, int64_t pos, int64_t len, int32_t target) {
    if (pos >= len || rows[pos] >= target) return pos;
    int64_t lo = pos, step = 1;
    while (lo + step < len && rows[lo + step] < target) {
        lo += step;
        step <<= 1;
    }
    int64_t hi = lo + step < len ? lo + step : len;
    lo += 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rows[mid] < target) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int64_t find_row(const int32_t *rows, int64_t len, int32_t row) {
    int64_t lo = 0, hi = len;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rows[mid] < row) lo = mid + 1; else hi = mid;
    }
    return lo < len && rows[lo] == row ? lo : -1;
}

void ragspec_bm25_lookup(int64_t n_seg, const int32_t *const *seg_terms,
                         const int64_t *seg_nterms, const int64_t *const *seg_starts,
                         const int32_t *const *seg_rows, const double *const *seg_best,
                         const double *seg_scale, int64_t n_q, const int32_t *qterms,
                         const uint8_t *alive, int64_t *lo, int64_t *hi, int64_t *df,
                         double *factor) {
    for (int64_t q = 0; q < n_q; q++) {
        int32_t term = qterms[q];
        int64_t live = 0;
        double best = 0.0;
        for (int64_t s = 0; s < n_seg; s++) {
            const int32_t *terms = seg_terms[s];
            int64_t a = 0, b = seg_nterms[s];
            while (a < b) {
                int64_t mid = a + (b - a) / 2;
                if (terms[mid] < term) a = mid + 1; else b = mid;
            }
            int64_t at = q * n_seg + s;
            lo[at] = hi[at] = 0;
            if (a >= seg_nterms[s] || terms[a] != term) continue;
            int64_t first = seg_starts[s][a], last = seg_starts[s][a + 1];
            int64_t held = last - first;
            if (alive) {
                const int32_t *rows = seg_rows[s];
                held = 0;
                for (int64_t i = first; i < last; i++) held += alive[rows[i]];
            }
            if (!held) continue;
            lo[at] = first;
            hi[at] = last;
            live += held;
            double f = seg_best[s][a] * seg_scale[s];
            if (f > best) best = f;
        }
        df[q] = live;
        factor[q] = best;
    }
}

/* A row's score over every term, summed in the caller's term order (the exhaustive bits). */
static double exact_score(const cursor_t *cur, const int64_t *by_term, int64_t n_q,
                          const double *idf, double k1p1, const double *norms, int32_t row) {
    double score = 0.0;
    for (int64_t t = 0; t < n_q; t++) {
        for (int64_t ci = by_term[t]; ci < by_term[t + 1]; ci++) {
            int64_t at = find_row(cur[ci].rows, cur[ci].len, row);
            if (at >= 0) {
                score += contribution(idf[t], cur[ci].tfs[at], k1p1, norms[row]);
                break;
            }
        }
    }
    return score;
}

static int compare_rows(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A min-heap of the k best scores so far. */
static void heap_push(double *heap, int64_t *size, int64_t k, double value) {
    if (*size < k) {
        int64_t i = (*size)++;
        while (i > 0) {
            int64_t parent = (i - 1) / 2;
            if (heap[parent] <= value) break;
            heap[i] = heap[parent];
            i = parent;
        }
        heap[i] = value;
        return;
    }
    if (value <= heap[0]) return;
    int64_t i = 0;
    for (;;) {
        int64_t child = 2 * i + 1;
        if (child >= k) break;
        if (child + 1 < k && heap[child + 1] < heap[child]) child++;
        if (heap[child] >= value) break;
        heap[i] = heap[child];
        i = child;
    }
    heap[i] = value;
}

/* `visited` (when not NULL) is set to the postings the traversal read (essential lists' entries
 * and the rows galloping landed on). Returns the number of rows written, -needed when `cap` is too small (nothing written then),
 * or -1 - INT64_MAX / 2 when memory runs out. */
int64_t ragspec_bm25_maxscore(int64_t n_seg, const int32_t *const *seg_rows,
                              const int32_t *const *seg_counts, int64_t n_q, const int64_t *lo,
                              const int64_t *hi, const double *idf, const double *bound,
                              double k1p1, const double *norms, const uint8_t *alive, int64_t k,
                              double slack, int64_t cap, int64_t *out_rows,
                              double *out_scores, int64_t *visited, double *scratch,
                              uint8_t *marks, int64_t seed_rows) {
    const int64_t oom = -1 - INT64_MAX / 2;
    int64_t n_cur = 0;
    for (int64_t i = 0; i < n_q * n_seg; i++) n_cur += hi[i] > lo[i];
    cursor_t *cur = malloc((n_cur + 1) * sizeof *cur);
    int64_t *by_term = malloc((n_q + 1) * sizeof *by_term); /* term's cursors: [by_term[t], by_term[t+1]) */
    int64_t *order = malloc((n_q + 1) * sizeof *order);    /* terms by increasing bound */
    double *rest = malloc((n_q + 1) * sizeof *rest);        /* rest[j]: bounds of order[0..j-1] */
    int64_t *essential = malloc((n_cur + 1) * sizeof *essential);
    double *heap = malloc((k + 1) * sizeof *heap);
    int64_t kept_cap = 1024, kept = 0;
    int32_t *kept_rows = malloc(kept_cap * sizeof *kept_rows);
    double *kept_scores = malloc(kept_cap * sizeof *kept_scores);
    int64_t result = 0;
    if (!cur || !by_term || !order || !rest || !essential || !heap || !kept_rows ||
        !kept_scores) {
        result = oom;
        goto done;
    }
    n_cur = 0;
    for (int64_t t = 0; t < n_q; t++) {
        by_term[t] = n_cur;
        for (int64_t s = 0; s < n_seg; s++) {
            int64_t at = t * n_seg + s;
            if (hi[at] <= lo[at]) continue;
            cur[n_cur].rows = seg_rows[s] + lo[at];
            cur[n_cur].tfs = seg_counts[s] + lo[at];
            cur[n_cur].len = hi[at] - lo[at];
            cur[n_cur].pos = 0;
            cur[n_cur].term = t;
            n_cur++;
        }
        order[t] = t;
    }
    by_term[n_q] = n_cur;
    for (int64_t i = 1; i < n_q; i++) { /* insertion sort: a query has a few terms */
        int64_t t = order[i], j = i;
        while (j > 0 && bound[order[j - 1]] > bound[t]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = t;
    }
    rest[0] = 0.0;
    for (int64_t j = 0; j < n_q; j++) rest[j + 1] = rest[j] + bound[order[j]];
    for (int64_t j = 0; j <= n_q; j++) rest[j] *= 1.0 + slack; /* rounded up */

    int64_t heap_size = 0, n_non = 0, n_ess = 0, read = 0;
    double floor_ = -INFINITY; /* theta * (1 - slack): below it a row cannot be in the top k */
    /* A head start: score the rows of the highest-bound (rare) terms' lists first, up to a
     * budget, and start from their k-th best. Any set of rows gives a floor under the final
     * k-th score; the traversal below then skips the common words' lists from its first row
     * instead of from the k-th good row it meets. */
    int64_t budget = seed_rows, n_seed = 0;
    int32_t *seed = malloc((budget + 1) * sizeof *seed);
    if (!seed) {
        result = oom;
        goto done;
    }
    for (int64_t j = n_q - 1; j >= 0 && n_seed < budget; j--) {
        int64_t t = order[j];
        for (int64_t ci = by_term[t]; ci < by_term[t + 1] && n_seed < budget; ci++)
            for (int64_t i = 0; i < cur[ci].len && n_seed < budget; i++)
                seed[n_seed++] = cur[ci].rows[i];
    }
    qsort(seed, n_seed, sizeof *seed, compare_rows);
    for (int64_t i = 0; i < n_seed; i++) {
        if ((i && seed[i] == seed[i - 1]) || (alive && !alive[seed[i]])) continue;
        heap_push(heap, &heap_size, k, exact_score(cur, by_term, n_q, idf, k1p1, norms, seed[i]));
    }
    read += n_seed;
    free(seed);
    if (heap_size == k) floor_ = heap[0] * (1.0 - slack);
    heap_size = 0; /* the traversal meets these rows again: a row must not count twice */
    while (n_non < n_q && rest[n_non + 1] < floor_) n_non++;
    for (int64_t j = n_non; j < n_q; j++)
        for (int64_t c = by_term[order[j]]; c < by_term[order[j] + 1]; c++) essential[n_ess++] = c;
    if (scratch) {
        /* The essential lists term at a time into the scratch scores (a pass over each list,
         * no per-row merging), then the touched rows in increasing order: each is probed in
         * the non-essential lists (galloping forward) until its bound falls below the floor. */
        int64_t lo_row = INT64_MAX, hi_row = -1;
        for (int64_t e = 0; e < n_ess; e++) {
            cursor_t *c = &cur[essential[e]];
            double w = idf[c->term];
            const int32_t *rows = c->rows;
            const int32_t *tfs = c->tfs;
            for (int64_t i = 0; i < c->len; i++) {
                int32_t row = rows[i];
                scratch[row] += contribution(w, tfs[i], k1p1, norms[row]);
                marks[row] = 1;
            }
            if (c->len && rows[0] < lo_row) lo_row = rows[0];
            if (c->len && rows[c->len - 1] > hi_row) hi_row = rows[c->len - 1];
            read += c->len;
        }
        int failed = 0;
        for (int64_t row = lo_row; row <= hi_row; row++) {
            if ((row & 7) == 0 && row + 8 <= hi_row + 1) {
                uint64_t word;
                memcpy(&word, marks + row, 8);
                if (!word) {
                    row += 7;
                    continue;
                }
            }
            if (!marks[row]) continue;
            marks[row] = 0;
            double score = scratch[row];
            scratch[row] = 0.0;
            if (failed || (alive && !alive[row])) continue;
            int dropped = 0;
            for (int64_t j = n_non - 1; j >= 0; j--) {
                if (score + rest[j + 1] < floor_) {
                    dropped = 1;
                    break;
                }
                int64_t t = order[j];
                for (int64_t ci = by_term[t]; ci < by_term[t + 1]; ci++) {
                    cursor_t *c = &cur[ci];
                    c->pos = gallop(c->rows, c->pos, c->len, (int32_t)row);
                    read += c->pos < c->len;
                    if (c->pos < c->len && c->rows[c->pos] == row) {
                        score += contribution(idf[t], c->tfs[c->pos], k1p1, norms[row]);
                        break;
                    }
                }
            }
            if (dropped || score < floor_) continue;
            if (kept == kept_cap) {
                kept_cap *= 2;
                int32_t *r = realloc(kept_rows, kept_cap * sizeof *kept_rows);
                if (r) kept_rows = r;
                double *v = realloc(kept_scores, kept_cap * sizeof *kept_scores);
                if (v) kept_scores = v;
                if (!r || !v) {
                    failed = 1; /* keep clearing the scratch, then report */
                    continue;
                }
            }
            kept_rows[kept] = (int32_t)row;
            kept_scores[kept++] = score;
            heap_push(heap, &heap_size, k, score);
            if (heap_size == k && heap[0] * (1.0 - slack) > floor_) floor_ = heap[0] * (1.0 - slack);
        }
        if (failed) {
            result = oom;
            goto done;
        }
    }
    for (; !scratch;) {
        int32_t row = INT32_MAX;
        for (int64_t e = 0; e < n_ess; e++) {
            cursor_t *c = &cur[essential[e]];
            if (c->pos < c->len && c->rows[c->pos] < row) row = c->rows[c->pos];
        }
        if (row == INT32_MAX) break;
        double score = 0.0;
        int64_t touched = 0;
        for (int64_t e = 0; e < n_ess; e++) {
            cursor_t *c = &cur[essential[e]];
            if (c->pos < c->len && c->rows[c->pos] == row) {
                score += contribution(idf[c->term], c->tfs[c->pos], k1p1, norms[row]);
                c->pos++;
                touched++;
            }
        }
        if (alive && !alive[row]) {
            read += touched;
            continue;
        }
        int dropped = 0;
        for (int64_t j = n_non - 1; j >= 0; j--) {
            if (score + rest[j + 1] < floor_) {
                dropped = 1;
                break;
            }
            int64_t t = order[j];
            for (int64_t ci = by_term[t]; ci < by_term[t + 1]; ci++) {
                cursor_t *c = &cur[ci];
                c->pos = gallop(c->rows, c->pos, c->len, row);
                touched += c->pos < c->len;
                if (c->pos < c->len && c->rows[c->pos] == row) {
                    score += contribution(idf[t], c->tfs[c->pos], k1p1, norms[row]);
                    break; /* a row is in one segment's list of a term at most */
                }
            }
        }
        read += touched;
        if (dropped || score < floor_) continue;
        if (kept == kept_cap) {
            kept_cap *= 2;
            int32_t *r = realloc(kept_rows, kept_cap * sizeof *kept_rows);
            if (r) kept_rows = r;
            double *v = realloc(kept_scores, kept_cap * sizeof *kept_scores);
            if (v) kept_scores = v;
            if (!r || !v) {
                result = oom;
                goto done;
            }
        }
        kept_rows[kept] = row;
        kept_scores[kept++] = score;
        heap_push(heap, &heap_size, k, score);
        if (heap_size == k && heap[0] * (1.0 - slack) > floor_) {
            floor_ = heap[0] * (1.0 - slack);
            int64_t before = n_non;
            while (n_non < n_q && rest[n_non + 1] < floor_) n_non++;
            if (n_non != before) {
                n_ess = 0;
                for (int64_t j = n_non; j < n_q; j++)
                    for (int64_t c = by_term[order[j]]; c < by_term[order[j] + 1]; c++)
                        essential[n_ess++] = c;
            }
        }
    }
    int64_t n_out = 0;
    for (int64_t i = 0; i < kept; i++) n_out += kept_scores[i] >= floor_;
    if (n_out > cap) {
        result = -n_out;
        goto done;
    }
    n_out = 0;
    for (int64_t i = 0; i < kept; i++) {
        if (kept_scores[i] < floor_) continue;
        out_rows[n_out] = kept_rows[i];
        out_scores[n_out++] = exact_score(cur, by_term, n_q, idf, k1p1, norms, kept_rows[i]);
    }
    result = n_out;
    if (visited) *visited = read;
done:
    free(cur);
    free(by_term);
    free(order);
    free(rest);
    free(essential);
    free(heap);
    free(kept_rows);
    free(kept_scores);
    return result;
}

/* -- tokenising and counting (bm25.BM25Index.add_many's path for ASCII texts) -----------------
 *
 * A vocabulary (token bytes -> id, ids 0, 1, 2, ... in insertion order) kept in C beside the
 * Python dict it mirrors: the caller inserts the tokens the dict holds and this table lacks
 * (ragspec_vocab_add) before each ragspec_tokenize_count, so ids agree; new tokens found while
 * tokenising get the next ids and are reported back for the dict.
 *
 * For an ASCII text, bm25.tokenize (lowercase, then the runs of re's \w) is: the runs of
 * [A-Za-z0-9_], with A-Z lowered to a-z. Python's str.lower and \w agree with that on every ASCII
 * character; the caller sends only texts for which str.isascii() holds. */

typedef struct {
    char *arena;        /* every token's bytes, back to back */
    int64_t arena_len, arena_cap;
    int64_t *at;        /* id -> offset in arena */
    int32_t *len;       /* id -> length */
    int64_t size, id_cap;
    uint64_t *slots;    /* open addressing: (hash's top 32 bits) << 32 | (id + 1); 0 = empty */
    uint64_t *hashes;   /* id -> hash */
    int64_t n_slots;    /* a power of two */
} vocab_t;

static uint64_t hash_bytes(const char *s, int64_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a, 64 bit */
    for (int64_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

void *ragspec_vocab_new(void) {
    vocab_t *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->n_slots = 1024;
    v->slots = calloc(v->n_slots, sizeof *v->slots);
    if (!v->slots) { free(v); return NULL; }
    return v;
}

void ragspec_vocab_free(void *handle) {
    vocab_t *v = handle;
    if (!v) return;
    free(v->arena); free(v->at); free(v->len); free(v->slots); free(v->hashes); free(v);
}

int64_t ragspec_vocab_size(void *handle) { return ((vocab_t *)handle)->size; }

static int64_t find_token(const vocab_t *v, const char *s, int64_t n, uint64_t h) {
    uint64_t mask = (uint64_t)v->n_slots - 1;
    uint64_t tag = h >> 32;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        uint64_t slot = v->slots[i];
        if (!slot) return -1 - (int64_t)i; /* absent: -1 - the empty slot */
        if (slot >> 32 != tag) continue; /* the tag in the slot spares a look at the token */
        int64_t id = (int64_t)(slot & 0xffffffffu) - 1;
        if (v->len[id] == n && memcmp(v->arena + v->at[id], s, n) == 0) return id;
    }
}

static int grow_slots(vocab_t *v) {
    int64_t n_slots = v->n_slots * 2;
    uint64_t *slots = calloc(n_slots, sizeof *slots);
    if (!slots) return -1;
    uint64_t mask = (uint64_t)n_slots - 1;
    for (int64_t id = 0; id < v->size; id++) {
        uint64_t i = v->hashes[id] & mask;
        while (slots[i]) i = (i + 1) & mask;
        slots[i] = (v->hashes[id] >> 32) << 32 | (uint64_t)(id + 1);
    }
    free(v->slots);
    v->slots = slots;
    v->n_slots = n_slots;
    return 0;
}

/* Append token s (absent, hash h) with the next id; returns the id or -1 when out of memory. */
static int64_t insert_token(vocab_t *v, const char *s, int64_t n, uint64_t h) {
    if (2 * (v->size + 1) > v->n_slots && grow_slots(v)) return -1;
    if (v->size == v->id_cap) {
        int64_t cap = v->id_cap ? 2 * v->id_cap : 1024;
        int64_t *at = realloc(v->at, cap * sizeof *at);
        if (!at) return -1;
        v->at = at;
        int32_t *len = realloc(v->len, cap * sizeof *len);
        if (!len) return -1;
        v->len = len;
        uint64_t *hashes = realloc(v->hashes, cap * sizeof *hashes);
        if (!hashes) return -1;
        v->hashes = hashes;
        v->id_cap = cap;
    }
    if (v->arena_len + n > v->arena_cap) {
        int64_t cap = v->arena_cap ? v->arena_cap : 65536;
        while (cap < v->arena_len + n) cap *= 2;
        char *arena = realloc(v->arena, cap);
        if (!arena) return -1;
        v->arena = arena;
        v->arena_cap = cap;
    }
    memcpy(v->arena + v->arena_len, s, n);
    int64_t id = v->size++;
    v->at[id] = v->arena_len;
    v->len[id] = (int32_t)n;
    v->hashes[id] = h;
    v->arena_len += n;
    int64_t found = find_token(v, s, n, h); /* the empty slot for it (the table may have grown) */
    v->slots[-1 - found] = (h >> 32) << 32 | (uint64_t)(id + 1);
    return id;
}

/* Insert n tokens (token i = buf[starts[i]:starts[i+1]]) that the table lacks, with the next
 * ids in order. Returns 0, -1 when out of memory, -2 when a token is already there. */
int64_t ragspec_vocab_add(void *handle, const char *buf, const int64_t *starts, int64_t n) {
    vocab_t *v = handle;
    for (int64_t i = 0; i < n; i++) {
        const char *s = buf + starts[i];
        int64_t len = starts[i + 1] - starts[i];
        uint64_t h = hash_bytes(s, len);
        if (find_token(v, s, len, h) >= 0) return -2;
        if (insert_token(v, s, len, h) < 0) return -1;
    }
    return 0;
}


static inline int is_word(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Tokenise and count n ASCII texts (text i = buf[ends[i-1]:ends[i]], ends[-1] = 0) as the rows
 * rows_of[i]: per (text, distinct token) one posting (term id, row, count) into terms / rows /
 * counts (capacity: the texts' tokens, at most (bytes + n) / 2), per text its token count
 * (lengths) and distinct tokens (distinct). Tokens new to the table get the next ids; each is
 * reported as its place in buf (new_at, new_len; as many as there can be tokens), *n_new of
 * them. Returns the postings written, or -1 when out of memory (the table then holds some of
 * the new tokens: the caller drops it and builds it again). */
int64_t ragspec_tokenize_count(void *handle, const char *buf, const int64_t *ends, int64_t n,
                               const int32_t *rows_of, int32_t *terms, int32_t *rows,
                               int32_t *counts, int32_t *lengths, int32_t *distinct,
                               int64_t *new_at, int64_t *new_len, int64_t *n_new) {
    vocab_t *v = handle;
    int64_t out = 0, fresh = 0, ids_cap = 256, tab_cap = 1024;
    int32_t *ids = malloc(ids_cap * sizeof *ids);
    int64_t *tab = calloc(tab_cap, sizeof *tab);
    char *word = malloc(256);
    int64_t word_cap = 256;
    if (!ids || !word || !tab) { free(ids); free(word); free(tab); return -1; }
    int64_t pos = 0;
    for (int64_t t = 0; t < n; t++) {
        int64_t end = ends[t], held = 0;
        while (pos < end) {
            while (pos < end && !is_word((unsigned char)buf[pos])) pos++;
            if (pos >= end) break;
            int64_t start = pos;
            while (pos < end && is_word((unsigned char)buf[pos])) pos++;
            int64_t len = pos - start;
            if (len > word_cap) {
                char *bigger = realloc(word, len);
                if (!bigger) { free(ids); free(word); free(tab); return -1; }
                word = bigger;
                word_cap = len;
            }
            for (int64_t i = 0; i < len; i++) {
                char c = buf[start + i];
                word[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
            }
            uint64_t h = hash_bytes(word, len);
            int64_t id = find_token(v, word, len, h);
            if (id < 0) {
                id = insert_token(v, word, len, h);
                if (id < 0) { free(ids); free(word); free(tab); return -1; }
                new_at[fresh] = start;
                new_len[fresh] = len;
                fresh++;
            }
            if (held == ids_cap) {
                int32_t *bigger = realloc(ids, 2 * ids_cap * sizeof *ids);
                if (!bigger) { free(ids); free(word); free(tab); return -1; }
                ids = bigger;
                ids_cap *= 2;
            }
            ids[held++] = (int32_t)id;
        }
        pos = end;
        /* Count the text's ids in a small hash table of its own (cleared after the text): each
         * distinct id gets a posting, in the order of first appearance (a caller sorts them). */
        if (2 * held > tab_cap) {
            int64_t cap = tab_cap;
            while (cap < 2 * held) cap *= 2;
            free(tab);
            tab = calloc(cap, sizeof *tab);
            if (!tab) { free(ids); free(word); free(tab); return -1; }
            tab_cap = cap;
        }
        uint32_t mask = (uint32_t)tab_cap - 1;
        int64_t first = out;
        for (int64_t i = 0; i < held; i++) {
            uint32_t id = (uint32_t)ids[i], k = (id * 2654435761u) & mask;
            while (tab[k] && terms[tab[k] - 1] != (int32_t)id) k = (k + 1) & mask;
            if (tab[k]) {
                counts[tab[k] - 1]++;
            } else {
                tab[k] = out + 1; /* the posting's place + 1 (0: empty) */
                terms[out] = (int32_t)id;
                rows[out] = rows_of[t];
                counts[out] = 1;
                out++;
            }
        }
        int64_t kinds = out - first;
        for (int64_t p = first; p < out; p++) { /* clear the slots this text took */
            uint32_t k = ((uint32_t)terms[p] * 2654435761u) & mask;
            while (tab[k] != p + 1) k = (k + 1) & mask;
            tab[k] = 0;
        }
        lengths[t] = (int32_t)held;
        distinct[t] = (int32_t)kinds;
    }
    free(ids);
    free(word);
    free(tab);
    *n_new = fresh;
    return out;
}
