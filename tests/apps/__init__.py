"""Applications the tests run under a real supervisor."""
