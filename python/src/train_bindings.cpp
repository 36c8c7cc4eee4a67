// pyrlx bindings for rlx::train (losses, optimisers). Empty until they land.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void bind_train(nb::module_& m) { (void)m; }
