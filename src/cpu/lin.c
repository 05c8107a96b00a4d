#include "mesanet.h"

MnLinOpts mn_lin_opts_default(MnLinRule rule) {
    MnLinOpts o = {rule, 1.0f, MN_FORM_AUTO, 0};
    return o;
}
