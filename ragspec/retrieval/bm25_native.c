/* ragspec's BM25 accumulation loop (bm25_native.py compiles and loads it).
 *
 * accumulate: for each posting i, scores[rows[i]] += idf * tfs[i] * k1p1 / (tfs[i] + norms[rows[i]])
 * -- the very operations, in the very order, of bm25_postings.contribution followed by numpy's
 * `scores[rows] += ...` (compiled with -ffp-contract=off, no fast-math: every step is one IEEE
 * rounding, as in numpy) -- and lists each row the first time it is touched in `touched_rows`.
 * Returns the new number of touched rows. */
#include <stdint.h>

int64_t ragspec_bm25_accumulate(const int32_t *rows, const int32_t *tfs, int64_t n, double idf,
                                double k1p1, const double *norms, double *scores,
                                uint8_t *touched, int64_t *touched_rows, int64_t n_touched) {
    for (int64_t i = 0; i < n; i++) {
        int32_t row = rows[i];
        double tf = (double)tfs[i];
        double c = idf * tf;
        c = c * k1p1;
        c = c / (tf + norms[row]);
        scores[row] += c;
        if (!touched[row]) {
            touched[row] = 1;
            touched_rows[n_touched++] = row;
        }
    }
    return n_touched;
}
