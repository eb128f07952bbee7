"""What padded_eval keeps between calls, in one list (`padded_eval.caches.registry`)."""
