"""The fused kernels' shared checks and tests live in helper modules (_ops_helpers.py, _carry_table_tests.py): pytest
rewrites their asserts as it does a test module's, so that a failure shows the values it compared."""
import pytest

pytest.register_assert_rewrite("_ops_helpers", "_carry_table_tests")
