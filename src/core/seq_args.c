#include "seq_args.h"

#include <stdint.h>

#include "common.h"

int seq_check_dims(const MnSeqDims *d) {
    if (!d) return mn_error(MN_ERR_ARG, "sequence dims: NULL");
    const struct {
        const char *name;
        int value;
    } f[] = {{"B", d->B}, {"T", d->T}, {"H", d->H}, {"Dk", d->Dk}, {"Dv", d->Dv}};
    for (int i = 0; i < 5; i++)
        if (f[i].value <= 0) return mn_error(MN_ERR_ARG, "sequence dims: %s must be > 0, got %d", f[i].name, f[i].value);
    if (d->Dk > 4096 || d->Dv > 4096)
        return mn_error(MN_ERR_ARG, "sequence dims: head sizes above 4096 are not supported (Dk=%d, Dv=%d)", d->Dk, d->Dv);
    double n = (double)d->B * d->T * d->H * (d->Dk > d->Dv ? d->Dk : d->Dv);
    if (n > (double)INT64_MAX / 8)
        return mn_error(MN_ERR_ARG, "sequence dims: B*T*H*D = %.3g elements is too large", n);
    return MN_OK;
}

int seq_check_groups(const MnSeqDims *d, int n, const char *what) {
    if (n < 0 || (n > 0 && d->B % n))
        return mn_error(MN_ERR_ARG, "%s = %d: 0, or a divisor of the %d sequences", what, n, d->B);
    return MN_OK;
}

int seq_check_solver(const MnSolver *s) {
    if (!s) return mn_error(MN_ERR_ARG, "mesa: solver is NULL");
    if (s->max_steps < 0) return mn_error(MN_ERR_ARG, "mesa: solver max_steps must be >= 0, got %d", s->max_steps);
    if (!(s->tol >= 0)) return mn_error(MN_ERR_ARG, "mesa: solver tol must be >= 0, got %g", (double)s->tol);
    if (s->chunk < 0 || s->chunk > 1024)
        return mn_error(MN_ERR_ARG, "mesa: solver chunk must be in [1, 1024] (0: the backend's default), got %d", s->chunk);
    if (s->precond != MN_PRECOND_NONE && s->precond != MN_PRECOND_JACOBI)
        return mn_error(MN_ERR_ARG, "mesa: unknown preconditioner %d", (int)s->precond);
    if (s->init != MN_CG_INIT_ZERO && s->init != MN_CG_INIT_JACOBI && s->init != MN_CG_INIT_GIVEN)
        return mn_error(MN_ERR_ARG, "mesa: unknown initial guess %d", (int)s->init);
    if (s->form != MN_FORM_AUTO && s->form != MN_FORM_CHUNK && s->form != MN_FORM_RECURRENT)
        return mn_error(MN_ERR_ARG, "mesa: unknown form %d", (int)s->form);
    return MN_OK;
}

MnSolver mn_solver_default(void) {
    MnSolver s = {.max_steps = 30, .tol = 0, .precond = MN_PRECOND_NONE, .init = MN_CG_INIT_ZERO,
                  .form = MN_FORM_AUTO, .chunk = 0, .precision = MN_PREC_AUTO, .check = 0};
    return s;
}

int lin_check_args(const char *fn, const MnSeqDims *d, const MnLinOpts *o, const void *io) {
    MN_TRY(seq_check_dims(d));
    if (!o) return mn_error(MN_ERR_ARG, "%s: opts is NULL", fn);
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    if (o->rule != MN_LIN_GLA && o->rule != MN_LIN_DELTA) return mn_error(MN_ERR_ARG, "%s: unknown rule %d", fn, (int)o->rule);
    if (o->form != MN_FORM_AUTO && o->form != MN_FORM_CHUNK && o->form != MN_FORM_RECURRENT)
        return mn_error(MN_ERR_ARG, "%s: unknown form %d", fn, (int)o->form);
    if (o->chunk < 0) return mn_error(MN_ERR_ARG, "%s: chunk = %d, must be >= 0", fn, o->chunk);
    if (o->precision != MN_PREC_AUTO && o->precision != MN_PREC_SPLIT && o->precision != MN_PREC_BF16)
        return mn_error(MN_ERR_ARG, "%s: unknown precision %d (auto, split or bf16)", fn, (int)o->precision);
    return MN_OK;
}
