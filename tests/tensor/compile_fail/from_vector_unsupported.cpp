// Must not compile: short has no weft DType, so fromVector<short> stops at its
// static_assert (tests/CMakeLists.txt checks for the message) instead of
// compiling and failing at link time.
#include <vector>

#include "tensor/tensor.h"

weft::Tensor makeShorts() { return weft::fromVector(std::vector<short>{1, 2, 3}); }
