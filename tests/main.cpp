// Catch2 main shared by every tessel test binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
