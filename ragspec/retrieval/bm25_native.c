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
