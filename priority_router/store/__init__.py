"""The counter store: the Redis connection, client keys, the atomic counter and its breaker."""
