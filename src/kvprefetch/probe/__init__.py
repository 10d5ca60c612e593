"""Stand-alone scripts run with *another* environment's python (stdlib, plus torch where
noted). They must not import kvprefetch: the environment being probed does not have it."""
