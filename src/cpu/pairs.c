// The (sequence, head) pairs of the CPU cores, over the threads (pairs.h).
#include "pairs.h"

#include <omp.h>
#include <string.h>

#include "core/common.h"
#include "workspace.h"

int cpu_for_pairs(const MnSeqDims *d, int C, size_t per, size_t extra, float **extra_out, PairFn fn, void *ctx) {
    int npairs = d->B * d->H, nt = mn_max(1, mn_min(omp_get_max_threads(), npairs));
    float *work = cpu_workspace((size_t)nt * per + extra);
    if (!work) return MN_ERR_NOMEM;
    if (extra_out) {
        *extra_out = work + (size_t)nt * per;
        memset(*extra_out, 0, sizeof(float) * extra);
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int bh = 0; bh < npairs; bh++) {
        SeqPair p = {d->T, d->H, d->Dk, d->Dv, C, (size_t)(bh / d->H) * d->T * d->H + (size_t)(bh % d->H), bh % d->H};
        fn(ctx, &p, bh, work + (size_t)omp_get_thread_num() * per);
    }
    return MN_OK;
}
