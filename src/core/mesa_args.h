// Argument checks shared by every implementation of the Mesa core.
#ifndef MN_MESA_ARGS_H
#define MN_MESA_ARGS_H

#include "mesanet.h"

// MN_ERR_ARG with a message naming the field unless all sizes are positive
// and the products fit the index type.
int mesa_check_dims(const MnMesaDims *d);
int mesa_check_solver(const MnSolver *s);

#endif
