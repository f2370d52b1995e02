#include <catch2/catch.hpp>
TEST_CASE("placeholder_ops") { CHECK(true); }
