/* Keeps dt_test_support non-empty before any helper exists. */
typedef int dt_test_support_empty_t;
